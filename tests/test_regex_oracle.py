"""Token-level oracle: compile_regex + GrammarMatcher accept exactly what re.fullmatch(p, s, re.ASCII) does.

Walks byte tokens (checking each mask bit against the matcher) and a greedy multi-byte
tokenization over a toy vocabulary, with random regexes from a small generator of constructs.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grammar import GrammarMatcher, TokenVocabulary, allocate_token_bitmask, compile_regex, unpack_bitmask

EXTRA = ["ab", "abc", "12", "é", " \n", "a.", "ba", "\n\n", "éa"]
VOCAB = TokenVocabulary.byte_level(EXTRA)
EOS = len(VOCAB) - 1
ALPHABET = "abcAB1 \n._é-"


def _mask(m: GrammarMatcher) -> np.ndarray:
    bitmask = allocate_token_bitmask(1, len(VOCAB))
    m.fill_next_token_bitmask(bitmask, 0)
    return unpack_bitmask(bitmask, len(VOCAB))[0]


def _walk_bytes(pattern: str, s: str) -> bool:
    """Feed ``s`` byte by byte; every step checks the mask agrees with accept_token."""
    m = GrammarMatcher(compile_regex(pattern, VOCAB))
    for b in s.encode():
        allowed = _mask(m)
        probe = m.copy()
        assert bool(allowed[b]) == probe.accept_token(b), (pattern, s, b)
        if not allowed[b]:
            return False
        assert m.accept_token(b)
    allowed = _mask(m)
    assert bool(allowed[EOS]) == m.can_terminate(), (pattern, s)
    for t in range(256, EOS):  # multi-byte tokens: the mask agrees with the matcher
        assert bool(allowed[t]) == m.copy().accept_token(t), (pattern, s, VOCAB.token_bytes[t])
    if not allowed[EOS]:
        return False
    assert m.accept_token(EOS) and m.is_terminated()
    return True


def _greedy_tokens(s: str) -> list[int]:
    data, ids, i = s.encode(), [], 0
    by_len = sorted(((VOCAB.token_bytes[t], t) for t in range(256, EOS)), key=lambda x: -len(x[0]))
    while i < len(data):
        for tok, tid in by_len:
            if data.startswith(tok, i):
                ids.append(tid)
                i += len(tok)
                break
        else:
            ids.append(data[i])
            i += 1
    return ids


def _walk_tokens(pattern: str, s: str) -> bool:
    m = GrammarMatcher(compile_regex(pattern, VOCAB))
    return all(m.accept_token(t) for t in _greedy_tokens(s)) and m.accept_token(EOS)


_ATOMS = ["a", "b", "ab", ".", "\\d", "\\w", "\\s", "\\W", "[ab]", "[^a]", "[a-c\\d]", "\\.", "é", "\\n", "[^\\s]", "[é-ü]"]


def _regexes() -> st.SearchStrategy[str]:
    atom = st.sampled_from(_ATOMS)

    def extend(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        quant = st.sampled_from(["*", "+", "?", "{2}", "{1,3}", "{,2}", "{2,}", "+?"])
        return st.one_of(
            st.tuples(inner, inner).map("".join),
            st.tuples(inner, inner).map("|".join),
            inner.map(lambda r: f"({r})"),
            inner.map(lambda r: f"(?i:{r})"),
            inner.map(lambda r: f"(?s:{r})"),
            st.tuples(inner.map(lambda r: f"(?:{r})"), quant).map("".join),
        )

    top = st.recursive(atom, extend, max_leaves=6)
    return st.one_of(top, top.map(lambda r: f"^{r}$"), top.map(lambda r: f"(?i){r}"))


_SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


@_SETTINGS
@given(_regexes(), st.lists(st.text(alphabet=ALPHABET, max_size=6), min_size=1, max_size=4))
def test_random_strings_match_re(pattern: str, texts: list[str]) -> None:
    for s in texts:
        expected = re.fullmatch(pattern, s, re.ASCII) is not None
        assert _walk_bytes(pattern, s) == expected, (pattern, s)
        assert _walk_tokens(pattern, s) == expected, (pattern, s)


@_SETTINGS
@given(st.data())
def test_sampled_strings_are_accepted(data: st.DataObject) -> None:
    pattern = data.draw(_regexes())
    s = data.draw(st.from_regex(re.compile(pattern, re.ASCII), fullmatch=True, alphabet=ALPHABET))
    assert _walk_bytes(pattern, s), (pattern, s)
    assert _walk_tokens(pattern, s), (pattern, s)


@pytest.mark.parametrize(
    "pattern,passing,failing",
    [
        ("\\d{3}-\\d{4}", ["555-1234"], ["5551234", "555-123", "555-12345"]),
        ("(?P<word>[a-z]+)@(?:[a-z]+\\.)+com", ["ab@c.com", "x@y.z.com"], ["@c.com", "ab@com", "AB@c.com"]),
        ("(?i)ab+c", ["abc", "ABBBC", "aBc"], ["ac", "abd"]),
        ("[^\\n]*\\n", ["abc\n", "\n", "é\n"], ["abc", "a\nb\n"]),
        ("é+|\\U0001F600", ["é", "éé", "\U0001F600"], ["", "e", "\U0001F600\U0001F600"]),
        ("a{2,3}", ["aa", "aaa"], ["a", "aaaa"]),
        ("x{", ["x{"], ["x"]),
    ],
)
def test_table(pattern: str, passing: list[str], failing: list[str]) -> None:
    for s in passing:
        assert re.fullmatch(pattern, s, re.ASCII) and _walk_bytes(pattern, s), (pattern, s)
    for s in failing:
        assert not re.fullmatch(pattern, s, re.ASCII) and not _walk_bytes(pattern, s), (pattern, s)


def test_ecma_flavor_compiles() -> None:
    m = GrammarMatcher(compile_regex("\\u{1F600}\\s", VOCAB, flavor="ecma"))
    assert m.accept_bytes("\U0001F600\u00a0".encode()) and m.accept_token(EOS)
