"""The small per-row operations of a quantized model's layer as compiled loops: RMSNorm, rotary
embedding and the gated activation.

At batch 1 a SmolLM2 decode step runs 61 RMSNorms, 30 rotary applications and 30 activations;
each costs torch several dispatches (``F.rms_norm`` on 576 floats measured 43 µs in a step, the
rotary 33 µs) for a few hundred nanoseconds of arithmetic. Here each is one numba call, about 2-4
µs. (The float32 cache write is the pool's own: ``mem_cache.memory_pool``.) The ``*_rows``
functions take and return numpy arrays, for ``models.row_forward``, which also adds the residual
stream in the norm's loop (``add_rms_norm_rows``: the same IEEE additions, then the same norm).

Why only for quantized models (``LlamaForCausalLM.use_row_kernels``): their activations are
quantized to 8-bit blocks before every product, which turns any difference in the last bit of a
norm into other codes. Each loop computes a row in a fixed order that does not depend on how many
rows a forward holds (batch invariance), with no fast-math flag. Float models keep torch's
operations, whose bits the transformers oracle tests pin.

The arithmetic follows llama.cpp's CPU backend where it has a choice: RMSNorm sums the squares
in float64 and scales by ``1 / sqrt(mean + eps)`` before the weight multiplies, the rotary
rounds each product before the sum (as torch's ``x * cos + rotated * sin``, and as its
multiply-then-add does), SiLU is ``x / (1 + exp(-x))`` in float32, with ``vector_exp.exp32`` (an
exp that vectorizes and gives the C library's ``expf`` bits on all but about 10 arguments in a
million; ``expf`` itself, one call an element, made this loop 1.2-1.4x slower).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from numba import njit

from . import numba_cache
from .vector_exp import exp32

numba_cache.register()  # before the loops below enable their caches: they inline vector_exp's IR


@njit(nogil=True, cache=True, boundscheck=False)
def _rms_norm(x, weight, eps, out):  # pragma: no cover - compiled
    rows, dim = x.shape
    for r in range(rows):
        total = 0.0
        for j in range(dim):
            total += np.float64(x[r, j]) * np.float64(x[r, j])
        scale = np.float32(1.0 / math.sqrt(total / dim + eps))
        for j in range(dim):
            out[r, j] = (x[r, j] * scale) * weight[j]


@njit(nogil=True, cache=True, boundscheck=False)
def _add_rms_norm(residual, delta, weight, eps, total, out):  # pragma: no cover - compiled
    """total = residual + delta (the residual stream's add), out = its RMSNorm (``_rms_norm``)."""
    rows, dim = residual.shape
    for r in range(rows):
        for j in range(dim):
            total[r, j] = residual[r, j] + delta[r, j]
    _rms_norm(total, weight, eps, out)


@njit(nogil=True, cache=True, boundscheck=False)
def _rotary(x, cos, sin, out):  # pragma: no cover - compiled
    """x [T, heads, dim], cos / sin [T, dim] -> out: x * cos + rotate_half(x) * sin."""
    tokens, heads, dim = x.shape
    half = dim // 2
    for t in range(tokens):
        for h in range(heads):
            for j in range(half):
                out[t, h, j] = x[t, h, j] * cos[t, j] + (-x[t, h, j + half]) * sin[t, j]
            for j in range(half, dim):
                out[t, h, j] = x[t, h, j] * cos[t, j] + x[t, h, j - half] * sin[t, j]


@njit(nogil=True, cache=True, boundscheck=False)
def _silu_and_mul(gate_up, out):  # pragma: no cover - compiled
    """gate_up [T, 2 * I] (gate then up) -> out [T, I]: silu(gate) * up."""
    rows, inner = out.shape
    e = np.empty(inner, np.float32)
    for r in range(rows):
        for j in range(inner):  # alone in their loop, the exponentials vectorize
            e[j] = exp32(-gate_up[r, j])
        for j in range(inner):
            g = gate_up[r, j]
            out[r, j] = (g / (np.float32(1.0) + e[j])) * gate_up[r, inner + j]


def _array(x: torch.Tensor) -> np.ndarray:
    return x.float().contiguous().numpy()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dimension of float32 ``x`` (any leading shape)."""
    flat = _array(x.reshape(-1, x.shape[-1]))
    out = np.empty_like(flat)
    _rms_norm(flat, _array(weight), np.float64(eps), out)
    return torch.from_numpy(out).view(x.shape)


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x`` [T, heads, dim] rotated by ``cos`` / ``sin`` [T, 1, dim] (the whole head rotates)."""
    x32 = _array(x)
    out = np.empty_like(x32)
    _rotary(x32, _array(cos[:, 0]), _array(sin[:, 0]), out)
    return torch.from_numpy(out)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up of a fused [T, 2 * I] projection."""
    rows = _array(gate_up)
    out = np.empty((rows.shape[0], rows.shape[1] // 2), np.float32)
    _silu_and_mul(rows, out)
    return torch.from_numpy(out)


# The same loops on numpy arrays (C-ordered float32), for ``models.row_forward``: no torch call
# between two loops.


def rms_norm_rows(x: np.ndarray, weight: np.ndarray, eps: np.float64) -> np.ndarray:
    out = np.empty_like(x)
    _rms_norm(x, weight, eps, out)
    return out


def add_rms_norm_rows(residual: np.ndarray, delta: np.ndarray, weight: np.ndarray, eps: np.float64) -> tuple[np.ndarray, np.ndarray]:
    """(residual + delta, its RMSNorm)."""
    total, out = np.empty_like(residual), np.empty_like(residual)
    _add_rms_norm(residual, delta, weight, eps, total, out)
    return total, out


def rotary_rows(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """``x`` [T, heads, dim] rotated by ``cos`` / ``sin`` [T, dim]."""
    out = np.empty_like(x)
    _rotary(x, cos, sin, out)
    return out


def silu_and_mul_rows(gate_up: np.ndarray) -> np.ndarray:
    out = np.empty((gate_up.shape[0], gate_up.shape[1] // 2), np.float32)
    _silu_and_mul(gate_up, out)
    return out


def warm_up() -> None:
    """Run every loop once on forward-typed arrays (compiled or loaded before the engine is ready)."""
    x = torch.ones(1, 2, 4)
    rms_norm(x[0], torch.ones(4), 1e-5)
    rotary(x, torch.ones(1, 1, 4), torch.zeros(1, 1, 4))
    silu_and_mul(x[0])
    rows = x[0].numpy()
    add_rms_norm_rows(rows, rows, np.ones(4, np.float32), np.float64(1e-5))
