"""Whole-grammar analyses the text front ends (EBNF, Lark, structural tags) share.

- :func:`eliminate_left_recursion` rewrites direct left recursion into iteration, which a pushdown
  automaton handles without a stack that grows on every step.
- :func:`prune_unreachable` drops rules the root cannot reach.
- :func:`check_grammar` refuses an empty language and any remaining (indirect) left recursion,
  naming the rule and, when known, its line and column.
- :func:`map_refs` / :func:`prefix_rules` rebuild expressions (used to merge grammars without name
  clashes).

All loops are iterative: grammars generated from deep schemas must not hit Python's recursion limit.
"""

from __future__ import annotations

from typing import Callable, Protocol

from . import ir
from .errors import GrammarSyntaxError


class _Pos(Protocol):
    line: int
    column: int


def map_refs(expr: ir.Expr, fn: Callable[[ir.Ref], ir.Expr]) -> ir.Expr:
    """Rebuild ``expr`` with every ``Ref`` replaced by ``fn(ref)``, re-simplifying on the way up."""
    if isinstance(expr, ir.Ref):
        return fn(expr)
    if isinstance(expr, ir.Seq):
        return ir.seq(*(map_refs(e, fn) for e in expr.items))
    if isinstance(expr, ir.Choice):
        return ir.choice(*(map_refs(e, fn) for e in expr.items))
    if isinstance(expr, ir.Repeat):
        return ir.repeat(map_refs(expr.item, fn), expr.min, expr.max)
    return expr


def prefix_rules(grammar: ir.Grammar, prefix: str) -> ir.Grammar:
    """A copy of ``grammar`` with every rule name (and reference) prefixed by ``prefix``."""
    rename = lambda ref: ir.Ref(prefix + ref.name)  # noqa: E731
    rules = {prefix + name: map_refs(body, rename) for name, body in grammar.rules.items()}
    return ir.Grammar(rules, root=prefix + grammar.root, source_kind=grammar.source_kind)


def _split_left_recursive(name: str, body: ir.Expr) -> tuple[list[ir.Expr], list[ir.Expr]] | None:
    """For ``A ::= A x | A y | b | c`` return ([x, y], [b, c]); None if A is not directly left-recursive."""
    alts = body.items if isinstance(body, ir.Choice) else (body,)
    tails: list[ir.Expr] = []
    bases: list[ir.Expr] = []
    for alt in alts:
        if alt == ir.Ref(name):
            tails.append(ir.EMPTY)
        elif isinstance(alt, ir.Seq) and alt.items[0] == ir.Ref(name):
            tails.append(ir.seq(*alt.items[1:]))
        else:
            bases.append(alt)
    return (tails, bases) if tails else None


def _starts_with(expr: ir.Expr, name: str) -> bool:
    """Can ``expr`` begin with ``Ref(name)`` syntactically (through leading groups and options)?"""
    if isinstance(expr, ir.Ref):
        return expr.name == name
    if isinstance(expr, ir.Seq):
        return _starts_with(expr.items[0], name)
    if isinstance(expr, ir.Choice):
        return any(_starts_with(e, name) for e in expr.items)
    if isinstance(expr, ir.Repeat):
        return _starts_with(expr.item, name)
    return False


def _distribute_leading(name: str, body: ir.Expr, limit: int = 64) -> ir.Expr:
    """Pull ``A`` out of leading groups and options: ``(A "+" | A "-")? t`` becomes the
    alternatives ``A "+" t | A "-" t | t``, so the direct rewrite below can see it. Gives up
    (returns ``body``) past ``limit`` alternatives."""
    todo = list(body.items if isinstance(body, ir.Choice) else (body,))
    done: list[ir.Expr] = []
    while todo:
        alt = todo.pop()
        items = alt.items if isinstance(alt, ir.Seq) else (alt,)
        first, rest = items[0], items[1:]
        if isinstance(first, ir.Choice) and _starts_with(first, name):
            todo.extend(ir.seq(x, *rest) for x in first.items)
        elif isinstance(first, ir.Repeat) and (first.min, first.max) == (0, 1) and _starts_with(first, name):
            todo.extend([ir.seq(first.item, *rest), ir.seq(*rest)])
        else:
            done.append(alt)
        if len(todo) + len(done) > limit:
            return body
    return ir.choice(*reversed(done))


def eliminate_left_recursion(grammar: ir.Grammar) -> ir.Grammar:
    """Rewrite each directly left-recursive rule ``A ::= A x | b`` into ``A ::= b x*`` (same
    language), after pulling ``A`` out of leading groups and options (``(A "+")? t``)."""
    rules = dict(grammar.rules)
    for name, body in grammar.rules.items():
        if _starts_with(body, name):
            body = _distribute_leading(name, body)
        split = _split_left_recursive(name, body)
        if split is not None:
            tails, bases = split
            rules[name] = ir.seq(ir.choice(*bases), ir.star(ir.choice(*tails)))
    return ir.Grammar(rules, root=grammar.root, source_kind=grammar.source_kind)


def prune_unreachable(grammar: ir.Grammar) -> ir.Grammar:
    """Keep only the rules reachable from the root."""
    seen = {grammar.root}
    todo = [grammar.root]
    while todo:
        for ref in ir.iter_refs(grammar.rules[todo.pop()]):
            if ref not in seen:
                seen.add(ref)
                todo.append(ref)
    rules = {n: e for n, e in grammar.rules.items() if n in seen}
    return ir.Grammar(rules, root=grammar.root, source_kind=grammar.source_kind)


def _fixpoint(grammar: ir.Grammar, test: Callable[[ir.Expr, set[str]], bool]) -> set[str]:
    """The least set S of rule names with ``test(body, S)`` for each member."""
    found: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name, body in grammar.rules.items():
            if name not in found and test(body, found):
                found.add(name)
                changed = True
    return found


def nullable(expr: ir.Expr, nullable_rules: set[str]) -> bool:
    """Can ``expr`` match the empty string, given which rules can?"""
    if isinstance(expr, ir.Empty):
        return True
    if isinstance(expr, ir.Ref):
        return expr.name in nullable_rules
    if isinstance(expr, ir.Seq):
        return all(nullable(e, nullable_rules) for e in expr.items)
    if isinstance(expr, ir.Choice):
        return any(nullable(e, nullable_rules) for e in expr.items)
    if isinstance(expr, ir.Repeat):
        return expr.min == 0 or nullable(expr.item, nullable_rules)
    return False


def productive(expr: ir.Expr, productive_rules: set[str]) -> bool:
    """Does ``expr`` match at least one string, given which rules do?"""
    if isinstance(expr, ir.Nothing):
        return False
    if isinstance(expr, ir.Ref):
        return expr.name in productive_rules
    if isinstance(expr, ir.Seq):
        return all(productive(e, productive_rules) for e in expr.items)
    if isinstance(expr, ir.Choice):
        return any(productive(e, productive_rules) for e in expr.items)
    if isinstance(expr, ir.Repeat):
        return expr.min == 0 or productive(expr.item, productive_rules)
    return True


def left_corners(expr: ir.Expr, nullable_rules: set[str]) -> set[str]:
    """Rules that ``expr`` may enter before consuming any byte."""
    if isinstance(expr, ir.Ref):
        return {expr.name}
    if isinstance(expr, ir.Seq):
        out: set[str] = set()
        for item in expr.items:
            out |= left_corners(item, nullable_rules)
            if not nullable(item, nullable_rules):
                break
        return out
    if isinstance(expr, ir.Choice):
        return set().union(*(left_corners(e, nullable_rules) for e in expr.items))
    if isinstance(expr, ir.Repeat):
        return left_corners(expr.item, nullable_rules)
    return set()


def _error(message: str, pos: _Pos | None) -> GrammarSyntaxError:
    return GrammarSyntaxError(message, pos.line if pos else None, pos.column if pos else None)


def check_grammar(grammar: ir.Grammar, positions: dict[str, _Pos] | None = None) -> None:
    """Refuse an empty language and left recursion (positions name where the rule was written)."""
    positions = positions or {}
    grammar.validate()
    prod = _fixpoint(grammar, productive)
    if grammar.root not in prod:
        raise _error(f"the grammar's language is empty: rule {grammar.root!r} can never complete", positions.get(grammar.root))
    nul = _fixpoint(grammar, nullable)
    graph = {name: left_corners(body, nul) for name, body in grammar.rules.items()}
    for name in grammar.rules:
        # Depth-first search from `name` over left corners; reaching `name` again is left recursion.
        seen: set[str] = set()
        todo = list(graph[name])
        while todo:
            cur = todo.pop()
            if cur == name:
                raise _error(
                    f"rule {name!r} is left-recursive (it can reach itself without consuming input); "
                    "only direct left recursion 'A ::= A x | y' is rewritten automatically",
                    positions.get(name),
                )
            if cur not in seen:
                seen.add(cur)
                todo.extend(graph.get(cur, ()))
