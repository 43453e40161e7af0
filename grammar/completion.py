"""Shortest completions: how many bytes, at least, until a configuration can end.

Per NFA state we compute ``d[q]``, the fewest bytes from ``q`` to the final state of its own rule
(a call edge costs the callee's shortest length). A stack's distance is then ``d[top]`` plus the
distances of the return states below it, memoized per stack node (the cheapest parent counts); a
configuration's is the minimum over its stacks (0 when it accepts). This is what budget-aware masks and
``GrammarMatcher.shortest_completion`` stand on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .automaton import LazyAutomaton

INF = 1 << 40


def _state_distances(automaton: "LazyAutomaton") -> list[int]:
    nfa = automaton.nfa
    n = nfa.num_states
    d = [INF] * n
    for final in nfa.rule_final:
        d[final] = 0
    # Reverse edges (predecessor lists) make this a simple relaxation to a fixpoint.
    preds: list[list[tuple[int, int, int]]] = [[] for _ in range(n)]  # (pred, cost, callee or -1)
    for q, t in zip(nfa.eps_src, nfa.eps_dst):
        preds[t].append((q, 0, -1))
    for q, t in zip(nfa.edge_src, nfa.edge_dst):
        preds[t].append((q, 1, -1))
    for q, callee, ret in zip(nfa.call_src, nfa.call_rule, nfa.call_ret):
        preds[ret].append((q, 0, callee))
    changed = True
    while changed:
        changed = False
        todo = [q for q in range(n) if d[q] < INF]
        while todo:
            t = todo.pop()
            for q, cost, callee in preds[t]:
                extra = d[nfa.rule_start[callee]] if callee >= 0 else 0
                cand = d[t] + cost + extra
                if cand < d[q]:
                    d[q] = cand
                    todo.append(q)
                    changed = True
        # Callee lengths may have shrunk after their callers were relaxed: repeat until stable.
        changed = changed and nfa.has_calls
    return d


class CompletionDistance:
    """Minimum number of bytes before each configuration of ``automaton`` can accept."""

    def __init__(self, automaton: "LazyAutomaton") -> None:
        self.automaton = automaton
        self.state_dist = _state_distances(automaton)
        self._stack_dist: dict[int, int] = {}
        self._config_dist: dict[int, int] = {}

    def stack_distance(self, nid: int) -> int:
        """Fewest bytes until the stacks of node ``nid`` (its top state over any of its
        parents) are all popped. Parents first, without recursion however deep the stack."""
        memo = self._stack_dist
        if nid in memo:
            return memo[nid]
        frame = self.automaton.frame
        todo, seen = [nid], {nid}
        while todo:
            for p in frame(todo.pop())[1]:
                if p >= 0 and p not in memo and p not in seen:
                    seen.add(p)
                    todo.append(p)
        for n in sorted(seen):  # a node's parents have smaller ids
            q, parents = frame(n)
            below = min((memo[p] if p >= 0 else 0 for p in parents), default=0)
            memo[n] = min(INF, self.state_dist[q] + below)
        return memo[nid]

    def config_distance(self, state: int) -> int:
        if state < 0:
            return INF
        cached = self._config_dist.get(state)
        if cached is not None:
            return cached
        a = self.automaton
        if a.accepting[state]:
            dist = 0
        else:
            dist = min((self.stack_distance(s) for s in a.config_stacks(state)), default=INF)
        self._config_dist[state] = dist
        return dist

    def distances(self, states: np.ndarray) -> np.ndarray:
        out = np.full(len(states), INF, dtype=np.int64)
        for i, s in enumerate(states.tolist()):
            out[i] = self.config_distance(s)
        return out

    def shortest_completion(self, state: int) -> bytes:
        """Bytes of one shortest continuation from ``state`` to an accepting configuration."""
        a = self.automaton
        out = bytearray()
        dist = self.config_distance(state)
        if dist >= INF:
            raise ValueError("no completion exists from this state")
        while dist > 0:
            a.expand(state)
            row = a.table[state]
            best = None
            for b in _PREFERRED_BYTES:
                nxt = int(row[b])
                if nxt >= 0 and self.config_distance(nxt) == dist - 1:
                    best = (b, nxt)
                    break
            assert best is not None, "distance table inconsistent"
            out.append(best[0])
            state, dist = best[1], dist - 1
        return bytes(out)


def _preferred_bytes() -> list[int]:
    # Prefer readable ASCII (digits and letters before punctuation) so completions look natural.
    order = list(b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
    order += [b for b in range(0x20, 0x7F) if b not in order]
    order += [b for b in range(256) if b not in order]
    return order


_PREFERRED_BYTES = _preferred_bytes()
