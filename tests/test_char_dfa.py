"""char_dfa: products and complements agree with ``re`` on every short string over a small alphabet,
and the IR they hand back compiles to the same language."""

from __future__ import annotations

import itertools
import re

import pytest

from grammar import char_dfa as cd
from grammar import ir
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
