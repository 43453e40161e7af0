"""Structural tags (free text with schema-checked tool calls) and plain choice, as grammar IR.

A structural tag grammar, in the spirit of XGrammar's ``structural_tag``::

    root ::= ( text_T  rest_of_begin  json_body  end )*  text_end

Free text runs until the first occurrence of a trigger ``T`` (e.g. ``<tool_call>``); from there one
of the tags whose ``begin`` starts with ``T`` is enforced (rest of ``begin``, a JSON body valid
against the tag's schema, ``end``), then free text resumes. EOS is allowed anywhere in free text.

Free text is built exactly: ``text_T`` is "any text whose first trigger occurrence is ``T`` at its
very end" and ``text_end`` "any text containing no trigger", both read off the Aho-Corasick-style
automaton over the triggers' prefixes and turned into regular expressions by state elimination.
Using iteration (``Repeat``) rather than right recursion keeps the pushdown stack flat however
long the text is. Triggers must not contain one another (the shorter would always fire first).
"""

from __future__ import annotations

from dataclasses import dataclass

from . import ir
from .errors import GrammarError
from .grammar_checks import check_grammar, prefix_rules


@dataclass(frozen=True, eq=False)
class StructuralTagItem:
    """One tag: ``begin`` (must start with a trigger), a JSON ``schema`` for the body, ``end``."""

    begin: str
    schema: dict | bool
    end: str


def choice_to_grammar(options: list[str]) -> ir.Grammar:
    """A grammar accepting exactly one of ``options`` (an empty option allows the empty output)."""
    if not options:
        raise GrammarError("choice needs at least one option")
    return ir.Grammar({"root": ir.choice(*(ir.literal(o) for o in options))}, "root", "choice")


def _validate(tags: list[StructuralTagItem], triggers: list[str]) -> dict[str, list[int]]:
    """Map each trigger to the indices of its tags; refuse inconsistent inputs."""
    if not triggers:
        raise GrammarError("structural_tag needs at least one trigger")
    for t in triggers:
        if not t:
            raise GrammarError("structural_tag trigger must be a non-empty string")
        for u in triggers:
            if u != t and t in u:
                raise GrammarError(f"structural_tag trigger {t!r} occurs inside trigger {u!r}")
    by_trigger: dict[str, list[int]] = {t: [] for t in triggers}
    for i, tag in enumerate(tags):
        owners = [t for t in triggers if tag.begin.startswith(t)]
        if not owners:
            raise GrammarError(f"structural_tag tag {i} begin {tag.begin!r} starts with no trigger")
        by_trigger[owners[0]].append(i)
    for t, idx in by_trigger.items():
        if not idx:
            raise GrammarError(f"structural_tag trigger {t!r} has no tag whose begin starts with it")
    return by_trigger


class _TextAutomaton:
    """States are trigger prefixes that contain no trigger; reading a char moves to the longest
    suffix that is still a trigger prefix (a full trigger = that trigger just occurred)."""

    def __init__(self, triggers: list[str]) -> None:
        self.triggers = set(triggers)
        self.prefixes = {t[:k] for t in triggers for k in range(len(t))}
        self.special = sorted({c for t in triggers for c in t})

    def step(self, state: str, c: str) -> str:
        s = state + c
        for k in range(len(s)):
            if s[k:] in self.prefixes or s[k:] in self.triggers:
                return s[k:]
        return ""

    def edges(self, state: str) -> dict[str, ir.Expr]:
        """Outgoing edges of ``state`` as target -> character expression."""
        grouped: dict[str, list[ir.Expr]] = {}
        for c in self.special:
            grouped.setdefault(self.step(state, c), []).append(ir.literal(c))
        other = ir.char_class([(ord(c), ord(c)) for c in self.special], negate=True)
        grouped.setdefault("", []).append(other)
        return {target: ir.choice(*exprs) for target, exprs in grouped.items()}


def _free_text_expressions(triggers: list[str]) -> tuple[dict[str, ir.Expr], ir.Expr]:
    """(text ending at the first occurrence of each trigger, text containing no trigger)."""
    auto = _TextAutomaton(triggers)
    start, end = ("start",), ("end",)
    # Graph over nodes: ("start",), ("end",), ("q", prefix), ("T", trigger).
    graph: dict[tuple, dict[tuple, ir.Expr]] = {start: {("q", ""): ir.EMPTY}}
    for q in auto.prefixes:
        out: dict[tuple, ir.Expr] = {end: ir.EMPTY}
        for target, expr in auto.edges(q).items():
            out[("T", target) if target in auto.triggers else ("q", target)] = expr
        graph[("q", q)] = out
    # Eliminate the deepest states first: their expressions stay small chains of literals.
    for q in sorted(auto.prefixes, key=len, reverse=True):
        node = ("q", q)
        outgoing = graph.pop(node)
        loop = ir.star(outgoing.pop(node)) if node in outgoing else ir.EMPTY
        for edges in graph.values():
            into = edges.pop(node, None)
            if into is None:
                continue
            for target, expr in outgoing.items():
                path = ir.seq(into, loop, expr)
                edges[target] = ir.choice(edges[target], path) if target in edges else path
    final = graph[start]
    return {t: final.get(("T", t), ir.NOTHING) for t in triggers}, final.get(end, ir.NOTHING)


def structural_tag_to_grammar(tags: list[StructuralTagItem], triggers: list[str]) -> ir.Grammar:
    """Free text interleaved with tags whose bodies are JSON valid against the tags' schemas.

    Raises GrammarError for triggers that overlap or own no tag and tags that start with no
    trigger; schema errors propagate from the JSON Schema front end.
    """
    from .json_schema import json_schema_to_grammar

    tags = [t if isinstance(t, StructuralTagItem) else StructuralTagItem(**t) for t in tags]
    by_trigger = _validate(tags, triggers)
    text_to, text_end = _free_text_expressions(triggers)
    rules: dict[str, ir.Expr] = {"text_end": text_end}
    calls: list[ir.Expr] = []
    for ti, (trigger, indices) in enumerate(by_trigger.items()):
        rules[f"text_{ti}"] = text_to[trigger]
        bodies = []
        for i in indices:
            body = prefix_rules(json_schema_to_grammar(tags[i].schema), f"tag{i}_")
            rules.update(body.rules)
            bodies.append(ir.seq(ir.literal(tags[i].begin[len(trigger):]), ir.Ref(body.root), ir.literal(tags[i].end)))
        rules[f"call_{ti}"] = ir.choice(*bodies)
        calls.append(ir.seq(ir.Ref(f"text_{ti}"), ir.Ref(f"call_{ti}")))
    rules["root"] = ir.seq(ir.star(ir.choice(*calls)), ir.Ref("text_end"))
    grammar = ir.Grammar(rules, root="root", source_kind="structural_tag")
    check_grammar(grammar)
    return grammar
