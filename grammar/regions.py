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
    loops, lo, hi = automaton.row_shape(state)
    if loops >= MIN_LOOP_BYTES:
        return _region_from(automaton, state)
    if lo < 0x80 or hi >= 0xC0:  # (also when nothing is live: lo == -1)
        return None
    home = _home_after_continuations(automaton, state)
    if home is None or automaton.row_shape(home)[0] < MIN_LOOP_BYTES:
        return None
    region = _region_from(automaton, home)
    if region is None or state not in region.states:
        return None
    return Region(region.states, region.canonical, int(np.flatnonzero(region.states == state)[0]))


def _home_after_continuations(automaton, state: int) -> int | None:
    """The state reached after the continuation bytes of a multi-byte character."""
    for _ in range(3):
        automaton.expand(state)
        row = automaton.table[state]
        live = np.flatnonzero(row >= 0)
        if not len(live) or live.min() < 0x80 or live.max() >= 0xC0:
            return state
        state = int(row[live[0]])
    return None


def _region_from(automaton, home: int) -> Region | None:
    states = [home]
    index = {home: 0}
    i = 0
    while i < len(states):
        automaton.expand(states[i])
        row = automaton.table[states[i]]
        # Multi-byte characters: lead bytes from home, continuation bytes from middle states.
        span = row[0x80:] if i == 0 else row[0x80:0xC0]
        for t in np.unique(span[span >= 0]).tolist():
            if t not in index:
                if len(states) >= MAX_REGION:
                    return None
                index[t] = len(states)
                states.append(t)
        i += 1
    sub = automaton.table[states]
    canonical = np.full(sub.shape, EXIT, dtype=np.int32)
    canonical[sub < 0] = DEAD
    for t, k in index.items():
        canonical[sub == t] = k
    return Region(np.array(states, dtype=np.int32), canonical, 0)


def split_region(trie: TokenTrie, region: Region) -> RegionSplit:
    """Walk the vocabulary over the region's shape once (EXIT becomes an extra state flagged as
    an exit, so the walk reports each leaving subtree with its region state and byte offset)."""
    size = region.canonical.shape[0]
    table = np.full((size + 1, 256), DEAD, dtype=np.int32)
    table[:size] = np.where(region.canonical == EXIT, size, region.canonical)
    exits = np.zeros(size + 1, dtype=np.bool_)
    exits[size] = True
    walk = walk_trie(trie, StaticTable(table, exits), region.index, mode=STOP_AT_EXITS)
    pos, start, offset = range_positions(walk.exit_ranges)
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
        set_token_bits(bits, trie.sorted_ids[split.exit_pos[outcome == ALLOWED]])
        uncertain = split.exit_pos[outcome == AT_EXIT].astype(np.int32)
    add_duplicates(trie, bits)
    return bits, uncertain
