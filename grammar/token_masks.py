"""Mask rows of automaton states: the one route from a state to its packed row.

``GrammarMatcher.fill_next_token_bitmask`` -> ``CompiledGrammar.token_mask`` ->
:meth:`GrammarMasks.row`, which returns the grammar's cached row or computes it by the first
route that applies:

1. **string-like state** (inside a free string; ``regions.py``): the shape's split, shared by
   every grammar of the vocabulary, plus a check of the few tokens that leave the string;
   a **counted chain** (a string under maxLength: no state loops, each character steps to the
   next copy) takes the same split for the tokens no longer than the run of copies proved ahead
   and checks the others;
2. **state inside called rules**: the shared mask of its top stack frames (the fewest that
   leave few tokens to check; built per stack node, so a node met under many stacks, like the
   extra-key node at every position of an object, is walked once), plus a check of the tokens
   only the stack below could accept, against the real stack (``LazyAutomaton.truncate``);
3. otherwise the **trie walk** (``token_walk.walk_trie``).

:class:`VocabularyMasks` is the per-vocabulary, process-wide part (the trie and the region
splits, bounded by bytes); :class:`GrammarMasks` the per-grammar part (rows by state, bounded
by bytes). Each has one lock, held only to read or update its caches, never during a walk.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass

import numpy as np

from . import kernel_tier
from .caches import CACHES
from .lru import ByteLRU
from .regions import Chain, Region, RegionSplit, chain_mask, extend_chain, find_chain, find_region, region_mask, split_region
from .token_trie import TokenTrie
from .token_walk import (
    ALLOWED, DEAD_AFTER_EXITS, add_duplicates, check_tokens, range_positions, set_token_bits, walk_trie,
)
from .vocab import TokenVocabulary

# States of a recursive grammar nested deeper than this try truncation from KEEP_DEEP_FRAMES top
# frames on (see _first_cut).
TRUNCATE_DEEP_ABOVE = 3
KEEP_DEEP_FRAMES = 2
# A state inside called rules shares the mask of its top frames (the fewest that leave at most
# MAX_UNCERTAIN_SHARE of the vocabulary to be checked against the stack below them).
MAX_UNCERTAIN_SHARE = 0.1
# A truncated configuration of at most this many nodes has its mask built from per-node parts...
MAX_SPLIT_PARTS = 64
# ...unless more than this many of its parts are wide (see MIN_SIBLING_LIVE_BYTES) and not cached
# yet: a key's start under a union of a dozen object shapes, each with its own extra-key trie,
# holds a dozen wide parts of a few milliseconds each, where one walk of the whole
# configuration costs about one of them.
MAX_NEW_WIDE_PARTS = 3
# A state with at least this many live bytes may take its mask from a sibling state whose row
# differs from its own on at most MAX_SIBLING_DIFFERENCES bytes.
MIN_SIBLING_LIVE_BYTES = 64
# ...as long as the tokens starting with the differing bytes are at most this share of the trie.
MAX_SIBLING_WALK_SHARE = 0.05
# Two targets of one byte count as agreeing when they reach equal states within this many bytes
# on every path (a UTF-8 character's middle states, an escape sequence).
SIBLING_AGREE_DEPTH = 6
# Region splits kept per vocabulary (a split is one packed row plus its leaving tokens).
SHARED_SPLIT_BYTES = 64 << 20
# A counted chain's state (a string under maxLength) takes its mask from the free string's split
# when the run of copies proved from it (at most CHAIN_RUN states ahead) leaves at most
# MAX_CHAIN_CHECKS tokens longer than it to check one by one (Qwen2: 240 tokens over 32 bytes).
CHAIN_RUN = 32
MAX_CHAIN_CHECKS = 2000


class VocabularyMasks:
    """What every grammar over one vocabulary shares: the token trie and the region splits."""

    def __init__(self, vocab: TokenVocabulary, trie: TokenTrie, split_bytes: int = SHARED_SPLIT_BYTES) -> None:
        self.vocab = vocab
        self.trie = trie
        self.splits: ByteLRU[RegionSplit] = ByteLRU(split_bytes, lambda s: s.nbytes + 64)
        self._longer: dict[int, np.ndarray] = {}
        self._min_chain_run: dict[tuple[int, int], int] = {}

    def split_for(self, region: Region) -> RegionSplit:
        return self.splits.get_or_compute(region.shape_key, lambda: split_region(self.trie, region))

    @property
    def min_chain_run(self) -> int:
        """The shortest run of chain copies that leaves at most MAX_CHAIN_CHECKS tokens longer than
        it to check one by one (CHAIN_RUN + 1, never reached, when even CHAIN_RUN leaves more)."""
        key = (CHAIN_RUN, MAX_CHAIN_CHECKS)
        found = self._min_chain_run.get(key)
        if found is None:
            lengths = np.sort(self.trie.sorted_len)
            longer = len(lengths) - np.searchsorted(lengths, np.arange(1, CHAIN_RUN + 1), side="right")
            fits = np.flatnonzero(longer <= MAX_CHAIN_CHECKS)
            found = self._min_chain_run[key] = int(fits[0]) + 1 if len(fits) else CHAIN_RUN + 1
        return found

    def longer_than(self, length: int) -> np.ndarray:
        """Sorted positions (int32) of the tokens of more than ``length`` bytes."""
        found = self._longer.get(length)
        if found is None:
            lengths = self.trie.sorted_len
            found = self._longer[length] = np.flatnonzero(lengths > length).astype(np.int32)
        return found


_VOCABULARIES: dict[str, VocabularyMasks] = CACHES.table("vocabulary_masks", setup=True)
_VOCABULARIES_LOCK = threading.Lock()


def vocabulary_masks(vocab: TokenVocabulary) -> VocabularyMasks:
    """The process-wide :class:`VocabularyMasks` of ``vocab`` (its trie built on first use)."""
    with _VOCABULARIES_LOCK:
        shared = _VOCABULARIES.get(vocab.fingerprint)
        if shared is None:
            from . import jit_warmup

            # A cold numba cache (first use after an install) compiles in parallel children.
            jit_warmup.ensure_warm()
            shared = VocabularyMasks(vocab, TokenTrie.from_vocab(vocab))
            if kernel_tier.compiled():  # else load_compiled_kernels does it, at the switch
                _warm_up(shared)
            _VOCABULARIES[vocab.fingerprint] = shared
        return shared


def load_compiled_kernels() -> None:
    """Load every compiled mask kernel from numba's cache (the warm-up of each vocabulary set up
    while the process ran the kernels' Python twins), before ``kernel_tier`` switches to them."""
    with _VOCABULARIES_LOCK:
        vocabularies = list(_VOCABULARIES.values())
    for shared in vocabularies[:1]:  # one vocabulary reaches every kernel
        _warm_up(shared)


def _warm_up(shared: VocabularyMasks) -> None:
    """Load every compiled kernel now (2 to 20 ms apiece), during per-vocabulary setup, not in a
    request's masks: those in numba's cache, then whatever else the mask routes of a tiny
    grammar reach (a kernel missing from the cache compiles here)."""
    from . import char_dfa, jit_warmup

    jit_warmup.load_cached_kernels()
    char_dfa.load_kernels()  # the compile-time kernels (string and key-set products) as well
    warm_up_masks(shared)


def warm_up_nfa():  # -> ByteNFA
    """The tiny grammar every warm-up runs: strings, free or of at most 40 characters (a
    counted chain), nested in brackets (recursive, with a string region), so each mask route and
    each determinizer kernel is reached."""
    from . import ir
    from .fsm import build_nfa

    char = ir.char_class([(0x20, 0x21), (0x23, 0x10FFFF)])
    return build_nfa(ir.Grammar({"root": ir.choice(ir.seq(ir.literal('"'), ir.star(char), ir.literal('"')),
                                                   ir.seq(ir.literal("("), ir.repeat(char, 0, 40), ir.literal(")")),
                                                   ir.seq(ir.literal("["), ir.Ref("root"), ir.literal("]")))}))


def warm_up_masks(shared: VocabularyMasks) -> None:
    """The mask routes of ``_warm_up`` (jit_warmup compiles them in a process of their own)."""
    from .automaton import LazyAutomaton

    nfa = warm_up_nfa()
    automaton = LazyAutomaton(nfa)
    masks = GrammarMasks(automaton, shared, recursive=nfa.recursive, nested=True, cache_bytes=1 << 20)
    for prefix in (b"", b'"', b"[[[[[", b'[[[[["', b"[(", b"[(a"):
        state = automaton.step_bytes(automaton.initial_state, prefix)
        masks.compute(state)
    masks.allowed_with_end_states(automaton.initial_state)
    automaton.split(automaton.initial_state)
    walk_trie(shared.trie, automaton, automaton.initial_state, first_bytes=np.array([ord("[")]))
    automaton.differing_bytes(automaton.initial_state, automaton.step_bytes(automaton.initial_state, b"["), 2)
    automaton.sibling_of(automaton.step_bytes(automaton.initial_state, b'"'), MIN_SIBLING_LIVE_BYTES, SIBLING_AGREE_DEPTH)


@dataclass(frozen=True, eq=False)
class TruncatedMask:
    """The shared part of a truncated configuration's mask."""

    bits: np.ndarray  # uint32 [width]: tokens allowed whatever lies below the top frames
    uncertain: np.ndarray  # int32: sorted positions of tokens that may pop below them


class GrammarMasks:
    """Packed mask rows (int32, EOS included) of one grammar's automaton states."""

    def __init__(self, automaton, shared: VocabularyMasks, *, recursive: bool, nested: bool, cache_bytes: int) -> None:
        self.automaton = automaton
        self.shared = shared
        self.trie = shared.trie
        self.recursive = recursive
        self.nested = nested  # some rule is called (not inlined): stacks deeper than one exist
        self._rows: ByteLRU[np.ndarray] = ByteLRU(cache_bytes, lambda row: row.nbytes + 64)
        self._truncated: ByteLRU[TruncatedMask | bool] = ByteLRU(
            max(cache_bytes // 4, 1 << 20), lambda t: 64 if isinstance(t, bool) else t.bits.nbytes + t.uncertain.nbytes
        )
        self._regions: dict[int, Region | None] = {}
        self._chains: dict[int, tuple[Chain, int] | None] = {}  # state -> (its chain, index in the run)
        self._chain_lock = threading.Lock()  # serializes extending runs (taken before the automaton's)
        self._chain_tops_seen: set[tuple[int, int, tuple[bytes, int]]] = set()
        self._chain_tops: ByteLRU[TruncatedMask | bool] = ByteLRU(
            max(cache_bytes // 4, 1 << 20), lambda t: 64 if isinstance(t, bool) else t.bits.nbytes + t.uncertain.nbytes
        )
        self._lock = threading.Lock()  # guards the region cache and the truncation statistics
        self.routes: Counter[str] = Counter()  # how many rows each route computed (tests, profiles)
        self._truncation_useful = True
        self._truncation_tries = 0
        self._truncation_misses = 0
        eos = trie_eos = self.trie.eos_ids
        self._eos_words = eos >> 5
        self._eos_bits = (np.uint32(1) << (trie_eos & 31).astype(np.uint32)).astype(np.uint32)

    # ------------------------------------------------------------------ the route
    def row(self, state: int) -> np.ndarray:
        """The packed row of ``state`` (shared: callers copy it, never write to it)."""
        row = self._rows.get(state)
        if row is None:
            row = self._rows.put(state, self.compute(state).view(np.int32))
        return row

    def compute(self, state: int, *, via_sibling: bool = True) -> np.ndarray:
        """The uint32 bits of ``state``'s allowed tokens, EOS included, uncached."""
        bits, route = None, "walk"
        region = self.region_of(state)
        if region is not None:
            split = self.shared.split_for(region)
            if split.worth_it:
                bits, route = region_mask(self.trie, self.automaton, region, split)[0], "region"
        else:
            bits = self._chain_mask(state)
            if bits is not None:
                route = "chain"
        if bits is None and region is None:
            # Truncation first: its parts are shared by every stack a node occurs under; the
            # sibling's mask is the real state's own (a key prefix under ten object positions
            # would otherwise recompute the free key's mask ten times).
            first_cut = self._first_cut(state)
            if first_cut is not None:
                bits, route = self._truncated_mask(state, first_cut), "truncated"
            if bits is None and via_sibling:
                bits, route = self._sibling_mask(state), "sibling"
        if bits is None:
            bits, route = walk_trie(self.trie, self.automaton, state).bits, "walk"
        self.routes[route] += 1
        if self.automaton.accepting[state]:
            np.bitwise_or.at(bits, self._eos_words, self._eos_bits)
        return bits

    def region_of(self, state: int) -> Region | None:
        with self._lock:
            if state in self._regions:
                return self._regions[state]
        region = find_region(self.automaton, state)
        with self._lock:
            self._regions[state] = region
        return region

    # ------------------------------------------------------------------ counted chains
    def chain_of(self, state: int) -> tuple[Chain, int] | None:
        """(the counted chain ``state`` is in, its index in the chain's run), or None."""
        with self._lock:
            if state in self._chains:
                return self._chains[state]
        with self._chain_lock:
            chain = find_chain(self.automaton, state, self.shared.min_chain_run, CHAIN_RUN)
            with self._lock:
                if chain is not None:
                    for k, s in enumerate(chain.states):
                        self._chains.setdefault(s, (chain, k))
                return self._chains.setdefault(state, None)

    def _chain_mask(self, state: int) -> np.ndarray | None:
        """The mask of a counted chain's state from the free string's split (see
        ``regions.chain_mask``), or None when ``state`` is in no chain, the split does not pay
        or too few copies of it lie ahead.

        A string inside every element of an array or object meets the same top frames (the
        character's and its place in the chain) under each element's stack: from the second
        such state on, the leaving and long tokens are checked on those top frames once (over
        a hole, as truncated masks are) and only the tokens that reach the hole (that close the
        string) against each real stack."""
        found = self.chain_of(state)
        if found is None:
            return None
        chain, index = found
        with self._chain_lock:
            missing = index + CHAIN_RUN - len(chain.states)
            if missing > 0 and not chain.ended:
                start = len(chain.states)
                new = extend_chain(self.automaton, chain, missing)
                with self._lock:
                    for k, s in enumerate(new, start=start):
                        self._chains.setdefault(s, (chain, k))
            run = min(len(chain.states) - index, CHAIN_RUN)
            parent = chain.parents[index]
        if run < self.shared.min_chain_run:
            return None
        split = self.shared.split_for(chain.region)
        if not split.worth_it:
            return None
        longer = self.shared.longer_than(run)
        automaton = self.automaton
        if self.nested and parent >= 0 and automaton.max_depth(state) > 2:
            # (The shape too: states of two chains may share their top frames and still differ
            # below them, on bytes that pop under the frames: dead under one stack, leaving
            # under the other.)
            key = (automaton.truncate_over(state, parent), run, chain.shape)
            entry = self._chain_tops.get(key)
            if entry is None:
                with self._lock:
                    again = key in self._chain_tops_seen
                    self._chain_tops_seen.add(key)
                if again:
                    bits, uncertain = chain_mask(self.trie, automaton, key[0], split, longer, mode=DEAD_AFTER_EXITS)
                    useful = len(uncertain) <= MAX_UNCERTAIN_SHARE * self.trie.num_tokens
                    entry = self._chain_tops.put(key, TruncatedMask(bits, uncertain) if useful else False)
            if entry:
                self.routes["chain top"] += 1
                return self._with_uncertain(state, entry)
        return chain_mask(self.trie, automaton, state, split, longer)[0]

    def _with_uncertain(self, state: int, entry: TruncatedMask) -> np.ndarray:
        """A truncated configuration's shared mask completed for the real ``state``: its
        uncertain tokens checked against the real stack."""
        bits = entry.bits.copy()
        if len(entry.uncertain):
            starts = np.full(len(entry.uncertain), state, dtype=np.int32)
            outcome, _ = check_tokens(self.trie, self.automaton, entry.uncertain, starts)
            kernel_tier.pick(set_token_bits)(bits, self.trie.sorted_ids[entry.uncertain[outcome == ALLOWED]])
            add_duplicates(self.trie, bits)
        return bits

    # ------------------------------------------------------------------ sibling states
    def _sibling_of(self, state: int) -> tuple[int, np.ndarray] | None:
        """(sibling, differing bytes) when the tokens starting with those bytes are a small
        enough part of the trie to walk, else None."""
        found = self.automaton.sibling_of(state, MIN_SIBLING_LIVE_BYTES, SIBLING_AGREE_DEPTH)
        if found is None:
            return None
        spans = self.trie.first_byte_nodes[found[1]]
        if int((spans[:, 1] - spans[:, 0]).sum()) > MAX_SIBLING_WALK_SHARE * len(self.trie.words):
            return None
        return found

    def _sibling_mask(self, state: int) -> np.ndarray | None:
        """The mask of a wide state from the mask of the state most of its bytes lead to, when
        that state's row agrees with this one on all but a few bytes: tokens starting with an
        agreeing byte reach the same configuration after it either way, so only the tokens
        starting with a differing byte are walked. A key being typed beside named keys (``{"de``
        under ``additionalProperties``) is the free key string with a few bytes spelling the
        named ones; its mask is the free key's, corrected on those first bytes. None when no
        such sibling exists."""
        automaton = self.automaton
        found = self._sibling_of(state)
        if found is None:
            return None
        sibling, differ = found
        base = self._rows.get(sibling)
        if base is None:
            # The sibling's own mask takes any route but this one (no chains of siblings).
            base = self._rows.put(sibling, self.compute(sibling, via_sibling=False).view(np.int32))
        bits = base.view(np.uint32).copy()
        np.bitwise_and.at(bits, self._eos_words, ~self._eos_bits)  # EOS follows this state's own acceptance
        if len(differ):
            bits &= ~np.bitwise_or.reduce(self.trie.first_byte_bits[differ], axis=0)
            bits |= walk_trie(self.trie, automaton, state, first_bytes=differ).bits
        return bits

    # ------------------------------------------------------------------ truncated states
    def _first_cut(self, state: int) -> int | None:
        """How many top frames a truncation of ``state`` keeps first, or None to walk it whole.
        Wide states inside called rules (a key or a string under any object position: a walk
        of them costs most of the vocabulary) start from their top frame alone, the most shared
        part; deep states of a recursive grammar (nesting repeats the same top frames) from two,
        which seldom leak. A narrow shallow state walks faster than its truncation is built."""
        if not (self.nested and self._truncation_useful):
            return None
        depth = self.automaton.max_depth(state)
        if depth < 2:
            return None
        if self.automaton.live_bytes(state) >= MIN_SIBLING_LIVE_BYTES:
            return 1
        if depth > TRUNCATE_DEEP_ABOVE and self.recursive:
            return KEEP_DEEP_FRAMES
        return None

    def _truncated_mask(self, state: int, first_cut: int = 1) -> np.ndarray | None:
        """The mask of a state inside called rules from the shared mask of its top frames (see
        ``LazyAutomaton.truncate``): what the top frames accept is allowed whatever lies below;
        the tokens they reject after a possible pop into the hole are checked against the real
        stack, token-major. The fewest frames are tried first (the most sharing: a key inside
        any object position, a value inside any array), then more while too many tokens would
        need that check. None when no truncation pays."""
        automaton = self.automaton
        for keep in range(first_cut, automaton.max_depth(state)):
            top = automaton.truncate(state, keep)
            entry = self._truncated.get(top)
            if entry is None:
                entry = self._truncated.put(top, self._shared_top(top, split=first_cut == 1))
            if entry is not False:
                break
        else:
            self._count_truncation(False)
            return None
        self._count_truncation(True)
        return self._with_uncertain(state, entry)

    def _shared_top(self, top: int, *, split: bool = True) -> TruncatedMask | bool:
        """The shared mask of a truncated configuration: the union of its nodes' parts when it
        has several (each part cached on its own), else one walk. False when it leaks."""
        automaton = self.automaton
        parts = automaton.split(top) if split and automaton.config_size(top) > 1 else None
        if parts is None or len(parts) > MAX_SPLIT_PARTS:
            return self._walk_top(top)
        entries, new = [], []
        for part in parts.tolist():
            entry = self._truncated.get(part)
            if entry is False:
                return False  # a part known to leak: no need to compute the others
            if entry is None:
                new.append(part)
            else:
                entries.append(entry)
        if sum(automaton.live_bytes(part) >= MIN_SIBLING_LIVE_BYTES for part in new) > MAX_NEW_WIDE_PARTS:
            self.routes["whole top"] += 1
            return self._walk_top(top)
        for part in new:
            entry = self._truncated.put(part, self._walk_top(part))
            if entry is False:
                return False
            entries.append(entry)
        bits = entries[0].bits.copy()
        for entry in entries[1:]:
            np.bitwise_or(bits, entry.bits, out=bits)
        uncertain = np.unique(np.concatenate([e.uncertain for e in entries]))
        if len(uncertain):
            # A token some part allows outright needs no check against the stack.
            ids = self.trie.sorted_ids[uncertain]
            uncertain = uncertain[(bits[ids >> 5] >> (ids & 31).astype(np.uint32)) & 1 == 0]
        if len(uncertain) > MAX_UNCERTAIN_SHARE * self.trie.num_tokens:
            return False
        return TruncatedMask(bits, uncertain.astype(np.int32))

    def _walk_top(self, top: int) -> TruncatedMask | bool:
        limit = int(MAX_UNCERTAIN_SHARE * self.trie.num_tokens)
        sibling = self._sibling_top(top, limit)
        if sibling is not None:
            return sibling
        return self._plain_top(top, limit)

    def _sibling_top(self, top: int, limit: int) -> TruncatedMask | bool | None:
        """A truncated part's mask from its sibling part's (see :meth:`_sibling_mask`): a key
        prefix over the hole from the free key over the hole, walked once per grammar."""
        automaton = self.automaton
        found = self._sibling_of(top)
        if found is None:
            return None
        sibling, differ = found
        base = self._truncated.get(sibling)
        if base is None:
            base = self._truncated.put(sibling, self._plain_top(sibling, limit))
        if base is False:
            return None
        walk = walk_trie(self.trie, automaton, top, mode=DEAD_AFTER_EXITS, max_ranged_tokens=limit, first_bytes=differ)
        if walk is None:
            return False
        bits = base.bits.copy()
        uncertain, _, _ = kernel_tier.pick(range_positions)(walk.exit_ranges)
        if len(differ):
            bits &= ~np.bitwise_or.reduce(self.trie.first_byte_bits[differ], axis=0)
            bits |= walk.bits
            kept = base.uncertain[~np.isin(self.trie.flat[self.trie.sorted_offset[base.uncertain]], differ)]
            uncertain = np.union1d(kept, uncertain).astype(np.int32)
        else:
            uncertain = base.uncertain
        if len(uncertain) > limit:
            return False
        self.routes["sibling part"] += 1
        return TruncatedMask(bits, uncertain)

    def _plain_top(self, top: int, limit: int) -> TruncatedMask | bool:
        region = self.region_of(top)
        if region is not None and not self.automaton.exits[region.states].any():
            split = self.shared.split_for(region)
            if split.worth_it:
                return self._region_top(region, split, limit)
        walk = walk_trie(self.trie, self.automaton, top, mode=DEAD_AFTER_EXITS, max_ranged_tokens=limit)
        if walk is None:
            return False
        uncertain, _, _ = kernel_tier.pick(range_positions)(walk.exit_ranges)
        if len(uncertain) > limit:
            return False
        return TruncatedMask(walk.bits, uncertain)

    def _region_top(self, region: Region, split: RegionSplit, limit: int) -> TruncatedMask | bool:
        """A truncated part inside a free string (the free key over the hole): the shape's
        shared split, and its leaving tokens checked from the part's states, those dying after
        a pop into the hole being the uncertain ones. (No state of the region may exit: the
        tokens inside it never meet the hole.)"""
        bits, uncertain = region_mask(self.trie, self.automaton, region, split, mode=DEAD_AFTER_EXITS)
        if len(uncertain) > limit:
            return False
        self.routes["region part"] += 1
        return TruncatedMask(bits, uncertain)

    def _count_truncation(self, useful: bool) -> None:
        with self._lock:
            # Adaptive: a grammar whose truncated states keep leaking (JSON schemas whose only
            # recursion is "any JSON value") stops paying for the attempt.
            self._truncation_tries += 1
            self._truncation_misses += not useful
            hits = self._truncation_tries - self._truncation_misses
            if self._truncation_misses >= 4 and self._truncation_misses > hits:
                self._truncation_useful = False

    # ------------------------------------------------------------------ other views
    def allowed_with_end_states(self, state: int) -> tuple[np.ndarray, np.ndarray]:
        """(allowed token ids, the state after each), EOS excluded: for budget-aware masks."""
        walk = walk_trie(self.trie, self.automaton, state, end_states=True)
        ids = np.flatnonzero(walk.end_states >= 0).astype(np.int32)
        return ids, walk.end_states[ids]

    def precompute(self, deadline: float, max_states: int = 256) -> int:
        """For a small automaton (every reachable state found within ``max_states``), compute
        the rows of its states nearest the start first, until ``deadline``
        (``time.monotonic()``). Returns how many rows were computed. Big automata (most JSON
        schemas) stay lazy: a sweep of them would mostly visit states no document reaches."""
        order = _reachable_states(self.automaton, max_states, deadline)
        done = 0
        for state in order or ():
            if time.monotonic() > deadline:
                break
            self.row(state)
            done += 1
        return done


def _reachable_states(automaton, max_states: int, deadline: float) -> list[int] | None:
    """All states reachable from the start, breadth first; None if there are more than
    ``max_states`` or the deadline passes first."""
    start = automaton.initial_state
    order, seen = [start], {start}
    for s in order:
        if time.monotonic() > deadline:
            return None
        automaton.expand(s)
        row = automaton.table[s]
        for t in np.unique(row[row >= 0]).tolist():
            if t not in seen:
                if len(order) >= max_states:
                    return None
                seen.add(t)
                order.append(t)
    return order
