"""String-like regions: masks shared across states and grammars by the shape of a free string.

Most expensive states are "inside a free string": the automaton loops on almost every
character, so a trie walk visits nearly the whole vocabulary. For such a state we take its
*region* R: the looping state plus the states its multi-byte UTF-8 characters pass through,
with every transition leaving R marked EXIT. Numbered canonically, R's transition table (its
*shape*) no longer mentions the grammar: a JSON string body, a key under
``additionalProperties`` and a regex's free text each have one shape, whatever surrounds them.

Per shape and vocabulary, one walk over the shape's table splits the tokens (:class:`RegionSplit`):
those that never leave R (allowed outright), those that die, and those that leave R at a known
region state and byte offset. A state's mask is then the shared "inside" row plus a token-major
check of only the leaving tokens from the real states, which is where the grammar's own
continuation (the closing quote and what follows it) comes in.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from . import kernel_tier
from .automaton import expand_row, row_shape
from .token_trie import TokenTrie
from .token_walk import ALLOWED, AT_EXIT, PLAIN, STOP_AT_EXITS, StaticTable, add_duplicates, check_tokens, range_positions, set_token_bits, walk_trie

# A state is string-like when it loops on at least this many bytes...
MIN_LOOP_BYTES = 64
# ...and its split is used when the tokens leaving the region are at most this share.
MAX_EXCEPTION_SHARE = 0.8
# A region is at most this many states (the loop and its UTF-8 middle states).
MAX_REGION = 12
EXIT = -3
DEAD = -1


@dataclass(frozen=True, eq=False)
class Region:
    """A string-like region of one automaton, seen from one of its states."""

    states: np.ndarray  # int32 [R]: automaton states; states[0] is the looping one
    canonical: np.ndarray  # int32 [R, 256]: region index, DEAD or EXIT
    index: int  # this state's index in ``states``

    @property
    def shape_key(self) -> tuple[bytes, int]:
        """What the split depends on: the shape and where in it the walk starts."""
        return self.canonical.tobytes(), self.index


@dataclass(frozen=True, eq=False)
class RegionSplit:
    """How the vocabulary falls apart in one region shape, from one region state."""

    worth_it: bool  # False: too many tokens leave the region; walk the trie instead
    inside: np.ndarray  # uint32 [width]: tokens that never leave the region (nor die)
    exit_pos: np.ndarray  # int32: sorted positions of the tokens that leave it...
    exit_from: np.ndarray  # int32: ...from this region index...
    exit_offset: np.ndarray  # int32: ...on their byte at this offset

    @property
    def nbytes(self) -> int:
        return self.inside.nbytes + self.exit_pos.nbytes + self.exit_from.nbytes + self.exit_offset.nbytes


def find_region(automaton, state: int) -> Region | None:
    """The region ``state`` belongs to (as its looping state or a UTF-8 middle state), or None."""
    with automaton.lock:
        status, states, canonical, index = kernel_tier.pick_for(automaton.core, _find_region_kernel)(automaton.core, state, MIN_LOOP_BYTES, MAX_REGION)
    automaton.check_status(int(status))
    if not len(states):
        return None
    return Region(states, canonical, int(index))


# Every state a region search meets has its row computed, so the search is one compiled call
# (it runs for most new states of a grammar: in Python its row reads cost more than the rows).


@njit(nogil=True, cache=True)
def _find_region_kernel(c, state, min_loop, max_region):  # pragma: no cover
    """(status, region states, canonical table, index of ``state``); no states when ``state``
    is in no region. A state is a region's home when it loops on at least ``min_loop`` bytes;
    a state whose live bytes are all UTF-8 continuation bytes belongs to the region of the home
    its continuations lead to, if any."""
    none = np.zeros(0, np.int32)
    no_table = np.zeros((0, 256), np.int32)
    status, loops, lo, hi = row_shape(c, state)
    if status < 0:
        return status, none, no_table, 0
    home = state
    if loops < min_loop:
        if lo < 0x80 or hi >= 0xC0:  # (also when nothing is live: lo == -1)
            return 0, none, no_table, 0
        home = -1
        s = state
        for _ in range(3):  # the state after the continuation bytes of a multi-byte character
            status = expand_row(c, np.int64(s))
            if status < 0:
                return status, none, no_table, 0
            first = -1
            last = -1
            for b in range(256):
                if c.table[s, b] >= 0:
                    if first < 0:
                        first = b
                    last = b
            if first < 0 or first < 0x80 or last >= 0xC0:
                home = s
                break
            s = c.table[s, first]
        if home < 0:
            return 0, none, no_table, 0
        status, loops, lo, hi = row_shape(c, home)
        if status < 0:
            return status, none, no_table, 0
        if loops < min_loop:
            return 0, none, no_table, 0
    # The home and the middle states of its multi-byte characters (lead bytes from the home,
    # continuation bytes from middle states), numbered in the order found, each state's new
    # targets in ascending order: the numbering the shape's key depends on.
    states = np.empty(max_region, np.int32)
    states[0] = home
    n = 1
    found = np.empty(256, np.int32)
    i = 0
    while i < n:
        status = expand_row(c, np.int64(states[i]))
        if status < 0:
            return status, none, no_table, 0
        top = 0x100 if i == 0 else 0xC0
        k = 0
        for b in range(0x80, top):
            t = c.table[states[i], b]
            if t >= 0:
                known = False
                for j in range(n):
                    if states[j] == t:
                        known = True
                        break
                for j in range(k):
                    if found[j] == t:
                        known = True
                        break
                if not known:
                    found[k] = t
                    k += 1
        found[:k].sort()
        for j in range(k):
            if n >= max_region:
                return 0, none, no_table, 0
            states[n] = found[j]
            n += 1
        i += 1
    canonical = np.empty((n, 256), np.int32)
    index = -1
    for r in range(n):
        if states[r] == state:
            index = r
        for b in range(256):
            t = c.table[states[r], b]
            v = EXIT
            if t < 0:
                v = DEAD
            else:
                for j in range(n):
                    if states[j] == t:
                        v = j
                        break
            canonical[r, b] = v
    if index < 0:  # the continuations led to a home whose region does not hold the state
        return 0, none, no_table, 0
    return 0, states[:n].copy(), canonical, index


def split_region(trie: TokenTrie, region: Region) -> RegionSplit:
    """Walk the vocabulary over the region's shape once (EXIT becomes an extra state flagged as
    an exit, so the walk reports each leaving subtree with its region state and byte offset)."""
    size = region.canonical.shape[0]
    table = np.full((size + 1, 256), DEAD, dtype=np.int32)
    table[:size] = np.where(region.canonical == EXIT, size, region.canonical)
    exits = np.zeros(size + 1, dtype=np.bool_)
    exits[size] = True
    walk = walk_trie(trie, StaticTable(table, exits), region.index, mode=STOP_AT_EXITS)
    pos, start, offset = kernel_tier.pick(range_positions)(walk.exit_ranges)
    worth_it = len(pos) <= MAX_EXCEPTION_SHARE * trie.num_tokens
    if not worth_it:
        empty = np.zeros(0, dtype=np.int32)
        return RegionSplit(False, np.zeros(0, dtype=np.uint32), empty, empty, empty)
    return RegionSplit(True, walk.bits, pos, start, offset)


def region_mask(trie: TokenTrie, automaton, region: Region, split: RegionSplit, *, mode: int = PLAIN) -> tuple[np.ndarray, np.ndarray]:
    """(packed allowed tokens, uint32, EOS excluded; sorted positions of the leaving tokens that
    died after an exit) of ``region``'s state from its shape's split: the inside row plus the
    leaving tokens that survive from the region's states. ``mode`` DEAD_AFTER_EXITS for a
    truncated region (see ``token_walk``); the second array is empty otherwise."""
    bits = split.inside.copy()
    uncertain = np.zeros(0, dtype=np.int32)
    if len(split.exit_pos):
        outcome, _ = check_tokens(trie, automaton, split.exit_pos, region.states[split.exit_from], split.exit_offset, mode=mode)
        kernel_tier.pick(set_token_bits)(bits, trie.sorted_ids[split.exit_pos[outcome == ALLOWED]])
        uncertain = split.exit_pos[outcome == AT_EXIT].astype(np.int32)
    add_duplicates(trie, bits)
    return bits, uncertain
