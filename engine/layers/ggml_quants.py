"""ggml's block formats on the CPU: weights kept in their encoding, dot products as the format defines them.

``QuantizedWeight.from_gguf(type_name, raw)`` takes a GGUF tensor's bytes [N, row_bytes] and keeps
them block by block in arrays a compiled loop reads directly (each fp16 scale widened to float32
once at load, so the loop does no half-float conversion):

| type | block | kept as | activation quantized to |
| --- | ---: | --- | --- |
| Q4_0 / Q4_1 | 32 | nibbles in octets of eight rows (``octet_dot``), d (and m) likewise | Q8_0 / Q8_1 |
| Q5_0 / Q5_1 | 32 | nibbles as in the file, the fifth bits as uint32, d (and m) | Q8_0 / Q8_1 |
| Q8_0 | 32 | int8 codes (plus 128) in octets, d likewise | Q8_0 |
| Q4_K | 256 | nibbles per 32-element sub-block as Q4_1's; d, dmin and the 6-bit scales and mins | Q8_K |
| Q5_K / Q6_K | 256 | int8 codes [N, K], per sub-block d * scale (and dmin * min) | Q8_K |

In memory a matrix takes its file's bytes times about 1.06 (Q4_K), 1.1 (Q4_0, Q8_0), 1.2 (Q4_1),
1.5 (Q6_K) and 1.8 (Q5_K): the 32-element formats' scales are widened to float32, and the 5- and
6-bit codes to int8 (a Q4_K_M file, mostly Q4_K with some Q6_K, about 1.1x).

A linear layer on a few activation rows (decode, speculative verification, mixed batches) first
quantizes each row the way llama.cpp does for that format (8-bit blocks with an fp16 scale, plus
the block sum for the formats with a minimum: Q8_1; 256-element blocks with a float32 scale and
16-element sums for the K-quants: Q8_K), then sums code x code x both scales over the row: the
format's own dot product, which is why greedy outputs agree with llama.cpp's. Q4_0, Q4_1, Q8_0,
and the K-quants sum each 32-element block (Q6_K: 16) exactly in integers, then scale it, as
llama.cpp's own kernels do: Q4_0, Q4_1 and Q8_0 eight weight rows at once (``octet_dot``: one
``vpdpbusd`` adds four products into each of eight rows' sums, 2-4x faster than one row at a
time), the K-quants one weight row at a time (``int_dot``); Q5_0 and Q5_1 run a float loop (the
same sums up to rounding order, relative 1e-6).
The loops run at every row count, long prefills included: a row's result never depends on how
many rows share its forward. Dequantizing the weight for torch's GEMM would prefill a 256-token
SmolLM2 prompt 1.7x faster, but its rounding differs from the loop's by ~1e-7, and the next
layer's 8-bit activation blocks turn that into other codes: a logit moved by up to 1.06 between a
prompt prefilled whole and the same tokens decoded one by one, so batching, the prefix cache and
speculation changed greedy outputs.

Every loop releases the GIL and covers a range of output rows (of octets, for the octet
formats; a matrix whose rows are not a multiple of eight gets a last octet padded with zero rows).
The integer loops of a large
product run as one numba parallel region over equal ranges of rows (``_in_threads``: every
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

from .cpu_threads import run_rows, threads
from .fp16_round import round_half
from .int_dot import (
    CODES_IN_PAIR_ORDER, MAX_GROUP, NIBBLE_HIGH_ELEMENTS, NIBBLE_LOW_ELEMENTS, code16_row_dot, code16_rows, code_row_dot, code_rows, float_dot,
    nibble_bytes_of_codes, nibble_k_row_dot, nibble_k_rows,
)  # fmt: skip
from .octet_dot import (
    MAX_ROWS, OCTET, OCTET_BYTES, octet_rows_q4_0, octet_rows_q4_1, octet_rows_q8_0, pack_octets, pack_scales, unpack_octets, unpack_scales,
)  # fmt: skip

if TYPE_CHECKING:
    from .panel_linear import PanelWeight

QK = 32
QK_K = 256

BLOCK_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")
K_TYPES = ("Q4_K", "Q5_K", "Q6_K")
QUANT_TYPES = BLOCK_TYPES + K_TYPES
OCTET_TYPES = ("Q4_0", "Q4_1", "Q8_0")  # kept eight rows to an octet (``octet_dot``)
_Q8_1_TYPES = ("Q4_1", "Q5_1")  # the formats with a minimum: activations carry their block sums


def _f16(raw: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(raw).view(np.float16).astype(np.float32)[..., 0]


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
def quantize_q8_k(x, xq, xd, xbs, pair_order=False):  # pragma: no cover - compiled
    """Rows of ``x`` [M, K] into Q8_K: 256-element blocks scaled by -127 / (the signed value of
    largest magnitude), float32 scale ``xd`` [M, K/256], 16-element sums ``xbs`` [M, K/16].
    ``pair_order``: codes stored per 32 elements as ``quantize_q8_0``'s (for the nibble loop)."""
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
                    e = b * 256 + g * 16 + j
                    xq[r, (e - (e & 31) + 2 * (e & 15) + ((e & 31) >> 4)) if pair_order else e] = q
                    total += q
                xbs[r, b * 16 + g] = total
            xd[r, b] = np.float32(1.0) / iscale


# --------------------------------------------------------------------------- dot-product loops
# The octet loops (``_mm_q4_0``, ``_mm_q4_1``, ``_mm_q8_0``) call ``octet_dot`` once per (octet, up to
# four activation rows); the K-quant loops (``_mm_nibbles_k``, ``_mm_int8``) call ``int_dot`` once
# per (output, up to four activation rows). The float loop (Q5_0 / Q5_1) is one flat loop over the row's codes: code * its
# block's scale * the dequantized activation code (``x`` = activation code * its fp16 scale), i.e.
# sum_b d_w d_x (sum of code products) regrouped into one reduction that LLVM vectorizes. The
# minimum terms use the activation block sums as the format defines them (Q8_1's s, Q8_K's
# 16-element sums). The 5-bit loop reads the activation as two halves per block (``xlo``:
# elements 0-15, ``xhi``: 16-31), matching each byte's two nibbles.


@njit(boundscheck=False, inline="always")
def _plus_minimums(acc, wm, xs, n, r):  # pragma: no cover - compiled
    """acc plus the formats' minimum terms of output row n and activation row r (none: ``wm``
    has zero columns for the formats without a minimum), summed by ``int_dot.float_dot``: no
    fast-math, so a serial and a threaded build of a loop round alike."""
    if wm.shape[1] == 0:
        return acc
    return acc + float_dot(wm[n].ctypes.data, xs[r].ctypes.data, wm.shape[1])


@njit(inline="always", boundscheck=False)
def _octets_of(g0, g1, kind, w, wd, wm, x8, xd, xt, xs, out):  # pragma: no cover - compiled
    """Octets [g0, g1) of Q4_0 (``kind`` 0), Q4_1 (1) or Q8_0 (2) times activation rows up to
    ``octet_dot.MAX_ROWS`` at a time: ``out[r, 8g:8g + 8]``. ``wm``: Q4_1's minimums (any octet
    array of the matrix for the others). Inlined with ``kind`` a constant, so each loop keeps
    one format's intrinsic."""
    m_rows = x8.shape[0]
    blocks = xd.shape[1]
    for g in range(g0, g1):
        r = 0
        while r < m_rows:
            size = min(m_rows - r, MAX_ROWS)
            wg, dg, mg = w[g].ctypes.data, wd[g].ctypes.data, wm[g].ctypes.data
            xr, dr, tr, sr = x8[r].ctypes.data, xd[r].ctypes.data, xt[r].ctypes.data, xs[r].ctypes.data
            target = out[r].ctypes.data + g * OCTET * 4
            if kind == 0:
                octet_rows_q4_0(wg, dg, mg, xr, dr, tr, sr, blocks, target, out.strides[0], size)
            elif kind == 1:
                octet_rows_q4_1(wg, dg, mg, xr, dr, tr, sr, blocks, target, out.strides[0], size)
            else:
                octet_rows_q8_0(wg, dg, mg, xr, dr, tr, sr, blocks, target, out.strides[0], size)
            r += size


@njit(nogil=True, cache=True, boundscheck=False)
def _mm_q4_0(g0, g1, w, wd, wm, x8, xd, xt, xs, out):  # pragma: no cover - compiled
    _octets_of(g0, g1, 0, w, wd, wm, x8, xd, xt, xs, out)


@njit(nogil=True, cache=True, boundscheck=False)
def _mm_q4_1(g0, g1, w, wd, wm, x8, xd, xt, xs, out):  # pragma: no cover - compiled
    _octets_of(g0, g1, 1, w, wd, wm, x8, xd, xt, xs, out)


@njit(nogil=True, cache=True, boundscheck=False)
def _mm_q8_0(g0, g1, w, wd, wm, x8, xd, xt, xs, out):  # pragma: no cover - compiled
    _octets_of(g0, g1, 2, w, wd, wm, x8, xd, xt, xs, out)


@njit(nogil=True, cache=True, boundscheck=False)
def _mm_nibbles_k(n0, n1, qs, d, sc, dmin, mn, x8, xd, xsum, out):  # pragma: no cover - compiled
    """Q4_K's nibble loop (``_nibble_rows_of``): a sub-block's scale and minimum are d * sc and dmin * mn (float32
    products of the super-block's scales and the 6-bit ones, exact), computed where they are
    used, so the matrix keeps the file's 4.5 bits a weight; ``xd`` the Q8_K scale per sub-block,
    ``xsum`` as ``_mm_int8``'s."""
    m_rows = x8.shape[0]
    blocks = sc.shape[1]
    group = np.empty(MAX_GROUP, np.float32)
    for n in range(n0, n1):
        w, dn, scn = qs[n].ctypes.data, d[n].ctypes.data, sc[n].ctypes.data
        r = 0
        while r < m_rows:
            size = min(m_rows - r, MAX_GROUP)
            if size == 1:
                group[0] = nibble_k_row_dot(w, x8[r].ctypes.data, dn, scn, xd[r].ctypes.data, blocks)
            else:
                nibble_k_rows(w, x8[r].ctypes.data, x8.strides[0], dn, scn, xd[r].ctypes.data, xd.strides[0], blocks, group.ctypes.data, size)
            for i in range(size):
                acc = group[i]
                for g in range(blocks):
                    acc -= (dmin[n, g >> 3] * np.float32(mn[n, g])) * xsum[r + i, g]
                out[r + i, n] = acc
            r += size


@njit(nogil=True, cache=True, boundscheck=False)
def _mm_int8(n0, n1, q, scale, mins, x8, xd, xsum, out):  # pragma: no cover - compiled
    """Output rows [n0, n1) of int8 codes [N, K] with a scale per 32-element sub-block (Q8_0, and
    Q4_K / Q5_K, whose sub-block minimums times the activation's sub-block sums ``xsum`` are
    subtracted) or per 16 (Q6_K: ``scale`` [N, K/16]); ``xd``: the activation's scale per
    sub-block, the weight's layout. Activation rows up to four at a time, as the nibble loops."""
    m_rows = x8.shape[0]
    halves = scale.shape[1] * 32 == q.shape[1] * 2
    blocks = q.shape[1] // 32
    group = np.empty(MAX_GROUP, np.float32)
    for n in range(n0, n1):
        w, s = q[n].ctypes.data, scale[n].ctypes.data
        r = 0
        while r < m_rows:
            size = min(m_rows - r, MAX_GROUP)
            x, x_scale, g = x8[r].ctypes.data, xd[r].ctypes.data, group.ctypes.data
            if size == 1:
                group[0] = code16_row_dot(w, x, s, x_scale, blocks) if halves else code_row_dot(w, x, s, x_scale, blocks)
            elif halves:
                code16_rows(w, x, x8.strides[0], s, x_scale, xd.strides[0], blocks, g, size)
            else:
                code_rows(w, x, x8.strides[0], s, x_scale, xd.strides[0], blocks, g, size)
            for i in range(size):
                out[r + i, n] = _minus_minimums(group[i], mins, xsum, n, r + i)
            r += size


@njit(boundscheck=False, inline="always")
def _minus_minimums(acc, mins, xsum, n, r):  # pragma: no cover - compiled
    """acc minus the K-quants' sub-block minimums times the activation's sub-block sums."""
    for g in range(mins.shape[1]):
        acc -= mins[n, g] * xsum[r, g]
    return acc


# The integer loops across numba's threads: one parallel region whose iterations are equal ranges
# of output rows. Measured against ``run_rows`` on a SmolLM2 Q4_1 decode step: its handoff
# (a pool thread woken through a futex, then the GIL) cost about what a 576 x 576 product costs,
# so only the fused gate/up product was split and the rest ran on one core; numba's OpenMP
# threads spin briefly between regions, and every product of the step splits (step 24 -> 20 ms).
# Both loops are strict IEEE code (no fast-math), so a row's bits are the same whichever build
# (this region's inlined copy or the serial function) computes it.
@njit(nogil=True, cache=True, boundscheck=False, parallel=True)
def _mm_q4_0_threaded(chunks, w, wd, wm, x8, xd, xt, xs, out):  # pragma: no cover - compiled
    step = (w.shape[0] + chunks - 1) // chunks
    for c in prange(chunks):
        _mm_q4_0(c * step, min(w.shape[0], (c + 1) * step), w, wd, wm, x8, xd, xt, xs, out)


@njit(nogil=True, cache=True, boundscheck=False, parallel=True)
def _mm_q4_1_threaded(chunks, w, wd, wm, x8, xd, xt, xs, out):  # pragma: no cover - compiled
    step = (w.shape[0] + chunks - 1) // chunks
    for c in prange(chunks):
        _mm_q4_1(c * step, min(w.shape[0], (c + 1) * step), w, wd, wm, x8, xd, xt, xs, out)


@njit(nogil=True, cache=True, boundscheck=False, parallel=True)
def _mm_q8_0_threaded(chunks, w, wd, wm, x8, xd, xt, xs, out):  # pragma: no cover - compiled
    step = (w.shape[0] + chunks - 1) // chunks
    for c in prange(chunks):
        _mm_q8_0(c * step, min(w.shape[0], (c + 1) * step), w, wd, wm, x8, xd, xt, xs, out)


# The octet formats: (serial loop, threaded loop), each over ranges of octets
_OCTET_LOOPS = {"Q4_0": (_mm_q4_0, _mm_q4_0_threaded), "Q4_1": (_mm_q4_1, _mm_q4_1_threaded), "Q8_0": (_mm_q8_0, _mm_q8_0_threaded)}


@njit(nogil=True, cache=True, boundscheck=False, parallel=True)
def _mm_nibbles_k_threaded(chunks, qs, d, sc, dmin, mn, x8, xd, xsum, out):  # pragma: no cover - compiled
    n_out = qs.shape[0]
    step = (n_out + chunks - 1) // chunks
    for c in prange(chunks):
        _mm_nibbles_k(c * step, min(n_out, (c + 1) * step), qs, d, sc, dmin, mn, x8, xd, xsum, out)


@njit(nogil=True, cache=True, boundscheck=False, parallel=True)
def _mm_int8_threaded(chunks, q, scale, mins, x8, xd, xsum, out):  # pragma: no cover - compiled
    n_out = q.shape[0]
    step = (n_out + chunks - 1) // chunks
    for c in prange(chunks):
        _mm_int8(c * step, min(n_out, (c + 1) * step), q, scale, mins, x8, xd, xsum, out)


# Below this many multiply-adds a product runs on the calling thread (a parallel region costs a
# few microseconds while the threads spin, tens once they sleep).
THREADED_MIN_MACS = 1 << 17


def runs_threaded(n_out: int, macs: int, count: int) -> bool:
    """Whether a product of ``n_out`` outputs and ``macs`` multiply-adds runs the integer loops
    across ``count`` threads (else on the calling thread)."""
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
def _dequant_nibbles(i0, i1, kind, qs, qh, wd, wm, rows, out):  # pragma: no cover - compiled
    """Rows ``rows[i0:i1]`` of a nibble matrix: Q5_0 (``kind`` 2), Q5_1 (3), or Q4_K's sub-blocks (4:
    ``wd`` / ``wm`` their scales and minimums)."""
    nb = wd.shape[1]
    for i in range(i0, i1):
        n = rows[i]
        for b in range(nb):
            d = wd[n, b]
            m = wm[n, b] if kind == 3 or kind == 4 else np.float32(0.0)
            fifth = kind == 2 or kind == 3  # Q5_0 / Q5_1
            h = qh[n, b] if fifth else np.uint32(0)
            for j in range(16):
                v = np.int32(qs[n, b, j])
                lo = v & 15
                hi = v >> 4
                if fifth:  # Q5_x keep the file's layout: element j low, j + 16 high
                    lo |= np.int32(((h >> j) & 1) << 4)
                    hi |= np.int32(((h >> (j + 16)) & 1) << 4)
                    e_lo, e_hi = b * 32 + j, b * 32 + j + 16
                else:  # Q4_K: ``int_dot.nibble_bytes_of_codes``' layout
                    e_lo, e_hi = b * 32 + NIBBLE_LOW_ELEMENTS[j], b * 32 + NIBBLE_HIGH_ELEMENTS[j]
                if kind == 2:
                    out[i, e_lo] = np.float32(lo - 16) * d
                    out[i, e_hi] = np.float32(hi - 16) * d
                elif kind == 4:  # Q4_K: sub-block scale and minimum, as ``_dequant_codes`` rounds them
                    out[i, e_lo] = d * np.float32(lo) - m
                    out[i, e_hi] = d * np.float32(hi) - m
                else:
                    out[i, e_lo] = np.float32(lo) * d + m
                    out[i, e_hi] = np.float32(hi) * d + m


@njit(nogil=True, cache=True, boundscheck=False)
def _dequant_octets(i0, i1, kind, w, wd, wm, rows, out):  # pragma: no cover - compiled
    """Rows ``rows[i0:i1]`` of an octet matrix (``octet_dot``'s layout): Q4_0 (``kind`` 0), Q4_1 (1),
    Q8_0 (2)."""
    blocks = wd.shape[1]
    for i in range(i0, i1):
        g, r = rows[i] >> 3, rows[i] & 7
        for b in range(blocks):
            d = wd[g, b, r]
            for e in range(32):
                if kind == 2:  # chunk e // 4, lane r, byte e % 4; stored plus 128
                    out[i, b * 32 + e] = d * np.float32(np.int32(w[g, b, (e >> 2) * 32 + r * 4 + (e & 3)]) - 128)
                    continue
                byte = np.int32(w[g, b, (e >> 3) * 32 + r * 4 + (e & 3)])  # chunk e // 8; high nibble: e % 8 >= 4
                code = (byte >> (4 * ((e >> 2) & 1))) & 15
                if kind == 0:
                    out[i, b * 32 + e] = np.float32(code - 8) * d
                else:
                    out[i, b * 32 + e] = np.float32(code) * d + wm[g, b, r]


@njit(nogil=True, cache=True, boundscheck=False)
def _dequant_codes(i0, i1, shift, q, scale, mins, rows, out):  # pragma: no cover - compiled
    k_dim = q.shape[1]
    has_min = mins.shape[1] > 0
    for i in range(i0, i1):
        n = rows[i]
        for e in range(k_dim):
            value = scale[n, e >> shift] * np.float32(q[n, e])
            if has_min:
                value -= mins[n, e >> shift]
            out[i, e] = value


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


def _unpack_k(type_name: str, blocks: np.ndarray) -> dict[str, np.ndarray]:
    """[N, nsb, bytes] K-quant super-blocks -> codes and, per sub-block of ``1 << shift``
    elements, its float scale (d * 6-bit scale) and minimum (dmin * 6-bit min). Codes: Q4_K's as
    nibbles ``qs`` [N, K/32, 16] in ``int_dot.nibble_bytes_of_codes``' layout (4 bits a
    weight in memory, as in the file), the others as int8
    ``q`` [N, K]."""
    n, nsb, _ = blocks.shape
    if type_name in ("Q4_K", "Q5_K"):
        d, dmin = _f16(blocks[..., 0:2]), _f16(blocks[..., 2:4])
        sc, mn = _k_scales_mins(blocks[..., 4:16])
        qs = blocks[..., 16:144] if type_name == "Q4_K" else blocks[..., 48:176]
        qs = qs.reshape(n, nsb, 4, 32).astype(np.int32)
        codes = np.stack([qs & 15, qs >> 4], axis=3)  # [n, nsb, 4 chunks, lo/hi, 32]
        if type_name == "Q5_K":
            qh = blocks[..., 16:48].astype(np.int32)  # [n, nsb, 32]
            shifts = np.arange(8).reshape(4, 2)  # chunk c, half h -> bit 2c + h
            high = (qh[:, :, None, None, :] >> shifts[None, None, :, :, None]) & 1
            codes = codes | (high << 4)
        if type_name == "Q4_K":  # nibbles repacked per 32-element sub-block as Q4_1's, scales as in the file
            sub = codes.reshape(n, nsb * 8, 32)
            qs = nibble_bytes_of_codes(sub)
            k_scales = {"d": d, "dmin": dmin, "sc": sc.reshape(n, nsb * 8).astype(np.uint8), "mn": mn.reshape(n, nsb * 8).astype(np.uint8)}
            return {"qs": qs, **k_scales, "shift": 5}
        scale = (d[..., None] * sc.astype(np.float32)).reshape(n, nsb * 8)
        mins = (dmin[..., None] * mn.astype(np.float32)).reshape(n, nsb * 8)
        q = codes.reshape(n, nsb * 256).astype(np.int8)
        return {"q": q, "scale": scale, "min": mins, "shift": 5}
    # Q6_K: ql[128], qh[64], scales int8[16], d
    ql = blocks[..., 0:128].reshape(n, nsb, 2, 64).astype(np.int32)
    qh = blocks[..., 128:192].reshape(n, nsb, 2, 32).astype(np.int32)
    scales = np.ascontiguousarray(blocks[..., 192:208]).view(np.int8).astype(np.int32)
    d = _f16(blocks[..., 208:210])
    lo = ql[..., :32] & 15, ql[..., 32:] & 15, ql[..., :32] >> 4, ql[..., 32:] >> 4
    codes = np.stack([lo[i] | (((qh >> (2 * i)) & 3) << 4) for i in range(4)], axis=3) - 32  # [n, nsb, half, 4, 32]
    q = codes.reshape(n, nsb * 256).astype(np.int8)
    scale = (d[..., None] * scales.astype(np.float32)).reshape(n, nsb * 16)
    return {"q": q, "scale": scale, "min": np.zeros((n, 0), np.float32), "shift": 4}


class QuantizedWeight:
    """A [N, K] weight matrix in a ggml block format; ``linear`` and ``embedding`` use it as is.

    Looks enough like a weight tensor for the model code around it (``shape``, ``dtype`` of the
    results, ``device``). ``cat`` stacks matrices of one format along N (fused q/k/v, gate/up).
    """

    def __init__(self, type_name: str, shape: tuple[int, int], arrays: dict[str, np.ndarray]) -> None:
        self.type_name = type_name
        self.shape = torch.Size(shape)
        # The integer loops read rows through their addresses (``int_dot``): C order everywhere.
        self.arrays = {k: v if k == "shift" else np.ascontiguousarray(v) for k, v in arrays.items()}
        self.dtype = torch.float32  # what it computes in
        self.device = torch.device("cpu")

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays.values() if isinstance(a, np.ndarray))

    @classmethod
    def from_gguf(cls, type_name: str, raw: np.ndarray, shape: tuple[int, int]) -> QuantizedWeight:
        """``raw``: the tensor's bytes [N, row_bytes] as stored in the file."""
        n, k = shape
        if type_name in K_TYPES:
            if k % QK_K:
                raise ValueError(f"{type_name} rows of {k} elements are not whole 256-element blocks")
            blocks = raw.reshape(n, k // QK_K, -1)
            return cls(type_name, shape, _unpack_k(type_name, blocks))
        if type_name not in BLOCK_TYPES:
            raise ValueError(f"no kernel for type {type_name}")
        blocks = raw.reshape(n, k // QK, -1)
        if type_name in OCTET_TYPES:
            return cls._octets_of_file(type_name, blocks, shape)
        arrays: dict[str, np.ndarray] = {"d": _f16(blocks[..., 0:2])}
        start = 2
        if type_name in _Q8_1_TYPES:
            arrays["m"] = _f16(blocks[..., 2:4])
            start = 4
        else:  # no minimum, no fifth bits: empty arrays the loops skip
            arrays["m"] = np.zeros((n, 0), np.float32)
        if type_name in ("Q5_0", "Q5_1"):
            arrays["qh"] = np.ascontiguousarray(blocks[..., start : start + 4]).view(np.uint32)[..., 0]
            start += 4
        else:
            arrays["qh"] = np.zeros((n, 0), np.uint32)
        arrays["qs"] = np.ascontiguousarray(blocks[..., start : start + 16])  # Q5_x: the file's layout
        return cls(type_name, shape, arrays)

    # Rows decoded and packed per slice at load, so a large matrix (an embedding) needs a slice's
    # temporaries beside its packed arrays, not a copy of its codes.
    _PACK_ROWS = 8192

    @classmethod
    def _octets_of_file(cls, type_name: str, blocks: np.ndarray, shape: tuple[int, int]) -> QuantizedWeight:
        """Q4_0 / Q4_1 / Q8_0 file blocks [N, K/32, bytes] -> the octet layout (``octet_dot``)."""
        n, k = shape
        groups = -(-n // OCTET)
        arrays = {"octets": np.empty((groups, k // QK, OCTET_BYTES[type_name]), np.uint8), "octet_d": np.empty((groups, k // QK, OCTET), np.float32)}
        if type_name == "Q4_1":
            arrays["octet_m"] = np.empty_like(arrays["octet_d"])
        for first in range(0, n, cls._PACK_ROWS):
            part = blocks[first : first + cls._PACK_ROWS]
            g0, g1 = first // OCTET, -(-(first + len(part)) // OCTET)
            if type_name == "Q8_0":
                codes = np.ascontiguousarray(part[..., 2:34]).view(np.int8).reshape(len(part), k)
            else:
                nibbles = part[..., 4:20] if type_name == "Q4_1" else part[..., 2:18]  # element j low, j + 16 high
                codes = np.concatenate([nibbles & 15, nibbles >> 4], axis=2).reshape(len(part), k)
            arrays["octets"][g0:g1] = pack_octets(codes, type_name)
            arrays["octet_d"][g0:g1] = pack_scales(_f16(part[..., 0:2]))
            if type_name == "Q4_1":
                arrays["octet_m"][g0:g1] = pack_scales(_f16(part[..., 2:4]))
        return cls(type_name, shape, arrays)

    def _octet_parts(self) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """An octet matrix's codes [N, K] (uint8 nibbles or int8), scales and minimums [N, K/32]."""
        n, a = self.shape[0], self.arrays
        minimums = unpack_scales(a["octet_m"], n) if "octet_m" in a else None
        return unpack_octets(a["octets"], n, self.type_name), unpack_scales(a["octet_d"], n), minimums

    @classmethod
    def _octets_of_parts(cls, type_name: str, codes: np.ndarray, d: np.ndarray, m: np.ndarray | None) -> QuantizedWeight:
        arrays = {"octets": pack_octets(codes, type_name), "octet_d": pack_scales(d)}
        if m is not None:
            arrays["octet_m"] = pack_scales(m)
        return cls(type_name, codes.shape, arrays)

    @property
    def split_units(self) -> int:
        """How many units the loops split across threads: octets for the octet formats, else rows."""
        return self.arrays["octets"].shape[0] if "octets" in self.arrays else self.shape[0]

    @staticmethod
    def cat(parts: list[QuantizedWeight]) -> QuantizedWeight:
        kinds = {p.type_name for p in parts}
        assert len(kinds) == 1, f"cannot fuse weights of types {sorted(kinds)}"
        first = parts[0]
        if first.type_name in OCTET_TYPES and any(p.shape[0] % OCTET for p in parts[:-1]):
            codes, d, m = zip(*(p._octet_parts() for p in parts))  # a part ends inside an octet: repack
            return QuantizedWeight._octets_of_parts(first.type_name, np.concatenate(codes), np.concatenate(d), None if m[0] is None else np.concatenate(m))
        arrays = {}
        for key, value in first.arrays.items():
            arrays[key] = value if key == "shift" else np.concatenate([p.arrays[key] for p in parts])
        return QuantizedWeight(first.type_name, (sum(p.shape[0] for p in parts), first.shape[1]), arrays)

    def take_rows(self, index: np.ndarray) -> QuantizedWeight:
        """The matrix with its rows reordered / selected (each row is whole blocks, so no re-encoding;
        the octet formats' rows are repacked)."""
        if self.type_name in OCTET_TYPES:
            codes, d, m = self._octet_parts()
            return QuantizedWeight._octets_of_parts(self.type_name, codes[index], d[index], None if m is None else m[index])
        arrays = {k: (v if k == "shift" else np.ascontiguousarray(v[index])) for k, v in self.arrays.items()}
        return QuantizedWeight(self.type_name, (len(index), self.shape[1]), arrays)

    # ------------------------------------------------------------------ compute
    def dequantize_rows(self, rows: np.ndarray) -> np.ndarray:
        a = self.arrays
        out = np.empty((rows.shape[0], self.shape[1]), np.float32)
        rows = np.ascontiguousarray(rows, dtype=np.int64)
        if "octets" in a:
            kind, m = OCTET_TYPES.index(self.type_name), a.get("octet_m", a["octet_d"])
            fn = lambda i0, i1: _dequant_octets(i0, i1, kind, a["octets"], a["octet_d"], m, rows, out)  # noqa: E731
        elif "q" in a:
            fn = lambda i0, i1: _dequant_codes(i0, i1, a["shift"], a["q"], a["scale"], a["min"], rows, out)  # noqa: E731
        elif self.type_name == "Q4_K":  # the selected rows' sub-block scales and minimums, as float32
            qs, no_high, picked = a["qs"][rows], np.zeros((len(rows), 0), np.uint32), np.arange(len(rows))
            scale = np.repeat(a["d"][rows], 8, axis=1) * a["sc"][rows].astype(np.float32)
            mins = np.repeat(a["dmin"][rows], 8, axis=1) * a["mn"][rows].astype(np.float32)
            fn = lambda i0, i1: _dequant_nibbles(i0, i1, 4, qs, no_high, scale, mins, picked, out)  # noqa: E731
        else:
            kind = BLOCK_TYPES.index(self.type_name)
            fn = lambda i0, i1: _dequant_nibbles(i0, i1, kind, a["qs"], a["qh"], a["d"], a["m"], rows, out)  # noqa: E731
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
        m_rows = x32.shape[0]
        if self.type_name in BLOCK_TYPES:
            return self._block_product(x32, split)
        # K-quants: Q8_K activations; the minimum terms use their 16-element sums, times the scale.
        k_dim = self.shape[1]
        a = self.arrays
        nibbles = "qs" in a  # Q4_K
        halves = not nibbles and a["scale"].shape[1] * 32 == a["q"].shape[1] * 2  # Q6_K: a scale per 16
        xq = np.empty((m_rows, k_dim), np.int8)  # in the order its loop reads (int_dot)
        xd = np.empty((m_rows, k_dim // QK_K), np.float32)
        xbs = np.empty((m_rows, k_dim // 16), np.int32)
        quantize_q8_k(x32, xq, xd, xbs, nibbles or (CODES_IN_PAIR_ORDER and not halves))
        out = np.empty((m_rows, self.shape[0]), np.float32)
        if "qs" in a or a["min"].shape[1]:
            per_group = (1 << a["shift"]) // 16
            sums = xbs.reshape(m_rows, -1, per_group).sum(-1).astype(np.float32)
            xsum = sums * np.repeat(xd, sums.shape[1] // xd.shape[1], axis=1)
        else:
            xsum = np.zeros((m_rows, 0), np.float32)
        macs = m_rows * self.shape[0] * k_dim
        if nibbles:
            qs, xd_sub = a["qs"].reshape(self.shape[0], -1), np.repeat(xd, 8, axis=1)
            args = (qs, a["d"], a["sc"], a["dmin"], a["mn"], xq, xd_sub, xsum, out)
            _in_threads(_mm_nibbles_k, _mm_nibbles_k_threaded, self.shape[0], macs, split, *args)
        else:
            # the activation's scale per weight sub-block (32 elements: Q5_K; 16: Q6_K)
            xd_sub = np.repeat(xd, a["scale"].shape[1] // xd.shape[1], axis=1)
            _in_threads(_mm_int8, _mm_int8_threaded, self.shape[0], macs, split, a["q"], a["scale"], a["min"], xq, xd_sub, xsum, out)
        return out

    def _block_product(self, x32: np.ndarray, split: bool | None = None) -> np.ndarray:
        """Activation rows times a 32-element-block matrix (per-call Python work is a decode step's
        overhead, so the activations are quantized in one compiled call)."""
        m_rows, k_dim = x32.shape
        n_out = self.shape[0]
        a, kind = self.arrays, self.type_name
        out = np.empty((m_rows, n_out), np.float32)
        xs = np.empty((m_rows, k_dim // QK), np.float32)
        macs = m_rows * n_out * k_dim
        if kind in OCTET_TYPES:
            x8 = np.empty((m_rows, k_dim), np.int8)
            xd = np.empty_like(xs)
            xt = np.empty((m_rows, k_dim // QK), np.int32)
            quantize_q8_0(x32, x8, xd, xs, xt)
            groups = a["octets"].shape[0]
            padded = out if groups * OCTET == n_out else np.empty((m_rows, groups * OCTET), np.float32)
            args = (a["octets"], a["octet_d"], a.get("octet_m", a["octet_d"]), x8, xd, xt, xs, padded)
            _in_threads(*_OCTET_LOOPS[kind], groups, macs, split, *args)
            if padded is not out:
                out[:] = padded[:, :n_out]
            return out
        xlo = np.empty((m_rows, k_dim // 2), np.float32)
        xhi = np.empty_like(xlo)
        _q8_dequantized(x32, xlo, xhi, xs)
        qs = a["qs"].reshape(n_out, -1)
        off32 = np.float32(16.0 if kind == "Q5_0" else 0.0)
        run_rows(lambda n0, n1: _mm_q5(n0, n1, off32, qs, a["qh"], a["d"], a["m"], xlo, xhi, xs, out), n_out, macs)
        return out

    def embedding(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(self.dequantize_rows(ids.cpu().numpy().astype(np.int64)))


class StackedWeight:
    """Matrices of different encodings stacked along N (a fused q/k/v whose v is another type):
    each part multiplies on its own and the outputs are concatenated."""

    def __init__(self, parts: list) -> None:  # type: ignore[type-arg]
        self.parts = parts
        self.shape = torch.Size((sum(p.shape[0] for p in parts), parts[0].shape[1]))
        self.dtype = torch.float32
        self.device = torch.device("cpu")

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        outs = [p.matmul(x) if isinstance(p, QuantizedWeight) else _float_linear(x, p) for p in self.parts]
        return torch.cat(outs, dim=-1)


def _float_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    from .cpu_linear import linear

    return linear(x.float(), w).float()


def is_quantized(weight: object) -> bool:
    return isinstance(weight, (QuantizedWeight, StackedWeight))


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
