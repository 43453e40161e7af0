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

from .token_trie import TokenTrie, build_trie_from, walk_trie
from .vocab import TokenVocabulary

# Use the shortcut when a state loops on at least this many bytes...
MIN_LOOP_BYTES = 64
# ...and the tokens that leave the loop are at most this share of the vocabulary.
MAX_EXCEPTION_SHARE = 0.3


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
        self._lock = threading.Lock()

    def allowed(self, automaton, state: int, want_states: bool = False):
        """(bool [V] allowed tokens, int32 [V] end states or None); EOS not included."""
        automaton.expand(state)
        if not want_states and int((automaton.table[state] == state).sum()) >= MIN_LOOP_BYTES:
            region = _region(automaton, state)
            if region is not None:
                states, canonical = region
                split = self._split_for(canonical)
                if split.inside is not None:
                    allowed = split.inside.copy()
                    for c, trie in split.suffixes:
                        extra, _ = walk_trie(trie, automaton, states[c])
                        allowed |= extra
                    return allowed, None
        return walk_trie(self.trie, automaton, state, want_states)

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
    """The process-wide computer of ``vocab`` (built on first use, then shared)."""
    from .token_trie import trie_for

    with _LOCK:
        comp = _COMPUTERS.get(vocab.fingerprint)
        if comp is None:
            comp = _COMPUTERS[vocab.fingerprint] = TokenMaskComputer(vocab, trie_for(vocab))
        return comp
