"""The per-state queries of the mask routes against plain Python references.

- ``regions.find_region``: the compiled search must find the same string-like region (states in
  the same order, the same canonical table, the same index) or none;
- ``LazyAutomaton.sibling_of``: the same sibling state and differing bytes, or none;

at every reachable state of automata full of free strings: JSON strings with escapes, keys
beside named keys, UTF-8 classes, counted strings, and text between delimiters. Rows are
computed in byte order and, in a second pass, a byte at a time from 0xFF down, so that state
ids come in an order unlike their bytes'.
"""

from __future__ import annotations

import numpy as np
import pytest

from grammar import ir
from grammar.automaton import LazyAutomaton
from grammar.ebnf import ebnf_to_grammar
from grammar.fsm import build_nfa
from grammar.regex import regex_to_ir
from grammar.regions import DEAD, EXIT, MAX_REGION, MIN_LOOP_BYTES, find_region
from grammar.token_masks import MIN_SIBLING_LIVE_BYTES, SIBLING_AGREE_DEPTH


def reference_region(automaton, state: int):
    """(states, canonical, index) of ``state``'s region, or None: the search written plainly."""

    def row(s: int) -> np.ndarray:
        automaton.expand(s)
        return automaton.table[s]

    def loops(s: int) -> int:
        return int(np.count_nonzero(row(s) == s))

    def region_from(home: int):
        states, index = [home], {home: 0}
        for i, s in enumerate(states):  # grows while iterating: breadth first
            span = row(s)[0x80:] if i == 0 else row(s)[0x80:0xC0]
            for t in sorted(set(span[span >= 0].tolist())):
                if t not in index:
                    if len(states) >= MAX_REGION:
                        return None
                    index[t] = len(states)
                    states.append(t)
        canonical = np.array([[DEAD if t < 0 else index.get(t, EXIT) for t in row(s).tolist()] for s in states], dtype=np.int32)
        return states, canonical

    if loops(state) >= MIN_LOOP_BYTES:
        found = region_from(state)
    else:
        live = np.flatnonzero(row(state) >= 0)
        if not len(live) or live.min() < 0x80 or live.max() >= 0xC0:
            return None
        home = state
        for _ in range(3):
            live = np.flatnonzero(row(home) >= 0)
            if not len(live) or live.min() < 0x80 or live.max() >= 0xC0:
                break
            home = int(row(home)[live[0]])
        else:
            return None
        found = region_from(home) if loops(home) >= MIN_LOOP_BYTES else None
    if found is None or state not in found[0]:
        return None
    return found[0], found[1], found[0].index(state)


def _reachable(automaton, limit: int, descending: bool) -> list[int]:
    """Reachable states, breadth first. ``descending``: each row is computed a byte at a time
    from 0xFF down, so states get their ids in an order unlike their bytes' order."""
    order, seen = [automaton.initial_state], {automaton.initial_state}
    for s in order:
        if descending:
            for b in range(255, -1, -1):
                automaton.step_bytes(s, bytes([b]))
        automaton.expand(s)
        for t in np.unique(automaton.table[s][automaton.table[s] >= 0]).tolist():
            if t not in seen and len(order) < limit:
                seen.add(t)
                order.append(t)
    return order


def _automaton(kind: str, source) -> LazyAutomaton:
    if kind == "regex":
        g = ir.Grammar({"root": regex_to_ir(source)})
    elif kind == "ebnf":
        g = ebnf_to_grammar(source)
    else:
        from grammar.json_schema import json_schema_to_grammar

        g = json_schema_to_grammar(source)
    return LazyAutomaton(build_nfa(g))


CASES = {
    "json object": ("json_schema", {"type": "object", "properties": {"name": {"type": "string"}, "tag": {"enum": ["a", "b"]}},
                                    "additionalProperties": {"type": "string", "maxLength": 5}}),
    "json array of strings": ("json_schema", {"type": "array", "items": {"type": "string", "pattern": "^[^<>]*é[^<>]*$"}}),
    "utf-8 text": ("regex", r"<[^<>]*>(é|日本|[\u0100-\uffff]{2,4}|😀)*[^\n]{0,8}"),
    "quoted lines": ("ebnf", 'root ::= line+\nline ::= "\\"" [^"\\\\\\n]* "\\"" "\\n" | "#" [^\\n]* "\\n"'),
}


@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("case", list(CASES))
def test_compiled_region_search_equals_reference(case, descending):
    automaton = _automaton(*CASES[case])
    states = _reachable(automaton, 400, descending)
    found = middle = 0
    for state in states:
        want = reference_region(automaton, state)
        got = find_region(automaton, state)
        if want is None:
            assert got is None, state
            continue
        found += 1
        middle += want[2] > 0
        assert got is not None, state
        assert got.states.tolist() == want[0], state
        assert np.array_equal(got.canonical, want[1]), state
        assert got.index == want[2], state
    assert found >= 2 and middle >= 1, f"{case}: {found} of {len(states)} states in a region, {middle} mid-character"


def reference_sibling(automaton, state: int, min_live: int, depth: int):
    """(sibling, differing bytes) or None: the sibling search written plainly."""
    automaton.expand(state)
    row = automaton.table[state].copy()
    live = row[row >= 0]
    if len(live) < min_live:
        return None
    targets, counts = np.unique(live, return_counts=True)
    sibling = int(targets[np.argmax(counts)])
    exits = automaton.exits
    if sibling == state or exits[sibling] != exits[state]:
        return None
    automaton.expand(sibling)
    if 2 * int(np.count_nonzero(automaton.table[sibling] == row)) < len(live):
        return None
    return sibling, automaton.differing_bytes(state, sibling, depth)


@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("case", list(CASES))
def test_compiled_sibling_search_equals_reference(case, descending):
    automaton = _automaton(*CASES[case])
    found = 0
    for state in _reachable(automaton, 400, descending):
        want = reference_sibling(automaton, state, MIN_SIBLING_LIVE_BYTES, SIBLING_AGREE_DEPTH)
        got = automaton.sibling_of(state, MIN_SIBLING_LIVE_BYTES, SIBLING_AGREE_DEPTH)
        if want is None:
            assert got is None, state
            continue
        found += 1
        assert got is not None and got[0] == want[0], state
        assert got[1].tolist() == want[1].tolist(), state
    assert found >= 1, f"{case}: no state has a sibling"


NESTED = ir.Grammar({"root": ir.choice(
    ir.literal(""),
    ir.seq(ir.literal("("), ir.Ref("root"), ir.literal(")"), ir.Ref("root")),
    ir.seq(ir.literal("["), ir.Ref("root"), ir.literal("]"), ir.Ref("root")),
    ir.seq(ir.literal('"'), ir.star(ir.char_class([(0x20, 0x21), (0x23, 0x10FFFF)])), ir.literal('"')),
)})


def test_depth_size_and_live_bytes_of_configurations():
    """A configuration's depth is its longest stack, its size its number of stack nodes, and
    its live bytes those its row leads somewhere on (stacks enumerated in Python)."""
    automaton = LazyAutomaton(build_nfa(NESTED))
    deepest = 0
    for prefix in ["", "(", "([[", "([[]", "([[])", '[("', '[("ab', "(" * 12, "([" * 6 + '"']:
        state = automaton.step_bytes(automaton.initial_state, prefix.encode())
        stacks = automaton.stacks_of(state)
        assert automaton.max_depth(state) == max(map(len, stacks), default=0), prefix
        assert automaton.config_size(state) == len(automaton.config_stacks(state)), prefix
        automaton.expand(state)
        assert automaton.live_bytes(state) == int(np.count_nonzero(automaton.table[state] >= 0)), prefix
        deepest = max(deepest, automaton.max_depth(state))
    assert deepest >= 13
