"""Shortest completions: how many bytes, at least, until a configuration can end.

Per NFA state we compute ``d[q]``, the fewest bytes from ``q`` to the final state of its own rule
(a call edge costs the callee's shortest length). A stack's distance is then ``d[top]`` plus the
distances of the return states below it, memoized per stack node (the cheapest parent counts); a
configuration's is the minimum over its stacks (0 when it accepts). This is what budget-aware masks and
``GrammarMatcher.shortest_completion`` stand on.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .automaton import LazyAutomaton

INF = 1 << 40


def _by_target(n: int, target, *columns) -> tuple[list[int], ...]:  # type: ignore[no-untyped-def]
    """CSR by ``target`` (flat Python lists: [ptr, column...]); few objects for the collector."""
    target = np.asarray(target, dtype=np.int64)
    order = np.argsort(target, kind="stable")
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(target, minlength=n), out=ptr[1:])
    return (ptr.tolist(), *(np.asarray(column, dtype=np.int64)[order].tolist() for column in columns))


def _state_distances(automaton: "LazyAutomaton") -> list[int]:
    """``d[q]`` for every NFA state: shortest paths to the rule finals, settled in increasing
    distance (Knuth's generalization of Dijkstra's algorithm: a call's cost is its return state's
    distance plus its callee's, known once both are settled). Distances are integers, so the
    queue is a bucket per distance. Each state is settled once; relaxing to a fixpoint instead
    revisited states over and over (923 ms on one MaskBench schema of 39k states, 37 ms here;
    bench/completion_bench.py)."""
    nfa = automaton.nfa
    n = nfa.num_states
    d = [INF] * n
    rule_start = np.asarray(nfa.rule_start, dtype=np.int64)
    call_src = np.asarray(nfa.call_src, dtype=np.int64)
    call_ret = np.asarray(nfa.call_ret, dtype=np.int64)
    call_start = rule_start[np.asarray(nfa.call_rule, dtype=np.int64)] if len(call_src) else call_src
    # Into each state: its predecessors by a byte (cost 1) or an epsilon (0); into a return
    # state: the calls that return there (caller, callee's start); from a rule's start: the calls
    # of that rule (caller, return state).
    n_eps = len(nfa.eps_src)
    plain_ptr, plain_src, plain_cost = _by_target(
        n, np.concatenate([np.asarray(nfa.eps_dst, dtype=np.int64), np.asarray(nfa.edge_dst, dtype=np.int64)]),
        np.concatenate([np.asarray(nfa.eps_src, dtype=np.int64), np.asarray(nfa.edge_src, dtype=np.int64)]),
        np.concatenate([np.zeros(n_eps, dtype=np.int64), np.ones(len(nfa.edge_src), dtype=np.int64)]),
    )
    ret_ptr, ret_caller, ret_start = _by_target(n, call_ret, call_src, call_start)
    start_ptr, start_caller, start_ret = _by_target(n, call_start, call_src, call_ret)
    done = [False] * n
    buckets: dict[int, list[int]] = {}
    pending: list[int] = []  # heap of the distances that have a bucket

    def reach(q: int, dist: int) -> None:
        if dist < d[q]:
            d[q] = dist
            bucket = buckets.get(dist)
            if bucket is None:
                buckets[dist] = [q]
                heapq.heappush(pending, dist)
            else:
                bucket.append(q)  # the bucket being settled too: zero-cost edges

    for final in np.asarray(nfa.rule_final, dtype=np.int64).tolist():
        reach(final, 0)
    while pending:
        dist = heapq.heappop(pending)
        bucket = buckets[dist]
        k = 0
        while k < len(bucket):
            t = bucket[k]
            k += 1
            if done[t] or d[t] != dist:
                continue
            done[t] = True
            for j in range(plain_ptr[t], plain_ptr[t + 1]):
                reach(plain_src[j], dist + plain_cost[j])
            for j in range(ret_ptr[t], ret_ptr[t + 1]):
                if done[ret_start[j]]:
                    reach(ret_caller[j], dist + d[ret_start[j]])
            for j in range(start_ptr[t], start_ptr[t + 1]):
                if done[start_ret[j]]:
                    reach(start_caller[j], d[start_ret[j]] + dist)
        del buckets[dist]
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
        frame = self.automaton.frame_reader()
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
