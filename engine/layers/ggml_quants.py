"""ggml's block formats on the CPU: weights kept in their encoding, dot products as the format defines them.

``QuantizedWeight.from_gguf(type_name, raw)`` takes a GGUF tensor's bytes [N, row_bytes] and keeps
them block by block in arrays a compiled loop reads directly (the octet formats' fp16 scales kept
as the file's half-precision bits and widened in the loop, ``octet_dot.half_to_float``; Q5_0 /
Q5_1 widen theirs to float32 at load):

| type | block | kept as | activation quantized to |
| --- | ---: | --- | --- |
| Q4_0 / Q4_1 | 32 | nibbles in octets of eight rows (``octet_dot``); d (and m) likewise | Q8_0 / Q8_1 |
| Q8_0 | 32 | int8 codes (plus 128) in octets; d likewise | Q8_0 |
| Q4_K | 256 | nibbles in octets; d and dmin a super-block, the 6-bit scales and mins a 32-block | Q8_K |
| Q5_K | 256 | codes 0..31 in octets, a byte each; the scales as Q4_K's | Q8_K |
| Q6_K | 256 | codes 0..63 in octets, a byte each; d a super-block, the int8 scales a 16-block | Q8_K |
| Q5_0 / Q5_1 | 32 | nibbles as in the file, the fifth bits as uint32, d (and m), row by row | Q8_0 / Q8_1 |

In memory a matrix takes its file's bytes times about 1.0 (Q4_0, Q4_1, Q8_0), 1.03 (Q4_K), 1.3
(Q6_K) and 1.6 (Q5_K): the K-quants' 6-bit sub-scales and mins take a byte each, and the 5- and
6-bit codes a byte (a Q4_K_M file, mostly Q4_K with some Q6_K, about 1.07x).

A linear layer on a few activation rows (decode, speculative verification, mixed batches) first
quantizes each row the way llama.cpp does for that format (8-bit blocks with an fp16 scale, plus
the block sum for the formats with a minimum: Q8_1; 256-element blocks with a float32 scale and
16-element sums for the K-quants: Q8_K), then sums code x code x both scales over the row: the
format's own dot product, which is why greedy outputs agree with llama.cpp's. Q4_0, Q4_1, Q8_0,
and the K-quants sum each 32-element block (Q6_K: 16) exactly in integers, then scale it, as
llama.cpp's own kernels do, eight weight rows at once (``octet_dot``: one ``vpdpbusd`` adds four
products into each of eight rows' sums; 2-4x faster than the one-row-at-a-time loops it
replaced); Q5_0 and Q5_1 run a float loop (the same sums up to rounding order, relative 1e-6).
The loops run at every row count, long prefills included: a row's result never depends on how
many rows share its forward. Dequantizing the weight for torch's GEMM prefilled a 256-token
SmolLM2 prompt 1.7x faster than the one-row loops did, but its rounding differs from the loop's by ~1e-7, and the next
layer's 8-bit activation blocks turn that into other codes: a logit moved by up to 1.06 between a
prompt prefilled whole and the same tokens decoded one by one, so batching, the prefix cache and
speculation changed greedy outputs.

Every loop releases the GIL and covers a range of output rows (of octets, for the octet
formats; a matrix whose rows are not a multiple of eight gets a last octet padded with zero rows).
The integer loops of a large
product run as one numba parallel region over equal ranges of octets (``_in_threads``: every
product of a SmolLM2 decode step splits; ``cpu_threads.run_rows``' handoff cost what a 576 x 576
product costs); the Q5 float loop and the dequantization keep ``run_rows``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F
from numba import njit, prange

from formcast_kernels.ggml_blocks import BlockMatrix

from . import numba_cache
from .cpu_threads import run_rows, threads
from .fp16_round import round_half
from .int_dot import float_dot
from .octet_dot import FORMATS as OCTET_FORMATS
from .octet_dot import (
    MAX_ROWS, OCTET, half_to_float, octet_rows_q4_0, octet_rows_q4_1, octet_rows_q4_k, octet_rows_q5_k, octet_rows_q6_k, octet_rows_q8_0,
    pack_lanes, pack_octets, unpack_lanes, unpack_octets,
)  # fmt: skip

if TYPE_CHECKING:
    from .panel_linear import PanelWeight

numba_cache.register()  # before the loops below enable their caches: they inline octet_dot's and int_dot's IR

QK = 32
QK_K = 256

BLOCK_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")
K_TYPES = ("Q4_K", "Q5_K", "Q6_K")
QUANT_TYPES = BLOCK_TYPES + K_TYPES
OCTET_TYPES = ("Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")  # kept eight rows to an octet (``octet_dot``); in this order: the loops' ``kind``
_Q8_1_TYPES = ("Q4_1", "Q5_1")  # the formats with a minimum: activations carry their block sums


def _f16(raw: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(raw).view(np.float16).astype(np.float32)[..., 0]


def _f16_bits(raw: np.ndarray) -> np.ndarray:
    """A block's fp16 field as its bit pattern (uint16): how the octet loops keep scales."""
    return np.ascontiguousarray(raw).view(np.uint16)[..., 0]


def _half_bits(values: np.ndarray) -> np.ndarray:
    """Scales as half-precision bit patterns: kept if they are already, else rounded to float16
    (exact for a file's scales, which are float16 values)."""
    return values if values.dtype == np.uint16 else np.asarray(values, np.float32).astype(np.float16).view(np.uint16)


# --------------------------------------------------------------------------- activation quantizers


@njit(inline="always", nogil=True, cache=True)
def _block_amax(x, r, b):  # pragma: no cover - compiled
    """The largest magnitude of row ``r``'s 32-element block ``b`` (Q8_0 / Q8_1's scale is it / 127)."""
    amax = np.float32(0.0)
    for j in range(32):
        amax = max(amax, abs(x[r, b * 32 + j]))
    return amax


@njit(nogil=True, cache=True, boundscheck=False)
def quantize_q8_0(x, xq, xd, xs, xt):  # pragma: no cover - compiled
    """Rows of ``x`` [M, K] into 32-element blocks: int8 codes ``xq`` [M, K], fp16-rounded
    scales ``xd`` [M, K/32], ``xs`` = fp16(d * sum of codes) (Q8_1's block sum; ignored by
    Q8_0) and the integer code sums ``xt`` [M, K/32] (int32: the octet loops' offset terms)."""
    m_rows, k_dim = x.shape
    for r in range(m_rows):
        for b in range(k_dim // 32):
            amax = _block_amax(x, r, b)
            d = amax / np.float32(127.0)
            inv = np.float32(127.0) / amax if amax != 0.0 else np.float32(0.0)
            total = 0
            for j in range(32):
                q = np.int32(np.rint(x[r, b * 32 + j] * inv))
                xq[r, b * 32 + j] = q
                total += q
            xd[r, b] = round_half(d)
            xs[r, b] = round_half(d * np.float32(total))
            xt[r, b] = total


@njit(nogil=True, cache=True, boundscheck=False)
def _q8_dequantized(x, lo, hi, xs):  # pragma: no cover - compiled
    """``quantize_q8_0`` fused with the dequantization the 5-bit loop reads: each code times its
    block's fp16 scale, per block elements 0-15 into ``lo`` and 16-31 into ``hi`` [M, K/2]; ``xs``
    as ``quantize_q8_0``'s."""
    m_rows, k_dim = x.shape
    for r in range(m_rows):
        for b in range(k_dim // 32):
            amax = _block_amax(x, r, b)
            inv = np.float32(127.0) / amax if amax != 0.0 else np.float32(0.0)
            d = round_half(amax / np.float32(127.0))
            total = 0
            for j in range(32):
                q = np.rint(x[r, b * 32 + j] * inv)
                total += np.int32(q)
                value = np.float32(q) * d
                if j < 16:
                    lo[r, b * 16 + j] = value
                else:
                    hi[r, b * 16 + j - 16] = value
            xs[r, b] = round_half(amax / np.float32(127.0) * np.float32(total))


@njit(nogil=True, cache=True, boundscheck=False)
def quantize_q8_k(x, xq, xd, xbs):  # pragma: no cover - compiled
    """Rows of ``x`` [M, K] into Q8_K: 256-element blocks scaled by -127 / (the signed value of
    largest magnitude), float32 scale ``xd`` [M, K/256], 16-element sums ``xbs`` [M, K/16]."""
    m_rows, k_dim = x.shape
    for r in range(m_rows):
        for b in range(k_dim // 256):
            amax = np.float32(0.0)
            vmax = np.float32(0.0)
            for j in range(256):
                v = x[r, b * 256 + j]
                if abs(v) > amax:
                    amax = abs(v)
                    vmax = v
            if amax == 0.0:
                xd[r, b] = 0.0
                for j in range(256):
                    xq[r, b * 256 + j] = 0
                for g in range(16):
                    xbs[r, b * 16 + g] = 0
                continue
            iscale = np.float32(-127.0) / vmax
            for g in range(16):
                total = 0
                for j in range(16):
                    q = min(127, np.int32(np.rint(iscale * x[r, b * 256 + g * 16 + j])))
                    xq[r, b * 256 + g * 16 + j] = q
                    total += q
                xbs[r, b * 16 + g] = total
            xd[r, b] = np.float32(1.0) / iscale


@njit(nogil=True, cache=True, boundscheck=False)
def _q8_k_block_terms(xd_super, sums16, minimum, xd, xt, xs):  # pragma: no cover - compiled
    """Q8_K's per-row scale and 16-element sums -> the octet loops' per-block arrays for blocks of
    ``xt.shape[1]``-th of a row (32 or 16 elements): the scale ``xd``, the code sum ``xt`` and,
    where the format has a minimum, ``xs`` = -(float(xt) * xd) (the minimum term subtracts the
    block's value sum). One call where numpy took five on every product of a K-quant model."""
    rows, blocks = xt.shape
    per_block = sums16.shape[1] // blocks  # 16-element sums a block: 2 or 1
    per_super = blocks // xd_super.shape[1]
    for r in range(rows):
        for b in range(blocks):
            total = 0
            for j in range(per_block):
                total += sums16[r, b * per_block + j]
            xt[r, b] = total
            xd[r, b] = xd_super[r, b // per_super]
            if minimum:
                xs[r, b] = -(np.float32(total) * xd[r, b])


# --------------------------------------------------------------------------- dot-product loops
# The octet loops (``_mm_q4_0`` ... ``_mm_q6_k``) call ``octet_dot`` once per (octet, up to ``octet_dot.MAX_ROWS``
# activation rows). The float loop (Q5_0 / Q5_1) is one flat loop over the row's codes: code * its
# block's scale * the dequantized activation code (``x`` = activation code * its fp16 scale), i.e.
# sum_b d_w d_x (sum of code products) regrouped into one reduction that LLVM vectorizes; its
# minimum term uses Q8_1's block sums. It reads the activation as two halves per block (``xlo``:
# elements 0-15, ``xhi``: 16-31), matching each byte's two nibbles.


@njit(boundscheck=False, inline="always")
def _plus_minimums(acc, wm, xs, n, r):  # pragma: no cover - compiled
    """acc plus Q5_1's minimum terms of output row n and activation row r (none: ``wm`` has zero
    columns for Q5_0), summed by ``int_dot.float_dot``: no fast-math, so a serial and a threaded
    build of a loop round alike."""
    if wm.shape[1] == 0:
        return acc
    return acc + float_dot(wm[n].ctypes.data, xs[r].ctypes.data, wm.shape[1])


@njit(inline="always", boundscheck=False)
def _octets_of(g0, g1, kind, w, wd, wm, sc, mn, x8, xd, xt, xs, out):  # pragma: no cover - compiled
    """Octets [g0, g1) of format ``OCTET_TYPES[kind]`` times activation rows up to
    ``octet_dot.MAX_ROWS`` at a time: ``out[r, 8g:8g + 8]``. Arrays a format has not (``wm``,
    ``sc``, ``mn``) are any octet array of the matrix: never read. Inlined with ``kind`` a
    constant, so each loop keeps one format's intrinsic."""
    m_rows = x8.shape[0]
    blocks = xd.shape[1]
    for g in range(g0, g1):
        r = 0
        while r < m_rows:
            size = min(m_rows - r, MAX_ROWS)
            wg, dg, mg, sg, ng = w[g].ctypes.data, wd[g].ctypes.data, wm[g].ctypes.data, sc[g].ctypes.data, mn[g].ctypes.data
            xr, dr, tr, sr = x8[r].ctypes.data, xd[r].ctypes.data, xt[r].ctypes.data, xs[r].ctypes.data
            target, step = out[r].ctypes.data + g * OCTET * 4, out.strides[0]
            if kind == 0:
                octet_rows_q4_0(wg, dg, mg, sg, ng, xr, dr, tr, sr, blocks, target, step, size)
            elif kind == 1:
                octet_rows_q4_1(wg, dg, mg, sg, ng, xr, dr, tr, sr, blocks, target, step, size)
            elif kind == 2:
                octet_rows_q8_0(wg, dg, mg, sg, ng, xr, dr, tr, sr, blocks, target, step, size)
            elif kind == 3:
                octet_rows_q4_k(wg, dg, mg, sg, ng, xr, dr, tr, sr, blocks, target, step, size)
            elif kind == 4:
                octet_rows_q5_k(wg, dg, mg, sg, ng, xr, dr, tr, sr, blocks, target, step, size)
            else:
                octet_rows_q6_k(wg, dg, mg, sg, ng, xr, dr, tr, sr, blocks, target, step, size)
            r += size


# One compiled loop per format, written out: a model compiles only its own formats (a cold start
# pays seconds a loop), and numba's disk cache keys a function by its name and line, so loops made
# by a factory would overwrite each other's cache entries.
@njit(nogil=True, cache=True, boundscheck=False)
def _mm_q4_0(g0, g1, w, wd, wm, sc, mn, x8, xd, xt, xs, out):  # pragma: no cover - compiled
    _octets_of(g0, g1, 0, w, wd, wm, sc, mn, x8, xd, xt, xs, out)


@njit(nogil=True, cache=True, boundscheck=False)
def _mm_q4_1(g0, g1, w, wd, wm, sc, mn, x8, xd, xt, xs, out):  # pragma: no cover - compiled
    _octets_of(g0, g1, 1, w, wd, wm, sc, mn, x8, xd, xt, xs, out)


@njit(nogil=True, cache=True, boundscheck=False)
def _mm_q8_0(g0, g1, w, wd, wm, sc, mn, x8, xd, xt, xs, out):  # pragma: no cover - compiled
    _octets_of(g0, g1, 2, w, wd, wm, sc, mn, x8, xd, xt, xs, out)


@njit(nogil=True, cache=True, boundscheck=False)
def _mm_q4_k(g0, g1, w, wd, wm, sc, mn, x8, xd, xt, xs, out):  # pragma: no cover - compiled
    _octets_of(g0, g1, 3, w, wd, wm, sc, mn, x8, xd, xt, xs, out)


@njit(nogil=True, cache=True, boundscheck=False)
def _mm_q5_k(g0, g1, w, wd, wm, sc, mn, x8, xd, xt, xs, out):  # pragma: no cover - compiled
    _octets_of(g0, g1, 4, w, wd, wm, sc, mn, x8, xd, xt, xs, out)


@njit(nogil=True, cache=True, boundscheck=False)
def _mm_q6_k(g0, g1, w, wd, wm, sc, mn, x8, xd, xt, xs, out):  # pragma: no cover - compiled
    _octets_of(g0, g1, 5, w, wd, wm, sc, mn, x8, xd, xt, xs, out)


# The octet loops across numba's threads: one parallel region whose iterations are equal ranges
# of octets. Measured against ``run_rows`` on a SmolLM2 Q4_1 decode step: its handoff (a pool
# thread woken through a futex, then the GIL) cost about what a 576 x 576 product costs, so only
# the fused gate/up product was split and the rest ran on one core; numba's OpenMP threads spin
# briefly between regions, and every product of the step splits (step 24 -> 20 ms). The loops are
# strict IEEE code (no fast-math), so a row's bits are the same whichever build (this region's
# inlined copy or the serial function) computes it.
@njit(nogil=True, cache=True, boundscheck=False, parallel=True)
def _mm_q4_0_threaded(chunks, w, wd, wm, sc, mn, x8, xd, xt, xs, out):  # pragma: no cover - compiled
    step = (w.shape[0] + chunks - 1) // chunks
    for c in prange(chunks):
        _mm_q4_0(c * step, min(w.shape[0], (c + 1) * step), w, wd, wm, sc, mn, x8, xd, xt, xs, out)


@njit(nogil=True, cache=True, boundscheck=False, parallel=True)
def _mm_q4_1_threaded(chunks, w, wd, wm, sc, mn, x8, xd, xt, xs, out):  # pragma: no cover - compiled
    step = (w.shape[0] + chunks - 1) // chunks
    for c in prange(chunks):
        _mm_q4_1(c * step, min(w.shape[0], (c + 1) * step), w, wd, wm, sc, mn, x8, xd, xt, xs, out)


@njit(nogil=True, cache=True, boundscheck=False, parallel=True)
def _mm_q8_0_threaded(chunks, w, wd, wm, sc, mn, x8, xd, xt, xs, out):  # pragma: no cover - compiled
    step = (w.shape[0] + chunks - 1) // chunks
    for c in prange(chunks):
        _mm_q8_0(c * step, min(w.shape[0], (c + 1) * step), w, wd, wm, sc, mn, x8, xd, xt, xs, out)


@njit(nogil=True, cache=True, boundscheck=False, parallel=True)
def _mm_q4_k_threaded(chunks, w, wd, wm, sc, mn, x8, xd, xt, xs, out):  # pragma: no cover - compiled
    step = (w.shape[0] + chunks - 1) // chunks
    for c in prange(chunks):
        _mm_q4_k(c * step, min(w.shape[0], (c + 1) * step), w, wd, wm, sc, mn, x8, xd, xt, xs, out)


@njit(nogil=True, cache=True, boundscheck=False, parallel=True)
def _mm_q5_k_threaded(chunks, w, wd, wm, sc, mn, x8, xd, xt, xs, out):  # pragma: no cover - compiled
    step = (w.shape[0] + chunks - 1) // chunks
    for c in prange(chunks):
        _mm_q5_k(c * step, min(w.shape[0], (c + 1) * step), w, wd, wm, sc, mn, x8, xd, xt, xs, out)


@njit(nogil=True, cache=True, boundscheck=False, parallel=True)
def _mm_q6_k_threaded(chunks, w, wd, wm, sc, mn, x8, xd, xt, xs, out):  # pragma: no cover - compiled
    step = (w.shape[0] + chunks - 1) // chunks
    for c in prange(chunks):
        _mm_q6_k(c * step, min(w.shape[0], (c + 1) * step), w, wd, wm, sc, mn, x8, xd, xt, xs, out)


# Each octet format's (serial loop, threaded loop)
_OCTET_LOOPS = {
    "Q4_0": (_mm_q4_0, _mm_q4_0_threaded), "Q4_1": (_mm_q4_1, _mm_q4_1_threaded), "Q8_0": (_mm_q8_0, _mm_q8_0_threaded),
    "Q4_K": (_mm_q4_k, _mm_q4_k_threaded), "Q5_K": (_mm_q5_k, _mm_q5_k_threaded), "Q6_K": (_mm_q6_k, _mm_q6_k_threaded),
}  # fmt: skip


# Below this many multiply-adds a product runs on the calling thread (a parallel region costs a
# few microseconds while the threads spin, tens once they sleep).
THREADED_MIN_MACS = 1 << 17


def runs_threaded(n_out: int, macs: int, count: int) -> bool:
    """Whether a product of ``n_out`` output units (octets, or rows) and ``macs`` multiply-adds
    runs the integer loops across ``count`` threads (else on the calling thread)."""
    return count > 1 and macs >= THREADED_MIN_MACS and n_out >= 2 * count


def _in_threads(serial, threaded, n_out: int, macs: int, split: bool | None, *args) -> None:  # type: ignore[no-untyped-def]
    """``serial(0, n_out, *args)``, or ``threaded(threads, *args)`` for a large product (``split``:
    the choice forced, for the warm-up)."""
    count = threads()
    if split is None:
        split = runs_threaded(n_out, macs, count)
    if split:
        threaded(count, *args)
    else:
        serial(0, n_out, *args)


@njit(fastmath=True, nogil=True, cache=True, boundscheck=False)
def _mm_q5(n0, n1, off, qs, qh, wd, wm, xlo, xhi, xs, out):  # pragma: no cover - compiled
    """Output rows [n0, n1) of Q5_0 (``off`` 16, ``wm`` zero) and Q5_1 (``off`` 0): each code's
    fifth bit from ``qh`` (bit j for element j, bit j + 16 for element j + 16)."""
    m_rows, half = xlo.shape
    for n in range(n0, n1):
        for r in range(m_rows):
            acc = np.float32(0.0)
            for i in range(half):
                v = np.uint32(qs[n, i])
                h = qh[n, i >> 4]
                j = np.uint32(i & 15)
                lo = (v & np.uint32(15)) | (((h >> j) & np.uint32(1)) << np.uint32(4))
                hi = (v >> np.uint32(4)) | (((h >> (j + np.uint32(16))) & np.uint32(1)) << np.uint32(4))
                acc += ((np.float32(lo) - off) * xlo[r, i] + (np.float32(hi) - off) * xhi[r, i]) * wd[n, i >> 4]
            out[r, n] = _plus_minimums(acc, wm, xs, n, r)


# --------------------------------------------------------------------------- dequantization


@njit(nogil=True, cache=True, boundscheck=False)
def _dequant_q5(i0, i1, off, qs, qh, wd, wm, rows, out):  # pragma: no cover - compiled
    """Rows ``rows[i0:i1]`` of Q5_0 (``off`` 16, ``wm`` zero columns) or Q5_1 (``off`` 0): the file's
    layout, element j in the low nibble of byte j with bit j of ``qh``, j + 16 in the high one."""
    for i in range(i0, i1):
        n = rows[i]
        for b in range(wd.shape[1]):
            d = wd[n, b]
            h = qh[n, b]
            for j in range(16):
                v = np.int32(qs[n, b, j])
                lo = (v & 15) | np.int32(((h >> j) & 1) << 4)
                hi = (v >> 4) | np.int32(((h >> (j + 16)) & 1) << 4)
                if wm.shape[1] == 0:
                    out[i, b * 32 + j] = np.float32(lo - off) * d
                    out[i, b * 32 + j + 16] = np.float32(hi - off) * d
                else:
                    out[i, b * 32 + j] = np.float32(lo) * d + wm[n, b]
                    out[i, b * 32 + j + 16] = np.float32(hi) * d + wm[n, b]


@njit(nogil=True, cache=True, boundscheck=False)
def _dequant_octets(i0, i1, nibbles, block, offset, super_blocks, minimum, w, wd, wm, sc, mn, rows, out):  # pragma: no cover - compiled
    """Rows ``rows[i0:i1]`` of an octet matrix (``octet_dot``'s layout; the format's constants
    passed as ``octet_dot.OctetFormat`` holds them), rounded as gguf's reference dequantizer:
    (stored code - offset) * d, code * d + m (Q4_1), d * code - m (the K-quants' minimums)."""
    for i in range(i0, i1):
        g, r = rows[i] >> 3, rows[i] & 7
        for b in range(w.shape[1]):
            if super_blocks:
                d = half_to_float(wd[g, b // super_blocks, r]) * np.float32(sc[g, b, r])
                m = np.float32(0.0)
                if minimum:
                    m = half_to_float(wm[g, b // super_blocks, r]) * np.float32(mn[g, b, r])
            else:
                d = half_to_float(wd[g, b, r])
                m = half_to_float(wm[g, b, r]) if minimum else np.float32(0.0)
            for e in range(block):
                if nibbles:  # chunk e // 8, lane r, byte e % 4; the high nibble where e % 8 >= 4
                    byte = np.int32(w[g, b, (e >> 3) * 32 + r * 4 + (e & 3)])
                    code = (byte >> (4 * ((e >> 2) & 1))) & 15
                else:  # chunk e // 4, lane r, byte e % 4
                    code = np.int32(w[g, b, (e >> 2) * 32 + r * 4 + (e & 3)])
                if not minimum:
                    out[i, b * block + e] = np.float32(code - offset) * d
                elif super_blocks:
                    out[i, b * block + e] = d * np.float32(code) - m
                else:
                    out[i, b * block + e] = np.float32(code) * d + m


# --------------------------------------------------------------------------- unpacking GGUF blocks


def _k_scales_mins(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K: 8 six-bit scales and 8 six-bit mins packed in 12 bytes -> [.., 8] each."""
    s = scales.astype(np.int32)
    sc = np.empty(s.shape[:-1] + (8,), np.int32)
    mn = np.empty_like(sc)
    sc[..., :4] = s[..., 0:4] & 63
    mn[..., :4] = s[..., 4:8] & 63
    sc[..., 4:] = (s[..., 8:12] & 0xF) | ((s[..., 0:4] >> 6) << 4)
    mn[..., 4:] = (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)
    return sc, mn


def _file_rows(type_name: str, blocks: np.ndarray) -> dict[str, np.ndarray]:
    """An octet format's file blocks [n, blocks or super-blocks, bytes] -> per-row arrays: ``codes``
    [n, K] in element order (unsigned; Q8_0's int8), ``d`` (a float32 scale a block, or the
    K-quants' a super-block), and where the format has them ``m`` (Q4_1's minimum a block, the
    K-quants' dmin a super-block), ``sc`` and ``mn`` (the K-quants' sub-scales a block: 6-bit,
    Q6_K's int8; 6-bit mins)."""
    n = blocks.shape[0]
    if type_name in ("Q4_0", "Q4_1", "Q8_0"):
        rows = {"d": _f16_bits(blocks[..., 0:2])}
        if type_name == "Q8_0":
            rows["codes"] = np.ascontiguousarray(blocks[..., 2:34]).view(np.int8).reshape(n, -1)
            return rows
        nibbles = blocks[..., 4:20] if type_name == "Q4_1" else blocks[..., 2:18]  # element j low, j + 16 high
        rows["codes"] = np.concatenate([nibbles & 15, nibbles >> 4], axis=2).reshape(n, -1)
        if type_name == "Q4_1":
            rows["m"] = _f16_bits(blocks[..., 2:4])
        return rows
    nsb = blocks.shape[1]
    if type_name in ("Q4_K", "Q5_K"):
        sc, mn = _k_scales_mins(blocks[..., 4:16])
        qs = blocks[..., 16:144] if type_name == "Q4_K" else blocks[..., 48:176]
        qs = qs.reshape(n, nsb, 4, 32)
        codes = np.stack([qs & 15, qs >> 4], axis=3)  # [n, nsb, 4 chunks, lo/hi, 32]
        if type_name == "Q5_K":
            qh = blocks[..., 16:48]  # [n, nsb, 32]
            shifts = np.arange(8, dtype=np.uint8).reshape(4, 2)  # chunk c, half h -> bit 2c + h
            codes = codes | (((qh[:, :, None, None, :] >> shifts[None, None, :, :, None]) & 1) << 4)
        return {
            "codes": codes.reshape(n, -1).astype(np.uint8), "d": _f16_bits(blocks[..., 0:2]), "m": _f16_bits(blocks[..., 2:4]),
            "sc": sc.reshape(n, -1).astype(np.uint8), "mn": mn.reshape(n, -1).astype(np.uint8),
        }  # fmt: skip
    # Q6_K: ql[128], qh[64], scales int8[16], d; codes 0..63 (the value is code - 32)
    ql = blocks[..., 0:128].reshape(n, nsb, 2, 64)
    qh = blocks[..., 128:192].reshape(n, nsb, 2, 32)
    lo = ql[..., :32] & 15, ql[..., 32:] & 15, ql[..., :32] >> 4, ql[..., 32:] >> 4
    codes = np.stack([lo[i] | (((qh >> (2 * i)) & 3) << 4) for i in range(4)], axis=3)  # [n, nsb, half, 4, 32]
    scales = np.ascontiguousarray(blocks[..., 192:208]).view(np.int8).reshape(n, -1)
    return {"codes": codes.reshape(n, -1).astype(np.uint8), "d": _f16_bits(blocks[..., 208:210]), "sc": scales}


def _octet_arrays(type_name: str, rows: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``_file_rows``' per-row arrays -> the octet arrays the loops read (``octet_dot``): ``d`` and
    ``m`` as half-precision bit patterns."""
    def packed(key: str, value: np.ndarray) -> np.ndarray:
        if key == "codes":
            return pack_octets(value, type_name)
        return pack_lanes(_half_bits(value) if key in ("d", "m") else value)

    return {("octets" if key == "codes" else f"octet_{key}"): packed(key, value) for key, value in rows.items()}


class QuantizedWeight:
    """A [N, K] weight matrix in a ggml block format; ``linear`` and ``embedding`` use it as is.

    Looks enough like a weight tensor for the model code around it (``shape``, ``dtype`` of the
    results, ``device``). ``cat`` stacks matrices of one format along N (fused q/k/v, gate/up).
    """

    def __init__(self, type_name: str, shape: tuple[int, int], arrays: dict[str, np.ndarray]) -> None:
        self.type_name = type_name
        self.shape = torch.Size(shape)
        # The integer loops read rows through their addresses: C order everywhere.
        self.arrays = {k: np.ascontiguousarray(v) for k, v in arrays.items()}
        self.dtype = torch.float32  # what it computes in
        self.device = torch.device("cpu")

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays.values())

    @property
    def split_units(self) -> int:
        """How many units the loops split across threads: octets for the octet formats, else rows."""
        return self.arrays["octets"].shape[0] if "octets" in self.arrays else self.shape[0]

    # Rows decoded and packed per slice at load, so a large matrix (an embedding) needs a slice's
    # temporaries beside its packed arrays, not a copy of its codes.
    _PACK_ROWS = 8192

    @classmethod
    def from_gguf(cls, type_name: str, raw: np.ndarray, shape: tuple[int, int]) -> QuantizedWeight:
        """``raw``: the tensor's bytes [N, row_bytes] as stored in the file."""
        n, k = shape
        if type_name not in QUANT_TYPES:
            raise ValueError(f"no kernel for type {type_name}")
        block = QK_K if type_name in K_TYPES else QK
        if k % block:
            raise ValueError(f"{type_name} rows of {k} elements are not whole {block}-element blocks")
        blocks = raw.reshape(n, k // block, -1)
        if type_name in ("Q5_0", "Q5_1"):
            arrays = {"d": _f16(blocks[..., 0:2])}
            start = 4 if type_name == "Q5_1" else 2
            arrays["m"] = _f16(blocks[..., 2:4]) if type_name == "Q5_1" else np.zeros((n, 0), np.float32)  # none: the loops skip it
            arrays["qh"] = np.ascontiguousarray(blocks[..., start : start + 4]).view(np.uint32)[..., 0]
            arrays["qs"] = np.ascontiguousarray(blocks[..., start + 4 : start + 20])  # the file's layout
            return cls(type_name, shape, arrays)
        arrays: dict[str, np.ndarray] = {}
        groups = -(-n // OCTET)
        for first in range(0, n, cls._PACK_ROWS):
            part = _octet_arrays(type_name, _file_rows(type_name, blocks[first : first + cls._PACK_ROWS]))
            g0 = first // OCTET
            for key, value in part.items():
                if key not in arrays:
                    arrays[key] = np.empty((groups,) + value.shape[1:], value.dtype)
                arrays[key][g0 : g0 + len(value)] = value
        return cls(type_name, shape, arrays)

    def _rows(self) -> dict[str, np.ndarray]:
        """An octet matrix's per-row arrays (``_file_rows``' form)."""
        n = self.shape[0]
        return {
            ("codes" if key == "octets" else key.removeprefix("octet_")): (unpack_octets(v, n, self.type_name) if key == "octets" else unpack_lanes(v, n))
            for key, v in self.arrays.items()
        }  # fmt: skip

    @staticmethod
    def cat(parts: list[QuantizedWeight]) -> QuantizedWeight:
        kinds = {p.type_name for p in parts}
        assert len(kinds) == 1, f"cannot fuse weights of types {sorted(kinds)}"
        first = parts[0]
        shape = (sum(p.shape[0] for p in parts), first.shape[1])
        if first.type_name in OCTET_TYPES and any(p.shape[0] % OCTET for p in parts[:-1]):  # a part ends inside an octet: repack
            rows = [p._rows() for p in parts]
            return QuantizedWeight(first.type_name, shape, _octet_arrays(first.type_name, {k: np.concatenate([r[k] for r in rows]) for k in rows[0]}))
        return QuantizedWeight(first.type_name, shape, {k: np.concatenate([p.arrays[k] for p in parts]) for k in first.arrays})

    def take_rows(self, index: np.ndarray) -> QuantizedWeight:
        """The matrix with its rows reordered / selected (each row is whole blocks, so no
        re-encoding; the octet formats' rows are repacked)."""
        if self.type_name in OCTET_TYPES:
            rows = {k: v[index] for k, v in self._rows().items()}
            return QuantizedWeight(self.type_name, (len(index), self.shape[1]), _octet_arrays(self.type_name, rows))
        return QuantizedWeight(self.type_name, (len(index), self.shape[1]), {k: v[index] for k, v in self.arrays.items()})

    # ------------------------------------------------------------------ compute
    def dequantize_rows(self, rows: np.ndarray) -> np.ndarray:
        a = self.arrays
        out = np.empty((rows.shape[0], self.shape[1]), np.float32)
        rows = np.ascontiguousarray(rows, dtype=np.int64)
        if self.type_name in OCTET_TYPES:
            f = OCTET_FORMATS[self.type_name]
            w, wd = a["octets"], a["octet_d"]
            wm, sc, mn = a.get("octet_m", wd), a.get("octet_sc", w), a.get("octet_mn", w)
            consts = (f.nibbles, f.block, f.offset, f.super_blocks, f.minimum)
            fn = lambda i0, i1: _dequant_octets(i0, i1, *consts, w, wd, wm, sc, mn, rows, out)  # noqa: E731
        else:
            off = 16 if self.type_name == "Q5_0" else 0
            fn = lambda i0, i1: _dequant_q5(i0, i1, off, a["qs"], a["qh"], a["d"], a["m"], rows, out)  # noqa: E731
        run_rows(fn, rows.shape[0], out.size)
        return out

    def dequantize(self) -> torch.Tensor:
        return torch.from_numpy(self.dequantize_rows(np.arange(self.shape[0])))

    def matmul(self, x: torch.Tensor, split: bool | None = None) -> torch.Tensor:
        """x [M, K] float -> x @ W.T [M, N] float32, any M (each row as it would be alone).
        ``split``: run the integer loops across threads (True) or on this one (False) whatever
        the product's size (the warm-up compiles both); the bits are the same."""
        return torch.from_numpy(self.matmul_rows(x.float().contiguous().numpy(), split))

    def matmul_rows(self, x32: np.ndarray, split: bool | None = None) -> np.ndarray:
        """``matmul`` of C-ordered float32 rows [M, K], as a numpy array [M, N]."""
        if self.type_name in OCTET_TYPES:
            return self._octet_product(x32, split)
        return self._q5_product(x32)

    def _octet_product(self, x32: np.ndarray, split: bool | None) -> np.ndarray:
        """Activation rows quantized as llama.cpp does for the format (Q8_0 / Q8_1 blocks of 32, or
        Q8_K: 256 elements a scale with 16-element code sums), then the octet loops."""
        m_rows, k_dim = x32.shape
        n_out, a, spec = self.shape[0], self.arrays, OCTET_FORMATS[self.type_name]
        x8 = np.empty((m_rows, k_dim), np.int8)
        if spec.super_blocks:
            xd_super = np.empty((m_rows, k_dim // QK_K), np.float32)
            sums16 = np.empty((m_rows, k_dim // 16), np.int32)
            quantize_q8_k(x32, x8, xd_super, sums16)
            xd = np.empty((m_rows, k_dim // spec.block), np.float32)
            xs, xt = np.empty_like(xd), np.empty((m_rows, k_dim // spec.block), np.int32)
            _q8_k_block_terms(xd_super, sums16, spec.minimum, xd, xt, xs)
        else:
            xd = np.empty((m_rows, k_dim // QK), np.float32)
            xs, xt = np.empty_like(xd), np.empty((m_rows, k_dim // QK), np.int32)
            quantize_q8_0(x32, x8, xd, xs, xt)
        w, wd = a["octets"], a["octet_d"]
        groups = w.shape[0]
        out = np.empty((m_rows, groups * OCTET), np.float32)
        args = (w, wd, a.get("octet_m", wd), a.get("octet_sc", w), a.get("octet_mn", w), x8, xd, xt, xs, out)
        _in_threads(*_OCTET_LOOPS[self.type_name], groups, m_rows * n_out * k_dim, split, *args)
        return out if groups * OCTET == n_out else np.ascontiguousarray(out[:, :n_out])

    def _q5_product(self, x32: np.ndarray) -> np.ndarray:
        m_rows, k_dim = x32.shape
        n_out, a = self.shape[0], self.arrays
        out = np.empty((m_rows, n_out), np.float32)
        xs = np.empty((m_rows, k_dim // QK), np.float32)
        xlo = np.empty((m_rows, k_dim // 2), np.float32)
        xhi = np.empty_like(xlo)
        _q8_dequantized(x32, xlo, xhi, xs)
        qs = a["qs"].reshape(n_out, -1)
        off32 = np.float32(16.0 if self.type_name == "Q5_0" else 0.0)
        run_rows(lambda n0, n1: _mm_q5(n0, n1, off32, qs, a["qh"], a["d"], a["m"], xlo, xhi, xs, out), n_out, m_rows * n_out * k_dim)
        return out

    def embedding(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(self.dequantize_rows(ids.cpu().numpy().astype(np.int64)))


class StackedWeight:
    """Matrices of different encodings stacked along N (a fused q/k/v whose v is another type):
    each part multiplies on its own and the outputs are concatenated. Parts live on one device:
    ``QuantizedWeight``s and float tensors on the CPU, ``BlockMatrix``es and tensors on a GPU."""

    def __init__(self, parts: list) -> None:  # type: ignore[type-arg]
        self.parts = parts
        self.shape = torch.Size((sum(p.shape[0] for p in parts), parts[0].shape[1]))
        self.dtype = torch.float32
        self.device = parts[0].device

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        outs = [_float_linear(x, p) if isinstance(p, torch.Tensor) else p.matmul(x) for p in self.parts]
        return torch.cat(outs, dim=-1)


def _float_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    if w.device.type != "cpu":
        return F.linear(x.to(w.dtype), w).float()
    from .cpu_linear import linear

    return linear(x.float(), w).float()


def is_quantized(weight: object) -> bool:
    """A matrix kept in a ggml block format, on the CPU or (``BlockMatrix``) on a GPU."""
    return isinstance(weight, (QuantizedWeight, StackedWeight, BlockMatrix))


def quantized_weights(model: torch.nn.Module) -> Iterator[QuantizedWeight]:
    """Every block-format matrix ``model``'s modules hold (the parts of stacked ones too)."""
    for value in (v for module in model.modules() for v in vars(module).values()):  # modules() includes model
        if isinstance(value, StackedWeight):
            value = value.parts
        for w in value if isinstance(value, list) else [value]:
            if isinstance(w, QuantizedWeight):
                yield w


def holds_quantized_weights(model: torch.nn.Module) -> bool:
    return next(quantized_weights(model), None) is not None


def embedding(ids: torch.Tensor, weight: torch.Tensor | QuantizedWeight | PanelWeight) -> torch.Tensor:
    """Rows ``ids`` of an embedding matrix, dequantized when it is kept in a block format (or
    read from the panels of a head it is tied to: ``panel_linear.PanelWeight``)."""
    if isinstance(weight, torch.Tensor):
        return F.embedding(ids, weight)
    return weight.embedding(ids)
