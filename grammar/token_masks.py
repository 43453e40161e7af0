"""Allowed-token sets of automaton states: the trie walk plus the self-loop shortcut.

Most expensive states are "inside a free string": the automaton loops on almost every character,
so a plain trie walk visits the whole vocabulary. For such a state ``s`` we take its *local
region* R: ``s`` plus the states its multi-byte UTF-8 characters pass through, and the region's
transition table with every edge leaving R marked EXIT. Every token that never leaves R is
allowed outright; every other token leaves R at a known byte from a known region state, so only
those tokens' *suffixes* from that byte need a trie walk. The split depends only on the region's
shape (its canonical table) and the vocabulary, so it is computed once per shape and shared by
every state and grammar with that shape: all the free-string states of all JSON schemas, say.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from .token_trie import TokenTrie, build_trie_from, expand_children, walk_trie
from .vocab import TokenVocabulary

# Use the shortcut when a state loops on at least this many bytes...
MIN_LOOP_BYTES = 64
# ...and the tokens that leave the loop are at most this share of the vocabulary.
MAX_EXCEPTION_SHARE = 0.3


# Subtrees entered in a string-like state at depth <= STAY_DEPTH with at least
# MIN_SUBTREE_TOKENS tokens are settled token-major from the shape's stay table.
STAY_DEPTH = 31  # bits of a uint32
MIN_SUBTREE_TOKENS = 16
# A region is at most this many states (s and its UTF-8 middle states).
MAX_REGION = 12
_EXIT = -3


@dataclass
class LoopSplit:
    inside: np.ndarray | None  # bool [V]: tokens that never leave the region (None: not worth it)
    # (region index the token leaves from, trie of those tokens' suffixes from the leaving byte)
    suffixes: list[tuple[int, TokenTrie]]


class TokenMaskComputer:
    """Per-vocabulary machinery (shared across grammars) computing allowed tokens of a state."""

    def __init__(self, vocab: TokenVocabulary, trie: TokenTrie) -> None:
        self.vocab = vocab
        self.trie = trie
        ids = [i for i, t in enumerate(vocab.token_bytes) if t and i not in vocab.special_token_ids]
        self._ids = np.array(ids, dtype=np.int64)
        toks = [vocab.token_bytes[i] for i in ids]
        self._toks = toks
        self._lengths = np.array([len(t) for t in toks], dtype=np.int64)
        self._offsets = np.concatenate([[0], np.cumsum(self._lengths)[:-1]]).astype(np.int64)
        self._flat = np.frombuffer(b"".join(toks), dtype=np.uint8)
        self._splits: OrderedDict[bytes, LoopSplit] = OrderedDict()
        self._stays: OrderedDict[bytes, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def allowed(self, automaton, state: int, want_states: bool = False):
        """(bool [V] allowed tokens, int32 [V] end states or None); EOS not included."""
        automaton.expand(state)
        if want_states:
            return walk_trie(self.trie, automaton, state, want_states)
        region = self._region_of(automaton, state)
        if region is not None and region[3] == 0:
            states, canonical = region[0], region[1]
            split = self._split_for(canonical)
            if split.inside is not None:
                allowed = split.inside.copy()
                for c, trie in split.suffixes:
                    extra, _ = walk_trie(trie, automaton, states[c])
                    allowed |= extra
                return allowed, None
        return self._walk(automaton, state), None

    def _region_of(self, automaton, state: int):
        """(region states, canonical table, key, index of ``state`` in the region) when
        ``state`` is string-like or a UTF-8 middle state of a string-like region; else None."""
        cache = automaton.region_cache
        if state in cache:
            return cache[state]
        automaton.expand(state)
        row = automaton.table[state]
        found = None
        if int((row == state).sum()) >= MIN_LOOP_BYTES:
            region = _region(automaton, state)
            if region is not None:
                found = (region[0], region[1], region[1].tobytes(), 0)
        else:
            live = np.flatnonzero(row >= 0)
            if len(live) and live.min() >= 0x80 and live.max() < 0xC0:
                home = self._home_after_continuations(automaton, state)
                region = self._region_of(automaton, home) if home is not None else None
                if region is not None and region[3] == 0 and state in region[0]:
                    found = (region[0], region[1], region[2], region[0].index(state))
        cache[state] = found
        return found

    @staticmethod
    def _home_after_continuations(automaton, state: int) -> int | None:
        for _ in range(3):
            automaton.expand(state)
            row = automaton.table[state]
            live = np.flatnonzero(row >= 0)
            if not len(live) or live.min() < 0x80 or live.max() >= 0xC0:
                return state
            state = int(row[live[0]])
        return None

    # ------------------------------------------------------------------ walk with shortcuts
    def walk_truncated(self, automaton, state: int) -> tuple[np.ndarray, np.ndarray]:
        """(allowed, sorted positions of uncertain tokens) for a truncated state: tokens that
        pass through a configuration which may pop into the hole are left out of ``allowed``
        and listed instead, for the caller to settle against the real stack."""
        uncertain: list[np.ndarray] = []
        allowed = self._walk(automaton, state, uncertain)
        positions = np.unique(np.concatenate(uncertain)) if uncertain else np.zeros(0, dtype=np.int64)
        return allowed, positions

    def _walk(self, automaton, state: int, uncertain: list | None = None) -> np.ndarray:
        """The trie walk, except that a big subtree entered in a string-like state is settled
        token-major from that shape's precomputed stay table instead of node by node. With
        ``uncertain``, subtrees at configurations that may pop into a truncation hole are
        collected there (as sorted token positions) instead of walked."""
        trie = self.trie
        allowed = np.zeros(trie.vocab_size, dtype=bool)
        if not trie.levels:
            return allowed
        nodes = np.arange(len(trie.levels[0].byte))
        parents = np.full(len(nodes), state, dtype=np.int32)
        for d, level in enumerate(trie.levels):
            automaton.expand_many(parents)
            states = automaton.table[parents, level.byte[nodes]]
            live = states >= 0
            nodes, states = nodes[live], states[live]
            if uncertain is not None:
                exits = automaton.exits[states]
                if exits.any():
                    uncertain.append(_range_positions(level.tok_lo[nodes[exits]], level.tok_hi[nodes[exits]]))
                    nodes, states = nodes[~exits], states[~exits]
            if len(nodes) == 0:
                break
            term = level.terminal_token[nodes]
            allowed[term[term >= 0]] = True
            if d + 1 == len(trie.levels):
                break
            if d + 1 <= STAY_DEPTH:
                nodes, states = self._settle_subtrees(automaton, level, nodes, states, d + 1, allowed, uncertain)
            nodes, owner = expand_children(level, nodes)
            parents = states[owner]
        if len(trie.dup_src):
            allowed[trie.dup_dst] = allowed[trie.dup_src]
        return allowed

    def _settle_subtrees(self, automaton, level, nodes, states, pos: int, allowed: np.ndarray, uncertain=None):
        """Settle the big subtrees whose node state is string-like; return the other nodes."""
        big = (level.tok_hi[nodes] - level.tok_lo[nodes]) >= MIN_SUBTREE_TOKENS
        if not big.any():
            return nodes, states
        groups: dict[tuple[bytes, int], list[int]] = {}
        canon: dict[bytes, np.ndarray] = {}
        for q in np.unique(states[big]).tolist():
            region = self._region_of(automaton, q)
            if region is not None:
                groups.setdefault((region[2], region[3]), []).append(q)
                canon[region[2]] = region[1]
        if not groups:
            return nodes, states
        settled = np.zeros(len(nodes), dtype=bool)
        trie = self.trie
        bit = np.uint32(1 << pos)
        for (key, c), qs in groups.items():
            sel = big & np.isin(states, qs)
            settled |= sel
            lo, hi, sel_states = level.tok_lo[nodes[sel]], level.tok_hi[nodes[sel]], states[sel]
            stay = self._stay_for(key, canon[key])
            if int((hi - lo).sum()) * 8 > len(trie.sorted_len):
                self._settle_dense(automaton, lo, hi, sel_states, stay, c, pos, allowed, uncertain)
            else:
                self._settle_sparse(automaton, lo, hi, sel_states, stay, c, pos, allowed, uncertain)
        return nodes[~settled], states[~settled]

    def _settle_sparse(self, automaton, lo, hi, sel_states, stay, c: int, pos: int, allowed, uncertain=None) -> None:
        trie = self.trie
        counts = hi - lo
        owner = np.repeat(np.arange(len(lo)), counts)
        tokpos = lo[owner] + (np.arange(int(counts.sum())) - (np.cumsum(counts) - counts)[owner])
        longer = trie.sorted_len[tokpos] > pos  # tokens ending at the node were counted already
        tokpos, tok_state = tokpos[longer], sel_states[owner[longer]]
        ok = (stay[c, tokpos] & np.uint32(1 << pos)) != 0
        allowed[trie.sorted_ids[tokpos[ok]]] = True
        rest = ~ok
        if rest.any():
            survived = self._simulate(automaton, tokpos[rest], tok_state[rest], pos, uncertain)
            allowed[trie.sorted_ids[tokpos[rest][survived]]] = True

    def _settle_dense(self, automaton, lo, hi, sel_states, stay, c: int, pos: int, allowed, uncertain=None) -> None:
        """Same as the sparse path, with whole-vocabulary boolean ops: cheaper for big ranges."""
        trie = self.trie
        n = len(trie.sorted_len)
        edges = np.zeros(n + 1, dtype=np.int32)
        edges[lo] += 1
        edges[hi] -= 1
        covered = np.cumsum(edges[:n]) > 0
        covered &= trie.sorted_len > pos
        inside = (stay[c] & np.uint32(1 << pos)) != 0
        allowed[trie.sorted_ids[covered & inside]] = True
        rest = np.flatnonzero(covered & ~inside)
        if len(rest):
            tok_state = sel_states[np.searchsorted(lo, rest, side="right") - 1]
            survived = self._simulate(automaton, rest, tok_state, pos, uncertain)
            allowed[trie.sorted_ids[rest[survived]]] = True

    def _simulate(self, automaton, tokpos: np.ndarray, states: np.ndarray, pos: int, uncertain=None) -> np.ndarray:
        """Token-major: do these tokens' bytes from ``pos`` on survive from ``states``? With
        ``uncertain``, tokens reaching a configuration that may pop into a truncation hole are
        listed there and reported as not surviving."""
        trie = self.trie
        ok = np.zeros(len(tokpos), dtype=bool)
        active = np.arange(len(tokpos))
        st = states.astype(np.int32)
        while len(active):
            if uncertain is not None:
                exits = automaton.exits[st]
                if exits.any():
                    uncertain.append(tokpos[active[exits]])
                    active, st = active[~exits], st[~exits]
                    if len(active) == 0:
                        break
            done = trie.sorted_len[tokpos[active]] <= pos
            ok[active[done]] = True
            active, st = active[~done], st[~done]
            if len(active) == 0:
                break
            automaton.expand_many(st)
            st = automaton.table[st, trie.flat[trie.sorted_offset[tokpos[active]] + pos]]
            live = st >= 0
            active, st = active[live], st[live]
            pos += 1
        return ok

    def _stay_for(self, key: bytes, canonical: np.ndarray) -> np.ndarray:
        """uint32 [R, N]: bit p of entry (c, i) says whether sorted token i, read from byte p
        on, starting in region state c, stays inside the region. Computed backwards over byte
        positions once per region shape."""
        with self._lock:
            hit = self._stays.get(key)
            if hit is not None:
                self._stays.move_to_end(key)
                return hit
        trie = self.trie
        n = len(trie.sorted_len)
        stay_now = np.ones((canonical.shape[0], n), dtype=bool)
        stay = np.zeros((canonical.shape[0], n), dtype=np.uint32)
        for p in range(int(trie.sorted_len.max()) - 1 if n else -1, -1, -1):
            act = np.flatnonzero(trie.sorted_len > p)
            nxt = canonical[:, trie.flat[trie.sorted_offset[act] + p]]
            valid = nxt >= 0
            new = np.zeros(nxt.shape, dtype=bool)
            cols = np.broadcast_to(act, nxt.shape)
            new[valid] = stay_now[nxt[valid], cols[valid]]
            stay_now[:, act] = new
            if p <= STAY_DEPTH:
                stay |= stay_now.astype(np.uint32) << np.uint32(p)
        with self._lock:
            self._stays[key] = stay
            if len(self._stays) > 16:
                self._stays.popitem(last=False)
        return stay

    def _split_for(self, canonical: np.ndarray) -> LoopSplit:
        key = canonical.tobytes()
        with self._lock:
            split = self._splits.get(key)
            if split is not None:
                self._splits.move_to_end(key)
                return split
        split = self._build_split(canonical)
        with self._lock:
            self._splits[key] = split
            if len(self._splits) > 64:
                self._splits.popitem(last=False)
        return split

    def _build_split(self, canonical: np.ndarray) -> LoopSplit:
        n = len(self._ids)
        cur = np.zeros(n, dtype=np.int64)
        exit_pos = np.full(n, -1, dtype=np.int64)
        exit_from = np.full(n, -1, dtype=np.int64)
        dead = np.zeros(n, dtype=bool)
        active = np.arange(n)
        for d in range(int(self._lengths.max()) if n else 0):
            active = active[self._lengths[active] > d]
            if len(active) == 0:
                break
            nxt = canonical[cur[active], self._flat[self._offsets[active] + d]]
            left = nxt == _EXIT
            exit_pos[active[left]] = d
            exit_from[active[left]] = cur[active[left]]
            dead[active[nxt == -1]] = True
            keep = nxt >= 0
            cur[active[keep]] = nxt[keep]
            active = active[keep]
        outside = exit_pos >= 0
        if int(outside.sum()) > MAX_EXCEPTION_SHARE * n:
            return LoopSplit(None, [])
        inside = np.zeros(self.vocab.vocab_size, dtype=bool)
        inside[self._ids[~outside & ~dead]] = True
        suffixes = []
        for c in np.unique(exit_from[outside]).tolist():
            rows = np.flatnonzero(outside & (exit_from == c)).tolist()
            sufs = [self._toks[j][int(exit_pos[j]) :] for j in rows]
            suffixes.append((c, build_trie_from(self._ids[rows].tolist(), sufs, self.vocab.vocab_size)))
        return LoopSplit(inside, suffixes)


def _range_positions(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """All integers of the half-open ranges [lo, hi), concatenated."""
    counts = hi - lo
    owner = np.repeat(np.arange(len(lo)), counts)
    return lo[owner] + (np.arange(int(counts.sum())) - (np.cumsum(counts) - counts)[owner])


def _region(automaton, state: int):
    """(region states, canonical int64 table [len(R), 256]) or None when the region is too big."""
    states = [state]
    index = {state: 0}
    i = 0
    while i < len(states):
        automaton.expand(states[i])
        row = automaton.table[states[i]]
        # Multi-byte characters: lead bytes from s, continuation bytes from middle states.
        span = row[0x80:] if i == 0 else row[0x80:0xC0]
        for t in np.unique(span[span >= 0]).tolist():
            if t not in index:
                if len(states) >= MAX_REGION:
                    return None
                index[t] = len(states)
                states.append(t)
        i += 1
    sub = automaton.table[states].astype(np.int64)
    canonical = np.full(sub.shape, _EXIT, dtype=np.int64)
    canonical[sub < 0] = -1
    for t, k in index.items():
        canonical[sub == t] = k
    return states, canonical


_COMPUTERS: dict[str, TokenMaskComputer] = {}
_LOCK = threading.Lock()


def mask_computer_for(vocab: TokenVocabulary) -> TokenMaskComputer:
    """The process-wide computer of ``vocab`` (its trie built on first use, then shared by every
    grammar compiled against the vocabulary)."""
    with _LOCK:
        comp = _COMPUTERS.get(vocab.fingerprint)
        if comp is None:
            comp = _COMPUTERS[vocab.fingerprint] = TokenMaskComputer(vocab, TokenTrie.from_vocab(vocab))
        return comp


def precompute_masks(computer: TokenMaskComputer, automaton, deadline: float, max_states: int = 256) -> dict[int, np.ndarray]:
    """For a small automaton (every reachable state found within ``max_states``), compute
    packed mask rows (EOS not included) of its states, nearest the start first, until
    ``deadline`` (``time.monotonic()``). One multi-source trie walk per chunk of states carries
    (trie node, source state) pairs, so the vectorized work is shared by all of them.
    String-like states are skipped: their lazy masks are cheap anyway. Big automata (most JSON
    schemas) stay fully lazy: a breadth-first sweep of them would mostly visit states no
    document passes through."""
    import time

    from .bitmask import pack_bool_mask

    order = _bfs_states(automaton, max_states, deadline)
    if order is None:
        return {}
    todo = [s for s in order if computer._region_of(automaton, s) is None]
    trie = computer.trie
    rows: dict[int, np.ndarray] = {}
    chunk = 16
    while todo and time.monotonic() < deadline:
        batch, todo = todo[:chunk], todo[chunk:]
        allowed = _multi_source_walk(trie, automaton, np.array(batch, dtype=np.int32), deadline)
        if allowed is None:
            break
        for s, row in zip(batch, pack_bool_mask(allowed)):
            rows[s] = row
    return rows


def _bfs_states(automaton, max_states: int, deadline: float) -> list[int] | None:
    """All states reachable from the start, breadth first; None if there are more than
    ``max_states`` or the deadline passes first."""
    import time

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


def _multi_source_walk(trie: TokenTrie, automaton, sources: np.ndarray, deadline: float) -> np.ndarray | None:
    import time

    allowed = np.zeros((len(sources), trie.vocab_size), dtype=bool)
    n0 = len(trie.levels[0].byte) if trie.levels else 0
    nodes = np.tile(np.arange(n0), len(sources))
    src = np.repeat(np.arange(len(sources)), n0)
    cur = np.repeat(sources, n0)
    for d, level in enumerate(trie.levels):
        if time.monotonic() > deadline:
            return None
        automaton.expand_many(cur)
        nxt = automaton.table[cur, level.byte[nodes]]
        live = nxt >= 0
        nodes, src, nxt = nodes[live], src[live], nxt[live]
        if len(nodes) == 0:
            break
        term = level.terminal_token[nodes]
        has = term >= 0
        allowed[src[has], term[has]] = True
        if d + 1 == len(trie.levels):
            break
        nodes, owner = expand_children(level, nodes)
        src, cur = src[owner], nxt[owner]
    if len(trie.dup_src):
        allowed[:, trie.dup_dst] = allowed[:, trie.dup_src]
    return allowed
