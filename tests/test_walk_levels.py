"""``token_walk.walk_levels`` (the trie walk as numpy operations, issue 25) against the compiled
``_walk_kernel``: every walk a real workload makes (mask routes, regions, deep and truncated
configurations, the three modes) is repeated with ``walk_levels`` on the same core and must give
the same tokens, end states and exit ranges; on a fresh automaton, where ``walk_levels`` computes
the cells itself (level by level), the masks along a generation equal the compiled path's."""

from __future__ import annotations

import numpy as np
import pytest

from grammar import token_walk
from grammar.automaton import LazyAutomaton
from grammar.fsm import build_nfa
from grammar.json_schema import json_schema_to_grammar
from grammar.token_masks import GrammarMasks, VocabularyMasks, warm_up_masks
from grammar.token_trie import TokenTrie

DEMO = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 40},
                                         "born": {"type": "integer", "minimum": 1000, "maximum": 2025},
                                         "fields": {"type": "array", "items": {"type": "string", "maxLength": 30}, "maxItems": 3}},
        "required": ["name", "born", "fields"], "additionalProperties": False}
TEXT = b'{"name": "Marie Curie", "born": 1867, "fields": ["Physics", "Chemistry"]}'
NESTED = {"type": "array", "items": {"$ref": "#"}, "maxItems": 2}


@pytest.fixture(scope="module")
def shared(smollm2_vocab):
    return VocabularyMasks(smollm2_vocab, TokenTrie.from_vocab(smollm2_vocab))


def _automaton(schema) -> LazyAutomaton:
    return LazyAutomaton(build_nfa(json_schema_to_grammar(schema)))


def test_every_walk_of_a_workload_equals_the_kernels(shared, monkeypatch):
    compiled = token_walk._walk_kernel
    seen = {"walks": 0, "modes": set(), "ranges": 0}

    def both(core, words, first_pos, begin, end, mode, state_at, tainted, bits, ends, want_ends, ranges, io):
        fresh = io[1] == begin
        bits_before, ends_before, start = bits.copy(), ends.copy(), int(state_at[0])
        compiled(core, words, first_pos, begin, end, mode, state_at, tainted, bits, ends, want_ends, ranges, io)
        if not fresh or io[0] != 0:  # a resumed or interrupted walk: compared only when whole
            return
        mine_ends = ends_before
        # The kernel's bits follow one spare word (token t is bit t + 32); walk_levels' do not.
        status, mine_ranges = token_walk.walk_levels(core, words, first_pos, begin, end, mode, start, bits_before[1:],
                                                     mine_ends, want_ends)
        assert status == 0
        np.testing.assert_array_equal(bits_before[1:], bits[1:])
        if want_ends:
            np.testing.assert_array_equal(mine_ends, ends)
        np.testing.assert_array_equal(mine_ranges, ranges[: int(io[2])] if mode != token_walk.PLAIN else mine_ranges)
        if len(mine_ranges):  # the kernel-shaped wrapper: too little room, then enough
            room = np.empty((len(mine_ranges) - 1, 4), dtype=np.int32)
            shim_io = np.zeros(3, dtype=np.int64)
            token_walk.walk_levels_kernel(core, words, first_pos, begin, end, mode, state_at, tainted, bits.copy(),
                                          ends.copy(), want_ends, room, shim_io)
            assert shim_io[0] == token_walk._GROW and shim_io[1] == begin
            np.testing.assert_array_equal(room, mine_ranges[: len(room)])
            room = np.empty((len(mine_ranges), 4), dtype=np.int32)
            token_walk.walk_levels_kernel(core, words, first_pos, begin, end, mode, state_at, tainted, bits.copy(),
                                          ends.copy(), want_ends, room, shim_io)
            assert list(shim_io) == [token_walk._DONE, end, len(mine_ranges)]
            np.testing.assert_array_equal(room, mine_ranges)
        seen["walks"] += 1
        seen["modes"].add(int(mode))
        seen["ranges"] += len(mine_ranges)

    monkeypatch.setattr(token_walk, "_walk_kernel", both)
    warm_up_masks(shared)  # every mask route of a recursive grammar with a string region
    for schema, text in ((DEMO, TEXT), (NESTED, b"[[[],[[]]],[]]")):
        automaton = _automaton(schema)
        masks = GrammarMasks(automaton, shared, recursive=automaton.nfa.recursive,
                             nested=True, cache_bytes=1 << 20)
        state = automaton.initial_state
        for k in range(len(text) + 1):
            masks.compute(state)
            if k < len(text):
                state = automaton.step_bytes(state, text[k:k + 1])
    assert seen["walks"] >= 10 and seen["modes"] == {token_walk.PLAIN, token_walk.STOP_AT_EXITS, token_walk.DEAD_AFTER_EXITS}
    assert seen["ranges"] > 0


def test_fresh_automaton_masks_equal_the_compiled_walks(shared):
    """``walk_levels`` expanding the cells itself: the masks along the demo's output equal the
    compiled walk's on an automaton of its own (state numbers may differ, masks may not)."""
    trie = shared.trie
    mine, theirs = _automaton(DEMO), _automaton(DEMO)
    a, b = mine.initial_state, theirs.initial_state
    for k in range(len(TEXT) + 1):
        bits = np.zeros(trie.width, dtype=np.uint32)
        ends = np.full(trie.vocab_size, -1, dtype=np.int32)
        with mine.lock:
            status, _ = token_walk.walk_levels(mine.core, trie.words, trie.first_pos, 0, len(trie.words), token_walk.PLAIN,
                                               a, bits, ends, True)
        assert status == 0
        walk = token_walk.walk_trie(trie, theirs, b, end_states=True)
        token_walk.add_duplicates(trie, bits, ends)
        np.testing.assert_array_equal(bits, walk.bits)
        np.testing.assert_array_equal(ends >= 0, walk.end_states >= 0)
        if k < len(TEXT):
            a, b = mine.step_bytes(a, TEXT[k:k + 1]), theirs.step_bytes(b, TEXT[k:k + 1])
