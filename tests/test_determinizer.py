"""The compiled determinizer's bookkeeping: interning stays exact while its hash maps double
(entries move over later inserts), and the transition table reserves its rows without a copy
per growth, initializing each row when its configuration appears.

The oracles are counts known in closed form: subset construction of ``[ab]*a[ab]{k}`` reaches
exactly 2^(k+1) subsets, and a bracket grammar reaches one configuration per stack of open
brackets. A lookup that missed an entry still waiting in the old table would intern a duplicate
and break either count.
"""

from __future__ import annotations

import itertools
import random

from grammar import ir
from grammar import determinizer as det
from grammar.automaton import DEAD, UNEXPANDED, AutomatonBudget, LazyAutomaton
from grammar.fsm import build_nfa
from grammar.regex import regex_to_ir

BRACKETS = ir.Grammar({"root": ir.choice(
    ir.literal(""),
    ir.seq(ir.literal("("), ir.Ref("root"), ir.literal(")"), ir.Ref("root")),
    ir.seq(ir.literal("["), ir.Ref("root"), ir.literal("]"), ir.Ref("root")),
)})


def _reachable(automaton: LazyAutomaton, alphabet: bytes) -> set[int]:
    seen, todo = {automaton.initial_state}, [automaton.initial_state]
    while todo:
        state = todo.pop()
        for byte in alphabet:
            nxt = automaton.step(state, byte)
            if nxt >= 0 and nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_subset_construction_count_survives_map_growth():
    k = 12
    automaton = LazyAutomaton(build_nfa(ir.Grammar({"root": regex_to_ir(f"[ab]*a[ab]{{{k}}}")})))
    states = _reachable(automaton, b"ab")
    assert len(states) == automaton.num_states == 2 ** (k + 1)
    # The state depends only on the last k+1 bytes, whatever came before (and whenever it was interned).
    rng = random.Random(0)
    for _ in range(200):
        tail = bytes(rng.choice(b"ab") for _ in range(k + 1))
        heads = [bytes(rng.choice(b"ab") for _ in range(rng.randrange(0, 30))) for _ in range(2)]
        ends = {automaton.step_bytes(automaton.initial_state, head + tail) for head in heads}
        assert len(ends) == 1
    assert automaton.num_states == 2 ** (k + 1)


def test_stack_nodes_and_parent_sets_intern_exactly_while_their_maps_grow():
    automaton = LazyAutomaton(build_nfa(BRACKETS))
    depth = 13
    for opens in itertools.product(b"([", repeat=depth):
        assert automaton.step_bytes(automaton.initial_state, bytes(opens)) >= 0
    # One configuration per stack of open brackets, from the empty one to `depth` deep.
    assert automaton.num_states == 2 ** (depth + 1) - 1
    nodes = int(automaton._views()[7])
    assert nodes > 4 * 4096  # the node map doubled several times during the sweep
    rng = random.Random(1)
    for _ in range(200):
        opens = bytes(rng.choice(b"([") for _ in range(rng.randrange(1, depth + 1)))
        balanced = [b"()[()]", b"[]", b"([[]])()", b""]
        ends = {automaton.step_bytes(automaton.initial_state, prefix + opens) for prefix in balanced}
        assert len(ends) == 1
    assert automaton.num_states == 2 ** (depth + 1) - 1


def test_table_reserves_its_budget_once_and_initializes_rows_as_they_appear():
    automaton = LazyAutomaton(build_nfa(BRACKETS), AutomatonBudget(max_states=100_000))
    for opens in itertools.product(b"([", repeat=12):
        automaton.step_bytes(automaton.initial_state, bytes(opens))
    n = automaton.num_states
    assert n > det.TABLE_RESERVE_FROM
    table = automaton.table
    assert table.shape == (min(100_000, det.TABLE_RESERVE_ROWS), 256)
    rows = table[:n]
    assert ((rows == UNEXPANDED) | ((rows >= DEAD) & (rows < n))).all()


def test_cells_computed_by_walks_agree_with_whole_rows():
    """Walks compute a row a segment at a time; completing the row later keeps those cells,
    and the states they lead to are the ones whole rows would have interned."""
    automaton = LazyAutomaton(build_nfa(BRACKETS))
    for opens in itertools.product(b"([", repeat=6):
        automaton.step_bytes(automaton.initial_state, bytes(opens) + b")]")
    n = automaton.num_states
    done = det.core_row_done(automaton.core)[:n].copy()
    before = automaton.table[:n].copy()
    partial = ~done & (before != UNEXPANDED).any(axis=1)
    assert partial.any()  # the walk left rows with only the segments it needed
    assert not (before[done] == UNEXPANDED).any()
    for state in range(n):
        automaton.expand(state)
    after = automaton.table[:n]
    computed = before != UNEXPANDED
    assert (after[computed] == before[computed]).all()
    assert not (after == UNEXPANDED).any()
    # Cells first, whole rows after: one configuration per subset all the same.
    k = 8
    regex = LazyAutomaton(build_nfa(ir.Grammar({"root": regex_to_ir(f"[ab]*a[ab]{{{k}}}")})))
    rng = random.Random(2)
    for _ in range(100):
        regex.step_bytes(regex.initial_state, bytes(rng.choice(b"ab") for _ in range(rng.randrange(1, 20))))
    assert len(_reachable(regex, b"ab")) == regex.num_states == 2 ** (k + 1)


def test_run_sort_and_unique_match_numpy_on_both_sides_of_the_insertion_limit():
    import numpy as np

    rng = random.Random(7)
    for dtype in (np.int32, np.int64):
        for n in (0, 1, 2, det.INSERTION_SORT_MAX - 1, det.INSERTION_SORT_MAX, det.INSERTION_SORT_MAX + 1, 200):
            values = [rng.randrange(-3, 40) for _ in range(n)]
            tail = [999, 998]  # past n: must stay where they are
            buf = np.array(values + tail, dtype=dtype)
            det._sort_run(buf, np.int64(n))
            assert buf.tolist() == sorted(values) + tail
            buf = np.array(values + tail, dtype=dtype)
            k = det._sort_unique(buf, np.int64(n))
            assert buf[:k].tolist() == sorted(set(values))
