"""The one entry point that applies a token bitmask to logits, dispatching by device.

CUDA tensors go to the Triton kernel (``bitmask_triton``); CPU tensors to the vectorized torch
path (``bitmask_torch``). The Triton module is imported lazily so CPU-only use never imports
Triton, and so tests can import it under ``TRITON_INTERPRET=1`` in a separate process.
"""

from __future__ import annotations

import torch

from .bitmask_torch import effective_cols, apply_token_bitmask_inplace_torch, normalize_args


def apply_token_bitmask_inplace(
    logits: torch.Tensor,
    bitmask: torch.Tensor,
    indices: torch.Tensor | list[int] | None = None,
    *,
    vocab_size: int | None = None,
) -> None:
    """Set ``logits[r, t] = -inf`` wherever the bitmask disallows token ``t``, in place.

    ``logits``: float32/float16/bfloat16 ``[B, V_logits]`` (or ``[V_logits]``).
    ``bitmask``: int32 ``[B, W]`` in the layout of ``grammar/bitmask.py`` (bit ``t % 32`` of word
    ``t // 32``, 1 = allowed); one row per logits row. Columns ``>= 32 * W`` (and ``>= vocab_size``
    when given) are masked. ``indices``: the rows to mask; other rows are untouched.
    The bitmask may live on the CPU while logits are on the GPU; it is copied over (non-blocking
    when pinned).
    """
    logits, bitmask, idx = normalize_args(logits, bitmask, indices)
    if logits.device.type == "cuda":
        from .bitmask_triton import apply_token_bitmask_inplace_triton

        if bitmask.device != logits.device:
            bitmask = bitmask.to(logits.device, non_blocking=True)
        if idx is not None:
            idx = idx.to(logits.device, non_blocking=True)
        cols = effective_cols(logits, bitmask, vocab_size)
        apply_token_bitmask_inplace_triton(logits, bitmask, idx, cols)
        return
    if bitmask.device != logits.device:
        bitmask = bitmask.to(logits.device)
    apply_token_bitmask_inplace_torch(logits, bitmask, idx, vocab_size=vocab_size)
