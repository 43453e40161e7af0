"""Core automaton, token trie and matcher on hand-built IR with a toy byte-level vocabulary.

Table-driven: ``check(grammar, passing, failing)`` walks every prefix of each string byte by byte
and checks the mask at each step against what the string needs.
"""

from __future__ import annotations

import numpy as np
import pytest

from grammar import GrammarBudgetError, GrammarError, GrammarTimeoutError, TokenVocabulary, allocate_token_bitmask, ir, unpack_bitmask
from grammar.compiler import CompileBudget, compile_grammar
from grammar.matcher import GrammarMatcher

VOCAB = TokenVocabulary.byte_level(["ab", "abc", "12", "[[", "]]", "é", "\u20ac", "\U0001f600"])
EOS = VOCAB.vocab_size - 1


def allowed(m: GrammarMatcher) -> np.ndarray:
    mask = allocate_token_bitmask(1, VOCAB.vocab_size)
    m.fill_next_token_bitmask(mask)
    return unpack_bitmask(mask[0], VOCAB.vocab_size)


def walk(g: ir.Grammar, text: str | bytes) -> bool:
    """True iff every byte is allowed and accepted, then EOS is allowed and accepted."""
    m = GrammarMatcher(compile_grammar(g, VOCAB))
    data = text.encode() if isinstance(text, str) else text
    for b in data:
        ok_mask = allowed(m)[b]
        ok = m.accept_token(b)
        assert ok == ok_mask, "mask and accept_token disagree"
        if not ok:
            return False
    end = allowed(m)[EOS]
    assert end == m.can_terminate()
    return m.accept_token(EOS) if end else False


def check(g: ir.Grammar, passing: list, failing: list) -> None:
    for s in passing:
        assert walk(g, s), f"should accept {s!r}"
    for s in failing:
        assert not walk(g, s), f"should reject {s!r}"


def G(expr: ir.Expr, **rules: ir.Expr) -> ir.Grammar:
    return ir.Grammar({"root": expr, **rules})


DIGIT = ir.char_class([(48, 57)])


def test_sequence_repeat_optional():
    g = G(ir.seq(ir.plus(ir.char_class([(97, 99)])), ir.optional(ir.literal("x")), ir.repeat(DIGIT, 2, 3)))
    check(g, ["a12", "abcx123", "cc00"], ["", "a1", "a1234", "x12", "ad12"])


def test_unicode_classes_are_utf8():
    g = G(ir.plus(ir.char_class([(0xE0, 0xFF), (0x20AC, 0x20AC), (0x1F600, 0x1F64F)])))
    check(g, ["é", "éè€😀", "ÿ"], ["e", "é€a", "\u20ad", "\U0001f650"])
    # Multi-byte tokens are allowed as a whole when their bytes fit.
    m = GrammarMatcher(compile_grammar(g, VOCAB))
    a = allowed(m)
    assert a[VOCAB.token_bytes.index("é".encode())] and a[VOCAB.token_bytes.index("😀".encode())]
    assert not a[ord("a")]


def test_negated_class_and_any_char():
    g = G(ir.seq(ir.literal('"'), ir.star(ir.char_class([(34, 34), (92, 92)], negate=True)), ir.literal('"')))
    check(g, ['""', '"abc"', '"é€"'], ['"a\\"', '"', 'a""'])


def test_choice_and_empty_language():
    g = G(ir.choice(ir.literal("cat"), ir.literal("car"), ir.literal("dog")))
    check(g, ["cat", "car", "dog"], ["ca", "cow", "cats"])
    with pytest.raises(GrammarError):
        compile_grammar(G(ir.NOTHING), VOCAB)


def test_multi_byte_tokens_in_mask():
    g = G(ir.seq(ir.literal("abc"), ir.repeat(DIGIT, 1, 2)))
    m = GrammarMatcher(compile_grammar(g, VOCAB))
    a = allowed(m)
    ids = {VOCAB.token_bytes[i] for i in np.flatnonzero(a)}
    assert ids == {b"a", b"ab", b"abc"}
    assert m.accept_token(VOCAB.token_bytes.index(b"abc"))
    ids = {VOCAB.token_bytes[i] for i in np.flatnonzero(allowed(m))}
    assert b"12" in ids and b"1" in ids and b"" not in ids


def test_recursion_nested_brackets_deep():
    arr = ir.seq(ir.literal("["), ir.optional(ir.seq(ir.Ref("arr"), ir.star(ir.seq(ir.literal(","), ir.Ref("arr"))))), ir.literal("]"))
    g = G(ir.Ref("arr"), arr=arr)
    check(g, ["[]", "[[],[[]]]", "[" * 500 + "]" * 500], ["[", "[]]", "[,]", "[[]"])


def test_left_recursion_refused():
    g = G(ir.Ref("e"), e=ir.choice(ir.seq(ir.Ref("e"), ir.literal("+a")), ir.literal("a")))
    with pytest.raises(GrammarError, match="left-recursive"):
        compile_grammar(g, VOCAB)


def test_undefined_rule():
    with pytest.raises(GrammarError, match="undefined"):
        compile_grammar(G(ir.Ref("nope")), VOCAB)


def test_budget_on_huge_repetition():
    with pytest.raises(GrammarBudgetError):
        compile_grammar(G(ir.repeat(ir.literal("a"), 1_000_000, 1_000_000)), VOCAB, budget=CompileBudget(max_nfa_states=100_000))


def test_rollback_and_terminate():
    g = G(ir.seq(ir.literal("ab"), ir.optional(ir.literal("c"))))
    m = GrammarMatcher(compile_grammar(g, VOCAB))
    assert m.accept_token(ord("a")) and m.accept_token(ord("b"))
    assert m.can_terminate() and m.accept_token(EOS) and m.is_terminated()
    assert not m.accept_token(ord("c"))
    assert not allowed(m).any()
    m.rollback(1)
    assert not m.is_terminated() and m.accept_token(ord("c"))
    m.rollback(3)
    assert m.num_accepted_tokens == 0
    with pytest.raises(ValueError):
        m.rollback(1)


def test_rejected_token_leaves_state():
    g = G(ir.literal("ab"))
    m = GrammarMatcher(compile_grammar(g, VOCAB))
    assert not m.accept_token(ord("b"))
    assert not m.accept_token(EOS)
    assert m.accept_token(ord("a")) and m.accept_token(ord("b")) and m.accept_token(EOS)


def test_forced_continuation_and_shortest_completion():
    g = G(ir.seq(ir.literal('{"name": "'), ir.plus(ir.char_class([(97, 122)])), ir.literal('", "é": '), ir.plus(DIGIT), ir.literal("}")))
    m = GrammarMatcher(compile_grammar(g, VOCAB))
    assert m.forced_continuation() == b'{"name": "'
    assert m.shortest_completion() == b'{"name": "a", "\xc3\xa9": 0}'
    assert m.accept_bytes(b'{"name": "x')
    assert m.forced_continuation() == b""
    assert m.accept_bytes(b'"')
    assert m.forced_continuation() == ', "é": '.encode()


def test_budgeted_mask_closes_in_time():
    arr = ir.seq(ir.literal("["), ir.optional(ir.seq(ir.Ref("arr"), ir.star(ir.seq(ir.literal(","), ir.Ref("arr"))))), ir.literal("]"))
    g = G(ir.Ref("arr"), arr=arr)
    m = GrammarMatcher(compile_grammar(g, VOCAB))
    assert m.accept_bytes("[[[")
    mask = allocate_token_bitmask(1, VOCAB.vocab_size)
    # 3 closing brackets + EOS = 4 tokens: with exactly 4 left, only "]" (or "]]") may come next.
    m.fill_next_token_bitmask(mask, remaining_tokens=4)
    ids = {VOCAB.token_bytes[i] for i in np.flatnonzero(unpack_bitmask(mask[0], VOCAB.vocab_size))}
    assert ids == {b"]", b"]]"}
    m.fill_next_token_bitmask(mask, remaining_tokens=100)
    assert unpack_bitmask(mask[0], VOCAB.vocab_size)[ord("[")]


def test_bitmask_wider_than_vocab_is_zeroed_and_torch_view_works():
    torch = pytest.importorskip("torch")
    g = G(ir.literal("a"))
    m = GrammarMatcher(compile_grammar(g, VOCAB))
    t = torch.full((2, 20), -1, dtype=torch.int32)
    m.fill_next_token_bitmask(t.numpy(), 1)
    row = t[1].numpy()
    bits = unpack_bitmask(row, 20 * 32)
    assert np.flatnonzero(bits).tolist() == [ord("a")]
    assert (t[0] == -1).all()


def test_time_backstop_and_step_budget():
    g = G(ir.repeat(ir.char_class([(0x80, 0x10FFFF)]), 0, 200_000))
    # The wall clock is a backstop: its expiry says "retry may succeed", it refuses nothing.
    with pytest.raises(GrammarTimeoutError, match="ran past its 0 s budget while building the automaton"):
        compile_grammar(g, VOCAB, budget=CompileBudget(max_compile_seconds=0.0))
    # Counted work refuses, whatever the clock says.
    with pytest.raises(GrammarBudgetError, match="steps of work .*building the automaton.*max_compile_steps"):
        compile_grammar(g, VOCAB, budget=CompileBudget(max_compile_steps=10_000, max_compile_seconds=None))
