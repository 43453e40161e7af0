"""Triton kernels over ``BlockMatrix``'s layout (GPU tensors; also runs under ``TRITON_INTERPRET=1``).

Contract: ``block_matmul(w, x)`` returns ``x @ W.T`` in float32 for x [M, K] of any float dtype,
and ``dequantize_rows(w, ids, dtype)`` the rows ``ids`` (all rows when None) of W as floats; both
read the weights quantized and dequantize them in registers. ``_weights`` turns codes into
``scale * (code - offset) + bias`` element by element for the tiled, dequantizing and elementwise
GEMV kernels; the grouped GEMV applies the same formula a scale group at a time.

Kernels, chosen by M with a fixed table (no autotune: the interpreter is too slow for it, and a
fixed choice keeps a CUDA graph's kernels the ones that were timed):

- M <= ``GEMV_MAX_M`` (decode, speculative verification, small batches): ``_grouped_gemv_kernel``
  (``block_matmul(w, x, gemv="elementwise")``: the first GEMV, ``_gemv_kernel``, kept to compare
  against). One program owns ``BLOCK_N`` weight rows and walks all of K, so each weight byte is
  read once for all M activation rows. Decode is bound by reading the weights, so the work per
  code byte is what the kernel minimizes: per group of codes sharing a scale, the products
  ``code * x`` are summed in float32 and the group's scale multiplies the sum once, each scale,
  bias, super-block value and high-bit word is loaded once per row and 16 code bytes (not per
  element), and a code becomes the exact float ``code - offset`` through its bits (an OR and one
  subtraction, which also takes the offset off). A bias (Q4_1/Q5_1 ``m``, the K-quants'
  ``-(dmin * min)``) adds ``bias * sum(x over the group)``, that sum taken from the activation
  tile the step loaded. The per-group results accumulate per (row, slot of the step) and are
  reduced once after the loop. The
  sums are reordered relative to ggml's element-wise weights (float32 rounding of the same
  order as the dot's own). The first GEMV formed a full float weight per element (a scale, and
  for K-quants a super scale and minimum, gathered per element) before multiplying.
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
def _load_units(ptr, ok, EVEN_K: tl.constexpr):
    """``tl.load`` of whole units: unmasked when the steps tile K exactly, else ``ok`` (broadcast)."""
    if EVEN_K:
        return tl.load(ptr)
    else:
        return tl.load(ptr, mask=ok, other=0)


@triton.jit
def _exact_float(q, minus: tl.constexpr):
    """int32 q in [0, 2**23) -> the float32 ``q - minus`` (``minus`` a small whole number), exactly:
    q's bits under the exponent of 2**23 are the float 2**23 + q, and one subtraction takes 2**23
    and the code offset off. An OR and an add instead of a conversion (a lower-throughput
    instruction on NVIDIA GPUs) and a separate offset subtraction."""
    return (q | 0x4B000000).to(tl.float32, bitcast=True) - (8388608.0 + minus)


@triton.jit
def _unit_scale(rows, g, e, ok, scales_ptr, super_scales_ptr, group_stride, super_stride,
                TWO_LEVEL: tl.constexpr, EVEN_K: tl.constexpr):
    """The float32 scale of group ``g`` (first element ``e``) per row and unit: [BLOCK_N, UNITS, 1]."""
    scale = _load_units(scales_ptr + rows * group_stride + g, ok, EVEN_K).to(tl.float32)
    if TWO_LEVEL:
        d = _load_units(super_scales_ptr + rows * super_stride + e // 256, ok, EVEN_K)
        scale = d.to(tl.float32) * scale
    return scale


@triton.jit
def _unit_bias(rows, g, e, ok, biases_ptr, super_mins_ptr, group_stride, super_stride,
               BIAS_KIND: tl.constexpr, EVEN_K: tl.constexpr):
    """The float32 bias of group ``g`` per row and unit, [BLOCK_N, UNITS, 1]: ``m``, or ``-(dmin * min)``."""
    bias = _load_units(biases_ptr + rows * group_stride + g, ok, EVEN_K).to(tl.float32)
    if BIAS_KIND == 2:
        dmin = _load_units(super_mins_ptr + rows * super_stride + e // 256, ok, EVEN_K)
        bias = -(dmin.to(tl.float32) * bias)
    return bias


@triton.jit
def _unit_top(high_ptr, rows, high_stride, e, b, ok, HIGH_BITS: tl.constexpr, EVEN_K: tl.constexpr):
    """The bits above the fourth of elements ``e + b`` (``e`` per unit, ``b`` within it), shifted
    into place: int32 [BLOCK_N, UNITS, UNIT]. One word load per unit and row."""
    PER_WORD: tl.constexpr = 32 // HIGH_BITS
    word = _load_units(high_ptr + rows * high_stride + e // PER_WORD, ok, EVEN_K)
    return ((word >> ((e % PER_WORD + b) * HIGH_BITS)) & ((1 << HIGH_BITS) - 1)) << 4


@triton.jit
def _unit_products(x_row, q_lo, q_hi, e_lo, b, ok, scale_lo, scale_hi, bias_lo, bias_hi,
                   SPAN: tl.constexpr, GROUP: tl.constexpr, BIAS_KIND: tl.constexpr, EVEN_K: tl.constexpr):
    """One activation row's products with a step's codes per weight row and unit, [BLOCK_N, UNITS, 1].
    ``q_hi`` / ``scale_hi`` / ``bias_hi`` are unused for Q8_0, the ``_hi`` scale and bias for the
    32-blocks (their two nibbles share a group), the biases unless BIAS_KIND. The activation's
    pointers are broadcast to the codes' shape so that both loads get one register layout (no
    layout conversion between them); the copies a thread would load for its rows are one load."""
    shape: tl.constexpr = q_lo.shape
    x_lo = _load_units(tl.broadcast_to(x_row + e_lo + b, shape), ok, EVEN_K).to(tl.float32)
    if SPAN == 0:
        return scale_lo * tl.sum(q_lo * x_lo, axis=2, keep_dims=True)
    x_hi = _load_units(tl.broadcast_to(x_row + e_lo + SPAN + b, shape), ok, EVEN_K).to(tl.float32)
    if SPAN < GROUP:  # the 32-blocks: both nibbles of a unit in one group
        part = scale_lo * tl.sum(q_lo * x_lo + q_hi * x_hi, axis=2, keep_dims=True)
        if BIAS_KIND > 0:
            part += bias_lo * tl.sum(x_lo + x_hi, axis=2, keep_dims=True)
        return part
    part = scale_lo * tl.sum(q_lo * x_lo, axis=2, keep_dims=True)
    part += scale_hi * tl.sum(q_hi * x_hi, axis=2, keep_dims=True)
    if BIAS_KIND > 0:
        part += bias_lo * tl.sum(x_lo, axis=2, keep_dims=True) + bias_hi * tl.sum(x_hi, axis=2, keep_dims=True)
    return part


@triton.jit
def _grouped_gemv_kernel(
    x_ptr, out_ptr, codes_ptr, high_ptr, scales_ptr, biases_ptr, super_scales_ptr, super_mins_ptr,
    M, N, row_bytes, x_stride, out_stride, high_stride, group_stride, super_stride,
    SPAN: tl.constexpr, HIGH_BITS: tl.constexpr, GROUP: tl.constexpr, OFFSET: tl.constexpr,
    BIAS_KIND: tl.constexpr, TWO_LEVEL: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, UNIT: tl.constexpr, UNITS: tl.constexpr, EVEN_K: tl.constexpr,
):
    """out[:M, rows] = x @ W[rows].T for the program's BLOCK_N rows: the module docstring's grouped
    GEMV. A unit is UNIT (16) code bytes whose low nibbles lie in one scale group and whose high
    nibbles in one (the same one for the 32-blocks; Q8_0: 16 codes of a group), so its scale,
    bias, super-block values and high-bit word are loaded once per row and unit. Every tensor is
    3-D, [rows, units, bytes of a unit] or broadcast to it, so that one register layout serves the
    whole step. Rows past N and activation rows past M are clamped to the last valid one (every
    load in bounds without a row mask) and dropped at the store."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)[:, None, None]
    rows64 = tl.minimum(rows, N - 1).to(tl.int64)
    b = tl.arange(0, UNIT)[None, None, :]
    code_rows = codes_ptr + rows64 * row_bytes
    units = row_bytes // UNIT
    ms = tl.arange(0, BLOCK_M)[None, None, :]
    # [rows, units, activation rows]: the per-unit products, reduced over the units after the loop
    acc = tl.zeros((BLOCK_N, UNITS, BLOCK_M), dtype=tl.float32)
    for start in range(0, units, UNITS):
        u = start + tl.arange(0, UNITS)[None, :, None]
        ok = u < units  # unused when EVEN_K
        byte = _load_units(code_rows + u * UNIT + b, ok, EVEN_K).to(tl.int32)
        if SPAN == 0:  # Q8_0: one signed code per byte, a unit half a group
            e_lo = u * UNIT
            q_lo = _exact_float(byte + 128, 128)
            q_hi = q_lo
        else:  # byte j of a run of SPAN holds elements j and j + SPAN of the run's 2 * SPAN
            e_lo = (u // (SPAN // UNIT)) * (2 * SPAN) + (u % (SPAN // UNIT)) * UNIT
            low = byte & 15
            high = byte >> 4
            if HIGH_BITS > 0:
                low = low | _unit_top(high_ptr, rows64, high_stride, e_lo, b, ok, HIGH_BITS, EVEN_K)
                high = high | _unit_top(high_ptr, rows64, high_stride, e_lo + SPAN, b, ok, HIGH_BITS, EVEN_K)
            q_lo = _exact_float(low, OFFSET)
            q_hi = _exact_float(high, OFFSET)
        g_lo = e_lo // GROUP
        g_hi = (e_lo + SPAN) // GROUP
        scale_lo = _unit_scale(rows64, g_lo, e_lo, ok, scales_ptr, super_scales_ptr, group_stride, super_stride,
                               TWO_LEVEL, EVEN_K)
        scale_hi = scale_lo
        if SPAN >= GROUP:
            scale_hi = _unit_scale(rows64, g_hi, e_lo, ok, scales_ptr, super_scales_ptr, group_stride, super_stride,
                                   TWO_LEVEL, EVEN_K)
        bias_lo = scale_lo
        bias_hi = scale_lo
        if BIAS_KIND > 0:
            bias_lo = _unit_bias(rows64, g_lo, e_lo, ok, biases_ptr, super_mins_ptr, group_stride, super_stride,
                                 BIAS_KIND, EVEN_K)
            if SPAN >= GROUP:
                bias_hi = _unit_bias(rows64, g_hi, e_lo, ok, biases_ptr, super_mins_ptr, group_stride, super_stride,
                                     BIAS_KIND, EVEN_K)
        if BLOCK_M == 1:
            acc += _unit_products(x_ptr, q_lo, q_hi, e_lo, b, ok, scale_lo, scale_hi, bias_lo, bias_hi,
                                  SPAN, GROUP, BIAS_KIND, EVEN_K)
        else:
            for m in tl.static_range(BLOCK_M):
                # activation rows past M read row M - 1 again (dropped at the store)
                x_row = x_ptr + tl.minimum(m, M - 1).to(tl.int64) * x_stride
                part = _unit_products(x_row, q_lo, q_hi, e_lo, b, ok, scale_lo, scale_hi, bias_lo, bias_hi,
                                      SPAN, GROUP, BIAS_KIND, EVEN_K)
                acc = tl.where(ms == m, acc + part, acc)
    out = tl.sum(acc, axis=1)  # [BLOCK_N, BLOCK_M]
    rows2 = (tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N))[:, None]
    ms2 = tl.arange(0, BLOCK_M)[None, :]
    tl.store(out_ptr + ms2.to(tl.int64) * out_stride + rows2, out, mask=(rows2 < N) & (ms2 < M))


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


# The grouped GEMV's tiles on a GPU, by BLOCK_M (M rounded up to a power of two): (BLOCK_N weight
# rows, code bytes of a row per step, warps). Each thread loads whole 16-byte units, so
# BLOCK_N * bytes >= 512 * warps keeps every thread on bytes of its own (no replicated work).
# M = 1: 4 KiB of codes a program and step, 32 bytes a thread in two rows (each activation value
# loaded and converted serves both), and at Q4_0's 56 registers nine programs an SM: loads enough
# in flight to cover the memory latency. Larger M multiply the products per byte (and the
# registers): M = 2 and 4 take 16 bytes a thread, M = 8 two rows again (its activation values are
# eight times as many to convert). Chosen by reading the compiled sm_90 code (registers, no
# spills, no shared-memory round trip in the loop), not by timing: the benchmark's --sweep times
# alternatives.
_GEMV_TILES = {1: (4, 1024, 4), 2: (4, 512, 4), 4: (4, 512, 4), 8: (8, 512, 4)}
# Under the interpreter the cost is per program step: few, large programs.
_GEMV_TILE_INTERPRETED = (32, 256, 4)
_GEMV_KERNELS = ("grouped", "elementwise")
_UNIT = 16  # bytes of a grouped GEMV unit (see _grouped_gemv_kernel)


def _gemv(
    w: BlockMatrix, x: torch.Tensor, out: torch.Tensor, gemv: str, tile: tuple[int, int, int] | None = None
) -> None:
    """out [M, N] = x @ W.T for M <= ``GEMV_MAX_M`` through the ``gemv`` kernel; ``tile``
    (BLOCK_N, code bytes of a row per step, warps) overrides the fixed choice (tests, benchmarks)."""
    m, n = x.shape[0], w.shape[0]
    tensors, (row_bytes, high_stride, group_stride, super_stride), constants = w.kernel_args()
    block_m = triton.next_power_of_2(m)
    on_gpu = x.device.type == "cuda"
    if gemv == "grouped":
        block_n, step_bytes, warps = tile or (_GEMV_TILES[block_m] if on_gpu else _GEMV_TILE_INTERPRETED)
        units = max(1, min(step_bytes, triton.next_power_of_2(row_bytes)) // _UNIT)
        _grouped_gemv_kernel[(triton.cdiv(n, block_n),)](
            x, out, *tensors, m, n, row_bytes, x.stride(0), out.stride(0), high_stride, group_stride, super_stride,
            **constants, BLOCK_M=block_m, BLOCK_N=block_n, UNIT=_UNIT, UNITS=units,
            EVEN_K=(row_bytes // _UNIT) % units == 0, num_warps=warps,
        )
    else:
        if tile is None:
            block_n = (8 if n >= 8192 else 4) if on_gpu else 32  # the interpreter: fewer programs
            tile = (block_n, {1: 256, 2: 256, 4: 128, 8: 64}[block_m], 4)
        block_n, block_b, warps = tile
        _gemv_kernel[(triton.cdiv(n, block_n),)](
            x, out, *tensors, m, n, row_bytes, x.stride(0), out.stride(0), high_stride, group_stride, super_stride,
            **constants, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_B=block_b, num_warps=warps,
        )


def block_matmul(w: BlockMatrix, x: torch.Tensor, gemv: str = "grouped") -> torch.Tensor:
    """x [M, K] (float32/float16/bfloat16) -> x @ W.T [M, N] float32. ``gemv`` names the kernel
    for M <= ``GEMV_MAX_M``: "grouped" (the default) or "elementwise" (the first GEMV, kept to
    compare against); larger M ignore it."""
    if gemv not in _GEMV_KERNELS:
        raise ValueError(f"gemv must be one of {_GEMV_KERNELS}, got {gemv!r}")
    m, n = x.shape[0], w.shape[0]
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        x = x.float()
    if x.stride(1) != 1:
        x = x.contiguous()
    out = torch.empty((m, n), dtype=torch.float32, device=x.device)
    if m <= GEMV_MAX_M:
        _gemv(w, x, out, gemv)
        return out
    tensors, (row_bytes, high_stride, group_stride, super_stride), constants = w.kernel_args()
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
