"""Whole-grammar analyses the text front ends (EBNF, Lark, structural tags) share.

- :func:`eliminate_left_recursion` rewrites left recursion (direct, inside leading groups, and
  indirect) into iteration, which a pushdown automaton handles without a growing stack.
- :func:`prune_unreachable` drops rules the root cannot reach.
- :func:`check_grammar` refuses an empty language and any remaining left recursion,
  naming the rule and, when known, its line and column.
- :func:`map_refs` / :func:`prefix_rules` rebuild expressions (used to merge grammars without name
  clashes).

Walks over rule references are iterative (fixpoints, explicit stacks); Python recursion follows only
the nesting of one expression, which the grammar text bounds.
"""

from __future__ import annotations

from typing import Callable, Protocol

from . import ir
from .budget import RULE_CHECK_STEPS, charge
from .errors import GrammarSyntaxError
from .rule_graph import on_cycles, strongly_connected_components


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
    if isinstance(expr, ir.Graph):
        return ir.Graph(expr.start, expr.finals, tuple((a, map_refs(x, fn), b) for a, x, b in expr.edges))
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


def _starts_with(expr: ir.Expr, names: frozenset[str]) -> bool:
    """Can ``expr`` begin with a reference to one of ``names`` syntactically (through leading
    groups and options)?"""
    if isinstance(expr, ir.Ref):
        return expr.name in names
    if isinstance(expr, ir.Seq):
        return _starts_with(expr.items[0], names)
    if isinstance(expr, ir.Choice):
        return any(_starts_with(e, names) for e in expr.items)
    if isinstance(expr, ir.Repeat):
        return _starts_with(expr.item, names)
    return False


def _leading_refs(expr: ir.Expr) -> set[str]:
    """The rules ``expr`` can syntactically begin with (the names ``_starts_with`` would find)."""
    if isinstance(expr, ir.Ref):
        return {expr.name}
    if isinstance(expr, ir.Seq):
        return _leading_refs(expr.items[0])
    if isinstance(expr, ir.Choice):
        return set().union(*(_leading_refs(e) for e in expr.items))
    if isinstance(expr, ir.Repeat):
        return _leading_refs(expr.item)
    return set()


def _distribute_leading(names: frozenset[str], body: ir.Expr, limit: int = 64) -> ir.Expr:
    """Pull ``A`` out of leading groups and options: ``(A "+" | A "-")? t`` becomes the
    alternatives ``A "+" t | A "-" t | t``, so the direct rewrite below can see it. Gives up
    (returns ``body``) past ``limit`` alternatives."""
    todo = list(body.items if isinstance(body, ir.Choice) else (body,))
    done: list[ir.Expr] = []
    while todo:
        alt = todo.pop()
        items = alt.items if isinstance(alt, ir.Seq) else (alt,)
        first, rest = items[0], items[1:]
        if isinstance(first, ir.Choice) and _starts_with(first, names):
            todo.extend(ir.seq(x, *rest) for x in first.items)
        elif isinstance(first, ir.Repeat) and (first.min, first.max) == (0, 1) and _starts_with(first, names):
            todo.extend([ir.seq(first.item, *rest), ir.seq(*rest)])
        else:
            done.append(alt)
        if len(todo) + len(done) > limit:
            return body
    return ir.choice(*reversed(done))


def _alternatives(expr: ir.Expr) -> tuple[ir.Expr, ...]:
    return expr.items if isinstance(expr, ir.Choice) else (expr,)


def _first_ref(alt: ir.Expr) -> str | None:
    first = alt.items[0] if isinstance(alt, ir.Seq) else alt
    return first.name if isinstance(first, ir.Ref) else None


def _rewrite_direct(name: str, body: ir.Expr) -> ir.Expr:
    if _starts_with(body, frozenset([name])):
        body = _distribute_leading(frozenset([name]), body)
    split = _split_left_recursive(name, body)
    if split is None:
        return body
    tails, bases = split
    return ir.seq(ir.choice(*bases), ir.star(ir.choice(*tails)))


def _cyclic_rules(rules: dict[str, ir.Expr]) -> list[str]:
    """Rules on a cycle of syntactic left corners (first items of their alternatives), in
    definition order."""
    graph = {n: frozenset(_leading_refs(b) & rules.keys()) for n, b in rules.items()}
    cyclic = on_cycles(strongly_connected_components(graph), graph)
    return [name for name in rules if name in cyclic]


# Paull's inlining multiplies a cycle's alternatives: past this many, a rule is left as it is.
REWRITE_ALTERNATIVES = 256


def eliminate_left_recursion(grammar: ir.Grammar, limit: int = REWRITE_ALTERNATIVES) -> ir.Grammar:
    """Rewrite left recursion into iteration, keeping the language.

    Direct: ``A ::= A x | b`` becomes ``A ::= b x*``, after pulling ``A`` out of leading groups and
    options (``(A "+")? t``). Indirect (``A ::= B x | a``, ``B ::= A y | b``): the rules on such a
    cycle are ordered and each earlier rule is inlined where it leads a later one (Paull's
    algorithm), then the direct rewrite applies. Past ``limit`` alternatives a rule is left alone,
    and ``check_grammar`` refuses what remains.
    """
    rules = {name: _rewrite_direct(name, body) for name, body in grammar.rules.items()}
    order = _cyclic_rules(rules)
    for i, name in enumerate(order):
        earlier = frozenset(order[:i])
        alts = list(_alternatives(_distribute_leading(earlier | {name}, rules[name])))
        for _ in range(len(earlier)):
            expanded: list[ir.Expr] = []
            for alt in alts:
                ref = _first_ref(alt)
                if ref in earlier:
                    rest = alt.items[1:] if isinstance(alt, ir.Seq) else ()
                    inlined = _distribute_leading(earlier | {name}, rules[ref])
                    expanded.extend(_alternatives(_distribute_leading(earlier | {name}, ir.choice(
                        *(ir.seq(b, *rest) for b in _alternatives(inlined))))))
                else:
                    expanded.append(alt)
            if len(expanded) > limit or expanded == alts:
                break
            alts = expanded
        if len(alts) <= limit:
            rules[name] = _rewrite_direct(name, ir.choice(*alts))
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
    """The least set S of rule names with ``test(body, S)`` for each member. A work list re-tests
    only the users of a rule just added: one pass per rule of a chain, not one per link."""
    users: dict[str, list[str]] = {name: [] for name in grammar.rules}
    for name, body in grammar.rules.items():
        for ref in set(ir.iter_refs(body)):
            if ref in users:
                users[ref].append(name)
    found: set[str] = set()
    todo = list(grammar.rules)
    queued = set(todo)
    steps = 0
    while todo:
        name = todo.pop()
        queued.discard(name)
        steps += 1
        if steps & 1023 == 0:
            charge("checking the grammar's rules", 1024 * RULE_CHECK_STEPS)
        if name in found or not test(grammar.rules[name], found):
            continue
        found.add(name)
        for user in users[name]:
            if user not in found and user not in queued:
                queued.add(user)
                todo.append(user)
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
    corners = {name: frozenset(left_corners(body, nul)) for name, body in grammar.rules.items()}
    # Left recursion is a cycle of the left-corner graph: one pass over its strongly connected
    # components (a search per rule is quadratic on long rule chains).
    cyclic = on_cycles(strongly_connected_components(corners), corners)
    for name in grammar.rules:  # the first such rule as written
        if name in cyclic:
            raise _error(
                f"rule {name!r} is left-recursive (it can reach itself without consuming input) in a way "
                "that cannot be rewritten: through a nullable prefix (A ::= B A x with B able to match "
                f"nothing), or through a cycle of rules whose rewrite would take more than {REWRITE_ALTERNATIVES} alternatives",
                positions.get(name),
            )
