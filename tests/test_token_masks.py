"""The mask shortcuts (string-like regions, settled subtrees) must equal the plain trie walk.

A synthetic vocabulary with thousands of tokens over an alphabet full of the bytes that matter
(quotes, backslashes, multi-byte characters, whitespace) makes every shortcut fire; masks at
states reached by random walks are compared bit for bit with ``walk_trie``.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from grammar import GrammarMatcher, TokenVocabulary, ir
from grammar.compiler import compile_grammar
from grammar.token_trie import walk_trie

ALPHABET = list('abcdeklmnz "\\:,{}[]0123456789\n\t') + ["é", "日", "€", "😀", "\x01"]


def synthetic_vocab(seed: int = 0, size: int = 4000) -> TokenVocabulary:
    rng = random.Random(seed)
    toks = {bytes([b]) for b in range(256)}
    while len(toks) < size:
        n = rng.choice([2, 2, 3, 3, 4, 5, 6, 8, 12])
        text = "".join(rng.choice(ALPHABET) for _ in range(n))
        data = text.encode()
        if rng.random() < 0.05:
            data = data[: rng.randrange(1, len(data) + 1)]  # some tokens end mid-character
        toks.add(data)
    ordered = sorted(toks)
    return TokenVocabulary.from_token_bytes(ordered + [b""], [len(ordered)])


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
def test_shortcut_masks_equal_plain_walk(seed):
    vocab = synthetic_vocab(seed)
    compiled = compile_grammar(ir.Grammar({"root": OBJECT}), vocab)
    rng = random.Random(seed)
    checked = 0
    for _ in range(12):
        m = GrammarMatcher(compiled)
        for _ in range(40):
            state = m.state
            fast, _ = compiled.masks.allowed(compiled.automaton, state)
            plain, _ = walk_trie(compiled.trie, compiled.automaton, state)
            assert np.array_equal(fast, plain), f"state {state}: {np.flatnonzero(fast != plain)[:10]}"
            checked += 1
            choices = np.flatnonzero(plain)
            if not len(choices):
                break
            assert m.accept_token(int(rng.choice(choices)))
    assert checked > 100
    # The shortcuts must actually have fired for this test to mean anything.
    assert compiled.masks._splits and compiled.masks._stays


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


@pytest.mark.parametrize("seed", [0, 1])
def test_truncated_masks_of_deep_states_equal_plain_walk(seed):
    from grammar.bitmask import pack_bool_mask
    from grammar.compiler import TRUNCATE_ABOVE_DEPTH

    vocab = synthetic_vocab(seed + 10)
    compiled = compile_grammar(SEXP, vocab)
    rng = random.Random(seed)
    deep = 0
    for _ in range(6):
        m = GrammarMatcher(compiled)
        for step in range(60):
            state = m.state
            plain, _ = walk_trie(compiled.trie, compiled.automaton, state)
            if compiled.automaton.accepting[state]:
                plain[compiled.trie.eos_ids] = True
            assert np.array_equal(compiled.token_mask(state), pack_bool_mask(plain)), f"state {state}"
            deep += compiled.automaton.max_depth(state) > TRUNCATE_ABOVE_DEPTH
            choices = [t for t in np.flatnonzero(plain) if t not in vocab.eos_token_ids]
            if not choices:
                break
            # Lean towards opening brackets for the first 40 steps so the walk goes deep.
            opening = [t for t in choices if vocab.token_bytes[t] in (b"(", b"[", b"((", b"[(", b"([")]
            closing = [t for t in choices if b")" not in vocab.token_bytes[t] and b"]" not in vocab.token_bytes[t]]
            if step < 40:
                pick = rng.choice(opening if opening and rng.random() < 0.7 else closing or choices)
            else:
                pick = rng.choice(choices)
            assert m.accept_token(int(pick))
    assert deep > 50 and compiled._truncated, "the truncated path must actually have been used"
