"""Counted chains: a string under minLength / maxLength is a chain of states, one per character,
whose masks come from the free string's split (``regions.chain_mask``). They must equal the
plain reference walk at every state: before and at the minLength boundary, near maxLength (where
the run of copies ahead is shorter than the longest tokens), inside unions of strings with
different bounds, and with tokens longer than the run proved ahead checked one by one.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mask_reference import ReferenceWalk, random_walk_check
from test_token_masks import synthetic_vocab

from grammar import GrammarMatcher, compile_json_schema, token_masks

VOCAB = synthetic_vocab(7)
REF = ReferenceWalk(VOCAB)
# Tokens that stay inside a string (no quote, no backslash): walks that pick them most of the time
# go deep into long strings instead of closing them at once.
_INSIDE = np.array([b'"' not in t and b"\\" not in t for t in VOCAB.token_bytes])


def _deep_pick(vocab, choices, step, rng):
    inside = [t for t in choices if _INSIDE[t]]
    if inside and rng.random() < 0.85:
        return rng.choice(inside)
    return rng.choice(choices)


def _record(string_schema: dict) -> dict:
    return {
        "type": "object",
        "properties": {"a": string_schema, "b": {"type": "array", "items": string_schema, "maxItems": 3}},
        "required": ["a", "b"],
        "additionalProperties": False,
    }


def _check(schema: dict, seed: int, walks: int = 8, steps: int = 45):
    compiled = compile_json_schema(schema, VOCAB)
    checked = random_walk_check(compiled, VOCAB, random.Random(seed), walks=walks, steps=steps, pick=_deep_pick, ref=REF)
    return compiled, checked


@pytest.mark.parametrize("low, high", [(0, 40), (3, 12), (10, 10), (1, 200), (0, 3), (35, 60)])
def test_bounded_strings_equal_reference(low, high):
    compiled, checked = _check(_record({"type": "string", "minLength": low, "maxLength": high}), seed=low * 1000 + high)
    assert checked > 100
    if high >= 40:  # long enough for runs of copies past the longest tokens
        assert compiled.masks.routes["chain"] > 0, compiled.masks.routes


@pytest.mark.parametrize(
    "string_schema",
    [
        {"anyOf": [{"type": "string", "maxLength": 4}, {"type": "string", "minLength": 2, "maxLength": 50}]},
        {"type": ["string", "null"], "maxLength": 45},
        {"type": "string", "maxLength": 60, "pattern": "^[a-z ]*$"},
        {"type": "string", "maxLength": 70, "pattern": "^[^@k]*$"},
    ],
)
def test_chains_in_unions_and_patterns_equal_reference(string_schema):
    _, checked = _check(_record(string_schema), seed=3)
    assert checked > 100


def test_tokens_longer_than_the_run_are_checked(monkeypatch):
    """With a run of 3 proved ahead, most tokens of the vocabulary are longer than it: they are
    checked from the state itself, not taken from the split."""
    monkeypatch.setattr(token_masks, "CHAIN_RUN", 3)
    monkeypatch.setattr(token_masks, "MAX_CHAIN_CHECKS", 10**6)
    compiled, checked = _check(_record({"type": "string", "minLength": 2, "maxLength": 30}), seed=11)
    assert checked > 100 and compiled.masks.routes["chain"] > 10, compiled.masks.routes


def test_chain_states_share_one_run():
    """Each character of a long string steps to the next state of one chain run: a state's mask
    after k characters is found in the run, not searched for again."""
    compiled = compile_json_schema(_record({"type": "string", "maxLength": 300}), VOCAB)
    m = GrammarMatcher(compiled)
    assert m.accept_bytes(b'{"a": "')
    masks = compiled.masks
    compiled.token_mask(m.state)
    found = masks.chain_of(m.state)
    assert found is not None and found[1] == 0
    chain = found[0]
    for k in range(1, 50):
        assert m.accept_bytes(b"x")
        np.testing.assert_array_equal(compiled.token_mask(m.state), REF.row(compiled.automaton, m.state))
        assert masks.chain_of(m.state) == (chain, k)


@settings(max_examples=12, deadline=None)
@given(
    low=st.integers(0, 50),
    span=st.integers(0, 80),
    nullable=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_random_bounds_equal_reference(low, span, nullable, seed):
    schema = {"type": ["string", "null"] if nullable else "string", "minLength": low, "maxLength": low + span}
    _check(_record(schema), seed, walks=4, steps=40)


def test_the_warm_up_grammar_reaches_the_chain_route():
    """``jit_warmup`` compiles the kernels the warm-up grammar's masks run: it must take this route
    too, or the first bounded string after an engine reports ready would wait for a JIT compile."""
    from grammar import TokenVocabulary
    from grammar.automaton import LazyAutomaton
    from grammar.token_masks import GrammarMasks, VocabularyMasks, warm_up_nfa
    from grammar.token_trie import TokenTrie

    vocab = TokenVocabulary.byte_level()
    shared = VocabularyMasks(vocab, TokenTrie.from_vocab(vocab))
    nfa = warm_up_nfa()
    automaton = LazyAutomaton(nfa)
    masks = GrammarMasks(automaton, shared, recursive=nfa.recursive, nested=True, cache_bytes=1 << 20)
    for prefix in (b"[(", b"[(a"):
        masks.compute(automaton.step_bytes(automaton.initial_state, prefix))
    assert masks.routes["chain"] == 2, masks.routes


def test_a_string_in_every_element_shares_its_top_frames(monkeypatch):
    """The same bounded string in each element of a counted array (each element under a stack of
    its own): from the third element on its states share the check of their leaving tokens on
    the top frames ("chain top"), and the masks still equal the reference at every byte."""
    # (In this vocabulary a token in ten holds a quote: allow that many tokens to reach the hole.)
    monkeypatch.setattr(token_masks, "MAX_UNCERTAIN_SHARE", 0.9)
    element = {"type": "object", "properties": {"s": {"type": "string", "minLength": 2, "maxLength": 50}, "n": {"type": "integer"}},
               "required": ["s"], "additionalProperties": False}
    compiled = compile_json_schema({"type": "array", "items": element, "maxItems": 6}, VOCAB)
    text = ('[{"s": "abcdefghijklmnop", "n": 1}, {"s": "abcdefghijklmnopqrstu"}, {"s": "abé日cdefghij"}, '
            '{"s": "xyz\\"z"}, {"s": "abcdefghijklmnopqrstuvwxyz"}]').encode()
    m = GrammarMatcher(compiled)
    for i in range(len(text)):
        np.testing.assert_array_equal(compiled.token_mask(m.state), REF.row(compiled.automaton, m.state), err_msg=repr(text[:i]))
        assert m.accept_bytes(text[i : i + 1]), text[: i + 1]
    assert compiled.masks.routes["chain top"] >= 10 and compiled.masks.routes["chain"] >= 40, compiled.masks.routes
