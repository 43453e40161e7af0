"""Paged decode attention as a Triton kernel (GPU tensors; also runs under ``TRITON_INTERPRET=1``).

One program per (request, KV head, split of the context): it loads the ``group`` query heads that
share the KV head, walks its part of the request's KV slots ``BLOCK_N`` at a time (slot ids come
from the flattened page table), gathers those K and V rows straight from the pool, and keeps an
online softmax (running max, running sum, rescaled accumulator), so each key and value is read
once and no padded or gathered copy is ever made. On a float32 cache scores are a broadcast multiply-and-sum; on a
half-precision cache they are ``tl.dot`` products with the group's query heads padded to the
tensor cores' 16-row tile (measured on an H200 with 128-wide heads and 8K contexts: the
multiply-and-sum ran out of registers and took 2.4x SDPA's time).

Splits: with few requests, (request, KV head) pairs alone leave most of the GPU idle on long
contexts (measured on an H200: one program walking 8K tokens took 0.3-0.4 ms, longer than
gathering and SDPA). The context is then cut into splits, each program writes an unnormalized
partial result with its max and sum, and a small reduction combines them (flash-decoding).

Imports only torch and triton.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .paged_rows import PagedRows

BLOCK_N = 32


@triton.jit
def _paged_decode_kernel(
    q_ptr, k_ptr, v_ptr, acc_ptr, m_ptr, l_ptr, kv_index_ptr, kv_start_ptr, kv_len_ptr, scale,
    stride_qb, stride_qh, stride_kt, stride_kh, splits, split_size,
    GROUP: tl.constexpr, GROUP_P: tl.constexpr, DIM: tl.constexpr, DIM_P: tl.constexpr, BLOCK_N: tl.constexpr,
    USE_DOT: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    sp = tl.program_id(2).to(tl.int64)
    start = tl.load(kv_start_ptr + b)
    n = tl.load(kv_len_ptr + b)
    lo = sp * split_size
    hi = tl.minimum(lo + split_size, n)
    g = tl.arange(0, GROUP_P)
    d = tl.arange(0, DIM_P)
    head = h * GROUP + g
    qmask = (g < GROUP)[:, None] & (d < DIM)[None, :]
    q = tl.load(q_ptr + b * stride_qb + head[:, None] * stride_qh + d[None, :], mask=qmask, other=0.0).to(tl.float32)
    q = q * scale
    m = tl.full([GROUP_P], float("-inf"), tl.float32)
    total = tl.zeros([GROUP_P], tl.float32)
    acc = tl.zeros([GROUP_P, DIM_P], tl.float32)
    for off in range(lo, hi, BLOCK_N):
        j = off + tl.arange(0, BLOCK_N)
        valid = j < hi
        slot = tl.load(kv_index_ptr + start + j, mask=valid, other=0).to(tl.int64)
        kvmask = valid[:, None] & (d < DIM)[None, :]
        rows = slot[:, None] * stride_kt + h * stride_kh + d[None, :]
        k = tl.load(k_ptr + rows, mask=kvmask, other=0.0)
        if USE_DOT:
            s = tl.dot(q.to(k.dtype), tl.trans(k), input_precision="ieee", out_dtype=tl.float32)
        else:
            s = tl.sum(q[:, None, :] * k.to(tl.float32)[None, :, :], axis=2)
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m - m_new)
        v = tl.load(v_ptr + rows, mask=kvmask, other=0.0)
        total = total * alpha + tl.sum(p, axis=1)
        if USE_DOT:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee", out_dtype=tl.float32)
        else:
            acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v.to(tl.float32)[None, :, :], axis=1)
        m = m_new
    # Partials [B, H, splits(, D)]; an empty split leaves max -inf and sum 0.
    part = (b * (tl.num_programs(1) * GROUP) + head) * splits + sp
    tl.store(acc_ptr + part[:, None] * DIM + d[None, :], acc, mask=qmask)
    tl.store(m_ptr + part, m, mask=g < GROUP)
    tl.store(l_ptr + part, total, mask=g < GROUP)


# Programs that keep the GPU busy: below this many (request, KV head) pairs, contexts are split.
TARGET_PROGRAMS = 512
MIN_SPLIT = 256


def paged_decode_attention_triton(
    q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor, rows: PagedRows, out: torch.Tensor, scale: float,
    split_size: int | None = None, use_dot: bool | None = None,
) -> None:  # fmt: skip
    """q / out [B, H, D]; k_buffer / v_buffer [slots, KVH, D] (one layer of the pool); ``rows``:
    which slots each row of q attends to (every row >= 1 slot); ``split_size``: tokens per
    program (default: chosen from the batch's size so about ``TARGET_PROGRAMS`` programs run)."""
    batch, heads, dim = q.shape
    kv_heads = k_buffer.shape[1]
    group = heads // kv_heads
    assert k_buffer.stride(2) == 1 and q.stride(2) == 1, "head_dim must be contiguous"
    longest = rows.longest()
    if split_size is None:
        wanted = max(1, TARGET_PROGRAMS // (batch * kv_heads))
        split_size = max(MIN_SPLIT, triton.cdiv(triton.cdiv(longest, wanted), BLOCK_N) * BLOCK_N)
    splits = triton.cdiv(longest, split_size)
    # Half-precision caches use the tensor cores (the query heads padded to their 16-row tile);
    # float32 keeps exact multiply-and-sum.
    use_dot = k_buffer.dtype in (torch.float16, torch.bfloat16) if use_dot is None else use_dot
    group_p = max(16, triton.next_power_of_2(group)) if use_dot else triton.next_power_of_2(group)
    acc = torch.empty((batch, heads, splits, dim), dtype=torch.float32, device=q.device)
    m = torch.empty((batch, heads, splits), dtype=torch.float32, device=q.device)
    total = torch.empty_like(m)
    _paged_decode_kernel[(batch, kv_heads, splits)](
        q, k_buffer, v_buffer, acc, m, total, rows.kv_index, rows.kv_start, rows.kv_len, scale,
        q.stride(0), q.stride(1), k_buffer.stride(0), k_buffer.stride(1), splits, split_size,
        GROUP=group, GROUP_P=group_p, DIM=dim, DIM_P=max(16, triton.next_power_of_2(dim)), BLOCK_N=BLOCK_N, USE_DOT=use_dot,
    )  # fmt: skip
    if splits == 1:
        out.copy_(acc[:, :, 0] / total)
        return
    top = m.max(dim=-1, keepdim=True).values
    weight = torch.exp(m - top)  # empty splits: exp(-inf) = 0
    out.copy_((acc * weight.unsqueeze(-1)).sum(dim=2) / (total * weight).sum(dim=-1, keepdim=True))
