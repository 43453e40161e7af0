"""Every mask route must equal the plain reference walk (``mask_reference.py``), bit for bit.

A synthetic vocabulary with thousands of tokens over an alphabet full of the bytes that matter
(quotes, backslashes, multi-byte characters, whitespace) makes every route fire: string-like
regions (shared splits), truncated deep states of recursive grammars, and the plain trie walk.
Masks at states reached by random walks are compared with the reference, and each test checks
that the route it is about was actually taken.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from mask_reference import ReferenceWalk, random_walk_check

from grammar import GrammarMatcher, TokenVocabulary, ir
from grammar.compiler import CompileBudget, compile_grammar

ALPHABET = list('abcdeklmnz "\\:,{}[]0123456789\n\t') + ["é", "日", "€", "😀", "\x01"]


def synthetic_vocab(seed: int = 0, size: int = 4000, extra: tuple[bytes, ...] = ()) -> TokenVocabulary:
    rng = random.Random(seed)
    toks = {bytes([b]) for b in range(256)} | set(extra)
    while len(toks) < size:
        n = rng.choice([2, 2, 3, 3, 4, 5, 6, 8, 12])
        text = "".join(rng.choice(ALPHABET) for _ in range(n))
        data = text.encode()
        if rng.random() < 0.05:
            data = data[: rng.randrange(1, len(data) + 1)]  # some tokens end mid-character
        toks.add(data)
    ordered = sorted(toks)
    # Two ids with the same bytes (duplicates must follow their twin), then EOS.
    return TokenVocabulary.from_token_bytes(ordered + [ordered[300], b""], [len(ordered) + 1])


STRING_BODY = ir.star(ir.choice(ir.char_class([(0, 31), (34, 34), (92, 92)], negate=True), ir.seq(ir.literal("\\"), ir.char_class([(34, 34), (92, 92), (110, 110)]))))
JSON_STRING = ir.seq(ir.literal('"'), STRING_BODY, ir.literal('"'))
KEY_OTHER = ir.seq(ir.literal('"'), ir.char_class([(ord("k"), ord("k")), (34, 34)], negate=True), STRING_BODY, ir.literal('"'))
OBJECT = ir.seq(
    ir.literal("{"),
    ir.optional(
        ir.seq(
            ir.choice(ir.seq(ir.literal('"key": '), JSON_STRING), ir.seq(KEY_OTHER, ir.literal(": "), ir.repeat(ir.char_class([(48, 57)]), 1, 3))),
            ir.star(ir.seq(ir.literal(", "), JSON_STRING, ir.literal(": "), JSON_STRING)),
        )
    ),
    ir.literal("}"),
)

@pytest.mark.parametrize("seed", [0, 1, 2])
def test_region_masks_equal_reference(seed):
    vocab = synthetic_vocab(seed)
    compiled = compile_grammar(ir.Grammar({"root": OBJECT}), vocab)
    assert random_walk_check(compiled, vocab, random.Random(seed), walks=12, steps=40) > 100
    routes = compiled.masks.routes
    assert routes["region"] > 5 and routes["walk"] > 5, routes


SEXP = ir.Grammar(
    {
        "root": ir.Ref("expr"),
        "expr": ir.choice(
            ir.plus(ir.char_class([(ord("a"), ord("e")), (ord("k"), ord("n"))])),
            ir.seq(ir.literal('"'), STRING_BODY, ir.literal('"')),
            ir.seq(ir.literal("("), ir.optional(ir.seq(ir.Ref("expr"), ir.star(ir.seq(ir.literal(" "), ir.Ref("expr"))))), ir.literal(")")),
            ir.seq(ir.literal("["), ir.optional(ir.seq(ir.Ref("expr"), ir.star(ir.seq(ir.literal(", "), ir.Ref("expr"))))), ir.literal("]")),
        ),
    }
)


def _leaning_deep(vocab, choices, step, rng):
    """Lean towards opening brackets for the first 40 steps so the walk goes deep."""
    choices = [t for t in choices if t not in vocab.eos_token_ids] or choices
    opening = [t for t in choices if vocab.token_bytes[t] in (b"(", b"[", b"((", b"[(", b"([")]
    closing = [t for t in choices if b")" not in vocab.token_bytes[t] and b"]" not in vocab.token_bytes[t]]
    if step < 40:
        return rng.choice(opening if opening and rng.random() < 0.7 else closing or choices)
    return rng.choice(choices)


@pytest.mark.parametrize("seed", [0, 1])
def test_truncated_masks_of_deep_states_equal_reference(seed):
    vocab = synthetic_vocab(seed + 10)
    compiled = compile_grammar(SEXP, vocab)
    random_walk_check(compiled, vocab, random.Random(seed), walks=6, steps=60, pick=_leaning_deep)
    deep = sum(compiled.automaton.max_depth(s) > 3 for s in range(compiled.automaton.num_states))
    assert deep > 20 and compiled.masks.routes["truncated"] >= 10, compiled.masks.routes


def test_tokens_longer_than_the_trie_depth():
    long_a = b"a" * 300
    long_q = b"a" * 280 + b'"'
    vocab = synthetic_vocab(3, size=1200, extra=(long_a, long_q, b"a" * 256))
    compiled = compile_grammar(ir.Grammar({"root": OBJECT}), vocab)
    assert len(compiled.trie.long_pos) == 3
    ids = {vocab.token_bytes.index(t) for t in (long_a, long_q)}
    m = GrammarMatcher(compiled)
    assert m.accept_token(vocab.token_bytes.index(b"{")) and m.accept_token(vocab.token_bytes.index(b'"'))
    # In a free key: the long runs are allowed, the one closing the key too (then ':' may follow).
    row = compiled.token_mask(m.state)
    ref = ReferenceWalk(vocab)
    assert np.array_equal(row, ref.row(compiled.automaton, m.state))
    assert all(ref.allowed(compiled.automaton, m.state)[i] for i in ids)
    assert random_walk_check(compiled, vocab, random.Random(3), walks=4, steps=20) > 20


def test_region_splits_are_shared_across_grammars():
    """A second grammar with the same string shape reuses the first one's split."""
    vocab = synthetic_vocab(4)
    lazy = CompileBudget(eager_mask_seconds=0)
    first = compile_grammar(ir.Grammar({"root": ir.seq(ir.literal("x="), JSON_STRING)}), vocab, budget=lazy)
    m = GrammarMatcher(first)
    assert m.accept_token(vocab.token_bytes.index(b"x")) and m.accept_token(vocab.token_bytes.index(b"="))
    assert m.accept_token(vocab.token_bytes.index(b'"'))
    first.token_mask(m.state)
    splits = first.vocabulary_masks.splits
    before_hits, before_size = splits.hits, len(splits)
    second = compile_grammar(ir.Grammar({"root": ir.seq(ir.literal("["), JSON_STRING, ir.literal("]"))}), vocab, budget=lazy)
    m2 = GrammarMatcher(second)
    assert m2.accept_token(vocab.token_bytes.index(b"[")) and m2.accept_token(vocab.token_bytes.index(b'"'))
    row = second.token_mask(m2.state)
    assert second.masks.routes["region"] == 1
    assert splits.hits > before_hits and len(splits) == before_size, "the split should come from the shared cache"
    assert np.array_equal(row, ReferenceWalk(vocab).row(second.automaton, m2.state))


def test_eager_precompute_fills_the_rows_the_walk_would():
    """With an eager budget, small automata get their rows at compile time; they must be the
    rows the lazy route computes."""
    vocab = synthetic_vocab(5, size=1500)
    g = ir.Grammar({"root": ir.seq(ir.literal("id="), ir.repeat(ir.char_class([(48, 57)]), 2, 4), ir.optional(JSON_STRING))})
    eager = compile_grammar(g, vocab, budget=CompileBudget(eager_mask_seconds=5.0))
    assert sum(eager.masks.routes.values()) >= 5, "rows should have been computed at compile time"
    computed = sum(eager.masks.routes.values())
    lazy = compile_grammar(g, vocab, budget=CompileBudget(eager_mask_seconds=0))
    assert sum(lazy.masks.routes.values()) == 0
    rng = random.Random(5)
    m_eager, m_lazy = GrammarMatcher(eager), GrammarMatcher(lazy)
    for _ in range(8):
        assert np.array_equal(eager.token_mask(m_eager.state), lazy.token_mask(m_lazy.state))
        ids = [t for t in np.flatnonzero(ReferenceWalk(vocab).allowed(lazy.automaton, m_lazy.state))]
        if not ids:
            break
        token = int(rng.choice(ids))
        assert m_eager.accept_token(token) and m_lazy.accept_token(token)
    assert sum(eager.masks.routes.values()) == computed, "the walk should have found every row precomputed"
