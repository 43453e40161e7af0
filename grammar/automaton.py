"""Lazy determinization of the byte NFA (with call edges) into numbered configurations.

The parser's stacks form a *graph-structured stack*: a node is an NFA state (the top frame)
over a set of parent nodes (the frames that may lie below it); the markers ``EMPTY_STACK`` (the
bottom) and ``HOLE_STACK`` (a truncated bottom) may stand among the parents. A *configuration* is
the set of nodes the parser may be in after some bytes, kept only at "kernel" nodes whose top can
consume a byte, and with at most one node per NFA state: nodes with the same top are merged by
uniting their parent sets. That merge keeps configurations small when one rule is called from
many places (a JSON string body called from every optional property of an object): the string
is read once, not once per caller. Configurations are interned to dense ids; their transition
rows (256 bytes -> id, -1 = dead) are computed on first use. For a regular grammar every node
sits on the bottom and this is lazy subset construction; for a recursive grammar, a pushdown
automaton explored on demand. Calls in tail position push no frame, so right recursion keeps
stacks flat. ``truncate`` cuts a deep configuration to its top frames over a HOLE, so nested
states can share one mask computation.

The data and the work live in ``determinizer.py`` (numba arrays and functions): the trie walk
computes the rows it reaches from inside its compiled kernel. An automaton made before the kernels
are compiled (a fresh install's first seconds) runs the determinizer's Python twin instead
(``kernel_tier``) for as long as it lives. This class is the Python face:
budgets become ``GrammarBudgetError``, and one lock serializes every change to the automaton.
The transition table and flags may be read without the lock: cells only ever go from UNEXPANDED
to computed, and the arrays are replaced (never shrunk) when they grow. Walks compute the cells
they need; whoever reads a whole row calls :meth:`LazyAutomaton.expand` first.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from . import determinizer as det
from . import kernel_tier
from .errors import GrammarBudgetError, GrammarError
from .fsm import ByteNFA

DEAD = det.DEAD
UNEXPANDED = det.UNEXPANDED
EMPTY_STACK = det.EMPTY_STACK
HOLE_STACK = det.HOLE_STACK

# The determinizer's entry points for compiled walks (``token_walk``, ``regions``): a kernel
# computes the cells it reaches on the ``core`` a LazyAutomaton hands it, while the caller holds
# that automaton's lock. Nothing else outside this module calls the determinizer.
expand_cell = det.expand_cell
expand_row = det.expand_row
row_shape = det.row_shape
static_core = det.static_core  # a complete table (a region's) in the same layout, never expanded


@dataclass(frozen=True)
class AutomatonBudget:
    max_states: int = 250_000
    max_stack_depth: int = 50_000
    max_stacks_per_state: int = 20_000


class LazyAutomaton:
    """Byte-level deterministic view of a :class:`ByteNFA`; ids are dense ints from 0."""

    def __init__(self, nfa: ByteNFA, budget: AutomatonBudget | None = None) -> None:
        self.nfa = nfa
        self.budget = budget or AutomatonBudget()
        self.lock = threading.RLock()
        arrays = nfa.arrays()
        # The determinizer's build (compiled, or its Python twin before the kernels are compiled:
        # kernel_tier) is chosen once: the core it makes is readable by that build only.
        self._det = kernel_tier.determinizer()
        self.core = self._det.new_core(
            arrays.e_ptr, arrays.e_lo, arrays.e_hi, arrays.e_dst, arrays.eps_ptr, arrays.eps_dst,
            arrays.call_ptr, arrays.call_callee, arrays.call_ret, arrays.final_rule, arrays.rule_start,
            arrays.tail_ret, arrays.has_edges,
            self.budget.max_states, self.budget.max_stack_depth, self.budget.max_stacks_per_state,
        )
        self._max_depth: dict[int, int] = {}
        with self.lock:
            self.initial_state = self.check_status(self._det.initial_config(self.core, int(nfa.root_rule)))
        if self.initial_state == DEAD:
            raise GrammarError("the grammar accepts no string at all (empty language)")

    @property
    def runs_python(self) -> bool:
        """Whether this automaton runs the determinizer's Python twin (``kernel_tier``)."""
        return kernel_tier.is_python(self.core)

    # ------------------------------------------------------------------ arrays
    def _views(self) -> tuple:
        return self._det.core_arrays(self.core)

    @property
    def table(self) -> np.ndarray:
        return self._det.core_table(self.core)

    @property
    def exits(self) -> np.ndarray:
        return self._det.core_flags(self.core)[0]

    @property
    def accepting(self) -> np.ndarray:
        return self._det.core_flags(self.core)[1]

    @property
    def num_states(self) -> int:
        return int(self._det.core_flags(self.core)[2])

    def check_status(self, status: int) -> int:
        if status >= DEAD:
            return int(status)
        if status == self._det.ERR_STATES:
            raise GrammarBudgetError(
                f"grammar automaton grew past {self.budget.max_states} states (raise CompileBudget.max_automaton_states)"
            )
        if status == self._det.ERR_DEPTH:
            raise GrammarBudgetError(f"grammar nesting deeper than {self.budget.max_stack_depth} levels")
        raise GrammarBudgetError("grammar is too ambiguous: too many parser stacks at one position")

    # ------------------------------------------------------------------ transitions
    def expand(self, state: int) -> None:
        """Compute the whole transition row of ``state`` (idempotent)."""
        if self._det.core_row_done(self.core)[state]:
            return
        with self.lock:
            self.check_status(self._det.expand_row(self.core, int(state)))

    def step(self, state: int, byte: int) -> int:
        self.expand(state)
        return int(self.table[state, byte])

    def step_bytes(self, state: int, data: bytes) -> int:
        with self.lock:
            return self.check_status(self._det.step_bytes(self.core, int(state), np.frombuffer(data, dtype=np.uint8)))

    def is_accepting(self, state: int) -> bool:
        return state >= 0 and bool(self.accepting[state])

    # ------------------------------------------------------------------ truncation
    def max_depth(self, state: int) -> int:
        """The deepest stack of ``state`` (1 for a regular grammar)."""
        depth = self._max_depth.get(state)
        if depth is None:
            with self.lock:
                depth = self._max_depth[state] = int(self._det.config_depth(self.core, int(state)))
        return depth

    def live_bytes(self, state: int) -> int:
        """How many bytes lead somewhere from ``state`` (its row computed if it was not)."""
        with self.lock:
            status, n = self._det.live_bytes(self.core, int(state))
        self.check_status(int(status))
        return int(n)

    def truncate(self, state: int, keep: int) -> int:
        """``state`` with every stack cut to its top ``keep`` frames over a HOLE bottom.

        Deeply nested configurations that agree on their top frames truncate to the same
        state, so its token mask is computed once and shared; a token that pops into the hole
        (its configuration has ``exits`` set) must then be checked against the real stack."""
        with self.lock:
            return self.check_status(self._det.truncate(self.core, int(state), keep))

    def truncate_over(self, state: int, parent: int) -> int:
        """``state`` with the stacks of the nodes whose one parent is stack node ``parent`` cut
        to two frames, every other stack to one, over a HOLE (a counted chain's top frames, see
        ``token_masks``)."""
        with self.lock:
            return self.check_status(self._det.truncate_over(self.core, int(state), int(parent)))

    def split(self, state: int) -> np.ndarray:
        """One configuration per stack node of ``state`` (int32): their languages unite into
        ``state``'s, so its mask is the union of theirs, and a node met in many configurations
        (a key inside every position of an object) has its part computed once."""
        with self.lock:
            parts, status = self._det.split_config(self.core, int(state))
        self.check_status(int(status))
        return parts

    def sibling_of(self, state: int, min_live: int, depth: int, max_pairs: int = 512) -> tuple[int, np.ndarray] | None:
        """(the state most of ``state``'s live bytes lead to, the bytes on which the two differ
        as :meth:`differing_bytes` finds them), or None for a state with fewer than ``min_live``
        live bytes, one that mostly loops, exit flags that differ, or rows that agree on fewer
        than half of its live bytes."""
        with self.lock:
            sibling, differ, status = self._det.sibling_of(self.core, int(state), min_live, depth, max_pairs)
        self.check_status(int(status))
        return None if sibling < 0 else (int(sibling), differ)

    def differing_bytes(self, state: int, other: int, depth: int, max_pairs: int = 512) -> np.ndarray:
        """Bytes on which ``state`` and ``other`` lead to states not shown to agree: equal, or
        both dead, on every byte string within ``depth`` bytes, through equal exit flags (at most
        ``max_pairs`` pairs of states examined; past that, the bytes count as differing)."""
        with self.lock:
            out, status = self._det.differing_bytes(self.core, int(state), int(other), depth, max_pairs)
        self.check_status(int(status))
        return out

    # ------------------------------------------------------------------ introspection
    def frame(self, nid: int) -> tuple[int, tuple[int, ...]]:
        """(NFA state, parent node ids and bottom markers) of stack node ``nid``."""
        return self.frame_reader()(nid)

    def frame_reader(self) -> Callable[[int], tuple[int, tuple[int, ...]]]:
        """``frame`` over one read of the core's arrays, for many nodes in a row (reading them
        costs a compiled call, several µs; a reader is stale once the automaton grows)."""
        views = self._views()
        node_q, node_ps, ps_start, ps_len, ps_pool = views[4], views[5], views[8], views[9], views[10]

        def frame(nid: int) -> tuple[int, tuple[int, ...]]:
            ps = node_ps[nid]
            start = ps_start[ps]
            return int(node_q[nid]), tuple(ps_pool[start : start + ps_len[ps]].tolist())

        return frame

    def config_size(self, state: int) -> int:
        """How many stack nodes configuration ``state`` holds."""
        with self.lock:
            return int(self._det.config_size(self.core, int(state)))

    def config_stacks(self, state: int) -> tuple[int, ...]:
        """The kernel node ids of configuration ``state``."""
        views = self._views()
        start = views[11][state]
        return tuple(views[13][start : start + views[12][state]].tolist())

    def stacks_of(self, state: int, limit: int = 1000) -> list[list[int]]:
        """Up to ``limit`` NFA-state stacks (top first) of a configuration, for debugging."""
        out: list[list[int]] = []
        todo = [(n, [self.frame(n)[0]]) for n in self.config_stacks(state)]
        while todo and len(out) < limit:
            n, frames = todo.pop()
            for p in self.frame(n)[1]:
                if p < 0:
                    out.append(frames)
                else:
                    todo.append((p, frames + [self.frame(p)[0]]))
        return out
