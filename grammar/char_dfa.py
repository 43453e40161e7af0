"""Character-level DFAs: intersection, union, difference and complement of regular languages.

The grammar IR has no boolean operations, yet JSON Schema needs them on strings and keys
(``pattern`` with ``maxLength``, ``not: {pattern}``, ``oneOf`` over strings, keys that match one
pattern but no named property). This module takes a character-level IR expression (literals,
classes, sequences, choices, repeats, graphs: what ``regex_to_ir`` and the format expressions
produce), builds a DFA over Unicode scalar values, combines DFAs by products, and hands the result
back as an ``ir.Graph`` with one character class per edge.

Representation: the code points are cut into *symbols* (``bounds``: symbol i is
``bounds[i] .. bounds[i+1]-1``), and ``table[state, symbol]`` is the next state (-1: dead).
State 0 starts. Tables are numpy arrays, so products and the Moore minimization run row-wise.
Surrogates (U+D800..U+DFFF) are one symbol that is always dead: they never occur in text.

Anchors: the regex front end marks a strict ``^`` / ``$`` that is not at an end of the pattern
with the byte classes ``START`` / ``END`` (bytes 0xFE / 0xFF never occur in UTF-8). ``^`` passes
only before the first character, ``$`` only after the last one.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

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
    """The product automaton, explored breadth-first one layer at a time with numpy."""
    bounds = np.union1d(a.bounds, b.bounds)
    ta, tb = _refine(a, bounds), _refine(b, bounds)
    na, nb = a.num_states, b.num_states
    # Dead becomes a real sink (index na / nb) so union and difference see it.
    ta = np.vstack([np.where(ta < 0, na, ta), np.full((1, ta.shape[1]), na, dtype=np.int32)]).astype(np.int64)
    tb = np.vstack([np.where(tb < 0, nb, tb), np.full((1, tb.shape[1]), nb, dtype=np.int32)]).astype(np.int64)
    acc_a = np.append(a.accepting, False)
    acc_b = np.append(b.accepting, False)
    width = nb + 1
    ids: dict[int, int] = {0: 0}  # pair code p * width + q -> product state
    codes_of = [0]
    rows: list[np.ndarray] = []
    frontier = np.array([0], dtype=np.int64)
    while len(frontier):
        p, q = frontier // width, frontier % width
        nxt = ta[p] * width + tb[q]  # [layer, symbols]
        dead = np.zeros(nxt.shape, dtype=bool)
        if op == "and":
            dead = (ta[p] == na) | (tb[q] == nb)
        elif op == "diff":
            dead = ta[p] == na
        fresh = []
        for code in np.unique(nxt[~dead]).tolist():
            if code not in ids:
                ids[code] = len(codes_of)
                codes_of.append(code)
                fresh.append(code)
        if len(codes_of) > MAX_DFA_STATES:
            raise GrammarBudgetError(f"string constraint needs more than {MAX_DFA_STATES} DFA states")
        uniq = np.array(sorted(ids), dtype=np.int64)
        lut = np.array([ids[c] for c in uniq.tolist()], dtype=np.int32)
        row = lut[np.minimum(np.searchsorted(uniq, nxt), len(uniq) - 1)]
        row[dead] = -1  # dead codes are not in ``ids``: whatever they looked up is replaced
        rows.append(row)
        frontier = np.array(fresh, dtype=np.int64)
    table = np.vstack(rows).astype(np.int32)
    codes = np.array(codes_of, dtype=np.int64)
    pa, pb = codes // width, codes % width
    if op == "and":
        acc = acc_a[pa] & acc_b[pb]
    elif op == "or":
        acc = acc_a[pa] | acc_b[pb]
    else:
        acc = acc_a[pa] & ~acc_b[pb]
    table[:, _surrogate_symbol(bounds)] = -1
    return _minimize(CharDFA(bounds, table, acc))


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
    full = np.vstack([np.where(dfa.table < 0, n, dfa.table), np.full((1, k), n, dtype=np.int32)])
    alive = _coreachable(full, np.append(dfa.accepting, False))
    cls = np.where(alive, 1 + np.append(dfa.accepting, False), 0).astype(np.int64)
    count = len(np.unique(cls))
    rounds = 0
    while True:
        rounds += 1
        if rounds > MINIMIZE_ROUNDS:
            cls = np.where(alive, np.arange(n + 1), -1)  # every live state its own class
            cls[n] = -1
            _, cls = np.unique(cls, return_inverse=True)
            break
        sig = np.ascontiguousarray(np.column_stack([cls, cls[full]]))
        rows = sig.view(np.dtype((np.void, sig.dtype.itemsize * sig.shape[1]))).reshape(-1)
        _, new = np.unique(rows, return_inverse=True)  # row-wise unique (axis=0 fails on wide rows)
        new = new.reshape(-1)
        c = int(new.max()) + 1
        cls = new
        if c == count:
            break
        count = c
    dead = cls[n]
    # Renumber classes in breadth-first order from the start; the dead class becomes -1.
    order: dict[int, int] = {}
    if cls[0] != dead:
        order[int(cls[0])] = 0
    reps: list[int] = [0] if cls[0] != dead else []
    i = 0
    while i < len(reps):
        for t in full[reps[i]].tolist():
            ct = int(cls[t])
            if ct != dead and ct not in order:
                order[ct] = len(reps)
                reps.append(t)
        i += 1
    if not reps:
        return CharDFA(dfa.bounds, np.full((1, k), -1, dtype=np.int32), np.zeros(1, dtype=bool))
    lut = np.full(int(cls.max()) + 1, -1, dtype=np.int32)
    for c, j in order.items():
        lut[c] = j
    rep_rows = full[np.array(reps)]
    table = lut[cls[rep_rows]]
    accepting = np.append(dfa.accepting, False)[np.array(reps)]
    return _merge_symbols(CharDFA(dfa.bounds, table.astype(np.int32), accepting))


def _coreachable(full: np.ndarray, accepting: np.ndarray) -> np.ndarray:
    """States from which an accepting state is reachable."""
    n = full.shape[0]
    preds: list[list[int]] = [[] for _ in range(n)]
    for s in range(n):
        for t in set(full[s].tolist()):
            preds[t].append(s)
    alive = accepting.copy()
    todo = list(np.flatnonzero(accepting))
    while todo:
        t = todo.pop()
        for s in preds[t]:
            if not alive[s]:
                alive[s] = True
                todo.append(s)
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
