"""llama.cpp's numerics outside the matrix products, which GGUF models follow with
``FORMCAST_GGML_NUMERICS=1`` (``ModelConfig.ggml_numerics``).

- Attention at float16 (``layers.attention``): the decode kernel's ``f16_probs`` variant and the
  spelled-out extend path equal a numpy transcription of llama.cpp's CPU attention (Q, K, V and
  the normalized probabilities rounded to float16, products summed in float).
- RoPE angles (``layers.rotary``, ``ggml=True``): each frequency's angle is the previous one's
  times theta ** (-2 / dim), multiplied in float32, as llama.cpp's rope cache does.
"""

from __future__ import annotations

import numpy as np
import torch

from engine.layers import attention, cpu_decode_attention, rotary
from engine.models.config import RopeConfig

HEADS, KV_HEADS, DIM = 6, 2, 64


def _f16(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float16).astype(np.float32)


def _llama_cpp_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool) -> np.ndarray:
    """q [Lq, H, D], k / v [S, KV, D] -> [Lq, H, D]; queries sit at the end of the keys."""
    lq, s = q.shape[0], k.shape[0]
    q, k, v = _f16(q), _f16(k), _f16(v)
    out = np.zeros_like(q)
    group = HEADS // KV_HEADS
    for h in range(HEADS):
        scores = (q[:, h].astype(np.float64) @ k[:, h // group].T.astype(np.float64)).astype(np.float32) * np.float32(DIM**-0.5)
        if causal:
            scores[np.arange(s)[None, :] > np.arange(s - lq, s)[:, None]] = -np.inf
        e = np.exp(scores.astype(np.float64) - scores.max(-1, keepdims=True))
        p = _f16((e / e.sum(-1, keepdims=True)).astype(np.float32))
        out[:, h] = (p.astype(np.float64) @ v[:, h // group].astype(np.float64)).astype(np.float32)
    return out


def _qkv(rng: np.random.Generator, lq: int, s: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    # large scores: peaked probabilities, where their float16 rounding moves the output most
    q = (rng.standard_normal((lq, HEADS, DIM)) * 1.5).astype(np.float32)
    k = (rng.standard_normal((s, KV_HEADS, DIM)) * 1.5).astype(np.float32)
    v = rng.standard_normal((s, KV_HEADS, DIM)).astype(np.float32)
    return q, k, v


def test_decode_kernel_rounds_like_llama_cpp():
    rng = np.random.default_rng(0)
    lens = [1, 9, 40]
    kernel = cpu_decode_attention.kernel_for(DIM, HEADS // KV_HEADS, False)
    q = np.zeros((len(lens), HEADS, DIM), np.float32)
    keys, values, expected = [], [], []
    for b, n in enumerate(lens):
        qb, kb, vb = _qkv(rng, 1, n)
        q[b] = _f16(qb[0])
        keys.append(_f16(kb))
        values.append(_f16(vb))
        expected.append(_llama_cpp_attention(qb, kb, vb, causal=False)[0])
    k_rows = np.concatenate(keys).reshape(-1, DIM)
    v_rows = np.concatenate(values).reshape(-1, DIM)
    index = np.arange(sum(lens), dtype=np.int64)
    starts = np.array([0, *np.cumsum(lens)[:-1]], dtype=np.int64)
    out = np.zeros_like(q)
    kernel(q, k_rows, v_rows, index, starts, np.array(lens, np.int64), out, np.float32(DIM**-0.5), KV_HEADS, np.float32(0.0), True)
    np.testing.assert_allclose(out, np.stack(expected), rtol=0, atol=2e-6)


def test_extend_path_rounds_like_llama_cpp():
    rng = np.random.default_rng(1)
    q, k, v = _qkv(rng, 12, 20)
    t = lambda a: torch.from_numpy(_f16(a)).transpose(0, 1).unsqueeze(0)  # noqa: E731  [1, heads, L, D]
    got = attention._attend(t(q), t(k), t(v), None, True, None, None, f16=True)[0].transpose(0, 1).numpy()
    np.testing.assert_allclose(got, _llama_cpp_attention(q, k, v, causal=True), rtol=0, atol=2e-6)


def test_rope_angles_are_multiplied_in_float32():
    theta, dim, positions = 100000.0, 64, 300
    ratio = np.power(np.float32(theta), np.float32(-2.0 / dim))
    expected = np.zeros((positions, dim // 2), np.float32)
    for p in range(positions):
        angle = np.float32(p)
        for i in range(dim // 2):
            expected[p, i] = angle
            angle = np.float32(angle * ratio)
    got = rotary._ggml_angles(theta, dim, positions).numpy()
    np.testing.assert_array_equal(got[:, : dim // 2], expected)
    np.testing.assert_array_equal(got[:, dim // 2 :], expected)
    emb = rotary.RotaryEmbedding(RopeConfig(theta=theta), dim, positions, torch.float32, torch.device("cpu"), ggml=True)
    np.testing.assert_array_equal(emb.cos.numpy(), np.cos(got.astype(np.float64)).astype(np.float32))
