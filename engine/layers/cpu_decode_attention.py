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
of the bytes. float32 and bfloat16 pools; float16 uses the torch path. The scores may be
soft-capped (Gemma 2) and the probabilities rounded to float16 (llama.cpp's precision), both
run-time arguments: they act outside the loops over ``head_dim``, and as compile-time variants
they doubled the kernels a process (and a test run on an empty cache) compiled.
The softmax's exponentials are ``vector_exp.exp32``, inlined into the kernel (numba IR, not a
shared compiled callee) so that its loop vectorizes: the C library's ``expf`` had taken more than
half of a SmolLM2 decode row's attention time.

Every process runs the machine code of numba's on-disk cache, the first one after an install
too (a child process compiles into the cache): a kernel compiled in the process that uses it
computed other bits than the cached one (see :func:`_load`).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np

try:  # numba is a dependency; keep the engine importable (torch path) if its install is broken
    from numba import njit, prange

    from . import numba_cache
    from .fp16_round import round_half
    from .vector_exp import exp32

    numba_cache.register()  # before a kernel enables its cache: it inlines vector_exp's IR
except ImportError:  # pragma: no cover
    njit = None

LANES = 4  # query heads per task


def available() -> bool:
    return njit is not None


def _build(dim: int, lanes: int, bf16: bool):  # type: ignore[no-untyped-def]
    """The kernel for ``head_dim == dim`` with ``lanes`` query heads per task, over a float32 or
    (``bf16``) bfloat16 cache. These are compile-time constants: the inner loops over ``dim``
    vectorize (measured 1.6x faster than a runtime trip count, at memory-copy speed), unused
    lanes fold away, and a bfloat16 row is widened to float32 (the top half of its bits) in a
    small buffer as it is read, so the cache is read at half the bytes. The kernel's last two
    arguments: ``softcap`` > 0 makes each score softcap * tanh(score / softcap) before the
    softmax (Gemma 2; 0: no cap); ``f16_probs``: the probabilities are normalized and rounded to
    float16 before they weight V (llama.cpp's precision)."""

    @njit(parallel=True, fastmath=True, nogil=True, cache=True, boundscheck=False)
    def paged_decode_attention(q, k_rows, v_rows, kv_index, kv_start, kv_len, out, scale, num_kv_heads, softcap, f16_probs):  # pragma: no cover - compiled
        """q [B, H, D] float32; k_rows / v_rows [slots * num_kv_heads, D] (the pool of one layer,
        float32, or bfloat16 bits as uint16);
        row ``b`` attends to slots ``kv_index[kv_start[b] : kv_start[b] + kv_len[b]]``; writes
        out [B, H, D]."""
        capped = softcap > np.float32(0.0)
        cap = softcap if capped else np.float32(1.0)
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
                if capped:
                    for j in range(n):
                        s[i, j] = np.float32(math.tanh(s[i, j] / cap)) * cap
                # The softmax written here, not called: a shared compiled callee would be linked
                # into every variant, and a process runs whichever copy it loaded first.
                m = s[i, 0]
                for j in range(1, n):
                    if s[i, j] > m:
                        m = s[i, j]
                for j in range(n):  # alone in their loop, the exponentials vectorize
                    s[i, j] = exp32(s[i, j] - m)
                total = np.float32(0.0)
                for j in range(n):
                    total += s[i, j]
                totals[i] = total
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
    _KERNELS: dict = {}

_ROOT = Path(__file__).resolve().parents[2]  # the folder holding the ``engine`` package
_CHILD = (
    "import json, sys; sys.path.insert(0, sys.argv[1]); "
    "from engine.layers import cpu_decode_attention as m; m.compile_here(*json.loads(sys.argv[2]))"
)


def kernel_for(head_dim: int, group: int, bf16: bool = False):  # type: ignore[no-untyped-def]
    """The compiled kernel for ``head_dim``, ``group`` query heads per KV head and the cache's
    dtype (see :func:`_build`), loaded from numba's on-disk cache (compiled into it by a child
    process first when it is not there: see :func:`_load`). A bfloat16 cache is passed as its
    ``int16``/``uint16`` view; queries and output stay float32."""
    key = (head_dim, min(group, LANES), bf16)
    kernel = _KERNELS.get(key)
    if kernel is None:
        kernel = _KERNELS[key] = _build(*key)
        _load(kernel, key)
    return kernel


def attend(  # type: ignore[no-untyped-def]
    q, k_pool, v_pool, kv_index, kv_start, kv_len, out, scale: float | None, f16_probs: bool, softcap: float | None
) -> None:
    """The kernel of ``q``'s geometry over one layer's pool [slots, kv_heads, dim] (float32, or
    bfloat16 bits as uint16), numpy arrays; ``scale`` None: dim ** -0.5."""
    heads, dim = q.shape[1], q.shape[2]
    kv_heads = k_pool.shape[1]
    kernel = kernel_for(dim, heads // kv_heads, k_pool.dtype == np.uint16)
    scale32 = np.float32(dim**-0.5 if scale is None else scale)
    cap = np.float32(0.0 if softcap is None else softcap)
    kernel(q, k_pool.reshape(-1, dim), v_pool.reshape(-1, dim), kv_index, kv_start, kv_len, out, scale32, kv_heads, cap, bool(f16_probs))


def _signature(bf16: bool):  # type: ignore[no-untyped-def]
    """The argument types a forward passes (``attention.TorchAttention._paged_decode_forward``)."""
    from numba import types

    rows = (types.uint16 if bf16 else types.float32)[:, ::1]
    index = types.int64[::1]
    qo = types.float32[:, :, ::1]
    return (qo, rows, rows, index, index, index, qo, types.float32, types.int64, types.float32, types.boolean)


def _load(kernel, key: tuple) -> None:  # type: ignore[no-untyped-def]
    """Give ``kernel`` the machine code numba's cache holds, whichever process compiled it.

    Why not compile here: numba links a copy of each compiled piece (the parallel loop's body)
    into the kernel and optimizes it again there, while the process that compiled the piece
    also keeps the piece's own build, and calls go to whichever build the process loaded first.
    Under fastmath the two builds may sum in different orders (measured: outputs up to 1e-6
    apart, greedy tokens flipped), so the compiling process computed other bits than every
    later process, which loads the kernel alone from the cache. A child compiles into the cache
    and every process, this one included, loads the same code. Where the cache cannot be used
    (no writable place, a failed child, other numba internals) this compiles here, as before."""
    if not hasattr(kernel, "compile"):  # NUMBA_DISABLE_JIT: the plain Python function
        return
    sig = _signature(key[2])
    if not _in_cache(kernel, sig):
        try:
            subprocess.run([sys.executable, "-c", _CHILD, str(_ROOT), json.dumps(key)],
                           capture_output=True, timeout=1800, check=False)  # fmt: skip
        except (OSError, subprocess.SubprocessError):
            pass
    kernel.compile(sig)


def _in_cache(kernel, sig) -> bool:  # type: ignore[no-untyped-def]
    """Whether numba's on-disk cache holds ``kernel`` for ``sig`` (numba internals: True when
    they are not as expected, so the caller compiles here)."""
    try:
        cache = kernel._cache
        return cache._cache_file.load(cache._index_key(sig, kernel.targetctx.codegen())) is not None
    except Exception:  # noqa: BLE001 - no cache (NullCache) or another numba version
        return True


def compile_here(head_dim: int, lanes: int, bf16: bool) -> None:
    """Compile one kernel into numba's on-disk cache (run by :func:`_load`'s child process)."""
    _build(head_dim, lanes, bf16).compile(_signature(bf16))

