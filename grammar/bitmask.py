"""The token bitmask contract, written once.

Layout (shared with XGrammar and vLLM): ``int32`` array of shape ``[batch, ceil(vocab_size / 32)]``;
token ``t`` is allowed iff bit ``t % 32`` of word ``t // 32`` is set (least significant bit first).
A fresh row is all ones (-1). Logits wider than ``vocab_size`` are masked by the kernel.
"""

from __future__ import annotations

import numpy as np

BITMASK_DTYPE = np.int32
BITS_PER_WORD = 32


def bitmask_width(vocab_size: int) -> int:
    """Number of int32 words in one row for ``vocab_size`` tokens."""
    return (vocab_size + BITS_PER_WORD - 1) // BITS_PER_WORD


def allocate_token_bitmask(batch_size: int, vocab_size: int) -> np.ndarray:
    """A ``[batch_size, ceil(vocab_size/32)]`` int32 array with every token allowed."""
    return np.full((batch_size, bitmask_width(vocab_size)), -1, dtype=BITMASK_DTYPE)


def reset_token_bitmask(bitmask: np.ndarray) -> None:
    """Allow every token again, in place."""
    bitmask.fill(-1)


def pack_bool_mask(allowed: np.ndarray) -> np.ndarray:
    """Pack a bool array ``[..., vocab]`` into int32 words ``[..., ceil(vocab/32)]``."""
    allowed = np.asarray(allowed, dtype=bool)
    vocab = allowed.shape[-1]
    pad = bitmask_width(vocab) * BITS_PER_WORD - vocab
    if pad:
        allowed = np.concatenate([allowed, np.zeros(allowed.shape[:-1] + (pad,), dtype=bool)], axis=-1)
    packed = np.packbits(allowed, axis=-1, bitorder="little")
    return packed.view(np.uint32).view(BITMASK_DTYPE).reshape(allowed.shape[:-1] + (-1,))


def unpack_bitmask(bitmask: np.ndarray, vocab_size: int) -> np.ndarray:
    """Unpack int32 words ``[..., W]`` into a bool array ``[..., vocab_size]``."""
    words = np.ascontiguousarray(bitmask, dtype=BITMASK_DTYPE)
    bits = np.unpackbits(words.view(np.uint8), axis=-1, bitorder="little")
    return bits[..., :vocab_size].astype(bool)


def allowed_token_ids(bitmask_row: np.ndarray, vocab_size: int) -> np.ndarray:
    """The ids set in one row, ascending."""
    return np.flatnonzero(unpack_bitmask(bitmask_row, vocab_size))


def tokens_allowed(bitmask_row: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Whether each of ``ids`` (int64, all below the row's 32 * width) is set in one row: a bool
    array of ``ids``' shape, without unpacking the whole row."""
    words = np.ascontiguousarray(bitmask_row, dtype=BITMASK_DTYPE).view(np.uint32)
    return ((words[ids >> 5] >> (ids & 31).astype(np.uint32)) & 1).astype(bool)
