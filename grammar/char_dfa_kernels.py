"""The character-level DFA and its compiled kernels, for ``char_dfa`` (the algebra) and
``char_nfa`` (construction).

A ``CharDFA`` cuts the code points into *symbols* (``bounds``: symbol i is
``bounds[i] .. bounds[i+1]-1``); ``table[state, symbol]`` is the next state (-1: dead); state 0
starts. Surrogates (U+D800..U+DFFF) are one symbol that is always dead. ``tabulate`` turns
per-state code point ranges into a table, ``minimize`` runs Moore's partition refinement, and
``product_kernel`` explores the reachable pairs of two tables: the numba loops live here, in one
module, so both users share one compiled copy and neither imports the other's private names.
``START`` / ``END`` are the zero-width anchor classes the regex front end emits (bytes 0xFE /
0xFF never occur in UTF-8).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit, types
from numba.typed import Dict

from . import ir, kernel_tier

START = ir.ByteClass(((0xFE, 0xFE),))  # zero-width "at the start of the text"
END = ir.ByteClass(((0xFF, 0xFF),))  # zero-width "at the end of the text"
LIMIT = ir.MAX_UNICODE + 1
MAX_NFA_STATES = 400_000
MAX_DFA_STATES = 10_000  # past this the IR and the automaton get too big to compile quickly
MINIMIZE_ROUNDS = 200
_SURROGATE_CUTS = (0xD800, 0xE000)


@dataclass(frozen=True, eq=False)
class CharDFA:
    bounds: np.ndarray  # int64, bounds[0] == 0, bounds[-1] == LIMIT
    table: np.ndarray  # int32 [states, symbols], -1 = dead; state 0 starts
    accepting: np.ndarray  # bool [states]

    @property
    def num_states(self) -> int:
        return self.table.shape[0]


def tabulate(rows: list[list[tuple[int, int, int]]], accepting: list[bool]) -> CharDFA:
    cuts = {0, LIMIT, *_SURROGATE_CUTS}
    for row in rows:
        for lo, hi, _ in row:
            cuts.add(lo)
            cuts.add(hi + 1)
    bounds = np.array(sorted(cuts), dtype=np.int64)
    table = np.full((len(rows), len(bounds) - 1), -1, dtype=np.int32)
    for s, row in enumerate(rows):
        for lo, hi, t in row:
            a = int(np.searchsorted(bounds, lo))
            b = int(np.searchsorted(bounds, hi + 1))
            table[s, a:b] = t
    table[:, surrogate_symbol(bounds)] = -1
    return CharDFA(bounds, table, np.array(accepting, dtype=bool))


def surrogate_symbol(bounds: np.ndarray) -> int:
    return int(np.searchsorted(bounds, 0xD800))


@njit(cache=True, nogil=True)
def product_kernel(ta: np.ndarray, tb: np.ndarray, op: int, max_states: int):  # type: ignore[no-untyped-def]
    """Breadth-first over the pairs reachable from (0, 0): the product's table and each
    state's pair code ``p * (nb + 1) + q``; (None, None) past ``max_states`` states. Row
    ``na`` of ``ta`` and ``nb`` of ``tb`` are the dead sinks: a pair that enters one is dead for
    "and" (either sink) and "diff" (``a``'s), a real state for "or"."""
    na, k = ta.shape[0] - 1, ta.shape[1]
    nb = tb.shape[0] - 1
    width = nb + 1
    ids = Dict.empty(key_type=types.int64, value_type=types.int64)
    ids[0] = 0
    capacity = 64
    codes = np.empty(capacity, dtype=np.int64)
    table = np.empty((capacity, k), dtype=np.int32)
    codes[0] = 0
    num = 1
    i = 0
    while i < num:
        p, q = codes[i] // width, codes[i] % width
        # Room for the row's new states before its loop: an array reassigned inside the loop
        # costs two reference counts an iteration (determinizer.GROWN_IN_LOOP).
        if num + k > capacity:
            capacity = 2 * capacity + k
            grown = np.empty(capacity, dtype=np.int64)
            wider = np.empty((capacity, k), dtype=np.int32)
            for row in range(num):  # loops, not slice assignments (see determinizer._grow)
                grown[row] = codes[row]
                for col in range(k):
                    wider[row, col] = table[row, col]
            codes = grown
            table = wider
        for j in range(k):
            x, y = ta[p, j], tb[q, j]
            if (op == 0 and (x == na or y == nb)) or (op == 2 and x == na):
                table[i, j] = -1
                continue
            code = x * width + y
            got = ids.get(code, -1)
            if got < 0:
                if num >= max_states:
                    return None, None
                got = num
                ids[code] = num
                codes[num] = code
                num += 1
            table[i, j] = got
        i += 1
    return table[:num].copy(), codes[:num].copy()


def minimize(dfa: CharDFA) -> CharDFA:
    """Moore's partition refinement; states that cannot reach acceptance become dead. Past
    ``MINIMIZE_ROUNDS`` rounds (long counters) the refinement stops at the trimmed automaton:
    an unfinished refinement would merge states that are not equivalent."""
    n, k = dfa.table.shape
    full = np.vstack([np.where(dfa.table < 0, n, dfa.table), np.full((1, k), n, dtype=np.int32)]).astype(np.int32)
    accepting = np.append(dfa.accepting, False)
    reps, table = kernel_tier.pick(minimize_kernel)(full, accepting, MINIMIZE_ROUNDS)
    if not len(reps):
        return CharDFA(dfa.bounds, np.full((1, k), -1, dtype=np.int32), np.zeros(1, dtype=bool))
    return merge_symbols(CharDFA(dfa.bounds, table, accepting[reps]))


@njit(cache=True, nogil=True)
def minimize_kernel(full: np.ndarray, accepting: np.ndarray, max_rounds: int) -> tuple[np.ndarray, np.ndarray]:
    """The minimal automaton of ``full`` (row ``n`` is the dead sink): a representative state
    per class, in breadth-first order from state 0, and the table over those classes (-1 for
    the dead one). No representatives when state 0 cannot reach acceptance.

    Classes of a round are told apart by a hash of each state's row, and rows with equal hashes
    are compared in full, so a collision never merges states."""
    m, k = full.shape
    n = m - 1
    alive = coreachable_kernel(full, accepting)
    cls = np.zeros(m, dtype=np.int64)
    seen = np.zeros(3, dtype=np.bool_)
    for s in range(m):
        if alive[s]:
            cls[s] = 2 if accepting[s] else 1
        seen[cls[s]] = True
    count = int(seen.sum())
    rounds = 0
    h = np.empty(m, dtype=np.uint64)
    new = np.empty(m, dtype=np.int64)
    group_reps = np.empty(m, dtype=np.int64)
    while True:
        rounds += 1
        if rounds > max_rounds:
            # every live state its own class, every other state the dead one
            c = 1
            for s in range(m):
                if alive[s] and s != n:
                    cls[s] = c
                    c += 1
                else:
                    cls[s] = 0
            break
        for s in range(m):
            x = np.uint64(cls[s]) * np.uint64(0x9E3779B97F4A7C15)
            for j in range(k):
                x = (x ^ np.uint64(cls[full[s, j]])) * np.uint64(0x100000001B3)
            h[s] = x
        order = np.argsort(h, kind="mergesort")
        c = 0
        p = 0
        while p < m:
            q = p
            while q < m and h[order[q]] == h[order[p]]:
                q += 1
            # states with one hash: exact row comparison against this group's representatives
            num_reps = 0
            for i in range(p, q):
                s = order[i]
                found = -1
                for r in range(num_reps):
                    t = group_reps[r]
                    same = cls[s] == cls[t]
                    j = 0
                    while same and j < k:
                        same = cls[full[s, j]] == cls[full[t, j]]
                        j += 1
                    if same:
                        found = new[t]
                        break
                if found < 0:
                    found = c
                    c += 1
                    group_reps[num_reps] = s
                    num_reps += 1
                new[s] = found
            p = q
        for s in range(cls.shape[0]):
            cls[s] = new[s]
        if c == count:
            break
        count = c
    dead = cls[n]
    index = np.full(m, -1, dtype=np.int64)  # class -> its number in breadth-first order
    reps = np.empty(m, dtype=np.int64)
    num = 0
    if cls[0] != dead:
        index[cls[0]] = 0
        reps[0] = 0
        num = 1
    i = 0
    while i < num:
        for j in range(k):
            t = full[reps[i], j]
            ct = cls[t]
            if ct != dead and index[ct] < 0:
                index[ct] = num
                reps[num] = t
                num += 1
        i += 1
    table = np.empty((num, k), dtype=np.int32)
    for i in range(num):
        for j in range(k):
            table[i, j] = index[cls[full[reps[i], j]]]
    return reps[:num].copy(), table


@njit(cache=True, nogil=True)
def coreachable_kernel(full: np.ndarray, accepting: np.ndarray) -> np.ndarray:
    """States from which an accepting state is reachable (backwards over a predecessor index)."""
    m, k = full.shape
    start = np.zeros(m + 1, dtype=np.int64)
    for s in range(m):
        for j in range(k):
            start[full[s, j] + 1] += 1
    for t in range(m):
        start[t + 1] += start[t]
    fill = start[:-1].copy()
    preds = np.empty(m * k, dtype=np.int64)
    for s in range(m):
        for j in range(k):
            t = full[s, j]
            preds[fill[t]] = s
            fill[t] += 1
    alive = accepting.copy()
    todo = np.empty(m, dtype=np.int64)
    top = 0
    for s in range(m):
        if accepting[s]:
            todo[top] = s
            top += 1
    while top:
        top -= 1
        t = todo[top]
        for e in range(start[t], start[t + 1]):
            s = preds[e]
            if not alive[s]:
                alive[s] = True
                todo[top] = s
                top += 1
    return alive


def merge_symbols(dfa: CharDFA) -> CharDFA:
    """Join adjacent symbols with identical columns (keeps tables narrow after products)."""
    t = dfa.table
    if t.shape[1] <= 1:
        return dfa
    keep = np.ones(t.shape[1], dtype=bool)
    keep[1:] = np.any(t[:, 1:] != t[:, :-1], axis=0)
    sur = surrogate_symbol(dfa.bounds)
    keep[sur] = True
    if sur + 1 < len(keep):
        keep[sur + 1] = True
    bounds = np.append(dfa.bounds[:-1][keep], LIMIT)
    return CharDFA(bounds, np.ascontiguousarray(t[:, keep]), dfa.accepting)

