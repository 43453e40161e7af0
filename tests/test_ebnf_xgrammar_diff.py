"""Dialect conformance: random EBNF texts (escapes, classes, repetition forms, groups, comments,
multi-line rules, recursion) must mean the same to formcast and to XGrammar, the reference
implementation of the dialect SGLang's ``ebnf`` field takes. Strings derived from our IR, their
mutations and random strings are accepted by both or by neither."""

from __future__ import annotations

import random

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from conftest import require_optional
from grammar import GrammarMatcher, TokenVocabulary, compile_grammar
from grammar.ebnf import ebnf_to_grammar
from test_ebnf_grammars import derive, mutate

xgt = require_optional("xgrammar.testing")

VOCAB = TokenVocabulary.byte_level()
ALPHABET = ['a', 'b', '(', ')', '"', '\\', '\n', 'é', '-', ']']
ESCAPED = {'"': '\\"', '\\': '\\\\', '\n': '\\n', 'é': '\\u00e9', ']': '\\]', '-': '\\-'}


def lit(rng: random.Random) -> str:
    chars = [rng.choice(ALPHABET) for _ in range(rng.randint(1, 3))]
    return '"' + "".join(ESCAPED.get(c, c) if c != "]" and c != "-" else c for c in chars) + '"'


def cls(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randint(1, 3)):
        if rng.random() < 0.3:
            parts.append("a-c" if rng.random() < 0.5 else "\\x20-\\x2f")
        else:
            parts.append(ESCAPED.get(c := rng.choice(ALPHABET), c))
    return "[" + ("^" if rng.random() < 0.3 else "") + "".join(parts) + "]"


def expr(rng: random.Random, rule: int, n_rules: int, depth: int, rec: list[bool]) -> str:
    """Rules may reference only later rules, or themselves once after a consumed "(" (no left
    recursion). Unbounded operators go on literals and classes only: ambiguous recursion under
    repetition makes the set-of-stacks automaton exponential (see the report on issue 4)."""
    kind = rng.randrange(6 if depth < 3 else 3)
    if kind == 4 and not rec[0]:
        rec[0] = True
        return f'"(" r{rule}? ")"'
    if kind == 2 and rule + 1 < n_rules:
        return f"r{rng.randint(rule + 1, n_rules - 1)}" + rng.choice(["", "?", "{2}"])
    if kind in (3, 4):
        alts = " | ".join(expr(rng, rule, n_rules, depth + 1, rec) for _ in range(rng.randint(1, 3)))
        return "(" + alts + ")" + rng.choice(["", "?", "{2}"])
    if kind == 5:
        return " ".join(expr(rng, rule, n_rules, depth + 1, rec) for _ in range(rng.randint(2, 3)))
    atom = lit(rng) if kind == 0 or kind == 2 else cls(rng)
    return atom + rng.choice(["", "", "*", "+", "?", "{2}", "{1,}", "{0,2}", "{1,3}"])


def grammar_text(rng: random.Random) -> str:
    n = rng.randint(1, 3)
    lines = []
    for i in range(n):
        rec = [False]
        alts = [expr(rng, i, n, 0, rec) for _ in range(rng.randint(1, 3))]
        sep = rng.choice([" | ", "\n   | ", " |\n  "])
        name = "root" if i == 0 else f"r{i}"
        lines.append(f"{name} ::= {sep.join(alts)}" + rng.choice(["", "  # comment \"x\" ::="]))
    return "\n".join(lines).replace("r0", "root")


def ours(compiled, text: str) -> bool:
    m = GrammarMatcher(compiled)
    return m.accept_bytes(text.encode()) and m.can_terminate()


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 2**32 - 1))
def test_same_language_as_xgrammar(seed: int) -> None:
    rng = random.Random(seed)
    text = grammar_text(rng)
    g = ebnf_to_grammar(text)
    compiled = compile_grammar(g, VOCAB)
    samples = []
    for _ in range(3):
        derived = derive(g, rng, max_depth=6)
        samples += [derived, mutate(derived, rng)]
    samples += [bytes(rng.choice(b'ab()"\\\n-]') for _ in range(rng.randint(0, 5))) for _ in range(3)]
    for data in samples:
        try:
            s = data.decode()
        except UnicodeDecodeError:
            continue
        assert ours(compiled, s) == xgt._is_grammar_accept_string(text, s), (text, s)


def left_recursive_text(rng: random.Random) -> str:
    """Rules whose alternatives may begin with any rule (self, earlier or later: direct and
    indirect left recursion, also inside a leading group) and always consume a literal after it."""
    n = rng.randint(1, 3)
    names = ["root"] + [f"r{i}" for i in range(1, n)]
    lines = []
    for name in names:
        alts = [lit(rng)]  # a base case keeps every rule productive
        for _ in range(rng.randint(1, 3)):
            head = rng.choice(names)
            if rng.random() < 0.3:
                head = f"({head} {lit(rng)} | {rng.choice(names)})" + rng.choice(["", "?"])
            alts.append(f"{head} {lit(rng)}" + rng.choice(["", " " + cls(rng)]))
        lines.append(f"{name} ::= " + " | ".join(alts))
    return "\n".join(lines)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 2**32 - 1))
@example(seed=23596)  # a three-rule cycle through optional groups: 65 to 128 alternatives rewritten
def test_left_recursion_rewrite_keeps_xgrammars_language(seed: int) -> None:
    # XGrammar's Earley parser takes left recursion as written; ours rewrites it into iteration.
    rng = random.Random(seed)
    text = left_recursive_text(rng)
    g = ebnf_to_grammar(text)
    compiled = compile_grammar(g, VOCAB)
    for _ in range(3):
        derived = derive(g, rng, max_depth=5)
        for data in (derived, mutate(derived, rng)):
            s = data.decode(errors="replace")
            assert ours(compiled, s) == xgt._is_grammar_accept_string(text, s), (text, s)
