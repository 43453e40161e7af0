"""Walking vocabulary tokens through an automaton: the one trie walk and the token-major check.

Both are compiled with numba (``nogil``): they run without the GIL, so an engine can fill masks
in a worker thread while torch runs the model's forward pass.

- :func:`walk_trie`: every token at once, depth first over the preorder trie of
  ``token_trie.py``. A node is one transition-table lookup; a rejected prefix skips its whole
  subtree. Options: record each allowed token's end state (budget-aware masks), and stop at
  configurations flagged as *exits* (a truncated stack popping into its hole, or a region's
  boundary), reporting those subtrees as ranges of sorted token positions instead of walking them;
  or walk through them and report the subtrees that die after one (from a truncated
  configuration: the tokens only the stack below the hole could accept).
- :func:`check_tokens`: listed tokens, one by one, each from its own start state and byte
  offset: the tokens that left a shared region or hit a truncation hole, checked against the
  real configuration.

The automaton is determinized lazily, so a walk can read a transition not computed yet
(``UNEXPANDED``): the kernel computes it on the spot with the compiled determinizer
(``determinizer.expand_cell``: that byte's segment of the row, not the whole row) and walks on,
so a whole mask is one call that never takes the GIL.
The caller holds the automaton's lock for the call (the determinizer changes the automaton);
walks of other grammars, and the model's forward pass, run meanwhile. Kernels allocate nothing
shared: every call gets its own work arrays.
"""

from __future__ import annotations

import contextlib
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from numba import njit

from . import determinizer as det  # the kernel cache stamp (see _drop_stale_kernels); walk_levels reads the core
from . import kernel_tier
from .automaton import DEAD as DEAD_STATE
from .automaton import UNEXPANDED, expand_cell, static_core
from .token_trie import DEPTH_SHIFT, FIELD_24, MAX_TRIE_DEPTH, SKIP_SHIFT, TOKEN_SHIFT, TokenTrie

# UNEXPANDED: a transition-table cell whose row has not been computed yet.

# Kernel status codes (io[0]); negative codes are the determinizer's budget errors.
_DONE, _GROW = 0, 2
# check_tokens outcomes.
DEAD, ALLOWED, AT_EXIT = 0, 1, 2
# Walk modes (see walk_trie).
PLAIN, STOP_AT_EXITS, DEAD_AFTER_EXITS = 0, 1, 2


class TransitionSource(Protocol):
    """What the walks need of an automaton: its compiled core, and the lock that guards it."""

    core: Any
    lock: Any

    def check_status(self, status: int) -> int:
        """Raise the budget error a negative status stands for; return the status otherwise."""
        ...


class StaticTable:
    """A complete transition table (a region's canonical table), walkable like an automaton."""

    def __init__(self, table: np.ndarray, exits: np.ndarray) -> None:
        self.core = kernel_tier.pick(static_core)(np.ascontiguousarray(table, dtype=np.int32), np.ascontiguousarray(exits, dtype=np.bool_))
        self.lock = contextlib.nullcontext()

    def check_status(self, status: int) -> int:
        assert status >= DEAD_STATE, "a static table is never expanded"
        return status


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


@njit(nogil=True, cache=True)
def _walk_kernel(core, words, first_pos, begin, end, mode, state_at, tainted, bits, ends, want_ends, ranges, io):  # pragma: no cover
    """Depth-first walk from ``state_at[0]`` over the nodes ``begin`` .. ``end`` (whole subtrees),
    from node io[1] on (resumable: ``state_at`` and
    ``tainted`` keep the path). Rows not computed yet are computed here. ``mode``: PLAIN,
    STOP_AT_EXITS (a subtree entering an exit configuration becomes a range) or DEAD_AFTER_EXITS
    (a subtree dying on a path that met an exit configuration becomes a range). ``bits``: the
    packed tokens after one spare word (token t at bit t + 32 of the array). io: [status,
    node to resume at, ranges used]; status _GROW means ``ranges`` is full, < 0 a determinizer
    budget error."""
    n = end
    i = io[1]
    nr = io[2]
    table = core.table
    exits = core.exits
    if i == begin:
        tainted[0] = exits[state_at[0]]
    while i < n:
        w = words[i]
        d = np.int64((w >> np.uint64(DEPTH_SHIFT)) & np.uint64(0xFF))
        p = state_at[d - 1]
        b = np.int64(w & np.uint64(0xFF))
        ns = table[p, b]
        if ns == UNEXPANDED:
            status = expand_cell(core, np.int64(p), np.int64(b))
            if status < 0:
                io[0], io[1], io[2] = status, i, nr
                return
            table = core.table  # the determinizer may have grown the arrays
            exits = core.exits
            ns = table[p, b]
        if ns < 0 or (mode == STOP_AT_EXITS and exits[ns]):
            skip = np.int64(w >> np.uint64(SKIP_SHIFT))
            if ns >= 0 or (mode == DEAD_AFTER_EXITS and tainted[d - 1]):
                if nr == ranges.shape[0]:
                    io[0], io[1], io[2] = _GROW, i, nr
                    return
                ranges[nr, 0] = first_pos[i]
                ranges[nr, 1] = first_pos[skip]
                ranges[nr, 2] = p
                ranges[nr, 3] = d - 1
                nr += 1
            i = skip
            continue
        # Branchless: a node without a token sets bit 31 of the spare word bits[0] (token t is
        # bit u = t + 32). Whether a token ends at a node follows no pattern the CPU can
        # predict, and the mispredicted branch took half a full walk's time.
        u = np.int64((w >> np.uint64(TOKEN_SHIFT)) & np.uint64(FIELD_24)) + 31
        bits[u >> 5] |= np.uint32(1) << np.uint32(u & 31)
        if want_ends and u >= 32:
            ends[u - 32] = ns
        state_at[d] = ns
        if mode == DEAD_AFTER_EXITS:
            tainted[d] = tainted[d - 1] | exits[ns]  # no branch, as for the bits
        i += 1
    io[0], io[1], io[2] = _DONE, n, nr


@njit(nogil=True, cache=True)
def _check_kernel(core, flat, offsets, lengths, positions, starts, skips, mode, out, ends, want_ends):  # pragma: no cover
    """Token-major: run token ``positions[k]``'s bytes from ``skips[k]`` on, starting in
    ``starts[k]``; out[k] = ALLOWED / DEAD / AT_EXIT (STOP_AT_EXITS: an exit configuration was
    entered; DEAD_AFTER_EXITS: the token died after one). Returns 0 or a determinizer status."""
    table = core.table
    exits = core.exits
    for k in range(positions.shape[0]):
        pos = positions[k]
        j = np.int64(skips[k])
        s = np.int64(starts[k])
        end = lengths[pos]
        base = offsets[pos]
        result = ALLOWED
        tainted = False
        while True:
            if exits[s]:
                if mode == STOP_AT_EXITS:
                    result = AT_EXIT
                    break
                tainted = True
            if j >= end:
                break
            b = flat[base + j]
            ns = table[s, b]
            if ns == UNEXPANDED:
                status = expand_cell(core, np.int64(s), np.int64(b))
                if status < 0:
                    return status
                table = core.table
                exits = core.exits
                ns = table[s, b]
            if ns < 0:
                result = AT_EXIT if mode == DEAD_AFTER_EXITS and tainted else DEAD
                break
            s = ns
            j += 1
        out[k] = result
        if want_ends and result == ALLOWED:
            ends[k] = s
    return 0


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


def walk_levels(core, words, first_pos, begin, end, mode, start, bits, ends, want_ends, expand=None):
    """``_walk_kernel``'s walk as numpy array operations, one trie level at a time (for a tier
    that runs before the kernels are compiled: ``_walk_kernel`` run as plain Python visits one
    node per interpreter loop, about a second per mask over a 49k vocabulary). The whole
    subtrees of nodes ``begin`` .. ``end`` from state ``start``, in one call (not resumable).
    Returns (status, ranges): status 0 or the determinizer's budget error (< 0), ``ranges`` the
    kernel's exit ranges in the kernel's order (preorder; cut subtrees never nest).

    The tokens, end states and ranges equal the kernel's; cells not computed yet are computed
    by ``expand`` level by level instead of depth first, so on a fresh automaton the new
    states are numbered in another order (the same configurations, the same set of cells).
    ``expand`` defaults to this module's ``expand_cell`` as it is at the call."""
    expand = expand_cell if expand is None else expand
    w = words[begin:end]
    depth = ((w >> np.uint64(DEPTH_SHIFT)) & np.uint64(0xFF)).astype(np.int64)
    byte = (w & np.uint64(0xFF)).astype(np.int64)
    token = ((w >> np.uint64(TOKEN_SHIFT)) & np.uint64(FIELD_24)).astype(np.int64) - 1
    skip = (w >> np.uint64(SKIP_SHIFT)).astype(np.int64)
    state = np.full(len(w), -1, dtype=np.int64)  # each continuing node's state after its byte
    taint = np.zeros(len(w), dtype=np.bool_)
    cuts: list[np.ndarray] = []  # [node, first pos, end pos, parent state, depth - 1] per range
    previous = None
    for d in range(1, int(depth.max(initial=0)) + 1):
        level = np.flatnonzero(depth == d)
        nodes = level
        if d == 1:
            pstate = np.full(len(nodes), start, dtype=np.int64)
            ptaint = np.full(len(nodes), bool(det.core_flags(core)[0][start]))
        else:
            parent = previous[np.searchsorted(previous, nodes) - 1]
            keep = state[parent] >= 0  # the parent continued (not dead, not cut)
            nodes, parent = nodes[keep], parent[keep]
            pstate, ptaint = state[parent], taint[parent]
        if not len(nodes):
            break
        table = det.core_table(core)
        ns = table[pstate, byte[nodes]].astype(np.int64)
        todo = ns == UNEXPANDED
        if todo.any():
            for p, b in np.unique(np.stack([pstate[todo], byte[nodes][todo]], axis=1), axis=0).tolist():
                if table[p, b] == UNEXPANDED:
                    status = expand(core, np.int64(p), np.int64(b))
                    if status < 0:
                        return status, _NO_RANGES[:0]
                    table = det.core_table(core)  # the determinizer may have grown the arrays
            ns = table[pstate, byte[nodes]].astype(np.int64)
        exits = det.core_flags(core)[0]
        dead = ns < 0
        stop = ~dead & (exits[np.maximum(ns, 0)] != 0) if mode == STOP_AT_EXITS else np.zeros(len(ns), dtype=np.bool_)
        ranged = stop | (dead & ptaint) if mode == DEAD_AFTER_EXITS else stop
        if ranged.any():
            cut = nodes[ranged]
            cuts.append(np.stack([cut, first_pos[begin + cut], first_pos[skip[cut]], pstate[ranged],
                                  np.full(len(cut), d - 1)], axis=1))
        go = ~dead & ~stop
        state[nodes[go]] = ns[go]
        if mode == DEAD_AFTER_EXITS:
            taint[nodes[go]] = ptaint[go] | (exits[ns[go]] != 0)
        t = token[nodes[go]]
        has = t >= 0
        t, tns = t[has], ns[go][has]
        np.bitwise_or.at(bits, t >> 5, (np.uint32(1) << (t & 31).astype(np.uint32)))
        if want_ends:
            ends[t] = tns
        previous = level
    if not cuts:
        return 0, _NO_RANGES[:0]
    table = np.concatenate(cuts)
    return 0, np.ascontiguousarray(table[np.argsort(table[:, 0], kind="stable"), 1:], dtype=np.int32)


def walk_levels_kernel(core, words, first_pos, begin, end, mode, state_at, tainted, bits, ends, want_ends, ranges, io):
    """:func:`walk_levels` behind ``_walk_kernel``'s signature and ``io`` protocol, so a walk
    driver can run either: a walk whose ranges do not fit fills ``ranges`` with the first ones
    and asks for room (_GROW), as the kernel does, and is then rerun whole (its token bits are
    idempotent)."""
    status, found = walk_levels(core, words, first_pos, begin, end, mode, int(state_at[0]), bits[1:], ends, want_ends)
    if status < 0:
        io[0], io[1], io[2] = status, begin, 0
    elif len(found) > ranges.shape[0]:
        ranges[:] = found[: ranges.shape[0]]
        io[0], io[1], io[2] = _GROW, begin, 0
    else:
        ranges[: len(found)] = found
        io[0], io[1], io[2] = _DONE, end, len(found)


# ---------------------------------------------------------------------------------- drivers


def walk_trie(
    trie: TokenTrie, source: TransitionSource, state: int, *, end_states: bool = False, mode: int = PLAIN,
    max_ranged_tokens: int | None = None, first_bytes: np.ndarray | None = None,
) -> TrieWalk | None:
    """All tokens allowed from ``state`` (EOS excluded), walking on through exit configurations
    (``PLAIN``), stopping at them (``STOP_AT_EXITS``: the subtrees that enter one become
    ``exit_ranges``), or reporting the subtrees that die on a path that met one
    (``DEAD_AFTER_EXITS``: from a truncated configuration, the tokens that only the stack below
    the hole could accept). With ``first_bytes``, only the tokens starting with one of those
    bytes are walked. Tokens too long for the trie are checked token-major. Returns None once
    the ranges hold more than ``max_ranged_tokens`` tokens (the walk stops there)."""
    ranged = mode != PLAIN
    spare_and_bits = np.zeros(trie.width + 1, dtype=np.uint32)  # the kernel's spare word first
    bits = spare_and_bits[1:]
    ends = np.full(trie.vocab_size, -1, dtype=np.int32) if end_states else _NO_INT32
    ranges = np.empty((256, 4), dtype=np.int32) if ranged else _NO_RANGES
    state_at = np.empty(MAX_TRIE_DEPTH + 1, dtype=np.int32)
    tainted = np.zeros(MAX_TRIE_DEPTH + 1, dtype=np.bool_)
    io = np.zeros(3, dtype=np.int64)
    if first_bytes is None:
        spans = [(0, len(trie.words))]
    else:
        first_bytes = np.asarray(first_bytes, dtype=np.int64)
        spans = [(b, e) for b, e in trie.first_byte_nodes[first_bytes].tolist() if e > b]
    with source.lock:
        for begin, end in spans:
            state_at[0] = state
            io[0], io[1] = _DONE, begin
            while True:
                kernel_tier.pick_for(source.core, _walk_kernel)(source.core, trie.words, trie.first_pos, begin, end, mode, state_at, tainted, spare_and_bits, ends,
                             end_states, ranges, io)
                if io[0] == _DONE:
                    break
                if io[0] != _GROW:
                    source.check_status(int(io[0]))
                if max_ranged_tokens is not None and int((ranges[:, 1] - ranges[:, 0]).sum()) > max_ranged_tokens:
                    return None
                ranges = np.concatenate([ranges, np.empty_like(ranges)])
    exit_ranges = ranges[: int(io[2])] if ranged else None
    if len(trie.long_pos):
        long_pos = trie.long_pos
        if first_bytes is not None:
            long_pos = long_pos[np.isin(trie.flat[trie.sorted_offset[long_pos]], first_bytes)]
        exit_ranges = _walk_long_tokens(trie, source, state, long_pos, bits, ends if end_states else None, exit_ranges, mode)
    add_duplicates(trie, bits, ends if end_states else None)
    return TrieWalk(bits, ends if end_states else None, exit_ranges)


def _walk_long_tokens(trie: TokenTrie, source, state: int, pos: np.ndarray, bits, ends, exit_ranges, mode: int):
    if not len(pos):
        return exit_ranges
    outcome, end = check_tokens(trie, source, pos, np.full(len(pos), state, dtype=np.int32), None, mode=mode,
                                end_states=ends is not None)
    ok = outcome == ALLOWED
    kernel_tier.pick(set_token_bits)(bits, trie.sorted_ids[pos[ok]])
    if ends is not None:
        ends[trie.sorted_ids[pos[ok]]] = end[ok]
    if exit_ranges is not None:
        # Whole tokens, re-checked from the start: a range of one token at offset 0.
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
    mode: int = PLAIN,
    end_states: bool = False,
) -> tuple[np.ndarray, np.ndarray | None]:
    """(outcome int8 per token: ALLOWED / DEAD / AT_EXIT, end state per token or None) of the
    sorted tokens ``positions``, each run from byte ``skips[k]`` (default 0) in state ``starts[k]``;
    ``mode`` as for :func:`walk_trie` (AT_EXIT: stopped at, or died after, an exit configuration)."""
    positions = np.ascontiguousarray(positions, dtype=np.int32)
    n = len(positions)
    starts = np.ascontiguousarray(starts, dtype=np.int32)
    skips = np.zeros(n, dtype=np.int32) if skips is None else np.ascontiguousarray(skips, dtype=np.int32)
    out = np.zeros(n, dtype=np.int8)
    ends = np.full(n, -1, dtype=np.int32) if end_states else _NO_INT32
    if n:
        with source.lock:
            status = kernel_tier.pick_for(source.core, _check_kernel)(source.core, trie.flat, trie.sorted_offset, trie.sorted_len, positions, starts, skips,
                                   mode, out, ends, end_states)
        source.check_status(int(status))
    return out, (ends if end_states else None)


def add_duplicates(trie: TokenTrie, bits: np.ndarray, ends: np.ndarray | None = None) -> None:
    """Set the bits (and end states) of tokens whose bytes equal an allowed token's."""
    if len(trie.dup_src):
        kernel_tier.pick(_copy_duplicates)(bits, _NO_INT32 if ends is None else ends, ends is not None, trie.dup_src, trie.dup_dst)


# Modules whose kernels inline the determinizer's functions (their numba cache files share the
# package's cache folder with this one).
INLINING_DETERMINIZER = ("token_walk", "regions")


def _drop_stale_kernels() -> None:
    """numba keys a cached kernel by the stamp of its own source file only, while the kernels
    here and in ``regions.py`` inline the determinizer's functions: after an edit of
    ``determinizer.py`` their cached machine code would still hold the old determinizer (and
    crash on a changed layout). A stamp of that file beside the cache drops them when it
    changes."""
    cache = getattr(_walk_kernel, "_cache", None)
    folder = getattr(cache, "cache_path", None)
    if folder is None:
        return
    try:
        stamp = hashlib.sha256(Path(det.__file__).read_bytes()).hexdigest()
        marker = Path(folder) / "token_walk.determinizer-stamp"
        if marker.is_file() and marker.read_text() == stamp:
            return
        for module in INLINING_DETERMINIZER:
            for stale in Path(folder).glob(f"{module}.*.nb[ic]"):
                stale.unlink(missing_ok=True)
        marker.write_text(stamp)
    except OSError:  # a read-only install: numba keeps its own cache elsewhere, or none
        return


_drop_stale_kernels()
