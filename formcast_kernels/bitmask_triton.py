"""Token bitmask application as a Triton kernel (GPU tensors; also runs under ``TRITON_INTERPRET=1``).

One program handles ``BLOCK`` columns of one logits row: it loads ``BLOCK // 32`` bitmask words,
expands them into a ``[BLOCK // 32, 32]`` tile of bits with a shift, and stores ``-inf`` only where a
bit is 0 (so allowed logits are never rewritten). Columns at or beyond ``mask_cols`` read as 0
bits, which masks logits wider than the bitmask's vocabulary. ``indices`` (optional) maps program
rows onto logits/bitmask rows, leaving other rows untouched.

Imports only torch and triton.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 4096


@triton.jit
def _apply_token_bitmask_kernel(
    logits_ptr,
    bitmask_ptr,
    indices_ptr,
    n_cols,
    mask_cols,
    logits_stride,
    bitmask_stride,
    HAS_INDICES: tl.constexpr,
    BLOCK: tl.constexpr,
    FULL_STORE: tl.constexpr,
):
    pid_row = tl.program_id(0)
    pid_col = tl.program_id(1)
    if HAS_INDICES:
        row = tl.load(indices_ptr + pid_row).to(tl.int64)
    else:
        row = pid_row.to(tl.int64)
    word_ids = pid_col * (BLOCK // 32) + tl.arange(0, BLOCK // 32)
    words = tl.load(
        bitmask_ptr + row * bitmask_stride + word_ids,
        mask=word_ids * 32 < mask_cols,
        other=0,
    )
    bit_ids = tl.arange(0, 32)
    cols = word_ids[:, None] * 32 + bit_ids[None, :]
    allowed = ((words[:, None] >> bit_ids[None, :]) & 1) != 0
    allowed = allowed & (cols < mask_cols)
    neg_inf = tl.full([BLOCK // 32, 32], float("-inf"), logits_ptr.dtype.element_ty)
    ptrs = logits_ptr + row * logits_stride + cols
    if FULL_STORE:  # read and write whole tiles: no partial sectors when most of a tile changes
        inside = cols < n_cols
        tl.store(ptrs, tl.where(allowed, tl.load(ptrs, mask=inside), neg_inf), mask=inside)
    else:
        tl.store(ptrs, neg_inf, mask=(cols < n_cols) & ~allowed)


# Masks over at least this many logits use whole-tile stores (see FULL_STORE); measured on an
# H200 (BENCHMARKS.md): masked partial stores win on small batches, whole tiles on large ones.
FULL_STORE_MIN_ELEMENTS = 1 << 22


def apply_token_bitmask_inplace_triton(
    logits: torch.Tensor,
    bitmask: torch.Tensor,
    indices: torch.Tensor | None,
    mask_cols: int,
    full_store: bool | None = None,
) -> None:
    """Launch the kernel on 2-D ``logits``/``bitmask`` (unit column stride); arguments already checked."""
    if logits.stride(1) != 1:
        raise ValueError("logits must have unit stride along the vocabulary axis")
    bitmask = bitmask if bitmask.stride(1) == 1 else bitmask.contiguous()
    n_rows = logits.shape[0] if indices is None else indices.numel()
    if n_rows == 0 or logits.shape[1] == 0:
        return
    grid = (n_rows, triton.cdiv(logits.shape[1], BLOCK))
    if full_store is None:
        full_store = n_rows * logits.shape[1] >= FULL_STORE_MIN_ELEMENTS
    _apply_token_bitmask_kernel[grid](
        logits,
        bitmask,
        indices if indices is not None else bitmask,  # dummy pointer when unused
        logits.shape[1],
        mask_cols,
        logits.stride(0),
        bitmask.stride(0),
        HAS_INDICES=indices is not None,
        BLOCK=BLOCK,
        FULL_STORE=full_store,
        num_warps=8,
    )
