"""The vocabulary as a byte trie in depth-first (preorder) layout, built once per vocabulary.

Every node is one ``uint64`` word: its byte, its depth, the token that ends at it and the index of
the first node *after* its subtree. A walk visits nodes in array order and, when a prefix is
rejected, jumps over the whole subtree in one step (``token_walk.py`` does the walking; the
compiled ``build_trie_nodes`` here lays the nodes out). The
sequential layout is what makes the compiled walk fast: one 8-byte load per visited node, read
front to back, and most tokens die at their first or second byte.

Tokens are also kept sorted by their bytes (``sorted_*``): a node's subtree is a contiguous run
of that order, so "every token below this node" is the range ``[first_pos[node],
first_pos[skip])``, which the truncated and region walks hand to token-major checks. The rare
tokens too long for the trie come last in that list (``long_pos``) and are always checked
token-major.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from . import kernel_tier
from .bitmask import bitmask_width
from .vocab import TokenVocabulary

# Node word layout (bits): 0-7 byte, 8-15 depth (1-based), 16-39 token id + 1 (0: no token ends
# here), 40-63 index of the next node outside the subtree.
DEPTH_SHIFT, TOKEN_SHIFT, SKIP_SHIFT = 8, 16, 40
FIELD_24 = (1 << 24) - 1
# Tokens longer than this do not fit the depth field; they are checked token-major instead.
MAX_TRIE_DEPTH = 255


@dataclass(frozen=True)
class TokenTrie:
    """The vocabulary's tokens (specials and empty tokens left out), as a preorder trie and as a
    byte-sorted list. Positions (``pos``) index the sorted list; ids are vocabulary ids."""

    words: np.ndarray  # uint64 [nodes]: packed node (see the layout above)
    first_pos: np.ndarray  # int32 [nodes + 1]: sorted position of the first token below each node
    vocab_size: int
    sorted_ids: np.ndarray  # int32 [N]: vocabulary id of each sorted position
    sorted_len: np.ndarray  # int32 [N]
    sorted_offset: np.ndarray  # int64 [N]: start of each token's bytes in ``flat``
    flat: np.ndarray  # uint8: every sorted token's bytes, concatenated
    long_pos: np.ndarray  # int32: positions of tokens longer than MAX_TRIE_DEPTH (not in the trie)
    # Tokens whose bytes equal an earlier token's: allowed[dup_dst] = allowed[dup_src].
    dup_src: np.ndarray  # int32
    dup_dst: np.ndarray  # int32
    eos_ids: np.ndarray  # int64
    # Per first byte b: the trie nodes of the subtree below the root's child b ([start, end),
    # empty when no token starts with b), and the packed bits of every token starting with b.
    first_byte_nodes: np.ndarray  # int64 [256, 2]
    first_byte_bits: np.ndarray  # uint32 [256, width]

    @property
    def width(self) -> int:
        """Words in one packed mask row."""
        return bitmask_width(self.vocab_size)

    @property
    def num_tokens(self) -> int:
        return len(self.sorted_ids)

    @classmethod
    def from_vocab(cls, vocab: TokenVocabulary) -> "TokenTrie":
        ids = [i for i, t in enumerate(vocab.token_bytes) if t and i not in vocab.special_token_ids]
        return build_trie([vocab.token_bytes[i] for i in ids], ids, vocab.vocab_size, sorted(vocab.eos_token_ids))


def build_trie(token_bytes: list[bytes], ids: list[int], vocab_size: int, eos_ids=()) -> TokenTrie:
    """A trie over arbitrary (bytes, id) pairs; several ids may share one byte string."""
    if vocab_size > FIELD_24 - 1:
        raise ValueError(f"vocabularies of more than {FIELD_24 - 1} tokens are not supported")
    order = sorted(range(len(ids)), key=lambda j: token_bytes[j])
    keep: list[int] = []
    dup_src: list[int] = []
    dup_dst: list[int] = []
    for j in order:
        if keep and token_bytes[keep[-1]] == token_bytes[j]:
            dup_src.append(ids[keep[-1]])
            dup_dst.append(ids[j])
        else:
            keep.append(j)
    # Tokens that fit the trie first (in byte order), then the too-long ones.
    keep = [j for j in keep if len(token_bytes[j]) <= MAX_TRIE_DEPTH] + [j for j in keep if len(token_bytes[j]) > MAX_TRIE_DEPTH]
    toks = [token_bytes[j] for j in keep]
    lengths = np.array([len(t) for t in toks], dtype=np.int32)
    offsets = np.zeros(len(toks), dtype=np.int64)
    if len(toks) > 1:
        offsets[1:] = np.cumsum(lengths[:-1], dtype=np.int64)
    flat = np.frombuffer(b"".join(toks), dtype=np.uint8).copy()  # writable: the kernels' signature
    sorted_ids = np.array([ids[j] for j in keep], dtype=np.int32)
    in_trie = lengths <= MAX_TRIE_DEPTH
    words, first_pos = kernel_tier.pick(build_trie_nodes)(flat, offsets, lengths, sorted_ids, int(in_trie.sum()))
    if len(words) > FIELD_24:
        raise ValueError(f"the vocabulary's trie has more than {FIELD_24} nodes")
    first_bytes = np.array([t[0] for t in token_bytes], dtype=np.int64)
    first_byte_bits = np.zeros((256, bitmask_width(vocab_size)), dtype=np.uint32)
    all_ids = np.array(ids, dtype=np.int64)
    np.bitwise_or.at(first_byte_bits, (first_bytes, all_ids >> 5), (np.uint32(1) << (all_ids & 31).astype(np.uint32)))
    first_byte_nodes = np.zeros((256, 2), dtype=np.int64)
    depth = (words >> np.uint64(DEPTH_SHIFT)) & np.uint64(0xFF)
    for node in np.flatnonzero(depth == 1).tolist():
        word = int(words[node])
        first_byte_nodes[word & 0xFF] = (node, (word >> SKIP_SHIFT) & FIELD_24)
    return TokenTrie(
        words=words,
        first_pos=first_pos,
        vocab_size=vocab_size,
        sorted_ids=sorted_ids,
        sorted_len=lengths,
        sorted_offset=offsets,
        flat=flat,
        long_pos=np.flatnonzero(~in_trie).astype(np.int32),
        dup_src=np.array(dup_src, dtype=np.int32),
        dup_dst=np.array(dup_dst, dtype=np.int32),
        eos_ids=np.array(sorted(eos_ids), dtype=np.int64),
        first_byte_nodes=first_byte_nodes,
        first_byte_bits=first_byte_bits,
    )


@njit(nogil=True, cache=True)
def _shared_prefix(flat, offsets, lengths, i):  # pragma: no cover - compiled
    """Bytes sorted token ``i`` shares with token ``i - 1`` (0 for the first)."""
    if i == 0:
        return 0
    a, b = offsets[i - 1], offsets[i]
    m = min(lengths[i - 1], lengths[i])
    lcp = 0
    while lcp < m and flat[a + lcp] == flat[b + lcp]:
        lcp += 1
    return lcp


@njit("Tuple((uint64[::1], int32[::1]))(uint8[::1], int64[::1], int32[::1], int32[::1], int64)", nogil=True, cache=True)
def build_trie_nodes(flat, offsets, lengths, ids, n):  # pragma: no cover - compiled
    """Preorder node words and first positions of the first ``n`` (sorted, distinct) tokens."""
    total = 0
    for i in range(n):
        total += lengths[i] - _shared_prefix(flat, offsets, lengths, i)
    words = np.zeros(total, dtype=np.uint64)
    first_pos = np.empty(total + 1, dtype=np.int32)
    depth = np.empty(total, dtype=np.int32)
    k = 0
    for i in range(n):
        lcp = _shared_prefix(flat, offsets, lengths, i)
        for d in range(lcp, lengths[i]):
            words[k] = np.uint64(flat[offsets[i] + d]) | (np.uint64(d + 1) << np.uint64(DEPTH_SHIFT))
            depth[k] = d + 1
            first_pos[k] = i
            k += 1
        words[k - 1] |= np.uint64(ids[i] + 1) << np.uint64(TOKEN_SHIFT)
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


def node_fields(word: int) -> tuple[int, int, int, int]:
    """(byte, depth, token id or -1, skip) of one node word, for tests and debugging."""
    word = int(word)
    return (
        word & 0xFF,
        (word >> DEPTH_SHIFT) & 0xFF,
        ((word >> TOKEN_SHIFT) & FIELD_24) - 1,
        (word >> SKIP_SHIFT) & FIELD_24,
    )
