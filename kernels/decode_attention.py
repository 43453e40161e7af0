"""Paged decode attention: one query token per row against that row's KV slots in the pool.

``paged_decode_attention`` dispatches by device: the Triton kernel (``decode_attention_triton``)
on CUDA, and ``paged_decode_attention_reference`` (gather + ``scaled_dot_product_attention`` per
row, the plainest correct form) elsewhere; the reference is what the kernel is tested against.
Imports only torch (triton lazily, on CUDA).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def paged_decode_attention(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    kv_index: torch.Tensor,
    kv_start: torch.Tensor,
    kv_len: torch.Tensor,
    out: torch.Tensor,
    scale: float | None = None,
    max_len: int | None = None,
) -> None:
    """q / out [B, H, D]; k_buffer / v_buffer [slots, KVH, D]; row ``b`` attends to slots
    ``kv_index[kv_start[b] : kv_start[b] + kv_len[b]]``. Writes ``out`` in place. ``max_len``
    (the longest row), when the caller knows it, spares the kernel a device read."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if q.device.type == "cuda":
        from .decode_attention_triton import paged_decode_attention_triton

        paged_decode_attention_triton(q, k_buffer, v_buffer, kv_index, kv_start, kv_len, out, scale, max_len=max_len)
        return
    paged_decode_attention_reference(q, k_buffer, v_buffer, kv_index, kv_start, kv_len, out, scale)


def paged_decode_attention_reference(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    kv_index: torch.Tensor,
    kv_start: torch.Tensor,
    kv_len: torch.Tensor,
    out: torch.Tensor,
    scale: float,
) -> None:
    for b in range(q.shape[0]):
        start, n = int(kv_start[b]), int(kv_len[b])
        slots = kv_index[start : start + n]
        k = k_buffer.index_select(0, slots).transpose(0, 1).unsqueeze(0)
        v = v_buffer.index_select(0, slots).transpose(0, 1).unsqueeze(0)
        o = F.scaled_dot_product_attention(q[b][None, :, None, :], k, v, scale=scale, enable_gqa=True)
        out[b] = o[0, :, 0].to(out.dtype)
