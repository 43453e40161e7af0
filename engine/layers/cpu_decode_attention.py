"""Decode attention on the CPU as one compiled loop (numba), reading K and V straight from the
paged pool: no gathered copy, no padding, each key read once per group of query heads.

For each (request, KV head, chunk of up to ``LANES`` query heads sharing that KV head) a task
computes the scores of its queries against the request's keys (located through the request's
slot list), a softmax per head, and the weighted sum of values. The query heads are carried in
named accumulators so that one read of a key row serves all of them and the inner loops over
``head_dim`` vectorize. Tasks run in parallel across numba's threads
and release the GIL, so the grammar's mask worker runs meanwhile.

Measured on the 2-core box (BENCHMARKS.md, ModelRunner section): against gathering K/V with
``index_select`` then ``scaled_dot_product_attention`` per length group, this reads about a third
of the bytes. float32 and bfloat16 pools; float16 uses the torch path.
"""

from __future__ import annotations

import math

import numpy as np

try:  # numba is a dependency; keep the engine importable (torch path) if its install is broken
    from numba import njit, prange

    from .ggml_quants import round_half
except ImportError:  # pragma: no cover
    njit = None

LANES = 4  # query heads per task


def available() -> bool:
    return njit is not None


def _build(dim: int, lanes: int, bf16: bool, f16_probs: bool = False):  # type: ignore[no-untyped-def]
    """The kernel for ``head_dim == dim`` with ``lanes`` query heads per task, over a float32 or
    (``bf16``) bfloat16 cache; ``f16_probs``: the probabilities are normalized and rounded to
    float16 before they weight V (llama.cpp's precision). All are compile-time constants: the inner loops over ``dim``
    vectorize (measured 1.6x faster than a runtime trip count, at memory-copy speed), unused lanes
    fold away, and a bfloat16 row is widened to float32 (the top half of its bits) in a small
    buffer as it is read, so the cache is read at half the bytes."""

    @njit(parallel=True, fastmath=True, nogil=True, cache=True, boundscheck=False)
    def paged_decode_attention(q, k_rows, v_rows, kv_index, kv_start, kv_len, out, scale, num_kv_heads):  # pragma: no cover - compiled
        """q [B, H, D] float32; k_rows / v_rows [slots * num_kv_heads, D] (the pool of one layer,
        float32, or bfloat16 bits as uint16);
        row ``b`` attends to slots ``kv_index[kv_start[b] : kv_start[b] + kv_len[b]]``; writes
        out [B, H, D]."""
        batch, heads, _ = q.shape
        group = heads // num_kv_heads
        chunks = (group + lanes - 1) // lanes
        for task in prange(batch * num_kv_heads * chunks):
            b = task // (num_kv_heads * chunks)
            rest = task - b * num_kv_heads * chunks
            h = rest // chunks
            first = h * group + (rest - h * chunks) * lanes
            used = min(lanes, h * group + group - first)
            qs = np.zeros((4, dim), dtype=np.float32)
            for i in range(used):
                for d in range(dim):
                    qs[i, d] = q[b, first + i, d] * scale
            q0, q1, q2, q3 = qs[0], qs[1], qs[2], qs[3]
            n = kv_len[b]
            base = kv_start[b]
            s = np.empty((4, n), dtype=np.float32)
            wide = np.empty(dim, dtype=np.uint32)
            row = wide.view(np.float32)
            for j in range(n):
                if bf16:
                    src = k_rows[kv_index[base + j] * num_kv_heads + h]
                    for d in range(dim):
                        wide[d] = np.uint32(src[d]) << np.uint32(16)
                    kr = row
                else:
                    kr = k_rows[kv_index[base + j] * num_kv_heads + h]
                a0 = np.float32(0.0)
                a1 = np.float32(0.0)
                a2 = np.float32(0.0)
                a3 = np.float32(0.0)
                for d in range(dim):
                    x = kr[d]
                    a0 += q0[d] * x
                    if lanes > 1:
                        a1 += q1[d] * x
                    if lanes > 2:
                        a2 += q2[d] * x
                    if lanes > 3:
                        a3 += q3[d] * x
                s[0, j] = a0
                s[1, j] = a1
                s[2, j] = a2
                s[3, j] = a3
            totals = np.ones(4, dtype=np.float32)
            for i in range(lanes):
                totals[i] = _softmax_in_place(s[i])
                if f16_probs:
                    inv = np.float32(1.0) / totals[i]
                    for j in range(n):
                        s[i, j] = round_half(s[i, j] * inv)
                    totals[i] = np.float32(1.0)
            o = np.zeros((4, dim), dtype=np.float32)
            o0, o1, o2, o3 = o[0], o[1], o[2], o[3]
            for j in range(n):
                if bf16:
                    src = v_rows[kv_index[base + j] * num_kv_heads + h]
                    for d in range(dim):
                        wide[d] = np.uint32(src[d]) << np.uint32(16)
                    vr = row
                else:
                    vr = v_rows[kv_index[base + j] * num_kv_heads + h]
                p0 = s[0, j]
                p1 = s[1, j]
                p2 = s[2, j]
                p3 = s[3, j]
                for d in range(dim):
                    x = vr[d]
                    o0[d] += p0 * x
                    if lanes > 1:
                        o1[d] += p1 * x
                    if lanes > 2:
                        o2[d] += p2 * x
                    if lanes > 3:
                        o3[d] += p3 * x
            for i in range(used):
                inv = np.float32(1.0) / totals[i]
                for d in range(dim):
                    out[b, first + i, d] = o[i, d] * inv

    return paged_decode_attention


if njit is not None:

    @njit(fastmath=True, nogil=True, cache=True)
    def _softmax_in_place(s):  # pragma: no cover - compiled
        """exp(s - max) in place; returns the sum."""
        m = s[0]
        for j in range(1, s.shape[0]):
            if s[j] > m:
                m = s[j]
        total = np.float32(0.0)
        for j in range(s.shape[0]):
            e = math.exp(s[j] - m)
            s[j] = e
            total += e
        return total

    _KERNELS: dict = {}


def kernel_for(head_dim: int, group: int, bf16: bool = False, f16_probs: bool = False):  # type: ignore[no-untyped-def]
    """The compiled kernel for ``head_dim``, ``group`` query heads per KV head, the cache's
    dtype and the probabilities' rounding (built on first use, cached on disk by numba). A bfloat16 cache is passed as its
    ``int16``/``uint16`` view; queries and output stay float32."""
    key = (head_dim, min(group, LANES), bf16, f16_probs)
    kernel = _KERNELS.get(key)
    if kernel is None:
        kernel = _KERNELS[key] = _build(*key)
    return kernel


def set_threads(n: int) -> None:
    """Use ``n`` threads (at most numba's pool) for the kernel's parallel loop."""
    if njit is not None:
        import numba

        numba.set_num_threads(max(1, min(n, numba.config.NUMBA_NUM_THREADS)))
