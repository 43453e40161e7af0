"""char_dfa: products and complements agree with ``re`` on every short string over a small alphabet,
and the IR they hand back compiles to the same language."""

from __future__ import annotations

import itertools
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grammar import char_dfa as cd
from grammar.char_dfa_kernels import minimize_kernel
from grammar import ir
from grammar.errors import GrammarBudgetError
from grammar.regex import regex_to_ir
from test_json_schema_oracle import ir_accepts

PATTERNS = ["a*b", "(a|b)*x", "[^a]+", "a.b", "x?", "(ab|ba){1,2}", "", "[ab]{2,3}"]
WORDS = ["".join(t) for n in range(5) for t in itertools.product("abx", repeat=n)] + ["é", "a\n"]


def dfa(pattern: str) -> cd.CharDFA:
    return cd.from_ir(regex_to_ir(pattern, flavor="ecma"))


@pytest.mark.parametrize("p", PATTERNS)
def test_products_and_complement_agree_with_re(p):
    a = dfa(p)
    ops = {q: (cd.intersect(a, dfa(q)), cd.union(a, dfa(q)), cd.difference(a, dfa(q))) for q in PATTERNS}
    neg = cd.complement(a)
    for s in WORDS:
        ra = re.fullmatch(p, s, re.DOTALL) is not None
        assert cd.accepts(a, s) == ra and cd.accepts(neg, s) == (not ra), (p, s)
        for q, (i, u, d) in ops.items():
            rb = re.fullmatch(q, s, re.DOTALL) is not None
            assert (cd.accepts(i, s), cd.accepts(u, s), cd.accepts(d, s)) == (ra and rb, ra or rb, ra and not rb), (p, q, s)


def test_to_ir_round_trip_and_queries():
    a = cd.intersect(dfa("[a-c]+x?"), cd.lengths(2, 3))
    g = ir.Grammar({"root": cd.to_ir(a)})
    for s in WORDS:
        assert ir_accepts(g, s) == cd.accepts(a, s) == (re.fullmatch("[a-c]+x?", s) is not None and 2 <= len(s) <= 3), s
    assert sorted(cd.finite_words(dfa("a{2,3}|b"), 10)) == ["aa", "aaa", "b"]
    assert cd.finite_words(dfa("a*"), 10) is None
    assert cd.is_empty(cd.intersect(dfa("a+"), dfa("b+")))
    assert cd.to_ir(cd.intersect(dfa("a+"), dfa("b+"))) == ir.NOTHING
    # The complement never contains surrogates (they are not text).
    assert not cd.accepts(cd.complement(dfa("a")), "\ud800")


# ---------------------------------------------------------------- the compiled minimization


def _reference_minimal(table: list[list[int]], accepting: list[bool]) -> tuple[list[list[int]], list[bool]]:
    """Textbook minimization in plain Python: drop states that cannot reach acceptance, refine
    classes by (own class, successors' classes) until stable, number the classes breadth-first
    from state 0 (symbols in order), the dead class -1."""
    n, k = len(table), len(table[0])
    full = [[t if t >= 0 else n for t in row] for row in table] + [[n] * k]
    acc = list(accepting) + [False]
    alive = acc[:]
    changed = True
    while changed:
        changed = False
        for s in range(n + 1):
            if not alive[s] and any(alive[t] for t in full[s]):
                alive[s] = changed = True
    cls = [(2 if acc[s] else 1) if alive[s] else 0 for s in range(n + 1)]
    while True:
        sigs: dict[tuple, int] = {}
        new = [sigs.setdefault((cls[s], *(cls[t] for t in full[s])), len(sigs)) for s in range(n + 1)]
        if len(sigs) == len(set(cls)):
            break
        cls = new
    dead = cls[n]
    if cls[0] == dead:
        return [], []
    index, reps = {cls[0]: 0}, [0]
    for s in reps:  # grows while read: breadth-first
        for t in full[s]:
            if cls[t] != dead and cls[t] not in index:
                index[cls[t]] = len(reps)
                reps.append(t)
    return [[index.get(cls[t], -1) for t in full[s]] for s in reps], [acc[s] for s in reps]


@st.composite
def _tables(draw):
    n = draw(st.integers(1, 12))
    k = draw(st.integers(1, 4))
    table = draw(st.lists(st.lists(st.integers(-1, n - 1), min_size=k, max_size=k), min_size=n, max_size=n))
    accepting = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    return table, accepting


@settings(max_examples=300, deadline=None)
@given(_tables())
def test_compiled_minimization_equals_the_textbook_one(drawn):
    table, accepting = drawn
    n, k = len(table), len(table[0])
    full = np.array([[t if t >= 0 else n for t in row] for row in table] + [[n] * k], dtype=np.int32)
    reps, got = minimize_kernel(full, np.array(accepting + [False]), cd.MINIMIZE_ROUNDS)
    want_table, want_accepting = _reference_minimal(table, accepting)
    assert got.tolist() == want_table
    assert [accepting[r] if r < n else False for r in reps.tolist()] == want_accepting


def test_minimization_past_its_rounds_keeps_the_language():
    counter = cd.intersect(dfa("a*"), cd.lengths(0, 30))  # 31 states, told apart one round each
    assert counter.num_states == 31
    old = cd.MINIMIZE_ROUNDS
    try:
        cd.MINIMIZE_ROUNDS = 3
        trimmed = cd.intersect(dfa("(a|b)*"), cd.intersect(dfa("a*"), cd.lengths(0, 30)))
    finally:
        cd.MINIMIZE_ROUNDS = old
    for s in ["", "a" * 30, "a" * 31, "ab", "b"]:
        assert cd.accepts(trimmed, s) == cd.accepts(counter, s), s


def test_product_past_the_state_budget_is_refused(monkeypatch):
    monkeypatch.setattr(cd, "MAX_DFA_STATES", 40)
    with pytest.raises(GrammarBudgetError, match="more than 40 DFA states"):
        cd.intersect(dfa("[ab]*"), cd.lengths(0, 60))
    assert cd.intersect(dfa("[ab]*"), cd.lengths(0, 30)).num_states == 31
