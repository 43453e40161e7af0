"""ggml block formats (engine.layers.ggml_quants) against the gguf package's numpy (de)quantizers.

- Dequantization equals ``gguf.quants.dequantize`` exactly, block by block, for every type
  (the 32-element types quantized by ``gguf.quants``; the K-quants, which it cannot quantize, as
  random blocks with sane scales: every bit pattern of the codes and packed scales is valid).
- The activation quantizers equal a numpy transcription of llama.cpp's definitions (Q8_0/Q8_1:
  scale max|x|/127 rounded to fp16, codes rounded half to even; Q8_K: scale -max/127 by the
  signed extreme, float32, 16-element sums), and the fp16 rounding equals numpy's float16 cast.
- The integer dot products equal float products of the dequantized weights and the dequantized
  activation blocks (the format's definition), for one row, a few rows and a long prefill, and
  each row of a product equals that row alone.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")

from gguf import GGMLQuantizationType as T  # noqa: E402
from gguf.constants import GGML_QUANT_SIZES  # noqa: E402

from engine.layers import cpu_threads  # noqa: E402
from engine.layers import ggml_quants as gq  # noqa: E402

N, K = 24, 512


def _raw(type_name: str, w: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    kind = T[type_name]
    if type_name in gq.BLOCK_TYPES:
        return gguf.quants.quantize(w, kind)
    block, size = GGML_QUANT_SIZES[kind]
    raw = rng.integers(0, 256, (w.shape[0], w.shape[1] // block * size), dtype=np.uint8)
    blocks = raw.reshape(w.shape[0], -1, size)
    offsets = [208] if type_name == "Q6_K" else [0, 2]  # d (and dmin) as fp16 of sane size
    for off in offsets:
        scale = rng.uniform(0.001, 0.02, blocks.shape[:2]).astype(np.float16)
        blocks[..., off : off + 2] = scale.view(np.uint8).reshape(blocks.shape[:2] + (2,))
    return raw


@pytest.fixture(scope="module", params=gq.QUANT_TYPES)
def encoded(request):
    rng = np.random.default_rng(7)
    w = rng.standard_normal((N, K)).astype(np.float32)
    raw = _raw(request.param, w, rng)
    return request.param, raw, gguf.quants.dequantize(raw, T[request.param])


def test_dequantize_equals_gguf_block_by_block(encoded):
    type_name, raw, reference = encoded
    weight = gq.QuantizedWeight.from_gguf(type_name, raw, (N, K))
    got = weight.dequantize().numpy()
    block = GGML_QUANT_SIZES[T[type_name]][0]
    for n in range(N):
        for b in range(K // block):
            sl = slice(b * block, (b + 1) * block)
            np.testing.assert_array_equal(got[n, sl], reference[n, sl], err_msg=f"{type_name} row {n} block {b}")
    rows = np.array([5, 0, 5, 23])
    np.testing.assert_array_equal(weight.embedding(torch.from_numpy(rows)).numpy(), reference[rows])


# --- llama.cpp's activation quantizers, transcribed into numpy ------------------------------------


def _ref_q8_0(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    blocks = x.reshape(x.shape[0], -1, 32)
    amax = np.abs(blocks).max(-1)
    d = amax / np.float32(127)
    inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    q = np.rint(blocks * inv[..., None]).astype(np.int32)
    s = (d * q.sum(-1).astype(np.float32)).astype(np.float16).astype(np.float32)
    return q.reshape(x.shape).astype(np.int8), d.astype(np.float16).astype(np.float32), s


def _ref_q8_k(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    blocks = x.reshape(x.shape[0], -1, 256)
    idx = np.abs(blocks).argmax(-1)
    vmax = np.take_along_axis(blocks, idx[..., None], -1)[..., 0]
    iscale = np.float32(-127) / vmax
    q = np.minimum(127, np.rint(blocks * iscale[..., None])).astype(np.int32)
    sums = q.reshape(x.shape[0], -1, 16).sum(-1)
    return q.reshape(x.shape).astype(np.int8), (np.float32(1) / iscale).astype(np.float32), sums


def test_activation_quantizers_match_llama_cpp_definitions():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((3, K)) * rng.uniform(0.01, 30, (3, 1))).astype(np.float32)
    x[1, :32] = 0.0  # an all-zero block
    xq, xd, xs = np.empty((3, K), np.int8), np.empty((3, K // 32), np.float32), np.empty((3, K // 32), np.float32)
    xt = np.empty((3, K // 32), np.int32)
    gq.quantize_q8_0(x, xq, xd, xs, xt)
    rq, rd, rs = _ref_q8_0(x)
    np.testing.assert_array_equal(xq, rq)
    np.testing.assert_array_equal(xd, rd)
    np.testing.assert_array_equal(xs, rs)
    np.testing.assert_array_equal(xt, rq.reshape(3, -1, 32).sum(-1))
    kq, kd, kbs = np.empty((3, K), np.int8), np.empty((3, K // 256), np.float32), np.empty((3, K // 16), np.int32)
    gq.quantize_q8_k(x, kq, kd, kbs)
    rq, rd, rbs = _ref_q8_k(x)
    np.testing.assert_array_equal(kq, rq)
    np.testing.assert_array_equal(kd, rd)
    np.testing.assert_array_equal(kbs, rbs)
    x[2] = 0.0  # all-zero K blocks: scale 0, codes 0
    gq.quantize_q8_k(x, kq, kd, kbs)
    assert not kq[2].any() and not kd[2].any() and not kbs[2].any()


# In-memory bytes over the file's: the 32-element formats' scales and minimums are float32, the
# K-quants keep their 6-bit (Q6_K: int8) sub-scales as bytes, the codes of the nibble formats stay
# nibbles, the 5- and 6-bit ones take a byte each.
RESIDENT_OVER_FILE = {"Q4_0": 1.0, "Q4_1": 1.0, "Q8_0": 1.0, "Q4_K": 1.03, "Q5_K": 1.57, "Q6_K": 1.31, "Q5_0": 1.3, "Q5_1": 1.34}


def test_weights_stay_near_their_file_size(encoded):
    type_name, raw, _ = encoded
    weight = gq.QuantizedWeight.from_gguf(type_name, raw, (N, K))
    assert weight.nbytes <= raw.nbytes * RESIDENT_OVER_FILE[type_name], (type_name, weight.nbytes, raw.nbytes)


def test_fp16_rounding_matches_numpy():
    rng = np.random.default_rng(5)
    values = np.concatenate([
        rng.standard_normal(2000) * 10.0 ** rng.integers(-9, 5, 2000),
        [0.0, -0.0, 65504.0, 65519.0, 1e-8, 6.1e-5, 5.96e-8, 2.98e-8, 1.0 + 2**-11, 1.0 + 3 * 2**-11],
    ]).astype(np.float32)  # fmt: skip
    got = np.array([gq.round_half(np.float32(v)) for v in values], dtype=np.float32)
    np.testing.assert_array_equal(got, values.astype(np.float16).astype(np.float32))


@pytest.mark.parametrize("rows", [1, 3, 37])
def test_matmul_is_the_format_dot_product(encoded, rows):
    type_name, raw, reference = encoded
    weight = gq.QuantizedWeight.from_gguf(type_name, raw, (N, K))
    rng = np.random.default_rng(rows)
    x = rng.standard_normal((rows, K)).astype(np.float32)
    got = weight.matmul(torch.from_numpy(x)).numpy()
    if type_name in gq.K_TYPES:
        xq, xd, _ = _ref_q8_k(x)
        x_deq = (xq.reshape(rows, -1, 256) * xd[..., None]).reshape(rows, K)
    else:
        xq, xd, _ = _ref_q8_0(x)
        x_deq = (xq.reshape(rows, -1, 32) * xd[..., None]).reshape(rows, K)
    expected = x_deq.astype(np.float64) @ reference.T.astype(np.float64)
    # Q4_1 / Q5_1 add m * s with s rounded to fp16 (2**-11 relative) where the float product has
    # the exact block sum; the others are exact up to float32 accumulation order.
    tol = 2e-3 if type_name in ("Q4_1", "Q5_1") else 2e-5
    np.testing.assert_allclose(got, expected, rtol=0, atol=tol * np.abs(expected).max())


def test_a_long_prefill_gives_each_row_its_numbers_alone(encoded):
    """Any number of rows (a long prefill too) gives each row the bits it gets alone: the 8-bit
    activation blocks of the next layer would turn a rounding difference into other codes."""
    type_name, raw, _ = encoded
    weight = gq.QuantizedWeight.from_gguf(type_name, raw, (N, K))
    rng = np.random.default_rng(3)
    rows = 37
    x = torch.from_numpy((rng.standard_normal((rows, K)) + 0.5).astype(np.float32))  # nonzero block sums
    got = weight.matmul(x).numpy()
    for i in (0, 3, 4, 35, 36):
        np.testing.assert_array_equal(got[i], weight.matmul(x[i : i + 1]).numpy()[0], err_msg=f"{type_name} row {i}")


def test_stacked_and_reordered_weights():
    rng = np.random.default_rng(11)
    a_raw = gguf.quants.quantize(rng.standard_normal((8, 256)).astype(np.float32), T.Q4_1)
    b_raw = gguf.quants.quantize(rng.standard_normal((4, 256)).astype(np.float32), T.Q8_0)
    a = gq.QuantizedWeight.from_gguf("Q4_1", a_raw, (8, 256))
    b = gq.QuantizedWeight.from_gguf("Q8_0", b_raw, (4, 256))
    x = torch.from_numpy(rng.standard_normal((2, 256)).astype(np.float32))
    stacked = gq.StackedWeight([a, b])
    assert tuple(stacked.shape) == (12, 256)
    torch.testing.assert_close(stacked.matmul(x), torch.cat([a.matmul(x), b.matmul(x)], dim=1))
    fused = gq.QuantizedWeight.cat([a, a])
    torch.testing.assert_close(fused.matmul(x), torch.cat([a.matmul(x), a.matmul(x)], dim=1))
    order = np.array([3, 1, 2, 0, 7, 6, 5, 4])
    torch.testing.assert_close(a.take_rows(order).matmul(x), a.matmul(x)[:, order])


# --- rows split across threads (``cpu_threads.run_rows``), any shape ------------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


def _format_product(type_name: str, raw: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The 32-element formats' dot product in float64 from integer block sums: for each block,
    d_w * d_x * sum(weight code * activation code) (+ m_w * s_x, Q8_1's fp16 block sum)."""
    n = raw.shape[0]
    k = x.shape[1]
    xq, xd, xs = _ref_q8_0(x)
    w = gguf.quants.dequantize(raw, T[type_name]).astype(np.float64).reshape(n, k // 32, 32)
    blocks = raw.reshape(n, k // 32, -1)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float64)
    m = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float64) if type_name in ("Q4_1", "Q5_1") else 0.0
    codes = np.rint((w - (m[..., None] if type_name in ("Q4_1", "Q5_1") else 0.0)) / np.where(d == 0, 1, d)[..., None])
    isum = np.einsum("nbj,rbj->rnb", codes, xq.reshape(x.shape[0], k // 32, 32).astype(np.float64))
    out = (isum * d[None] * xd.astype(np.float64)[:, None, :]).sum(-1)
    if type_name in ("Q4_1", "Q5_1"):
        out += (m[None] * xs.astype(np.float64)[:, None, :]).sum(-1)
    return out


@settings(max_examples=25, deadline=None)
@given(
    type_name=st.sampled_from(gq.BLOCK_TYPES),
    n=st.integers(1, 70),
    blocks=st.integers(1, 6),
    rows=st.integers(1, 5),
    split=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_block_products_equal_integer_block_sums(two_threads, type_name, n, blocks, rows, split, seed):
    rng = np.random.default_rng(seed)
    k = 32 * blocks
    raw = gguf.quants.quantize(rng.standard_normal((n, k)).astype(np.float32), T[type_name])
    x = (rng.standard_normal((rows, k)) * rng.uniform(0.1, 10)).astype(np.float32)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cpu_threads, "PARALLEL_MIN_MACS", 0 if split else 1 << 62)  # run_rows (Q5_x)
        mp.setattr(gq, "THREADED_MIN_MACS", 0 if split else 1 << 62)  # the integer loops' parallel region
        got = gq.QuantizedWeight.from_gguf(type_name, raw, (n, k)).matmul(torch.from_numpy(x)).numpy()
    expected = _format_product(type_name, raw, x)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5 * max(1.0, np.abs(expected).max()))


@pytest.fixture(scope="module")
def two_threads():
    import numba

    threads = numba.get_num_threads()
    numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))  # a split needs a second thread
    yield
    numba.set_num_threads(threads)


def test_split_rows_equal_one_call_and_raise_errors(monkeypatch):
    calls: list[tuple[int, int]] = []
    monkeypatch.setattr(cpu_threads, "threads", lambda: 2)
    cpu_threads.run_rows(lambda a, b: calls.append((a, b)), 100, 1 << 30)
    assert sorted(calls)[0][0] == 0 and sum(b - a for a, b in calls) == 100 and len(calls) > 1
    assert all(b == c for (_, b), (c, _) in zip(sorted(calls), sorted(calls)[1:])), "chunks tile the rows"

    def fail(a, b):
        raise ValueError("chunk failed")

    with pytest.raises(ValueError, match="chunk failed"):
        cpu_threads.run_rows(fail, 100, 1 << 30)
