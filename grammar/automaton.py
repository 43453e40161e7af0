"""Lazy determinization of the byte NFA (with call edges) into numbered configurations.

The parser's stacks form a *graph-structured stack*: a node is an NFA state (the top frame)
over a set of parent nodes (the frames that may lie below it), interned as ``(state,
parent_set)``; the markers ``EMPTY_STACK`` (the bottom) and ``HOLE_STACK`` (a truncated bottom)
may stand among the parents. A *configuration* is the set of nodes the parser may be in after
some bytes, kept only at "kernel" nodes whose top can consume a byte, and with at most one node
per NFA state: nodes with the same top are merged by uniting their parent sets. That merge is
what keeps configurations small when one rule is called from many places (a JSON string body
called from every optional property of an object, say): the string is read once, not once per
caller. Configurations are interned to dense ids; their transition rows (256 bytes -> id,
-1 = dead) are computed on first use. For a regular grammar every node sits on the bottom and
this is lazy subset construction; for a recursive grammar, a pushdown automaton explored on
demand.

Closures come from per-NFA-state local fragments (what a state pushes without consuming a byte),
so only pops walk down the graph; calls in tail position push nothing. A transition row is
computed per *block* of byte classes on which every node of the configuration moves alike, so a
string body's hundred bytes cost one closure, not a hundred. ``truncate`` cuts a deep
configuration to its top frames over a HOLE, so nested states can share one mask computation.

Everything that changes the automaton happens under its lock; the transition table and flags
are also read without it (``transition_arrays``), by walks that may run in other threads.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from .errors import GrammarBudgetError, GrammarError
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


# A closure: (kernel nodes reachable without consuming a byte (sorted), whether the input may end
# there (accepting), whether a pop reached a truncation hole (exits)). A plain tuple, not a
# NamedTuple: there is one per stack node, and plain tuples of untracked items leave the garbage
# collector's tracking while NamedTuple instances never do.
Closure = tuple[tuple[int, ...], bool, bool]


# Per-NFA-state moves and per-configuration row layouts are plain tuples of ints, tuples and
# arrays, for the same reason as closures: there are thousands of them per grammar, and plain
# tuples leave the garbage collector's tracking (a full collection walks every tracked object of
# the process; the fewer long-lived tracked objects a mask leaves behind, the rarer those stalls).
#
# Moves of an NFA state: (moves, targets, pattern). On byte class c it moves to targets[g] for
# each (c, g) in ``moves`` (sparse: most states move on one class); states with equal ``moves``
# share the ``pattern`` id.
MoveGroups = tuple[tuple[tuple[int, int], ...], tuple[tuple[int, ...], ...], int]
_MOVES, _TARGETS, _PATTERN = range(3)
# Layout of a configuration's row: (block_of, moves, bytes_of, dead). A *block* is a set of
# bytes on which the same nodes move by the same groups: block_of[byte] is its block (-1: no
# node moves), moves[k] the (index of a moving node, its group) pairs of block k, bytes_of[k]
# its bytes, dead the bytes on which nothing moves. It depends only on the nodes' move
# patterns, so configurations whose tops move alike (each step of a counted repetition) share it.
RowLayout = tuple[tuple[int, ...], tuple[tuple[tuple[int, int], ...], ...], tuple[np.ndarray, ...], np.ndarray]


class LazyAutomaton:
    """Byte-level deterministic view of a :class:`ByteNFA`; ids are dense ints from 0."""

    def __init__(self, nfa: ByteNFA, budget: AutomatonBudget | None = None) -> None:
        self.nfa = nfa
        self.budget = budget or AutomatonBudget()
        self.lock = threading.RLock()
        self._init_byte_classes()
        # Graph-structured stack: node id -> (NFA state, parent set id); parent set id -> parents.
        # Sets of ids are sorted tuples throughout: tuples of ints drop out of the garbage
        # collector's tracking, frozensets never do, and a full collection walking every
        # frozenset of every cached automaton stalled masks for 100-200 ms.
        self._nodes: list[tuple[int, int]] = []
        self._node_depth: list[int] = []
        self._node_ids: dict[tuple[int, int], int] = {}
        self._parent_sets: list[tuple[int, ...]] = []
        self._parent_set_ids: dict[tuple[int, ...], int] = {}
        self._parent_set_depth: list[int] = []  # the deepest member's depth
        self._closures: dict[int, Closure] = {}
        self._local_memo: dict[int, tuple[list[tuple[int, ...]], bool]] = {}
        self._groups: list[MoveGroups | None] = [None] * nfa.num_states
        self._configs: list[tuple[int, ...]] = []  # kernel node ids, sorted
        self._config_ids: dict[tuple[tuple[int, ...], bool, bool], int] = {}
        self._node_steps: dict[tuple[int, int], Closure] = {}  # (node, group) -> closure after
        self._step_configs: dict[tuple[tuple[int, int], ...], int] = {}  # moving (node, group) pairs -> config
        self._patterns: dict[tuple[tuple[int, int], ...], int] = {}  # moves -> pattern id
        self._layouts: dict[tuple[int, ...], RowLayout] = {}  # the nodes' move patterns -> row layout
        self._config_layouts: list[RowLayout | None] = []
        self._max_depth: dict[int, int] = {}
        cap = 64
        self.table = np.full((cap, 256), UNEXPANDED, dtype=np.int32)
        self.accepting = np.zeros(cap, dtype=bool)
        self.exits = np.zeros(cap, dtype=bool)
        self.expanded = np.zeros(cap, dtype=bool)
        # (table, exits) as one object, replaced whole when the arrays grow: a walk running
        # without the lock reads both from the same generation.
        self._arrays = (self.table, self.exits)
        with self.lock:
            root = self._node(nfa.rule_start[nfa.root_rule], self._parent_set((EMPTY_STACK,)))
            self.initial_state = self._config_for([root])
        if self.initial_state == DEAD:
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

    def _move_groups(self, q: int) -> MoveGroups:
        """Moves of NFA state ``q`` grouped by target set, built on first use: most NFA states of
        a big grammar are never reached by a given request."""
        groups = self._groups[q]
        if groups is None:
            by_class: dict[int, list[int]] = {}
            cls = self.byte_class
            for lo, hi, target in self.nfa.byte_edges[q]:
                for c in range(int(cls[lo]), int(cls[hi]) + 1):
                    by_class.setdefault(c, []).append(target)
            index: dict[tuple[int, ...], int] = {}
            moves = tuple((c, index.setdefault(tuple(sorted(set(ts))), len(index))) for c, ts in sorted(by_class.items()))
            pattern = self._patterns.setdefault(moves, len(self._patterns))
            groups = self._groups[q] = (moves, tuple(index), pattern)
        return groups

    # ------------------------------------------------------------------ interning
    def _parent_set(self, parents: tuple[int, ...]) -> int:
        """Id of the parent set ``parents`` (a sorted tuple)."""
        pid = self._parent_set_ids.get(parents)
        if pid is None:
            pid = self._parent_set_ids[parents] = len(self._parent_sets)
            self._parent_sets.append(parents)
            self._parent_set_depth.append(max([self._node_depth[p] for p in parents if p >= 0], default=0))
        return pid

    def _node(self, state: int, pid: int) -> int:
        key = (state, pid)
        nid = self._node_ids.get(key)
        if nid is None:
            depth = 1 + self._parent_set_depth[pid]
            if depth > self.budget.max_stack_depth:
                raise GrammarBudgetError(f"grammar nesting deeper than {self.budget.max_stack_depth} levels")
            nid = self._node_ids[key] = len(self._nodes)
            self._nodes.append(key)
            self._node_depth.append(depth)
        return nid

    def _closure(self, nid: int) -> Closure:
        """Kernel nodes reachable from node ``nid`` without consuming a byte. Built from
        per-NFA-state local closures (what lies above the parents is the same wherever a state
        occurs), so only pops walk down; parents' closures come first (they have smaller ids),
        computed without recursion however deep the stack."""
        memo = self._closures.get(nid)
        if memo is not None:
            return memo
        if not self._local_closure(self._nodes[nid][0])[1]:  # no pop: the parents do not matter
            memo = self._closures[nid] = self._closure_of(nid)
            return memo
        todo, seen = [nid], {nid}
        while todo:
            n = todo.pop()
            q, pid = self._nodes[n]
            if self._local_closure(q)[1]:
                for p in self._parent_sets[pid]:
                    if p >= 0 and p not in seen and p not in self._closures:
                        seen.add(p)
                        todo.append(p)
        for n in sorted(seen):
            self._closures[n] = self._closure_of(n)
        return self._closures[nid]

    def _closure_of(self, nid: int) -> Closure:
        q, pid = self._nodes[nid]
        fragments, pops = self._local_closure(q)
        kernel: set[int] = set()
        for fragment in fragments:
            below = pid
            for x in reversed(fragment[1:]):
                below = self._parent_set((self._node(x, below),))
            kernel.add(self._node(fragment[0], below))
        accepting = exits = False
        if pops:
            for p in self._parent_sets[pid]:
                if p == EMPTY_STACK:
                    accepting = True
                elif p == HOLE_STACK:
                    exits = True
                else:
                    below, below_accepting, below_exits = self._closures[p]
                    kernel.update(below)
                    accepting |= below_accepting
                    exits |= below_exits
        return tuple(sorted(kernel)), accepting, exits

    def _local_closure(self, q: int) -> tuple[list[tuple[int, ...]], bool]:
        """Stack fragments (top first) that ``q`` reaches without consuming a byte and without
        popping its own frame, whose top can consume a byte; and whether ``q``'s frame can pop."""
        memo = self._local_memo.get(q)
        if memo is not None:
            return memo
        nfa = self.nfa
        start = (q,)
        seen = {start}
        todo = [start]
        kernel: list[tuple[int, ...]] = []
        pops = False
        while todo:
            frag = todo.pop()
            x = frag[0]
            if nfa.byte_edges[x]:
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

    def _merged(self, nodes) -> tuple[int, ...]:
        """``nodes`` (distinct) with every group sharing a top state merged into one node, sorted."""
        all_nodes = self._nodes
        if len({all_nodes[n][0] for n in nodes}) == len(nodes):
            return tuple(sorted(nodes))
        by_top: dict[int, list[int]] = {}
        for n in nodes:
            by_top.setdefault(all_nodes[n][0], []).append(n)
        out = []
        for q, group in by_top.items():
            if len(group) == 1:
                out.append(group[0])
            else:
                parents = set().union(*(self._parent_sets[self._nodes[n][1]] for n in group))
                out.append(self._node(q, self._parent_set(tuple(sorted(parents)))))
        return tuple(sorted(out))

    def _config_for(self, seeds) -> int:
        kernel: set[int] = set()
        accepting = exits = False
        for nid in seeds:
            more, more_accepting, more_exits = self._closure(nid)
            kernel.update(more)
            accepting |= more_accepting
            exits |= more_exits
        if not kernel and not accepting and not exits:
            return DEAD
        return self._intern_config(self._merged(kernel), accepting, exits)

    def _intern_config(self, kernel: tuple[int, ...], accepting: bool, exits: bool) -> int:
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
        self._config_layouts.append(None)
        self._config_ids[key] = cid
        self.accepting[cid] = accepting
        self.exits[cid] = exits
        return cid

    def _grow(self) -> None:
        cap = self.table.shape[0] * 2
        table = np.full((cap, 256), UNEXPANDED, dtype=np.int32)
        table[: self.table.shape[0]] = self.table
        self.table = table
        self.accepting = np.concatenate([self.accepting, np.zeros(cap - len(self.accepting), dtype=bool)])
        self.exits = np.concatenate([self.exits, np.zeros(cap - len(self.exits), dtype=bool)])
        self.expanded = np.concatenate([self.expanded, np.zeros(cap - len(self.expanded), dtype=bool)])
        self._arrays = (self.table, self.exits)

    # ------------------------------------------------------------------ truncation
    def max_depth(self, state: int) -> int:
        """The deepest stack of ``state`` (1 for a regular grammar)."""
        depth = self._max_depth.get(state)
        if depth is None:
            depth = self._max_depth[state] = max((self._node_depth[n] for n in self._configs[state]), default=0)
        return depth

    def truncate(self, state: int, keep: int) -> int:
        """``state`` with every stack cut to its top ``keep`` frames over a HOLE bottom.

        Deeply nested configurations that agree on their top frames truncate to the same
        state, so its token mask is computed once and shared; a token that pops into the hole
        (its configuration has ``exits`` set) must then be checked against the real stack."""
        with self.lock:
            memo: dict[tuple[int, int], int] = {}
            top = {self._truncated(n, keep, memo) for n in self._configs[state]}
            return self._intern_config(self._merged(top), False, False)

    def _truncated(self, nid: int, keep: int, memo: dict[tuple[int, int], int]) -> int:
        if self._node_depth[nid] <= keep:
            return nid
        key = (nid, keep)
        hit = memo.get(key)
        if hit is None:
            q, pid = self._nodes[nid]
            if keep == 1:
                parents = (HOLE_STACK,)
            else:
                parents = tuple(sorted({p if p < 0 else self._truncated(p, keep - 1, memo) for p in self._parent_sets[pid]}))
            hit = memo[key] = self._node(q, self._parent_set(parents))
        return hit

    # ------------------------------------------------------------------ transitions
    @property
    def num_states(self) -> int:
        return len(self._configs)

    def transition_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(table, exits) of one generation, for walks that read them without the lock. Rows
        not expanded yet hold UNEXPANDED; a row is complete before ``expanded`` says so."""
        return self._arrays

    def expand(self, state: int) -> None:
        """Compute the whole transition row of ``state`` (idempotent)."""
        if self.expanded[state]:
            return
        with self.lock:
            if self.expanded[state]:
                return
            _, moves, bytes_of, dead = layout = self._layout(state)
            targets = [self._block_target(state, layout, k) for k in range(len(moves))]
            table = self.table  # after the targets: interning them may have grown it
            table[state, dead] = DEAD
            for block, target in zip(bytes_of, targets):
                table[state, block] = target
            self.expanded[state] = True

    def resolve(self, state: int, byte: int) -> int:
        """The transition of ``state`` on ``byte``, computing only the block of bytes that move
        like it (a walk deep inside a token reads a few bytes of most rows, not all 256)."""
        target = int(self.table[state, byte])
        if target != UNEXPANDED:
            return target
        with self.lock:
            return self._resolve_locked(state, byte)

    def resolve_many(self, cells: np.ndarray) -> None:
        """Resolve every (state, byte) row of ``cells`` (one lock for the batch; each block once)."""
        by_state: dict[int, set[int]] = {}
        for state, byte in cells.tolist():
            by_state.setdefault(state, set()).add(byte)
        with self.lock:
            for state, byte_set in by_state.items():
                block_of, _, bytes_of, dead = layout = self._layout(state)
                for k in {block_of[b] for b in byte_set}:
                    if k < 0:
                        self.table[state, dead] = DEAD
                    elif self.table[state, bytes_of[k][0]] == UNEXPANDED:
                        target = self._block_target(state, layout, k)
                        self.table[state, bytes_of[k]] = target  # (interning may have grown the table)

    def _resolve_locked(self, state: int, byte: int) -> int:
        target = int(self.table[state, byte])
        if target != UNEXPANDED:
            return target
        block_of, _, bytes_of, dead = layout = self._layout(state)
        k = block_of[byte]
        if k < 0:
            self.table[state, dead] = DEAD
            return DEAD
        target = self._block_target(state, layout, k)
        self.table[state, bytes_of[k]] = target
        return target

    def _layout(self, state: int) -> RowLayout:
        layout = self._config_layouts[state]
        if layout is None:
            groups = [self._move_groups(self._nodes[n][0]) for n in self._configs[state]]
            key = tuple(g[_PATTERN] for g in groups)
            layout = self._layouts.get(key)
            if layout is None:
                layout = self._layouts[key] = self._row_layout(groups)
            self._config_layouts[state] = layout
        return layout

    def _row_layout(self, groups: list[MoveGroups]) -> RowLayout:
        """Byte classes on which the same nodes move by the same groups form a block (work in
        proportion to the nodes' moves, not nodes x classes)."""
        by_class: dict[int, list[tuple[int, int]]] = {}
        for i, g in enumerate(groups):
            for c, group in g[_MOVES]:
                by_class.setdefault(c, []).append((i, group))
        block_ids: dict[tuple[tuple[int, int], ...], int] = {}
        block_of_class = [-1] * self.num_classes
        for c, moving in by_class.items():
            block_of_class[c] = block_ids.setdefault(tuple(moving), len(block_ids))
        block_of = np.array(block_of_class, dtype=np.int32)[self.byte_class]
        bytes_of = tuple(np.flatnonzero(block_of == k) for k in range(len(block_ids)))
        return tuple(block_of.tolist()), tuple(block_ids), bytes_of, np.flatnonzero(block_of < 0)

    def _block_target(self, state: int, layout: RowLayout, k: int) -> int:
        nodes = self._configs[state]
        moving = tuple((nodes[i], g) for i, g in layout[1][k])
        target = self._step_configs.get(moving)
        if target is None:
            target = self._step_configs[moving] = self._config_after(moving)
        return target

    def _config_after(self, moving: tuple[tuple[int, int], ...]) -> int:
        """The configuration after a byte on which each (node, group) moves to its group's targets."""
        if len(moving) == 1:
            kernel, accepting, exits = self._node_step(*moving[0])
        else:
            union: set[int] = set()
            accepting = exits = False
            for n, g in moving:
                more, more_accepting, more_exits = self._node_step(n, g)
                union.update(more)
                accepting |= more_accepting
                exits |= more_exits
            kernel = union
        if not kernel and not accepting and not exits:
            return DEAD
        return self._intern_config(self._merged(kernel), accepting, exits)

    def _node_step(self, nid: int, gid: int) -> Closure:
        """Closure of node ``nid`` after a byte of its top state's move group ``gid``."""
        key = (nid, gid)
        step = self._node_steps.get(key)
        if step is None:
            q, pid = self._nodes[nid]
            targets = self._move_groups(q)[_TARGETS][gid]
            if len(targets) == 1:
                step = self._closure(self._node(targets[0], pid))
            else:
                kernel: set[int] = set()
                accepting = exits = False
                for t in targets:
                    more, more_accepting, more_exits = self._closure(self._node(t, pid))
                    kernel.update(more)
                    accepting |= more_accepting
                    exits |= more_exits
                step = tuple(sorted(kernel)), accepting, exits
            self._node_steps[key] = step
        return step

    def expand_many(self, states: np.ndarray) -> None:
        todo = states[~self.expanded[states]]
        for s in set(todo.tolist()):
            self.expand(s)

    def step(self, state: int, byte: int) -> int:
        return self.resolve(state, byte)

    def step_bytes(self, state: int, data: bytes) -> int:
        for byte in data:
            if state < 0:
                return DEAD
            state = self.step(state, byte)
        return state

    def is_accepting(self, state: int) -> bool:
        return state >= 0 and bool(self.accepting[state])

    # ------------------------------------------------------------------ introspection
    def frame(self, nid: int) -> tuple[int, tuple[int, ...]]:
        """(NFA state, parent node ids and bottom markers) of stack node ``nid``."""
        q, pid = self._nodes[nid]
        return q, self._parent_sets[pid]

    def config_stacks(self, state: int) -> tuple[int, ...]:
        """The kernel node ids of configuration ``state``."""
        return self._configs[state]

    def stacks_of(self, state: int, limit: int = 1000) -> list[list[int]]:
        """Up to ``limit`` NFA-state stacks (top first) of a configuration, for debugging."""
        out: list[list[int]] = []
        todo = [(n, [self._nodes[n][0]]) for n in self._configs[state]]
        while todo and len(out) < limit:
            n, frames = todo.pop()
            for p in self._parent_sets[self._nodes[n][1]]:
                if p < 0:
                    out.append(frames)
                else:
                    todo.append((p, frames + [self._nodes[p][0]]))
        return out
