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
numpy's per-call costs made a row-wise round cost more than its work. The representation and
those loops are ``char_dfa_kernels``; the construction from IR is ``char_nfa``.
Surrogates (U+D800..U+DFFF) are one symbol that is always dead: they never occur in text.

Anchors: the regex front end marks a strict ``^`` / ``$`` that is not at an end of the pattern
with the byte classes ``START`` / ``END`` (bytes 0xFE / 0xFF never occur in UTF-8). ``^`` passes
only before the first character, ``$`` only after the last one.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from . import ir, kernel_tier
from .char_dfa_kernels import (  # the representation and its compiled loops; CharDFA etc. are imported from here too
    END,
    LIMIT,
    MAX_DFA_STATES,
    MAX_NFA_STATES,
    MINIMIZE_ROUNDS,
    START,
    CharDFA,
    minimize,
    product_kernel,
    surrogate_symbol,
)
from .char_nfa import build
from .errors import GrammarBudgetError

__all__ = [
    "END", "LIMIT", "MAX_DFA_STATES", "MAX_NFA_STATES", "MINIMIZE_ROUNDS", "START", "CharDFA", "accepts", "complement",
    "difference", "finite_words", "from_ir", "from_table", "intersect", "is_empty", "lengths", "load_kernels", "to_ir",
    "union", "universal",
]  # fmt: skip


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
    # C-contiguous int64 whatever the refinement's layout: the kernel compiles once per layout.
    ta = np.ascontiguousarray(np.vstack([np.where(ta < 0, na, ta), np.full((1, ta.shape[1]), na, dtype=np.int32)]), dtype=np.int64)
    tb = np.ascontiguousarray(np.vstack([np.where(tb < 0, nb, tb), np.full((1, tb.shape[1]), nb, dtype=np.int32)]), dtype=np.int64)
    acc_a = np.append(a.accepting, False)
    acc_b = np.append(b.accepting, False)
    table, codes = kernel_tier.pick(product_kernel)(ta, tb, _OPS[op], MAX_DFA_STATES)
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
    table[:, surrogate_symbol(bounds)] = -1
    return minimize(CharDFA(bounds, table, acc))


_OPS = {"and": 0, "or": 1, "diff": 2}


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
    table[:, surrogate_symbol(a.bounds)] = -1
    return minimize(CharDFA(a.bounds, table.astype(np.int32), ~np.append(a.accepting, False)))


# ---------------------------------------------------------------------------- minimization


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
    table[:, surrogate_symbol(bounds)] = -1
    return minimize(CharDFA(np.asarray(bounds, dtype=np.int64), table, np.asarray(accepting, dtype=bool)))


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
    return build(expr)
