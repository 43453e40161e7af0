"""Paged decode attention: one query token per row against that row's KV slots in the pool.

``paged_decode_attention`` dispatches by device: the Triton kernel (``decode_attention_triton``)
on CUDA, and ``paged_decode_attention_reference`` (gather + ``scaled_dot_product_attention`` per
row, the plainest correct form) elsewhere; the reference is what the kernel is tested against.
Imports only torch (triton lazily, on CUDA).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .paged_rows import PagedRows


def paged_decode_attention(
    q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor, rows: PagedRows, out: torch.Tensor, scale: float | None = None,
) -> None:  # fmt: skip
    """q / out [B, H, D]; k_buffer / v_buffer [slots, KVH, D]; ``rows`` says which slots each row
    of q attends to. Writes ``out`` in place."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if q.device.type == "cuda":
        from .decode_attention_triton import paged_decode_attention_triton

        paged_decode_attention_triton(q, k_buffer, v_buffer, rows, out, scale)
        return
    paged_decode_attention_reference(q, k_buffer, v_buffer, rows, out, scale)


def paged_decode_attention_reference(
    q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor, rows: PagedRows, out: torch.Tensor, scale: float,
) -> None:  # fmt: skip
    for b in range(q.shape[0]):
        start, n = int(rows.kv_start[b]), int(rows.kv_len[b])
        slots = rows.kv_index[start : start + n]
        k = k_buffer.index_select(0, slots).transpose(0, 1).unsqueeze(0)
        v = v_buffer.index_select(0, slots).transpose(0, 1).unsqueeze(0)
        o = F.scaled_dot_product_attention(q[b][None, :, None, :], k, v, scale=scale, enable_gqa=True)
        out[b] = o[0, :, 0].to(out.dtype)
