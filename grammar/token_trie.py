"""The vocabulary as a byte trie laid out level by level in numpy arrays.

Built once per vocabulary and shared by every grammar. Computing the mask of an automaton state
walks this trie breadth-first with numpy gathers on the automaton's transition table, dropping a
node (and all tokens below it) the moment its prefix is rejected: the cost follows the number of
live trie nodes, not vocabulary size times token length. Most tokens die at their first byte.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .vocab import TokenVocabulary


@dataclass
class TrieLevel:
    """Nodes at one depth (depth d = prefixes of length d + 1), ordered by parent."""

    byte: np.ndarray  # uint8/int32 [n]: the byte of each node
    child_start: np.ndarray  # int64 [n]: children range in the next level
    child_count: np.ndarray  # int64 [n]
    terminal_token: np.ndarray  # int32 [n]: token whose bytes end exactly here, or -1
    # The tokens below a node are a contiguous run of the sorted token list: [tok_lo, tok_hi).
    tok_lo: np.ndarray
    tok_hi: np.ndarray


@dataclass
class TokenTrie:
    levels: list[TrieLevel]
    vocab_size: int
    # Tokens that share their bytes with another token: allowed[dup_dst] = allowed[dup_src].
    dup_src: np.ndarray
    dup_dst: np.ndarray
    eos_ids: np.ndarray
    # The (deduplicated) tokens in byte order, for token-major work on whole subtrees.
    sorted_ids: np.ndarray  # int64 [N]
    sorted_len: np.ndarray  # int64 [N]
    sorted_offset: np.ndarray  # int64 [N] into flat
    flat: np.ndarray  # uint8: all sorted tokens' bytes, concatenated

    @classmethod
    def from_vocab(cls, vocab: TokenVocabulary) -> "TokenTrie":
        return _build_trie(vocab)


def _build_trie(vocab: TokenVocabulary) -> TokenTrie:
    ids = [i for i, t in enumerate(vocab.token_bytes) if t and i not in vocab.special_token_ids]
    return build_trie_from(ids, [vocab.token_bytes[i] for i in ids], vocab.vocab_size, sorted(vocab.eos_token_ids))


def build_trie_from(ids: list[int], token_bytes: list[bytes], vocab_size: int, eos_ids=()) -> TokenTrie:
    """A trie over arbitrary (id, bytes) pairs; several ids may share one byte string."""
    order = sorted(range(len(ids)), key=lambda j: token_bytes[j])
    ids = [ids[j] for j in order]
    toks = [token_bytes[j] for j in order]
    # Identical byte strings: keep the first as representative.
    keep, dup_src, dup_dst = [], [], []
    for j, t in enumerate(toks):
        if keep and toks[keep[-1]] == t:
            dup_src.append(ids[keep[-1]])
            dup_dst.append(ids[j])
        else:
            keep.append(j)
    ids = [ids[j] for j in keep]
    toks = [toks[j] for j in keep]
    n = len(toks)
    lengths = np.array([len(t) for t in toks], dtype=np.int64)
    max_len = int(lengths.max()) if n else 0
    flat = np.frombuffer(b"".join(toks), dtype=np.uint8)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]) if n else np.zeros(0, dtype=np.int64)
    token_ids = np.array(ids, dtype=np.int32)

    levels: list[TrieLevel] = []
    prev_node_of_token = np.zeros(n, dtype=np.int64)  # node id at previous depth (all 0 at root)
    alive = np.arange(n)
    for d in range(max_len):
        alive = alive[lengths[alive] > d]
        if len(alive) == 0:
            break
        b = flat[offsets[alive] + d].astype(np.int32)
        parent = prev_node_of_token[alive]
        new = np.ones(len(alive), dtype=bool)
        new[1:] = (parent[1:] != parent[:-1]) | (b[1:] != b[:-1])
        node = np.cumsum(new) - 1
        first = np.flatnonzero(new)
        nodes_parent = parent[first]
        nodes_byte = b[first]
        term = np.full(len(first), -1, dtype=np.int32)
        ends = lengths[alive] == d + 1
        term[node[ends]] = token_ids[alive[ends]]
        last = np.concatenate([first[1:] - 1, [len(alive) - 1]])
        tok_lo, tok_hi = alive[first], alive[last] + 1
        if levels:
            prev = levels[-1]
            counts = np.bincount(nodes_parent, minlength=len(prev.byte))
            prev.child_count = counts.astype(np.int64)
            prev.child_start = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        levels.append(
            TrieLevel(
                byte=nodes_byte,
                child_start=np.zeros(len(first), dtype=np.int64),
                child_count=np.zeros(len(first), dtype=np.int64),
                terminal_token=term,
                tok_lo=tok_lo,
                tok_hi=tok_hi,
            )
        )
        full = np.zeros(n, dtype=np.int64)
        full[alive] = node
        prev_node_of_token = full
    return TokenTrie(
        levels=levels,
        vocab_size=vocab_size,
        dup_src=np.array(dup_src, dtype=np.int64),
        dup_dst=np.array(dup_dst, dtype=np.int64),
        eos_ids=np.array(list(eos_ids), dtype=np.int64),
        sorted_ids=token_ids.astype(np.int64),
        sorted_len=lengths,
        sorted_offset=offsets.astype(np.int64),
        flat=flat,
    )


def expand_children(level: TrieLevel, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Children (indices into the next level) of ``nodes``, and for each child its parent's
    position in ``nodes``."""
    counts = level.child_count[nodes]
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    owner = np.repeat(np.arange(len(nodes)), counts)
    starts = level.child_start[nodes]
    run_begin = np.cumsum(counts) - counts
    children = starts[owner] + (np.arange(total) - run_begin[owner])
    return children, owner


def walk_trie(trie: TokenTrie, automaton, state: int, want_states: bool = False):
    """Allowed tokens from ``state``: a bool array over the vocabulary; with ``want_states``, also
    the automaton state after each allowed token (-1 elsewhere). EOS is not handled here."""
    allowed = np.zeros(trie.vocab_size, dtype=bool)
    end_state = np.full(trie.vocab_size, -1, dtype=np.int32) if want_states else None
    if not trie.levels:
        return allowed, end_state
    level0 = trie.levels[0]
    nodes = np.arange(len(level0.byte))
    parents = np.full(len(nodes), state, dtype=np.int32)
    for d, level in enumerate(trie.levels):
        automaton.expand_many(parents)
        states = automaton.table[parents, level.byte[nodes]]
        live = states >= 0
        nodes, states = nodes[live], states[live]
        if len(nodes) == 0:
            break
        term = level.terminal_token[nodes]
        has = term >= 0
        allowed[term[has]] = True
        if want_states:
            end_state[term[has]] = states[has]
        if d + 1 == len(trie.levels):
            break
        nodes, owner = expand_children(level, nodes)
        parents = states[owner]
    if len(trie.dup_src):
        allowed[trie.dup_dst] = allowed[trie.dup_src]
        if want_states:
            end_state[trie.dup_dst] = end_state[trie.dup_src]
    return allowed, end_state

