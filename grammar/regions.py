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

A string under maxLength loops nowhere: each character steps to the next state of a *counted
chain*. Seen with its next state taken for itself, a chain state has the free string's shape, so
the same split serves it for every token no longer than the run of proved copies ahead of it
(:class:`Chain`, ``find_chain``, ``chain_mask``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from . import kernel_tier
from .automaton import UNEXPANDED, expand_cell, expand_row, row_shape
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
NO_ALIAS = -5  # (a region search without a counted chain's next state)
I64 = np.int64


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
    status, states, canonical = _region_table(c, I64(home), I64(NO_ALIAS), max_region)
    if status < 0 or not len(states):
        return status, none, no_table, 0
    index = -1
    for r in range(len(states)):
        if states[r] == state:
            index = r
    if index < 0:  # the continuations led to a home whose region does not hold the state
        return 0, none, no_table, 0
    return 0, states, canonical, index


@njit(nogil=True, cache=True)
def _region_table(c, home, alias, max_region):  # pragma: no cover
    """(status, states, canonical table) of the region whose looping state is ``home``, no states
    past ``max_region``. A target equal to ``alias`` counts as the home itself (a counted chain's
    next state, see ``_chain_start_kernel``; NO_ALIAS for none)."""
    none = np.zeros(0, np.int32)
    no_table = np.zeros((0, 256), np.int32)
    # The home and the middle states of its multi-byte characters (lead bytes from the home,
    # continuation bytes from middle states), numbered in the order found, each state's new
    # targets in ascending order: the numbering the shape's key depends on.
    states = np.empty(max_region, np.int32)
    states[0] = home
    n = 1
    found = np.empty(256, np.int32)
    i = 0
    while i < n:
        status = expand_row(c, I64(states[i]))
        if status < 0:
            return status, none, no_table
        top = 0x100 if i == 0 else 0xC0
        k = 0
        for b in range(0x80, top):
            t = c.table[states[i], b]
            if t >= 0 and t != alias:
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
                return 0, none, no_table
            states[n] = found[j]
            n += 1
        i += 1
    canonical = np.empty((n, 256), np.int32)
    for r in range(n):
        for b in range(256):
            t = c.table[states[r], b]
            v = EXIT
            if t < 0:
                v = DEAD
            elif t == alias:
                v = 0
            else:
                for j in range(n):
                    if states[j] == t:
                        v = j
                        break
            canonical[r, b] = v
    return 0, states[:n].copy(), canonical


# ---------------------------------------------------------------------------------- counted chains
#
# A string with maxLength (a counted repeat of one shared character rule) has no looping state:
# after k characters it is in state s_k, and each character steps to s_k+1. Its states read
# like the free string's looping state, one step further each time: seen with s_k+1 taken for
# s_k itself, s_k's region has the free string's shape. A token of L bytes crosses at most L
# of these steps, so wherever the L states from s_k on are copies of one another (the chain's
# middle: neither the minLength boundary nor its end within reach), the shape's split gives the
# token's fate; longer tokens and the tokens leaving the shape are checked from s_k itself.


@dataclass(eq=False)
class Chain:
    """A run of counted-chain states, each one character after the one before, proved to be
    copies of the first (``_linked``)."""

    region: Region  # the first state's region, its next state taken for itself
    byte: int  # a byte that steps each state of the run to the next
    states: list[int]  # the run so far
    parents: list[int]  # the stack node each state of the run has its characters over
    ended: bool = False
    shape: tuple[bytes, int] = (b"", 0)  # ``region.shape_key``, made once  # the state after the last one is not a copy: the run stops there


@njit(nogil=True, cache=True)
def _chain_next_kernel(c, state, min_loop):  # pragma: no cover
    """(status, step byte, next state): the one other state at least ``min_loop`` ASCII bytes
    of ``state`` lead to, and the first such byte; next -1 when there is none (or ``state``
    loops: a region's home)."""
    status, loops, lo, hi = row_shape(c, state)
    if status < 0 or loops >= min_loop or lo < 0:
        return status, 0, -1
    targets = np.empty(128, np.int32)
    counts = np.zeros(128, np.int32)
    firsts = np.empty(128, np.int32)
    nt = 0
    for b in range(128):
        t = c.table[state, b]
        if t < 0 or t == state:
            continue
        j = 0
        while j < nt and targets[j] != t:
            j += 1
        if j == nt:
            targets[nt] = t
            firsts[nt] = b
            nt += 1
        counts[j] += 1
    best = -1
    for j in range(nt):
        if counts[j] >= min_loop and (best < 0 or counts[j] > counts[best]):
            best = j
    if best < 0:
        return 0, 0, -1
    return 0, firsts[best], targets[best]


@njit(nogil=True, cache=True)
def _chain_region_kernel(c, state, next_state, max_region):  # pragma: no cover
    """(status, states, canonical table) of ``state``'s region with ``next_state`` taken for it."""
    return _region_table(c, I64(state), I64(next_state), max_region)


@njit(nogil=True, cache=True)
def _same_return(c, r, s):  # pragma: no cover
    """NFA states ``r`` and ``s`` continue alike up to their one call's return state: the same
    byte and epsilon edges, one call each to the same rule (not in tail position), the same
    rule ending there."""
    if r == s or c.final_rule[r] != c.final_rule[s]:
        return False
    n = c.e_ptr[r + 1] - c.e_ptr[r]
    if n != c.e_ptr[s + 1] - c.e_ptr[s]:
        return False
    for k in range(n):
        i, j = c.e_ptr[r] + k, c.e_ptr[s] + k
        if c.e_lo[i] != c.e_lo[j] or c.e_hi[i] != c.e_hi[j] or c.e_dst[i] != c.e_dst[j]:
            return False
    n = c.eps_ptr[r + 1] - c.eps_ptr[r]
    if n != c.eps_ptr[s + 1] - c.eps_ptr[s]:
        return False
    for k in range(n):
        if c.eps_dst[c.eps_ptr[r] + k] != c.eps_dst[c.eps_ptr[s] + k]:
            return False
    if c.call_ptr[r + 1] - c.call_ptr[r] != 1 or c.call_ptr[s + 1] - c.call_ptr[s] != 1:
        return False
    i, j = c.call_ptr[r], c.call_ptr[s]
    return c.call_callee[i] == c.call_callee[j] and not c.tail_ret[c.call_ret[i]] and not c.tail_ret[c.call_ret[j]]


@njit(nogil=True, cache=True)
def _linked(c, x, y):  # pragma: no cover
    """(P, Q), or (-1, -1) unless configuration ``y`` is ``x`` one chain step on: the same nodes, except that those over one
    parent node P (and nothing else) are over Q in ``y``, where P and Q have the same parents and
    NFA states that continue alike (``_same_return``). Then every byte string leads from the two
    to configurations related the same way, or to the same one: their rows are copies, Q's
    successor in ``y``'s standing for Q in ``x``'s."""
    n = c.cfg_len[x]
    if n != c.cfg_len[y] or c.accepting[x] != c.accepting[y] or c.exits[x] != c.exits[y]:
        return -1, -1
    kx = np.empty(n, np.int64)
    ky = np.empty(n, np.int64)
    for i in range(n):
        a = c.cfg_pool[c.cfg_start[x] + i]
        b = c.cfg_pool[c.cfg_start[y] + i]
        kx[i] = (np.int64(c.node_q[a]) << 32) | np.int64(a)
        ky[i] = (np.int64(c.node_q[b]) << 32) | np.int64(b)
    kx.sort()
    ky.sort()
    p = -1
    q = -1
    for i in range(n):
        if (kx[i] >> 32) != (ky[i] >> 32):
            return -1, -1
        a = np.int32(kx[i] & 0xFFFFFFFF)
        b = np.int32(ky[i] & 0xFFFFFFFF)
        if a == b:
            continue
        pa, pb = c.node_ps[a], c.node_ps[b]
        if c.ps_len[pa] != 1 or c.ps_len[pb] != 1:
            return -1, -1
        u, v = c.ps_pool[c.ps_start[pa]], c.ps_pool[c.ps_start[pb]]
        if u < 0 or v < 0 or u == v:
            return -1, -1
        if p < 0:
            p, q = u, v
        elif u != p or v != q:
            return -1, -1
    if p < 0 or c.node_ps[p] != c.node_ps[q] or not _same_return(c, I64(c.node_q[p]), I64(c.node_q[q])):
        return -1, -1
    return p, q


@njit(nogil=True, cache=True)
def _extend_chain_kernel(c, last, byte, count):  # pragma: no cover
    """(status, up to ``count`` next states of a run ending at ``last``, the chain's parent node
    in each, the chain's parent node in ``last``, True when the run ends before ``count``)."""
    out = np.empty(count, np.int32)
    parents = np.empty(count, np.int32)
    first = -1
    x = last
    for n in range(count):
        if c.table[x, byte] == UNEXPANDED:
            status = expand_cell(c, I64(x), I64(byte))
            if status < 0:
                return status, out[:0].copy(), parents[:0].copy(), first, True
        y = c.table[x, byte]
        p = -1
        q = -1
        if y >= 0:
            p, q = _linked(c, I64(x), I64(y))
        if q < 0:
            return 0, out[:n].copy(), parents[:n].copy(), first, True
        if n == 0:
            first = p
        out[n] = y
        parents[n] = q
        x = y
    return 0, out, parents, first, False


def find_chain(automaton, state: int, min_run: int, max_run: int) -> Chain | None:
    """The counted chain starting at ``state`` with its run proved up to ``max_run`` states, or
    None when ``state`` starts no run of at least ``min_run`` copies (a key prefix before the
    free key's loop leads to one state on most bytes too, but is no copy of it)."""
    core = automaton.core
    with automaton.lock:
        status, byte, next_state = kernel_tier.pick_for(core, _chain_next_kernel)(core, state, MIN_LOOP_BYTES)
    automaton.check_status(int(status))
    if next_state < 0:
        return None
    chain = Chain(None, int(byte), [int(state)], [-1])  # type: ignore[arg-type]  (the region comes last)
    extend_chain(automaton, chain, max_run - 1)
    if len(chain.states) < min_run:
        return None
    with automaton.lock:
        status, states, canonical = kernel_tier.pick_for(core, _chain_region_kernel)(core, state, int(next_state), MAX_REGION)
    automaton.check_status(int(status))
    if not len(states):
        return None
    chain.region = Region(states, canonical, 0)
    chain.shape = chain.region.shape_key
    return chain


def extend_chain(automaton, chain: Chain, count: int) -> list[int]:
    """Prove up to ``count`` more states of ``chain``'s run, append them (the caller serializes
    extensions of one chain; readers of ``states`` only ever see it grow) and return them;
    ``chain.ended`` records whether the run stopped before."""
    with automaton.lock:
        status, new, parents, first, ended = kernel_tier.pick_for(automaton.core, _extend_chain_kernel)(
            automaton.core, chain.states[-1], chain.byte, count)
    automaton.check_status(int(status))
    if chain.parents[-1] < 0 and first >= 0:
        chain.parents[-1] = int(first)
    chain.parents.extend(parents.tolist())
    chain.ended = bool(ended)
    new_states = new.tolist()
    chain.states.extend(new_states)
    return new_states


def chain_mask(trie: TokenTrie, automaton, state: int, split: RegionSplit, longer: np.ndarray, *,
               mode: int = PLAIN) -> tuple[np.ndarray, np.ndarray]:
    """(packed allowed tokens, uint32, EOS excluded; sorted positions of the tokens that died
    after an exit) of counted-chain state ``state`` from its shape's split: the inside row, less
    the tokens ``longer`` than the run proved from ``state``, plus those and the leaving tokens
    checked from ``state`` itself. ``mode`` DEAD_AFTER_EXITS for a truncated state (see
    ``token_walk``); the second array is empty otherwise."""
    bits = split.inside.copy()
    if len(longer):
        # (Duplicates too: the split's row has them; add_duplicates below sets them again from
        # their twins' final bits.)
        ids = np.concatenate([trie.sorted_ids[longer], trie.dup_dst])
        np.bitwise_and.at(bits, ids >> 5, ~(np.uint32(1) << (ids & 31).astype(np.uint32)))
        check = np.union1d(split.exit_pos, longer).astype(np.int32)
    else:
        check = split.exit_pos
    uncertain = np.zeros(0, dtype=np.int32)
    if len(check):
        outcome, _ = check_tokens(trie, automaton, check, np.full(len(check), state, dtype=np.int32), mode=mode)
        kernel_tier.pick(set_token_bits)(bits, trie.sorted_ids[check[outcome == ALLOWED]])
        uncertain = check[outcome == AT_EXIT].astype(np.int32)
    add_duplicates(trie, bits)
    return bits, uncertain


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
