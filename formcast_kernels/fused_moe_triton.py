"""The experts of a mixture-of-experts layer as two Triton grouped GEMMs (GPU tensors; also runs
under ``TRITON_INTERPRET=1``).

The (token, choice) pairs are sorted by expert and each expert's run is padded to a multiple of
``BLOCK_M`` (on the device, no host sync: the block count is the bound T*k/BLOCK_M + E, blocks past
the last expert's run do nothing). Each program then owns one block of ``BLOCK_M`` pairs of a single
expert, so the expert's weight tile is read once per block rather than once per token:

1. gate/up: gathers the block's token rows of x, multiplies by the expert's gate and up rows
   (two accumulators over the same x tile), applies the activation and writes act(gate) * up
   to an [T*k, I] buffer at each pair's index;
2. down: multiplies those rows by the expert's down projection and scales each by its router
   weight, writing [T*k, H] at the pair's index.

The k contributions of each token are summed in torch afterwards (a fixed order, so results do not
depend on scheduling, and no atomics). Unused experts cost nothing: no block names them.
Accumulation is float32; the intermediate is stored in x's dtype, as the unfused path rounds it.
Imports only torch and triton.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_M = 16  # pairs per block: tl.dot's smallest tile, and decode batches put few tokens on an expert


@triton.jit
def _act_mul(gate, up, ACT: tl.constexpr):
    if ACT == 0:  # SiLU
        g = gate * tl.sigmoid(gate)
    else:  # GELU, tanh form; tanh(z) = 2 * sigmoid(2z) - 1
        inner = 0.7978845608028654 * (gate + 0.044715 * gate * gate * gate)
        g = 0.5 * gate * (1.0 + (2.0 * tl.sigmoid(2.0 * inner) - 1.0))
    return g * up


@triton.jit
def _block_tile(pair_ptr, num_pairs, width, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """This program's block: its pairs (padding rows are not ``live``) and its output columns."""
    m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(pair_ptr + m).to(tl.int64)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    return pair, pair < num_pairs, n, n < width


@triton.jit
def _gate_up_kernel(
    x_ptr, w_ptr, out_ptr, pair_ptr, block_expert_ptr, num_pairs, hidden, inter, top_k,
    stride_xt, stride_we, stride_wn, stride_ot,
    ACT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_FP32: tl.constexpr,
):  # fmt: skip
    blk = tl.program_id(0)
    expert = tl.load(block_expert_ptr + blk).to(tl.int64)
    if expert < 0:
        return
    pair, live, n, nmask = _block_tile(pair_ptr, num_pairs, inter, BLOCK_M, BLOCK_N)
    token = pair // top_k
    acc_g = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc_u = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    w_base = w_ptr + expert * stride_we
    for k0 in range(0, hidden, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        kmask = k < hidden
        a = tl.load(x_ptr + token[:, None] * stride_xt + k[None, :], mask=live[:, None] & kmask[None, :], other=0.0)
        wmask = kmask[:, None] & nmask[None, :]
        wg = tl.load(w_base + n[None, :] * stride_wn + k[:, None], mask=wmask, other=0.0)  # [K, N]
        wu = tl.load(w_base + (n[None, :] + inter) * stride_wn + k[:, None], mask=wmask, other=0.0)
        if DOT_FP32:
            acc_g += tl.dot(a, wg, input_precision="ieee")
            acc_u += tl.dot(a, wu, input_precision="ieee")
        else:
            acc_g += tl.dot(a, wg)
            acc_u += tl.dot(a, wu)
    # the unfused path rounds gate and up to x's dtype before the activation
    dt = out_ptr.dtype.element_ty
    h = _act_mul(acc_g.to(dt).to(tl.float32), acc_u.to(dt).to(tl.float32), ACT)
    tl.store(out_ptr + pair[:, None] * stride_ot + n[None, :], h.to(dt), mask=live[:, None] & nmask[None, :])


@triton.jit
def _down_kernel(
    h_ptr, w_ptr, rw_ptr, out_ptr, pair_ptr, block_expert_ptr, num_pairs, hidden, inter,
    stride_ht, stride_we, stride_wn, stride_ot,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_FP32: tl.constexpr,
):  # fmt: skip
    blk = tl.program_id(0)
    expert = tl.load(block_expert_ptr + blk).to(tl.int64)
    if expert < 0:
        return
    pair, live, n, nmask = _block_tile(pair_ptr, num_pairs, hidden, BLOCK_M, BLOCK_N)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    w_base = w_ptr + expert * stride_we
    for k0 in range(0, inter, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        kmask = k < inter
        a = tl.load(h_ptr + pair[:, None] * stride_ht + k[None, :], mask=live[:, None] & kmask[None, :], other=0.0)
        w = tl.load(w_base + n[None, :] * stride_wn + k[:, None], mask=kmask[:, None] & nmask[None, :], other=0.0)
        if DOT_FP32:
            acc += tl.dot(a, w, input_precision="ieee")
        else:
            acc += tl.dot(a, w)
    dt = out_ptr.dtype.element_ty
    rw = tl.load(rw_ptr + pair, mask=live, other=0.0).to(dt).to(tl.float32)
    # the unfused path rounds the expert's output to x's dtype, then scales it
    y = acc.to(dt).to(tl.float32) * rw[:, None]
    tl.store(out_ptr + pair[:, None] * stride_ot + n[None, :], y.to(dt), mask=live[:, None] & nmask[None, :])


def group_pairs(ids: torch.Tensor, num_experts: int, block_m: int = BLOCK_M) -> tuple[torch.Tensor, torch.Tensor]:
    """(pair index per padded row [blocks * block_m], padding = T*k; expert per block, -1 = unused),
    every block holding pairs of one expert. On the device, without a host sync."""
    flat = ids.reshape(-1)
    pairs = flat.numel()
    device = flat.device
    counts = torch.bincount(flat, minlength=num_experts)
    padded = (counts + block_m - 1) // block_m * block_m
    ends = torch.cumsum(padded, 0)
    starts = ends - padded
    order = torch.argsort(flat, stable=True)
    first_of_expert = torch.cumsum(counts, 0) - counts
    rank = torch.arange(pairs, device=device) - first_of_expert[flat[order]]
    blocks = (pairs + block_m - 1) // block_m + num_experts  # a bound on sum(padded) / block_m
    rows = torch.full((blocks * block_m,), pairs, dtype=torch.int64, device=device)
    rows[starts[flat[order]] + rank] = order
    block_start = torch.arange(blocks, device=device) * block_m
    block_expert = torch.searchsorted(ends, block_start, right=True)
    block_expert = torch.where(block_expert < num_experts, block_expert, -1)
    return rows, block_expert


def fused_moe_triton(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    ids: torch.Tensor,
    weights: torch.Tensor,
    act: str = "silu",
    block_n: int = 64,
    block_k: int = 32,
) -> torch.Tensor:
    """As ``fused_moe.fused_moe_reference``: x [T, H], gate_up [E, 2I, H], down [E, H, I], ids and
    weights [T, k] -> [T, H]."""
    tokens, hidden = x.shape
    top_k = ids.shape[1]
    experts, inter = gate_up.shape[0], down.shape[2]
    assert gate_up.shape == (experts, 2 * inter, hidden) and down.shape == (experts, hidden, inter)
    x, gate_up, down = x.contiguous(), gate_up.contiguous(), down.contiguous()
    pairs = tokens * top_k
    rows, block_expert = group_pairs(ids, experts)
    rw = weights.reshape(-1).contiguous()
    h = torch.empty(pairs, inter, dtype=x.dtype, device=x.device)
    y = torch.empty(pairs, hidden, dtype=x.dtype, device=x.device)
    dot_fp32 = x.dtype == torch.float32
    blocks = block_expert.numel()
    _gate_up_kernel[(blocks, triton.cdiv(inter, block_n))](
        x, gate_up, h, rows, block_expert, pairs, hidden, inter, top_k,
        x.stride(0), gate_up.stride(0), gate_up.stride(1), h.stride(0),
        ACT=0 if act == "silu" else 1, BLOCK_M=BLOCK_M, BLOCK_N=block_n, BLOCK_K=block_k, DOT_FP32=dot_fp32,
    )  # fmt: skip
    _down_kernel[(blocks, triton.cdiv(hidden, block_n))](
        h, down, rw, y, rows, block_expert, pairs, hidden, inter,
        h.stride(0), down.stride(0), down.stride(1), y.stride(0),
        BLOCK_M=BLOCK_M, BLOCK_N=block_n, BLOCK_K=block_k, DOT_FP32=dot_fp32,
    )  # fmt: skip
    return y.view(tokens, top_k, hidden).sum(dim=1)
