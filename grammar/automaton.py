"""Lazy determinization of the byte NFA (with call edges) into numbered configurations.

A *stack* is an NFA state plus the stack of return states below it, interned as
``(state, parent_stack_id)`` so stacks share their tails and deep nesting costs no recursion.
A *configuration* is the set of stacks the parser may be in after some bytes (several at once
when the grammar is ambiguous), kept only at "kernel" stacks whose top can consume a byte.
Configurations are interned to dense ids; their transition rows (256 bytes -> id, -1 = dead)
are computed on first use. For a regular grammar every stack has depth one and this is exactly
lazy subset construction; for a recursive grammar it is a pushdown automaton explored on demand.

Closures come from per-NFA-state local fragments (what a state pushes without consuming a byte),
so only pops walk down a stack; calls in tail position push nothing. ``truncate`` cuts a deep
configuration to its top frames over a HOLE, so nested states can share one mask computation.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from .errors import GrammarBudgetError
from .fsm import ByteNFA

DEAD = -1
UNEXPANDED = -2
EMPTY_STACK = -1
# Bottom of a *truncated* stack: what lies below is unknown. Popping into it sets the
# configuration's ``exits`` flag instead of ``accepting`` (see ``truncate``).
HOLE_STACK = -3


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
        self._init_byte_classes()
        self._stacks: list[tuple[int, int]] = []
        self._stack_depth: list[int] = []
        self._stack_ids: dict[tuple[int, int], int] = {}
        self._closure_memo: dict[int, tuple[frozenset[int], bool, bool]] = {}
        self._local_memo: dict[int, tuple[list[tuple[int, ...]], bool]] = {}
        self._configs: list[frozenset[int]] = []
        self._config_ids: dict[tuple[frozenset[int], bool, bool], int] = {}
        self._max_depth: dict[int, int] = {}
        cap = 64
        self.table = np.full((cap, 256), UNEXPANDED, dtype=np.int32)
        self.accepting = np.zeros(cap, dtype=bool)
        self.exits = np.zeros(cap, dtype=bool)
        self.expanded = np.zeros(cap, dtype=bool)
        # (table, exits) as one object, replaced whole when the arrays grow: a walk running
        # without the lock reads both from the same generation.
        self._arrays = (self.table, self.exits)
        root = self._intern_stack(nfa.rule_start[nfa.root_rule], EMPTY_STACK)
        self.initial_state = self._config_for([root])
        if self.initial_state == DEAD:
            from .errors import GrammarError

            raise GrammarError("the grammar accepts no string at all (empty language)")

    # ------------------------------------------------------------------ setup
    def _init_byte_classes(self) -> None:
        bounds = np.zeros(257, dtype=bool)
        bounds[0] = bounds[256] = True
        for edges in self.nfa.byte_edges:
            for lo, hi, _ in edges:
                bounds[lo] = bounds[hi + 1] = True
        cuts = np.flatnonzero(bounds)
        self.byte_class = (np.cumsum(bounds[:256]) - 1).astype(np.int32)
        self.num_classes = len(cuts) - 1
        # moves[q] (byte class -> targets) is built on first use: most NFA states of a big
        # grammar are never reached by a given request.
        self._moves: list[dict[int, list[int]] | None | bool] = [False] * self.nfa.num_states

    def _moves_of(self, q: int) -> dict[int, list[int]] | None:
        m = self._moves[q]
        if m is False:
            edges = self.nfa.byte_edges[q]
            if not edges:
                m = None
            else:
                cls = self.byte_class
                m = {}
                for lo, hi, target in edges:
                    for c in range(int(cls[lo]), int(cls[hi]) + 1):
                        m.setdefault(c, []).append(target)
            self._moves[q] = m
        return m  # type: ignore[return-value]

    # ------------------------------------------------------------------ interning
    def _intern_stack(self, state: int, parent: int) -> int:
        key = (state, parent)
        sid = self._stack_ids.get(key)
        if sid is None:
            depth = 1 if parent < 0 else self._stack_depth[parent] + 1
            if depth > self.budget.max_stack_depth:
                raise GrammarBudgetError(f"grammar nesting deeper than {self.budget.max_stack_depth} levels")
            sid = len(self._stacks)
            self._stacks.append(key)
            self._stack_depth.append(depth)
            self._stack_ids[key] = sid
        return sid

    def _closure(self, sid: int) -> tuple[frozenset[int], bool, bool]:
        """Kernel stacks reachable from stack ``sid`` without consuming a byte, and whether the
        whole input may end here. Built from per-NFA-state local closures: what lies above the
        parent stack is the same wherever a state occurs, so only the pops walk down the stack."""
        memo = self._closure_memo.get(sid)
        if memo is not None:
            return memo
        kernel: set[int] = set()
        accepting = exits = False
        cur = sid
        while True:
            q, parent = self._stacks[cur]
            fragments, pops = self._local_closure(q)
            for fragment in fragments:
                top = parent
                for x in reversed(fragment):
                    top = self._intern_stack(x, top)
                kernel.add(top)
            if not pops:
                break
            if parent == EMPTY_STACK:
                accepting = True
                break
            if parent == HOLE_STACK:
                exits = True
                break
            below = self._closure_memo.get(parent)
            if below is not None:
                kernel |= below[0]
                accepting |= below[1]
                exits |= below[2]
                break
            cur = parent
        result = (frozenset(kernel), accepting, exits)
        self._closure_memo[sid] = result
        return result

    def _local_closure(self, q: int) -> tuple[list[tuple[int, ...]], bool]:
        """Stack fragments (top first) that ``q`` reaches without consuming a byte and without
        popping its own frame, whose top can consume a byte; and whether ``q``'s frame can pop."""
        memo = self._local_memo.get(q)
        if memo is not None:
            return memo
        nfa, moves_of = self.nfa, self._moves_of
        start = (q,)
        seen = {start}
        todo = [start]
        kernel: list[tuple[int, ...]] = []
        pops = False
        while todo:
            frag = todo.pop()
            x = frag[0]
            if moves_of(x) is not None:
                kernel.append(frag)
            rest = frag[1:]
            nxt = [(t,) + rest for t in nfa.eps[x]]
            for callee, ret in nfa.calls[x]:
                # A call in tail position returns straight to the caller's caller: no frame, so
                # right recursion (`list ::= item list?`) keeps the stack flat.
                if self._is_tail_return(ret):
                    nxt.append((nfa.rule_start[callee],) + rest)
                else:
                    nxt.append((nfa.rule_start[callee], ret) + rest)
            if nfa.final_rule[x] >= 0:
                if rest:
                    nxt.append(rest)
                else:
                    pops = True
            for y in nxt:
                if y not in seen:
                    seen.add(y)
                    todo.append(y)
            if len(seen) > self.budget.max_stacks_per_state:
                raise GrammarBudgetError("grammar is too ambiguous: too many parser stacks at one position")
        result = (kernel, pops)
        self._local_memo[q] = result
        return result

    def _is_tail_return(self, ret: int) -> bool:
        nfa = self.nfa
        return nfa.final_rule[ret] >= 0 and not nfa.eps[ret] and not nfa.byte_edges[ret] and not nfa.calls[ret]

    def _config_for(self, seeds) -> int:
        kernel: set[int] = set()
        accepting = exits = False
        for sid in seeds:
            k, a, e = self._closure(sid)
            kernel |= k
            accepting |= a
            exits |= e
        if not kernel and not accepting and not exits:
            return DEAD
        return self._intern_config(frozenset(kernel), accepting, exits)

    def _intern_config(self, kernel: frozenset[int], accepting: bool, exits: bool) -> int:
        key = (kernel, accepting, exits)
        cid = self._config_ids.get(key)
        if cid is not None:
            return cid
        cid = len(self._configs)
        if cid >= self.budget.max_states:
            raise GrammarBudgetError(
                f"grammar automaton grew past {self.budget.max_states} states (raise CompileBudget.max_automaton_states)"
            )
        if cid >= self.table.shape[0]:
            self._grow()
        self._configs.append(kernel)
        self._config_ids[key] = cid
        self.accepting[cid] = accepting
        self.exits[cid] = exits
        return cid

    # ------------------------------------------------------------------ truncation
    def max_depth(self, state: int) -> int:
        """The deepest stack of ``state`` (1 for a regular grammar)."""
        depth = self._max_depth.get(state)
        if depth is None:
            depth = self._max_depth[state] = max((self._stack_depth[s] for s in self._configs[state]), default=0)
        return depth

    def truncate(self, state: int, keep: int) -> int:
        """``state`` with every stack cut to its top ``keep`` frames over a HOLE bottom.

        Deeply nested configurations that agree on their top frames truncate to the same
        state, so its token mask is computed once and shared; a token that pops into the hole
        (its configuration has ``exits`` set) must then be checked against the real stack."""
        with self.lock:
            stacks = set()
            for sid in self._configs[state]:
                frames = []
                x = sid
                while x >= 0 and len(frames) < keep:
                    q, x = self._stacks[x]
                    frames.append(q)
                if x < 0:
                    stacks.add(sid)
                    continue
                top = HOLE_STACK
                for q in reversed(frames):
                    top = self._intern_stack(q, top)
                stacks.add(top)
            return self._intern_config(frozenset(stacks), False, False)

    def _grow(self) -> None:
        cap = self.table.shape[0] * 2
        table = np.full((cap, 256), UNEXPANDED, dtype=np.int32)
        table[: self.table.shape[0]] = self.table
        self.table = table
        self.accepting = np.concatenate([self.accepting, np.zeros(cap - len(self.accepting), dtype=bool)])
        self.exits = np.concatenate([self.exits, np.zeros(cap - len(self.exits), dtype=bool)])
        self.expanded = np.concatenate([self.expanded, np.zeros(cap - len(self.expanded), dtype=bool)])
        self._arrays = (self.table, self.exits)

    # ------------------------------------------------------------------ transitions
    @property
    def num_states(self) -> int:
        return len(self._configs)

    def transition_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(table, exits) of one generation, for walks that read them without the lock. Rows
        not expanded yet hold UNEXPANDED; a row is complete before ``expanded`` says so."""
        return self._arrays

    def expand(self, state: int) -> None:
        """Compute the full transition row of ``state`` (idempotent)."""
        if self.expanded[state]:
            return
        with self.lock:
            if self.expanded[state]:
                return
            buckets: dict[int, list[int]] = {}
            for sid in self._configs[state]:
                q, parent = self._stacks[sid]
                for c, targets in self._moves_of(q).items():  # type: ignore[union-attr]
                    bucket = buckets.setdefault(c, [])
                    bucket.extend(self._intern_stack(t, parent) for t in targets)
            # Many byte classes lead to the same stacks (string bodies): resolve each set once.
            by_seeds: dict[frozenset[int], int] = {}
            row = np.full(self.num_classes, DEAD, dtype=np.int32)
            for c, seeds in buckets.items():
                key = frozenset(seeds)
                target = by_seeds.get(key)
                if target is None:
                    target = by_seeds[key] = self._config_for(key)
                row[c] = target
            self.table[state] = row[self.byte_class]
            self.expanded[state] = True

    def expand_many(self, states: np.ndarray) -> None:
        todo = states[~self.expanded[states]]
        for s in np.unique(todo).tolist():
            self.expand(s)

    def step(self, state: int, byte: int) -> int:
        if not self.expanded[state]:
            self.expand(state)
        return int(self.table[state, byte])

    def step_bytes(self, state: int, data: bytes) -> int:
        for byte in data:
            if state < 0:
                return DEAD
            state = self.step(state, byte)
        return state

    def is_accepting(self, state: int) -> bool:
        return state >= 0 and bool(self.accepting[state])

    # ------------------------------------------------------------------ introspection
    def frame(self, sid: int) -> tuple[int, int]:
        """(NFA state, parent stack id) of the interned stack ``sid``."""
        return self._stacks[sid]

    def config_stacks(self, state: int) -> frozenset[int]:
        """The kernel stack ids of configuration ``state``."""
        return self._configs[state]

    def stacks_of(self, state: int) -> list[list[int]]:
        """The NFA-state stacks (top first) of a configuration, for debugging and tests."""
        out = []
        for sid in self._configs[state]:
            frames = []
            while sid >= 0:
                q, sid = self._stacks[sid]
                frames.append(q)
            out.append(frames)
        return out
