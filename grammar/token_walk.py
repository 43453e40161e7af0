"""Walking vocabulary tokens through an automaton: the one trie walk and the token-major check.

Both are compiled with numba (``nogil``): they run without the GIL, so an engine can fill masks
in a worker thread while torch runs the model's forward pass. Every kernel has one explicit
signature: it is compiled (or loaded from numba's cache) when this module is imported, never in
the middle of a request, and an argument of the wrong dtype is an error, not a new compilation.

- :func:`walk_trie`: every token at once, depth first over the preorder trie of
  ``token_trie.py``. A node is one transition-table lookup; a rejected prefix skips its whole
  subtree. Options: record each allowed token's end state (budget-aware masks), and stop at
  configurations flagged as *exits* (a truncated stack popping into its hole, or a region's
  boundary), reporting those subtrees as ranges of sorted token positions instead of walking them.
- :func:`check_tokens`: listed tokens, one by one, each from its own start state and byte
  offset: the tokens that left a shared region or hit a truncation hole, checked against the
  real configuration.

The automaton is determinized lazily, cell by cell, so a walk can read a transition that does not
exist yet (``UNEXPANDED``). The kernel does not stop there: it notes the cell and the subtree
(or token) behind it and walks on. Then the Python driver computes all the noted cells in one
batch (under the automaton's lock) and the kernel walks the noted subtrees, round after round
until none is left: few Python round trips, however many new configurations a walk discovers.
Kernels allocate nothing shared: every call gets its own small work arrays, so concurrent walks
(several threads, one grammar or many) never interfere.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
from numba import njit

from .token_trie import DEPTH_SHIFT, FIELD_24, MAX_TRIE_DEPTH, SKIP_SHIFT, TOKEN_SHIFT, TokenTrie

UNEXPANDED = -2  # a transition-table cell whose row has not been computed yet

# Kernel status codes (io[0]).
_DONE, _GROW = 0, 2
# check_tokens outcomes.
DEAD, ALLOWED, AT_EXIT = 0, 1, 2


class TransitionSource(Protocol):
    """What the walks need of an automaton: its current arrays, and a way to fill cells."""

    def transition_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(table int32 [states, 256], exits bool [states]), one consistent snapshot."""
        ...

    def resolve_many(self, cells: np.ndarray) -> None:
        """Compute the table cells (state, byte) of each row of ``cells`` that are UNEXPANDED."""
        ...


class StaticTable:
    """A complete transition table (a region's canonical table), walkable like an automaton."""

    def __init__(self, table: np.ndarray, exits: np.ndarray) -> None:
        self._arrays = (np.ascontiguousarray(table, dtype=np.int32), np.ascontiguousarray(exits, dtype=np.bool_))

    def transition_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        return self._arrays

    def resolve_many(self, cells: np.ndarray) -> None:
        assert len(cells) == 0, "a static table has no cells to compute"


@dataclass
class TrieWalk:
    """What one walk found: allowed tokens (EOS never included) and what was asked for besides."""

    bits: np.ndarray  # uint32 [width]: packed allowed tokens
    end_states: np.ndarray | None = None  # int32 [vocab]: state after each allowed token, else -1
    # int32 [k, 4]: (first position, end position, state before the byte, byte offset) of each
    # subtree that entered an exit configuration; None unless the walk stopped at exits.
    exit_ranges: np.ndarray | None = None


_NO_INT32 = np.zeros(1, dtype=np.int32)
_NO_RANGES = np.zeros((1, 4), dtype=np.int32)


# ---------------------------------------------------------------------------------- kernels


@njit("Tuple((uint64[::1], int32[::1]))(uint8[::1], int64[::1], int32[::1], int32[::1], int64)", nogil=True, cache=True)
def build_trie_nodes(flat, offsets, lengths, ids, n):  # pragma: no cover - compiled
    """Preorder node words and first positions of the first ``n`` (sorted, distinct) tokens."""
    total = 0
    prev_len = 0
    for i in range(n):
        lcp = 0
        if i > 0:
            a, b = offsets[i - 1], offsets[i]
            m = min(prev_len, lengths[i])
            while lcp < m and flat[a + lcp] == flat[b + lcp]:
                lcp += 1
        total += lengths[i] - lcp
        prev_len = lengths[i]
    words = np.zeros(total, dtype=np.uint64)
    first_pos = np.empty(total + 1, dtype=np.int32)
    depth = np.empty(total, dtype=np.int32)
    k = 0
    prev_len = 0
    for i in range(n):
        lcp = 0
        if i > 0:
            a, b = offsets[i - 1], offsets[i]
            m = min(prev_len, lengths[i])
            while lcp < m and flat[a + lcp] == flat[b + lcp]:
                lcp += 1
        for d in range(lcp, lengths[i]):
            words[k] = np.uint64(flat[offsets[i] + d]) | (np.uint64(d + 1) << np.uint64(DEPTH_SHIFT))
            depth[k] = d + 1
            first_pos[k] = i
            k += 1
        words[k - 1] |= np.uint64(ids[i] + 1) << np.uint64(TOKEN_SHIFT)
        prev_len = lengths[i]
    first_pos[total] = n
    # skip[k]: the first later node no deeper than k (the end of k's subtree), via a stack.
    stack = np.empty(total + 1, dtype=np.int64)
    top = 0
    for k in range(total):
        while top > 0 and depth[stack[top - 1]] >= depth[k]:
            words[stack[top - 1]] |= np.uint64(k) << np.uint64(SKIP_SHIFT)
            top -= 1
        stack[top] = k
        top += 1
    while top > 0:
        words[stack[top - 1]] |= np.uint64(total) << np.uint64(SKIP_SHIFT)
        top -= 1
    return words, first_pos


@njit("int64(int64[::1], int64)", nogil=True, cache=True)
def _add_cell(cells, key):  # pragma: no cover
    """Insert ``key`` (state * 256 + byte) into the open-addressing set ``cells`` (size a power
    of two, -1 = empty, at most half full); 1 if it was new."""
    mask = cells.shape[0] - 1
    h = (key * 0x9E3779B97F4A7C15) & mask
    while cells[h] != -1:
        if cells[h] == key:
            return 0
        h = (h + 1) & mask
    cells[h] = key
    return 1


@njit(
    "void(uint64[::1], int32[::1], int32[:, ::1], boolean[::1], boolean, int32[:, ::1], int32[::1], uint32[::1], "
    "int32[::1], boolean, int32[:, ::1], int32[:, ::1], int64[::1], int32[:, ::1], int64[::1])",
    nogil=True,
    cache=True,
)
def _walk_kernel(words, first_pos, table, exits, stop_at_exits, tasks, state_at, bits, ends, want_ends, ranges, pending,
                 cell_set, cell_list, io):  # pragma: no cover
    """Walk each task's nodes: task k covers nodes [tasks[k, 0], tasks[k, 1]) below a node in
    state tasks[k, 2]. A cell not computed yet (UNEXPANDED) is not waited for: the subtree
    behind it becomes a task of the next round in ``pending`` and is skipped, and the cell is
    listed once in ``cell_list`` (``cell_set`` dedupes, see _add_cell) for the driver to
    compute. io: [status, task, node to resume at or -1, ranges used, pending used, cells
    listed]; status _GROW means a buffer is full (the driver grows it, the kernel resumes)."""
    n_states = table.shape[0]
    nr = io[3]
    npend = io[4]
    ncells = io[5]
    k = io[1]
    while k < tasks.shape[0]:
        end = tasks[k, 1]
        if io[2] >= 0:
            i = io[2]
            io[2] = -1
        else:
            i = np.int64(tasks[k, 0])
            state_at[np.int64((words[i] >> np.uint64(DEPTH_SHIFT)) & np.uint64(0xFF)) - 1] = tasks[k, 2]
        while i < end:
            w = words[i]
            d = np.int64((w >> np.uint64(DEPTH_SHIFT)) & np.uint64(0xFF))
            p = state_at[d - 1]
            b = np.int64(w & np.uint64(0xFF))
            ns = table[p, b]
            if ns == UNEXPANDED or ns >= n_states:  # not computed yet (or a newer cell than this snapshot)
                if npend == pending.shape[0] or ncells == cell_list.shape[0] or 2 * (ncells + 1) > cell_set.shape[0]:
                    io[0], io[1], io[2], io[3], io[4], io[5] = _GROW, k, i, nr, npend, ncells
                    return
                skip = np.int64(w >> np.uint64(SKIP_SHIFT))
                pending[npend, 0] = i
                pending[npend, 1] = skip
                pending[npend, 2] = p
                npend += 1
                if _add_cell(cell_set, np.int64(p) * 256 + b):
                    cell_list[ncells, 0] = p
                    cell_list[ncells, 1] = b
                    ncells += 1
                i = skip
                continue
            if ns < 0:
                i = np.int64(w >> np.uint64(SKIP_SHIFT))
                continue
            if stop_at_exits and exits[ns]:
                if nr == ranges.shape[0]:
                    io[0], io[1], io[2], io[3], io[4], io[5] = _GROW, k, i, nr, npend, ncells
                    return
                skip = np.int64(w >> np.uint64(SKIP_SHIFT))
                ranges[nr, 0] = first_pos[i]
                ranges[nr, 1] = first_pos[skip]
                ranges[nr, 2] = p
                ranges[nr, 3] = d - 1
                nr += 1
                i = skip
                continue
            t = np.int64((w >> np.uint64(TOKEN_SHIFT)) & np.uint64(FIELD_24)) - 1
            if t >= 0:
                bits[t >> 5] |= np.uint32(1) << np.uint32(t & 31)
                if want_ends:
                    ends[t] = ns
            state_at[d] = ns
            i += 1
        k += 1
    io[0], io[1], io[2], io[3], io[4], io[5] = _DONE, k, -1, nr, npend, ncells


def _grown_cell_set(cell_set: np.ndarray) -> np.ndarray:
    out = np.full(2 * len(cell_set), -1, dtype=np.int64)
    for key in cell_set[cell_set >= 0].tolist():
        _add_cell(out, key)
    return out


@njit(
    "int64(uint8[::1], int64[::1], int32[::1], int32[::1], int32[:, ::1], int32[:, ::1], boolean[::1], boolean, int8[::1], "
    "int32[::1], boolean, int32[:, ::1])",
    nogil=True,
    cache=True,
)
def _check_kernel(flat, offsets, lengths, positions, todo, table, exits, stop_at_exits, out, ends, want_ends, pending):  # pragma: no cover
    """Token-major: for each (k, byte offset j, state s) of ``todo``, run token
    ``positions[k]``'s bytes from j on, starting in s; out[k] = ALLOWED / DEAD / AT_EXIT. A cell
    not computed yet sends (k, j, s) to ``pending`` (as long as ``todo``). Returns how many."""
    n_states = table.shape[0]
    npend = 0
    for r in range(todo.shape[0]):
        k = todo[r, 0]
        j = np.int64(todo[r, 1])
        s = np.int64(todo[r, 2])
        pos = positions[k]
        end = lengths[pos]
        base = offsets[pos]
        result = ALLOWED
        while True:
            if stop_at_exits and exits[s]:
                result = AT_EXIT
                break
            if j >= end:
                break
            ns = table[s, flat[base + j]]
            if ns == UNEXPANDED or ns >= n_states:
                result = -1
                break
            if ns < 0:
                result = DEAD
                break
            s = ns
            j += 1
        if result < 0:
            pending[npend, 0], pending[npend, 1], pending[npend, 2] = k, j, s
            npend += 1
            continue
        out[k] = result
        if want_ends and result == ALLOWED:
            ends[k] = s
    return npend


@njit("void(uint32[::1], int32[::1], boolean, int32[::1], int32[::1])", nogil=True, cache=True)
def _copy_duplicates(bits, ends, want_ends, dup_src, dup_dst):  # pragma: no cover
    """Tokens with the bytes of an allowed token are allowed too (with its end state)."""
    for k in range(dup_src.shape[0]):
        s, d = dup_src[k], dup_dst[k]
        if (bits[s >> 5] >> np.uint32(s & 31)) & np.uint32(1):
            bits[d >> 5] |= np.uint32(1) << np.uint32(d & 31)
            if want_ends:
                ends[d] = ends[s]


@njit("void(uint32[::1], int32[::1])", nogil=True, cache=True)
def set_token_bits(bits, ids):  # pragma: no cover
    """bits |= the tokens ``ids`` (any integer dtype)."""
    for k in range(ids.shape[0]):
        t = ids[k]
        bits[t >> 5] |= np.uint32(1) << np.uint32(t & 31)


@njit("Tuple((int32[::1], int32[::1], int32[::1]))(int32[:, ::1])", nogil=True, cache=True)
def range_positions(ranges):  # pragma: no cover
    """Every position of the ranges' [first, end) runs, with each run's state and offset."""
    total = 0
    for r in range(ranges.shape[0]):
        total += ranges[r, 1] - ranges[r, 0]
    pos = np.empty(total, dtype=np.int32)
    state = np.empty(total, dtype=np.int32)
    offset = np.empty(total, dtype=np.int32)
    k = 0
    for r in range(ranges.shape[0]):
        for p in range(ranges[r, 0], ranges[r, 1]):
            pos[k], state[k], offset[k] = p, ranges[r, 2], ranges[r, 3]
            k += 1
    return pos, state, offset


# ---------------------------------------------------------------------------------- drivers


def walk_trie(
    trie: TokenTrie, source: TransitionSource, state: int, *, end_states: bool = False, stop_at_exits: bool = False
) -> TrieWalk:
    """All tokens allowed from ``state`` (EOS excluded); see the module docstring. Tokens too long
    for the trie are checked token-major (and, when stopping at exits, may be reported there)."""
    bits = np.zeros(trie.width, dtype=np.uint32)
    ends = np.full(trie.vocab_size, -1, dtype=np.int32) if end_states else _NO_INT32
    ranges = np.empty((256, 4), dtype=np.int32) if stop_at_exits else _NO_RANGES
    state_at = np.empty(MAX_TRIE_DEPTH + 1, dtype=np.int32)
    tasks = np.array([[0, len(trie.words), state]], dtype=np.int32)
    pending = np.empty((256, 3), dtype=np.int32)
    cell_set = np.empty(4096, dtype=np.int64)
    cell_list = np.empty((1024, 2), dtype=np.int32)
    used = 0
    while True:
        cell_set.fill(-1)
        io = np.array([0, 0, -1, used, 0, 0], dtype=np.int64)
        while True:
            table, exits = source.transition_arrays()
            _walk_kernel(trie.words, trie.first_pos, table, exits, stop_at_exits, tasks, state_at, bits, ends, end_states,
                         ranges, pending, cell_set, cell_list, io)
            if io[0] == _DONE:
                break
            if io[3] == len(ranges) and stop_at_exits:
                ranges = np.concatenate([ranges, np.empty_like(ranges)])
            if io[4] == len(pending):
                pending = np.concatenate([pending, np.empty_like(pending)])
            if io[5] == len(cell_list):
                cell_list = np.concatenate([cell_list, np.empty_like(cell_list)])
            if 2 * (io[5] + 1) > len(cell_set):
                cell_set = _grown_cell_set(cell_set)
        used = int(io[3])
        if io[4] == 0:
            break
        # Compute this round's missing cells in one batch, then walk the subtrees behind them.
        source.resolve_many(cell_list[: int(io[5])])
        tasks, pending = pending[: int(io[4])], np.empty_like(pending)
    exit_ranges = ranges[:used] if stop_at_exits else None
    if len(trie.long_pos):
        exit_ranges = _walk_long_tokens(trie, source, state, bits, ends if end_states else None, exit_ranges)
    add_duplicates(trie, bits, ends if end_states else None)
    return TrieWalk(bits, ends if end_states else None, exit_ranges)


def _walk_long_tokens(trie: TokenTrie, source, state: int, bits, ends, exit_ranges):
    pos = trie.long_pos
    outcome, end = check_tokens(trie, source, pos, np.full(len(pos), state, dtype=np.int32), None,
                                stop_at_exits=exit_ranges is not None, end_states=ends is not None)
    ok = outcome == ALLOWED
    set_token_bits(bits, trie.sorted_ids[pos[ok]])
    if ends is not None:
        ends[trie.sorted_ids[pos[ok]]] = end[ok]
    if exit_ranges is not None:
        # Whole tokens, re-checked from the start: an exit range of one token at offset 0.
        hit = pos[outcome == AT_EXIT]
        extra = np.stack([hit, hit + 1, np.full(len(hit), state), np.zeros(len(hit))], axis=1).astype(np.int32)
        exit_ranges = np.concatenate([exit_ranges, extra])
    return exit_ranges


def check_tokens(
    trie: TokenTrie,
    source: TransitionSource,
    positions: np.ndarray,
    starts: np.ndarray,
    skips: np.ndarray | None = None,
    *,
    stop_at_exits: bool = False,
    end_states: bool = False,
) -> tuple[np.ndarray, np.ndarray | None]:
    """(outcome int8 per token: ALLOWED / DEAD / AT_EXIT, end state per token or None) of the
    sorted tokens ``positions``, each run from byte ``skips[k]`` (default 0) in state ``starts[k]``."""
    positions = np.ascontiguousarray(positions, dtype=np.int32)
    n = len(positions)
    out = np.zeros(n, dtype=np.int8)
    ends = np.full(n, -1, dtype=np.int32) if end_states else _NO_INT32
    todo = np.empty((n, 3), dtype=np.int32)
    todo[:, 0] = np.arange(n)
    todo[:, 1] = 0 if skips is None else skips
    todo[:, 2] = starts
    pending = np.empty_like(todo)
    while len(todo):
        table, exits = source.transition_arrays()
        count = _check_kernel(trie.flat, trie.sorted_offset, trie.sorted_len, positions, todo, table, exits,
                              stop_at_exits, out, ends, end_states, pending)
        todo = pending[:count].copy()
        if count:
            pos = positions[todo[:, 0]]
            keys = todo[:, 2].astype(np.int64) * 256 + trie.flat[trie.sorted_offset[pos] + todo[:, 1]]
            keys = np.sort(keys)
            keys = keys[np.concatenate([[True], keys[1:] != keys[:-1]])]
            source.resolve_many(np.stack([keys >> 8, keys & 255], axis=1).astype(np.int32))
    return out, (ends if end_states else None)


def add_duplicates(trie: TokenTrie, bits: np.ndarray, ends: np.ndarray | None = None) -> None:
    """Set the bits (and end states) of tokens whose bytes equal an allowed token's."""
    if len(trie.dup_src):
        _copy_duplicates(bits, _NO_INT32 if ends is None else ends, ends is not None, trie.dup_src, trie.dup_dst)
