"""Paged decode attention that reads each row's KV slots straight from the request table: the form
a CUDA graph can capture (GPU tensors; also runs under ``TRITON_INTERPRET=1``).

    table_decode_attention(q, k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens, out, scale, num_splits)

q / out [B, H, D]; k_buffer / v_buffer [slots, KVH, D] (one layer of the pool); ``req_to_token``
[R, C] int64, contiguous; row ``b`` attends to the slots
``req_to_token[req_pool_indices[b], :seq_lens[b]]`` (1 <= seq_lens[b] <= C). ``out`` is written
in place.

Why a variant: ``paged_decode_attention`` takes a flattened slot list whose length changes every
step and a longest length (a host int) that decides its splits, so no two steps launch the same
work. Here nothing about a launch depends on the data: the grid is (B, KVH, splits) with
``num_splits`` fixed by the caller (``table_splits``: from the batch-size bucket and the context
limit ``C``, never from the lengths), the split size is ``C / num_splits`` rounded up to the
kernel's block, and the partial buffers' shapes follow. Each program takes its range of the row
from the row's length in the kernel; a split that starts past the row's end walks nothing and
leaves max -inf and sum 0, which the reduction weighs 0. So one captured launch replays for any
lengths and any table rows.

How: the table viewed flat is a paged layout whose row ``b`` starts at ``req_pool_indices[b] * C``,
so this launches ``decode_attention_triton``'s kernel and reduction (imported, not copied) over it
with the split size fixed. ``row_start`` (that product) may be passed in, so the layers of one
forward share one computation of it.

Imports only torch and triton.
"""

from __future__ import annotations

import torch
import triton

from .decode_attention_triton import BLOCK_N, MIN_SPLIT, TARGET_PROGRAMS, paged_decode_attention_triton
from .paged_rows import PagedRows


def table_splits(batch_size: int, kv_heads: int, context_len: int) -> int:
    """Context splits for a batch-size bucket: the eager kernel's rule (about ``TARGET_PROGRAMS``
    programs, at least ``MIN_SPLIT`` tokens each), applied to the longest context a row may have
    instead of the batch's longest, so it is known before any data is."""
    wanted = max(1, TARGET_PROGRAMS // (batch_size * kv_heads))
    split = max(MIN_SPLIT, triton.cdiv(triton.cdiv(context_len, wanted), BLOCK_N) * BLOCK_N)
    return triton.cdiv(context_len, split)


def table_decode_attention(
    q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor, req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor, seq_lens: torch.Tensor, out: torch.Tensor, scale: float, num_splits: int,
    row_start: torch.Tensor | None = None, use_dot: bool | None = None,
) -> None:  # fmt: skip
    """See the module docstring. ``row_start``: ``req_pool_indices * req_to_token.shape[1]`` when
    the caller has it; ``use_dot``: as ``paged_decode_attention_triton`` (default: by dtype)."""
    assert req_to_token.dim() == 2 and req_to_token.is_contiguous(), "req_to_token [R, C], contiguous"
    assert num_splits >= 1, "at least one split"
    width = req_to_token.shape[1]
    if row_start is None:
        row_start = req_pool_indices * width
    split_size = triton.cdiv(triton.cdiv(width, num_splits), BLOCK_N) * BLOCK_N
    # max_len = the table's width: the kernel's split count then follows from the split size
    # alone (ceil(C / split_size) <= num_splits), never from the rows' lengths.
    rows = PagedRows(req_to_token.view(-1), row_start, seq_lens, max_len=width)
    paged_decode_attention_triton(q, k_buffer, v_buffer, rows, out, scale, split_size=split_size, use_dot=use_dot)
