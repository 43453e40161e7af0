"""Triton kernels over ``BlockMatrix``'s layout (GPU tensors; also runs under ``TRITON_INTERPRET=1``).

Contract: ``block_matmul(w, x)`` returns ``x @ W.T`` in float32 for x [M, K] of any float dtype,
and ``dequantize_rows(w, ids, dtype)`` the rows ``ids`` (all rows when None) of W as floats; both
read the weights quantized and dequantize them in registers (``_weights``: the one place that
turns a code into ``scale * (code - offset) + bias``, shared by every kernel).

Kernels, chosen by M with a fixed table (no autotune: the interpreter is too slow for it, and a
fixed choice keeps a CUDA graph's kernels the ones that were timed):

- M <= ``GEMV_MAX_M`` (decode, speculative verification, small batches): ``_gemv_kernel``. One
  program owns ``BLOCK_N`` weight rows and walks all of K, so each weight byte is read once for
  all M activation rows; the product is a broadcast multiply and ``tl.sum`` in float32.
- larger M: ``_dot_kernel``, a tiled ``tl.dot`` on the dequantized tile, in the activation's
  half dtype (float32 accumulator) or, for float32 activations, ``tf32x3`` (about float32's
  accuracy on tensor cores).
- M >= ``DEQUANT_GEMM_MIN_M`` on a GPU (long prefills): the whole weight dequantized into a
  buffer of the activations' dtype (``_dequantize_kernel``), then torch's GEMM; half-precision
  activations then get a half-precision product (the caller casts to their dtype anyway).

A nibble-packed step covers bytes, not elements: byte ``j`` holds element ``e_lo`` in its low
nibble and ``e_lo + SPAN`` in its high one, so each step multiplies two weight halves with the two
matching activation halves (a gather of x, small and cached) instead of interleaving nibbles.
Nothing here syncs with the host or branches on GPU values, so the launches are CUDA-graph
capturable. Imports only torch and triton.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

TYPE_CHECKING = False  # typing's, without importing typing (this package imports torch and triton only)
if TYPE_CHECKING:
    from .ggml_blocks import BlockMatrix

GEMV_MAX_M = 8
# From this many activation rows on (long prefills) on a GPU, the weight is dequantized into a
# buffer in the activations' dtype and multiplied by torch (cuBLAS): the tiled kernel's
# dequantization inside the K loop cost 3-7x a dense GEMM at M=128 on an H200.
DEQUANT_GEMM_MIN_M = 64


@triton.jit
def _weights(
    e, code, rows, mask, high_ptr, scales_ptr, biases_ptr, super_scales_ptr, super_mins_ptr,
    high_stride, group_stride, super_stride,
    HIGH_BITS: tl.constexpr, GROUP: tl.constexpr, OFFSET: tl.constexpr, BIAS_KIND: tl.constexpr, TWO_LEVEL: tl.constexpr,
):
    """Float32 weights at element columns ``e`` of weight rows ``rows`` (int64; broadcastable 2-D
    tiles), given the low four bits of their codes (Q8_0: the whole signed code), as int32."""
    if HIGH_BITS > 0:
        word = tl.load(high_ptr + rows * high_stride + e // (32 // HIGH_BITS), mask=mask, other=0)
        top = (word >> ((e % (32 // HIGH_BITS)) * HIGH_BITS)) & ((1 << HIGH_BITS) - 1)
        code = code | (top << 4)
    group = e // GROUP
    scale = tl.load(scales_ptr + rows * group_stride + group, mask=mask, other=0).to(tl.float32)
    if TWO_LEVEL:
        d = tl.load(super_scales_ptr + rows * super_stride + e // 256, mask=mask, other=0).to(tl.float32)
        scale = d * scale
    w = scale * (code - OFFSET).to(tl.float32)
    if BIAS_KIND == 1:
        w = w + tl.load(biases_ptr + rows * group_stride + group, mask=mask, other=0).to(tl.float32)
    if BIAS_KIND == 2:
        dmin = tl.load(super_mins_ptr + rows * super_stride + e // 256, mask=mask, other=0).to(tl.float32)
        low = tl.load(biases_ptr + rows * group_stride + group, mask=mask, other=0).to(tl.float32)
        w = w - dmin * low
    return w


@triton.jit
def _gemv_kernel(
    x_ptr, out_ptr, codes_ptr, high_ptr, scales_ptr, biases_ptr, super_scales_ptr, super_mins_ptr,
    M, N, row_bytes, x_stride, out_stride, high_stride, group_stride, super_stride,
    SPAN: tl.constexpr, HIGH_BITS: tl.constexpr, GROUP: tl.constexpr, OFFSET: tl.constexpr,
    BIAS_KIND: tl.constexpr, TWO_LEVEL: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    rows64 = rows.to(tl.int64)[:, None]
    ms = tl.arange(0, BLOCK_M)
    m_ok = (ms < M)[:, None]
    x_rows = x_ptr + ms.to(tl.int64)[:, None] * x_stride
    # Products accumulate element-wise across the steps and are reduced once at the end: a sum
    # across the step's lanes every step costs shuffles that the loads cannot hide.
    acc = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_B), dtype=tl.float32)
    for start in range(0, row_bytes, BLOCK_B):
        j = start + tl.arange(0, BLOCK_B)
        j_ok = j < row_bytes
        mask = row_ok[:, None] & j_ok[None, :]
        x_mask = m_ok & j_ok[None, :]
        byte = tl.load(codes_ptr + rows64 * row_bytes + j[None, :], mask=mask, other=0).to(tl.int32)
        if SPAN == 0:
            e = j[None, :]
            w = _weights(e, byte, rows64, mask, high_ptr, scales_ptr, biases_ptr, super_scales_ptr, super_mins_ptr,
                         high_stride, group_stride, super_stride, HIGH_BITS, GROUP, OFFSET, BIAS_KIND, TWO_LEVEL)
            xv = tl.load(x_rows + e, mask=x_mask, other=0.0).to(tl.float32)
            acc += xv[:, None, :] * w[None, :, :]
        else:
            e_lo = ((j // SPAN) * (2 * SPAN) + j % SPAN)[None, :]
            e_hi = e_lo + SPAN
            w_lo = _weights(e_lo, byte & 15, rows64, mask, high_ptr, scales_ptr, biases_ptr, super_scales_ptr, super_mins_ptr,
                            high_stride, group_stride, super_stride, HIGH_BITS, GROUP, OFFSET, BIAS_KIND, TWO_LEVEL)
            w_hi = _weights(e_hi, byte >> 4, rows64, mask, high_ptr, scales_ptr, biases_ptr, super_scales_ptr, super_mins_ptr,
                            high_stride, group_stride, super_stride, HIGH_BITS, GROUP, OFFSET, BIAS_KIND, TWO_LEVEL)
            x_lo = tl.load(x_rows + e_lo, mask=x_mask, other=0.0).to(tl.float32)
            x_hi = tl.load(x_rows + e_hi, mask=x_mask, other=0.0).to(tl.float32)
            acc += x_lo[:, None, :] * w_lo[None, :, :] + x_hi[:, None, :] * w_hi[None, :, :]
    tl.store(out_ptr + ms[:, None] * out_stride + rows[None, :], tl.sum(acc, axis=2), mask=m_ok & row_ok[None, :])


@triton.jit
def _dot_kernel(
    x_ptr, out_ptr, codes_ptr, high_ptr, scales_ptr, biases_ptr, super_scales_ptr, super_mins_ptr,
    M, N, row_bytes, x_stride, out_stride, high_stride, group_stride, super_stride,
    SPAN: tl.constexpr, HIGH_BITS: tl.constexpr, GROUP: tl.constexpr, OFFSET: tl.constexpr,
    BIAS_KIND: tl.constexpr, TWO_LEVEL: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr, DOT_F32: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    ms = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok = (ms < M)[:, None]
    rows = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    rows64 = rows.to(tl.int64)[None, :]  # the weight tile is [BLOCK_B, BLOCK_N]: already transposed
    x_rows = x_ptr + ms.to(tl.int64)[:, None] * x_stride
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for start in range(0, row_bytes, BLOCK_B):
        j = start + tl.arange(0, BLOCK_B)
        j_ok = j < row_bytes
        mask = j_ok[:, None] & row_ok[None, :]
        x_mask = m_ok & j_ok[None, :]
        byte = tl.load(codes_ptr + rows64 * row_bytes + j[:, None], mask=mask, other=0).to(tl.int32)
        if SPAN == 0:
            w = _weights(j[:, None], byte, rows64, mask, high_ptr, scales_ptr, biases_ptr, super_scales_ptr, super_mins_ptr,
                         high_stride, group_stride, super_stride, HIGH_BITS, GROUP, OFFSET, BIAS_KIND, TWO_LEVEL)
            xv = tl.load(x_rows + j[None, :], mask=x_mask, other=0.0)
            if DOT_F32:
                xv = xv.to(tl.float32)
            acc = tl.dot(xv, w.to(xv.dtype), acc, input_precision=DOT_PRECISION)
        else:
            e_lo = (j // SPAN) * (2 * SPAN) + j % SPAN
            w_lo = _weights(e_lo[:, None], byte & 15, rows64, mask, high_ptr, scales_ptr, biases_ptr, super_scales_ptr,
                            super_mins_ptr, high_stride, group_stride, super_stride, HIGH_BITS, GROUP, OFFSET, BIAS_KIND, TWO_LEVEL)
            w_hi = _weights(e_lo[:, None] + SPAN, byte >> 4, rows64, mask, high_ptr, scales_ptr, biases_ptr, super_scales_ptr,
                            super_mins_ptr, high_stride, group_stride, super_stride, HIGH_BITS, GROUP, OFFSET, BIAS_KIND, TWO_LEVEL)
            x_lo = tl.load(x_rows + e_lo[None, :], mask=x_mask, other=0.0)
            x_hi = tl.load(x_rows + (e_lo + SPAN)[None, :], mask=x_mask, other=0.0)
            if DOT_F32:
                x_lo = x_lo.to(tl.float32)
                x_hi = x_hi.to(tl.float32)
            acc = tl.dot(x_lo, w_lo.to(x_lo.dtype), acc, input_precision=DOT_PRECISION)
            acc = tl.dot(x_hi, w_hi.to(x_hi.dtype), acc, input_precision=DOT_PRECISION)
    tl.store(out_ptr + ms.to(tl.int64)[:, None] * out_stride + rows[None, :], acc, mask=m_ok & row_ok[None, :])


@triton.jit
def _dequantize_kernel(
    out_ptr, ids_ptr, codes_ptr, high_ptr, scales_ptr, biases_ptr, super_scales_ptr, super_mins_ptr,
    R, row_bytes, out_stride, high_stride, group_stride, super_stride,
    HAS_IDS: tl.constexpr, SPAN: tl.constexpr, HIGH_BITS: tl.constexpr, GROUP: tl.constexpr, OFFSET: tl.constexpr,
    BIAS_KIND: tl.constexpr, TWO_LEVEL: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_B: tl.constexpr,
):
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    r_ok = r < R
    if HAS_IDS:
        src = tl.load(ids_ptr + r, mask=r_ok, other=0).to(tl.int64)
    else:
        src = r.to(tl.int64)
    rows64 = src[:, None]
    j = tl.program_id(1) * BLOCK_B + tl.arange(0, BLOCK_B)
    mask = r_ok[:, None] & (j < row_bytes)[None, :]
    out_rows = out_ptr + r.to(tl.int64)[:, None] * out_stride
    byte = tl.load(codes_ptr + rows64 * row_bytes + j[None, :], mask=mask, other=0).to(tl.int32)
    if SPAN == 0:
        w = _weights(j[None, :], byte, rows64, mask, high_ptr, scales_ptr, biases_ptr, super_scales_ptr, super_mins_ptr,
                     high_stride, group_stride, super_stride, HIGH_BITS, GROUP, OFFSET, BIAS_KIND, TWO_LEVEL)
        tl.store(out_rows + j[None, :], w.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        e_lo = ((j // SPAN) * (2 * SPAN) + j % SPAN)[None, :]
        w_lo = _weights(e_lo, byte & 15, rows64, mask, high_ptr, scales_ptr, biases_ptr, super_scales_ptr, super_mins_ptr,
                        high_stride, group_stride, super_stride, HIGH_BITS, GROUP, OFFSET, BIAS_KIND, TWO_LEVEL)
        w_hi = _weights(e_lo + SPAN, byte >> 4, rows64, mask, high_ptr, scales_ptr, biases_ptr, super_scales_ptr, super_mins_ptr,
                        high_stride, group_stride, super_stride, HIGH_BITS, GROUP, OFFSET, BIAS_KIND, TWO_LEVEL)
        tl.store(out_rows + e_lo, w_lo.to(out_ptr.dtype.element_ty), mask=mask)
        tl.store(out_rows + e_lo + SPAN, w_hi.to(out_ptr.dtype.element_ty), mask=mask)


# (largest M, BLOCK_M, BLOCK_N, bytes per step, warps) for the tiled kernel; the last row serves
# every larger M.
_DOT_TILES = [(16, 16, 64, 32, 4), (32, 32, 64, 32, 4), (64, 64, 128, 32, 4), (None, 128, 128, 32, 8)]


def block_matmul(w: BlockMatrix, x: torch.Tensor) -> torch.Tensor:
    """x [M, K] (float32/float16/bfloat16) -> x @ W.T [M, N] float32."""
    m, n = x.shape[0], w.shape[0]
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        x = x.float()
    if x.stride(1) != 1:
        x = x.contiguous()
    out = torch.empty((m, n), dtype=torch.float32, device=x.device)
    tensors, (row_bytes, high_stride, group_stride, super_stride), constants = w.kernel_args()
    if m <= GEMV_MAX_M:
        block_m = triton.next_power_of_2(m)
        block_n = 8 if n >= 8192 else 4
        if x.device.type != "cuda":  # the interpreter: its cost is per program step, so fewer programs
            block_n = 32
        block_b = {1: 256, 2: 256, 4: 128, 8: 64}[block_m]
        grid = (triton.cdiv(n, block_n),)
        _gemv_kernel[grid](
            x, out, *tensors, m, n, row_bytes, x.stride(0), out.stride(0), high_stride, group_stride, super_stride,
            **constants, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_B=block_b, num_warps=4,
        )
        return out
    if m >= DEQUANT_GEMM_MIN_M and x.device.type == "cuda":
        return F.linear(x, dequantize_rows(w, None, x.dtype)).float()
    for top, block_m, block_n, block_b, warps in _DOT_TILES:
        if top is None or m <= top:
            break
    if constants["SPAN"] == 0:
        block_b *= 2  # one element per byte: keep the step's K at 64
    # float32 activations: tf32x3, about float32's accuracy on tensor cores. Triton's interpreter
    # multiplies bfloat16 tiles wrongly (garbage products), so there bfloat16 goes through float32.
    dot_f32 = x.dtype == torch.float32 or (x.dtype == torch.bfloat16 and x.device.type != "cuda")
    precision = "tf32x3" if dot_f32 else "tf32"  # the latter is ignored for half inputs
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    _dot_kernel[grid](
        x, out, *tensors, m, n, row_bytes, x.stride(0), out.stride(0), high_stride, group_stride, super_stride,
        **constants, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_B=block_b, DOT_F32=dot_f32, DOT_PRECISION=precision,
        num_warps=warps, num_stages=3,
    )
    return out


def dequantize_rows(w: BlockMatrix, ids: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """Rows ``ids`` of W (all rows when None) as ``dtype`` [R, K]; ids are not range-checked."""
    rows = w.shape[0] if ids is None else ids.numel()
    out = torch.empty((rows, w.shape[1]), dtype=dtype, device=w.device)
    if rows == 0:
        return out
    tensors, (row_bytes, high_stride, group_stride, super_stride), constants = w.kernel_args()
    block_r, block_b = (8, 128) if w.device.type == "cuda" else (64, 128)  # CPU: the interpreter, fewer programs
    grid = (triton.cdiv(rows, block_r), triton.cdiv(row_bytes, block_b))
    _dequantize_kernel[grid](
        out, w.codes if ids is None else ids, *tensors, rows, row_bytes, out.stride(0), high_stride, group_stride,
        super_stride, HAS_IDS=ids is not None, **constants, BLOCK_R=block_r, BLOCK_B=block_b, num_warps=4,
    )
    return out


__all__ = ["DEQUANT_GEMM_MIN_M", "GEMV_MAX_M", "block_matmul", "dequantize_rows"]
