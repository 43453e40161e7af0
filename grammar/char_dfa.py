"""Character-level DFAs: intersection, union, difference and complement of regular languages.

The grammar IR has no boolean operations, yet JSON Schema needs them on strings and keys
(``pattern`` with ``maxLength``, ``not: {pattern}``, ``oneOf`` over strings, keys that match one
pattern but no named property). This module takes a character-level IR expression (literals,
classes, sequences, choices, repeats, graphs: what ``regex_to_ir`` and the format expressions
produce), builds a DFA over Unicode scalar values, combines DFAs by products, and hands the result
back as an ``ir.Graph`` with one character class per edge.

Representation: the code points are cut into *symbols* (``bounds``: symbol i is
``bounds[i] .. bounds[i+1]-1``), and ``table[state, symbol]`` is the next state (-1: dead).
State 0 starts. Tables are numpy arrays; products and the Moore minimization are compiled
(numba) loops over them: the automata here are small, tens of states over tens of symbols, and
numpy's per-call costs made a row-wise round cost more than its work.
Surrogates (U+D800..U+DFFF) are one symbol that is always dead: they never occur in text.

Anchors: the regex front end marks a strict ``^`` / ``$`` that is not at an end of the pattern
with the byte classes ``START`` / ``END`` (bytes 0xFE / 0xFF never occur in UTF-8). ``^`` passes
only before the first character, ``$`` only after the last one.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from numba import njit, types
from numba.typed import Dict

from . import ir
from .errors import GrammarBudgetError

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


def _tabulate(rows: list[list[tuple[int, int, int]]], accepting: list[bool]) -> CharDFA:
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
    table[:, _surrogate_symbol(bounds)] = -1
    return CharDFA(bounds, table, np.array(accepting, dtype=bool))


def _surrogate_symbol(bounds: np.ndarray) -> int:
    return int(np.searchsorted(bounds, 0xD800))


# ---------------------------------------------------------------------------- products


def _refine(dfa: CharDFA, bounds: np.ndarray) -> np.ndarray:
    """``dfa``'s table over the finer symbol partition ``bounds``."""
    cols = np.searchsorted(dfa.bounds, bounds[:-1], side="right") - 1
    return dfa.table[:, cols]


def _product(a: CharDFA, b: CharDFA, op: str) -> CharDFA:
    """The product automaton of the pairs reachable from the two start states, minimized."""
    bounds = np.union1d(a.bounds, b.bounds)
    ta, tb = _refine(a, bounds), _refine(b, bounds)
    na, nb = a.num_states, b.num_states
    # Dead becomes a real sink (index na / nb) so union and difference see it.
    ta = np.vstack([np.where(ta < 0, na, ta), np.full((1, ta.shape[1]), na, dtype=np.int32)]).astype(np.int64)
    tb = np.vstack([np.where(tb < 0, nb, tb), np.full((1, tb.shape[1]), nb, dtype=np.int32)]).astype(np.int64)
    acc_a = np.append(a.accepting, False)
    acc_b = np.append(b.accepting, False)
    table, codes = _product_kernel(ta, tb, _OPS[op], MAX_DFA_STATES)
    if table is None:
        raise GrammarBudgetError(f"string constraint needs more than {MAX_DFA_STATES} DFA states")
    width = nb + 1
    pa, pb = codes // width, codes % width
    if op == "and":
        acc = acc_a[pa] & acc_b[pb]
    elif op == "or":
        acc = acc_a[pa] | acc_b[pb]
    else:
        acc = acc_a[pa] & ~acc_b[pb]
    table[:, _surrogate_symbol(bounds)] = -1
    return _minimize(CharDFA(bounds, table, acc))


_OPS = {"and": 0, "or": 1, "diff": 2}


@njit(cache=True, nogil=True)
def _product_kernel(ta: np.ndarray, tb: np.ndarray, op: int, max_states: int):  # type: ignore[no-untyped-def]
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
                if num == capacity:
                    capacity *= 2
                    grown = np.empty(capacity, dtype=np.int64)
                    grown[:num] = codes[:num]
                    codes = grown
                    wider = np.empty((capacity, k), dtype=np.int32)
                    wider[:num] = table[:num]
                    table = wider
                got = num
                ids[code] = num
                codes[num] = code
                num += 1
            table[i, j] = got
        i += 1
    return table[:num].copy(), codes[:num].copy()


_kernels_loaded = False


def load_kernels() -> None:
    """Run the compiled product and minimization once per process, so numba loads them (or
    compiles them, seconds on a fresh machine) before a budgeted compile starts its clock."""
    global _kernels_loaded
    if _kernels_loaded:
        return
    word = CharDFA(np.array([0, 0x61, 0x62, 0xD800, 0xE000, LIMIT], dtype=np.int64),
                   np.array([[-1, 1, -1, -1, -1], [-1, -1, -1, -1, -1]], dtype=np.int32), np.array([False, True]))
    for op in _OPS:
        _product(word, word, op)
    _kernels_loaded = True


def intersect(a: CharDFA, b: CharDFA) -> CharDFA:
    return _product(a, b, "and")


def union(a: CharDFA, b: CharDFA) -> CharDFA:
    return _product(a, b, "or")


def difference(a: CharDFA, b: CharDFA) -> CharDFA:
    return _product(a, b, "diff")


def complement(a: CharDFA) -> CharDFA:
    """All strings of Unicode scalar values not in ``a``."""
    n = a.num_states
    table = np.vstack([np.where(a.table < 0, n, a.table), np.full((1, a.table.shape[1]), n, dtype=np.int32)])
    table[:, _surrogate_symbol(a.bounds)] = -1
    return _minimize(CharDFA(a.bounds, table.astype(np.int32), ~np.append(a.accepting, False)))


# ---------------------------------------------------------------------------- minimization


def _minimize(dfa: CharDFA) -> CharDFA:
    """Moore's partition refinement; states that cannot reach acceptance become dead. Past
    ``MINIMIZE_ROUNDS`` rounds (long counters) the refinement stops at the trimmed automaton:
    an unfinished refinement would merge states that are not equivalent."""
    n, k = dfa.table.shape
    full = np.vstack([np.where(dfa.table < 0, n, dfa.table), np.full((1, k), n, dtype=np.int32)]).astype(np.int32)
    accepting = np.append(dfa.accepting, False)
    reps, table = _minimize_kernel(full, accepting, MINIMIZE_ROUNDS)
    if not len(reps):
        return CharDFA(dfa.bounds, np.full((1, k), -1, dtype=np.int32), np.zeros(1, dtype=bool))
    return _merge_symbols(CharDFA(dfa.bounds, table, accepting[reps]))


@njit(cache=True, nogil=True)
def _minimize_kernel(full: np.ndarray, accepting: np.ndarray, max_rounds: int) -> tuple[np.ndarray, np.ndarray]:
    """The minimal automaton of ``full`` (row ``n`` is the dead sink): a representative state
    per class, in breadth-first order from state 0, and the table over those classes (-1 for
    the dead one). No representatives when state 0 cannot reach acceptance.

    Classes of a round are told apart by a hash of each state's row, and rows with equal hashes
    are compared in full, so a collision never merges states."""
    m, k = full.shape
    n = m - 1
    alive = _coreachable_kernel(full, accepting)
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
        cls[:] = new
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
def _coreachable_kernel(full: np.ndarray, accepting: np.ndarray) -> np.ndarray:
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


def _merge_symbols(dfa: CharDFA) -> CharDFA:
    """Join adjacent symbols with identical columns (keeps tables narrow after products)."""
    t = dfa.table
    if t.shape[1] <= 1:
        return dfa
    keep = np.ones(t.shape[1], dtype=bool)
    keep[1:] = np.any(t[:, 1:] != t[:, :-1], axis=0)
    sur = _surrogate_symbol(dfa.bounds)
    keep[sur] = True
    if sur + 1 < len(keep):
        keep[sur + 1] = True
    bounds = np.append(dfa.bounds[:-1][keep], LIMIT)
    return CharDFA(bounds, np.ascontiguousarray(t[:, keep]), dfa.accepting)


# ---------------------------------------------------------------------------- queries and output


def is_empty(a: CharDFA) -> bool:
    return not a.accepting.any()


def accepts(a: CharDFA, text: str) -> bool:
    s = 0
    for ch in text:
        sym = int(np.searchsorted(a.bounds, ord(ch), side="right")) - 1
        s = int(a.table[s, sym])
        if s < 0:
            return False
    return bool(a.accepting[s])


def finite_words(a: CharDFA, limit: int) -> list[str] | None:
    """Every string of ``a`` when it has at most ``limit`` of them, else None."""
    if is_empty(a):
        return []
    out: list[str] = []
    stack: list[tuple[int, str, frozenset[int]]] = [(0, "", frozenset([0]))]
    while stack:
        s, prefix, path = stack.pop()
        if a.accepting[s]:
            out.append(prefix)
            if len(out) > limit:
                return None
        row = a.table[s]
        for sym in np.flatnonzero(row >= 0).tolist():
            t = int(row[sym])
            lo, hi = int(a.bounds[sym]), int(a.bounds[sym + 1]) - 1
            if t in path or hi - lo + 1 > limit:
                return None  # a cycle (infinite) or too many characters
            for cp in range(lo, hi + 1):
                stack.append((t, prefix + chr(cp), path | {t}))
            if len(stack) > 4 * limit:
                return None
    return out


def to_ir(a: CharDFA) -> ir.Expr:
    """The language of ``a`` as an ``ir.Graph`` of character classes (NOTHING when empty)."""
    if is_empty(a):
        return ir.NOTHING
    edges: list[tuple[int, ir.Expr, int]] = []
    for s in range(a.num_states):
        row = a.table[s]
        by_target: dict[int, list[tuple[int, int]]] = {}
        for sym in np.flatnonzero(row >= 0).tolist():
            by_target.setdefault(int(row[sym]), []).append((int(a.bounds[sym]), int(a.bounds[sym + 1]) - 1))
        for t, ranges in by_target.items():
            cls = ir.char_class(ranges)
            if not isinstance(cls, ir.Nothing):
                edges.append((s, _single(cls), t))
    finals = frozenset(np.flatnonzero(a.accepting).tolist())
    if not edges:
        return ir.EMPTY  # only the empty string
    return ir.Graph(0, finals, tuple(edges))


def _single(cls: ir.Expr) -> ir.Expr:
    if isinstance(cls, ir.CharClass) and len(cls.ranges) == 1 and cls.ranges[0][0] == cls.ranges[0][1]:
        return ir.literal(chr(cls.ranges[0][0]))
    return cls


def from_table(bounds: np.ndarray, table: np.ndarray, accepting: np.ndarray) -> CharDFA:
    """A minimal DFA from a hand-built table (``bounds`` must cut at the surrogates)."""
    table = table.astype(np.int32).copy()
    table[:, _surrogate_symbol(bounds)] = -1
    return _minimize(CharDFA(np.asarray(bounds, dtype=np.int64), table, np.asarray(accepting, dtype=bool)))


def universal() -> CharDFA:
    return from_ir(ir.star(ir.ANY_CHAR))


@lru_cache(maxsize=64)
def lengths(lo: int, hi: int | None) -> CharDFA:
    """Strings of ``lo`` to ``hi`` characters (a counter, built directly)."""
    top = lo if hi is None else hi
    if top + 1 > MAX_DFA_STATES:
        raise GrammarBudgetError(f"a length bound of {top} characters needs more than {MAX_DFA_STATES} DFA states")
    bounds = np.array([0, 0xD800, 0xE000, LIMIT], dtype=np.int64)
    nxt = np.arange(1, top + 2, dtype=np.int32)
    nxt[top] = top if hi is None else -1
    table = np.repeat(nxt[:, None], 3, axis=1)
    table[:, 1] = -1
    accepting = np.arange(top + 1) >= lo
    return CharDFA(bounds, table, accepting)


def from_ir(expr: ir.Expr) -> CharDFA:
    """The minimal DFA of a character-level IR expression (built by ``char_nfa``)."""
    from .char_nfa import build

    return build(expr)
