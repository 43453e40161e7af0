"""engine.layers.int_dot: ggml's 32-element block dot products as integer multiply-adds in LLVM IR.

- With unit scales the float result of every block count (odd ones take the tail) is the exact
  integer sum numpy computes in int64, over the whole int8 / nibble range (the largest pair
  product, 15 x -128 twice, must not wrap).
- Scaled: each block's (or 16-element half's) integer sum times its two scales, summed, to
  float32 accuracy.
- A row's bits do not depend on the other rows of its call (batch invariance), nor on whether
  ``ggml_quants`` splits its product across threads.
- ``float_dot`` (the minimum terms) sums any length to float32 accuracy.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import njit

from engine.layers.int_dot import (
    code16_row_dot, code_activation_codes, code_row_dot, float_dot, nibble_activation_codes, nibble_bytes_of_codes, nibble_k_row_dot,
)  # fmt: skip


def _loop_nibbles(qs: np.ndarray) -> np.ndarray:
    """Nibbles in ggml's layout (the test's data) -> the bytes Q4_K's loop reads."""
    return nibble_bytes_of_codes(_unpacked(qs, 0).reshape(qs.shape[0], -1, 32)).reshape(qs.shape[0], -1)


def _nibble_rows(qs, x, d, sc, xd):
    """Q4_K's nibble products: block b of row n scaled by d[n, b // 8] * sc[n, b]; activation
    codes in element order (the test's data), stored as the loop reads them."""
    return _nibble_rows_compiled(_loop_nibbles(qs), nibble_activation_codes(x), d, sc, xd)


def _unit_k_scales(n: int, blocks: int) -> tuple[np.ndarray, np.ndarray]:
    return np.ones((n, -(-blocks // 8)), np.float32), np.ones((n, blocks), np.uint8)


@njit(cache=False)
def _nibble_rows_compiled(qs, x, d, sc, xd):  # pragma: no cover - compiled
    out = np.empty((x.shape[0], qs.shape[0]), np.float32)
    for n in range(qs.shape[0]):
        for r in range(x.shape[0]):
            out[r, n] = nibble_k_row_dot(qs[n].ctypes.data, x[r].ctypes.data, d[n].ctypes.data, sc[n].ctypes.data, xd[r].ctypes.data, sc.shape[1])
    return out


def _code_rows(q, x, wd, xd):
    """Activation codes (the test's data, int16, element order) as the products read them: int8,
    in ``code_row_dot``'s order for a scale per 32 codes, element order for one per 16."""
    per_block = wd.shape[1] == q.shape[1] // 32
    return _code_rows_compiled(q, code_activation_codes(x) if per_block else x.astype(np.int8), wd, xd)


@njit(cache=False)
def _code_rows_compiled(q, x, wd, xd):  # pragma: no cover - compiled
    """A scale per 32 codes (``code_row_dot``), or per 16 where ``wd`` has twice the columns."""
    out = np.empty((x.shape[0], q.shape[0]), np.float32)
    blocks = q.shape[1] // 32
    for n in range(q.shape[0]):
        for r in range(x.shape[0]):
            if wd.shape[1] == blocks:
                out[r, n] = code_row_dot(q[n].ctypes.data, x[r].ctypes.data, wd[n].ctypes.data, xd[r].ctypes.data, blocks)
            else:
                out[r, n] = code16_row_dot(q[n].ctypes.data, x[r].ctypes.data, wd[n].ctypes.data, xd[r].ctypes.data, blocks)
    return out


@njit(cache=False)
def _float_dot(a, b):  # pragma: no cover - compiled
    return float_dot(a.ctypes.data, b.ctypes.data, a.shape[0])


def _unpacked(qs: np.ndarray, off: int) -> np.ndarray:
    """Nibbles [N, B*16] -> codes [N, B*32] minus ``off``: element j of a block in the low nibble
    of byte j, element j + 16 in its high nibble."""
    blocks = qs.reshape(qs.shape[0], -1, 16).astype(np.int64)
    return (np.concatenate([blocks & 15, blocks >> 4], axis=-1) - off).reshape(qs.shape[0], -1)


def _data(seed: int, n: int, rows: int, blocks: int, extremes: bool):
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, (rows, blocks * 32)).astype(np.int16)
    qs = rng.integers(0, 256, (n, blocks * 16), dtype=np.uint8)
    q = rng.integers(-128, 128, (n, blocks * 32)).astype(np.int8)
    if extremes:
        x[:] = -128
        qs[:] = 0xFF
        q[:] = -128
    return x, qs, q


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**16), n=st.integers(1, 9), rows=st.integers(1, 4), blocks=st.integers(1, 9), extremes=st.booleans())
def test_unit_scales_give_the_exact_integer_sum(seed, n, rows, blocks, extremes):
    x, qs, q = _data(seed, n, rows, blocks, extremes)
    ones_w, ones_x = np.ones((n, blocks), np.float32), np.ones((rows, blocks), np.float32)
    expected = x.astype(np.int64) @ _unpacked(qs, 0).T
    np.testing.assert_array_equal(_nibble_rows(qs, x, *_unit_k_scales(n, blocks), ones_x), expected.astype(np.float32))
    expected = x.astype(np.int64) @ q.astype(np.int64).T
    np.testing.assert_array_equal(_code_rows(q, x, ones_w, ones_x), expected.astype(np.float32))
    halves_w, halves_x = np.ones((n, 2 * blocks), np.float32), np.ones((rows, 2 * blocks), np.float32)
    np.testing.assert_array_equal(_code_rows(q, x, halves_w, halves_x), expected.astype(np.float32))


@pytest.mark.parametrize("blocks", [1, 4, 7, 18])
def test_scaled_blocks_sum_as_the_format_defines(blocks):
    x, qs, q = _data(blocks, 6, 3, blocks, False)
    rng = np.random.default_rng(blocks)
    wd = rng.uniform(1e-3, 2e-2, (6, blocks)).astype(np.float32)
    xd = rng.uniform(1e-3, 2e-2, (3, blocks)).astype(np.float32)
    scales = xd.astype(np.float64)[:, None, :] * wd.astype(np.float64)[None]  # [rows, n, blocks]

    def reference(codes: np.ndarray) -> np.ndarray:
        isum = np.einsum("rbj,nbj->rnb", x.reshape(3, blocks, 32).astype(np.float64), codes.reshape(6, blocks, 32).astype(np.float64))
        return (isum * scales).sum(-1)

    expected = reference(q)
    np.testing.assert_allclose(_code_rows(q, x, wd, xd), expected, rtol=0, atol=2e-6 * np.abs(expected).max())
    d = rng.uniform(1e-4, 1e-3, (6, -(-blocks // 8))).astype(np.float32)
    sc = rng.integers(1, 64, (6, blocks)).astype(np.uint8)
    k_scales = xd.astype(np.float64)[:, None, :] * (np.repeat(d, 8, axis=1)[:, :blocks] * sc.astype(np.float32)).astype(np.float64)[None]
    isum = np.einsum("rbj,nbj->rnb", x.reshape(3, blocks, 32).astype(np.float64), _unpacked(qs, 0).reshape(6, blocks, 32).astype(np.float64))
    expected = (isum * k_scales).sum(-1)
    np.testing.assert_allclose(_nibble_rows(qs, x, d, sc, xd), expected, rtol=0, atol=2e-6 * np.abs(expected).max())
    # a scale per 16 codes (Q6_K's sub-blocks)
    wd16 = rng.uniform(1e-3, 2e-2, (6, 2 * blocks)).astype(np.float32)
    xd16 = rng.uniform(1e-3, 2e-2, (3, 2 * blocks)).astype(np.float32)
    isum = np.einsum("rbj,nbj->rnb", x.reshape(3, 2 * blocks, 16).astype(np.float64), q.reshape(6, 2 * blocks, 16).astype(np.float64))
    expected = (isum * xd16.astype(np.float64)[:, None, :] * wd16.astype(np.float64)[None]).sum(-1)
    np.testing.assert_allclose(_code_rows(q, x, wd16, xd16), expected, rtol=0, atol=2e-6 * np.abs(expected).max())


def test_a_row_gets_the_same_bits_in_any_batch():
    x, qs, q = _data(3, 5, 6, 7, False)
    rng = np.random.default_rng(3)
    wd = rng.uniform(1e-3, 2e-2, (5, 7)).astype(np.float32)
    xd = rng.uniform(1e-3, 2e-2, (6, 7)).astype(np.float32)
    d, sc = rng.uniform(1e-3, 2e-2, (5, 1)).astype(np.float32), rng.integers(1, 64, (5, 7)).astype(np.uint8)
    together = _nibble_rows(qs, x, d, sc, xd), _code_rows(q, x, wd, xd)
    for r in range(6):
        alone = _nibble_rows(qs, x[r : r + 1], d, sc, xd[r : r + 1]), _code_rows(q, x[r : r + 1], wd, xd[r : r + 1])
        for a, t in zip(alone, together):
            np.testing.assert_array_equal(a[0], t[r])


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"])
@pytest.mark.parametrize("batch", [2, 3, 4, 5, 6, 7, 11])
def test_row_groups_give_each_row_its_bits_alone(type_name, batch):
    """``ggml_quants``' loops take activation rows in groups of up to ``int_dot.MAX_GROUP``
    (``*_rows``; a last row alone through ``*_row_dot``): every row of a batch of any size must
    equal its product alone, bit for bit."""
    gguf = pytest.importorskip("gguf")
    import torch

    from engine.layers import ggml_quants as gq

    rng = np.random.default_rng(1)
    n, k = 40, 512
    if type_name in gq.K_TYPES:  # random blocks (gguf cannot quantize K-quants), fp16 scales of sane size
        block, size = gguf.constants.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name]]
        raw = rng.integers(0, 256, (n, k // block * size), dtype=np.uint8)
        blocks = raw.reshape(n, k // block, size)
        for off in [208] if type_name == "Q6_K" else [0, 2]:
            blocks[..., off : off + 2] = rng.uniform(0.001, 0.02, blocks.shape[:2] + (1,)).astype(np.float16).view(np.uint8)
    else:
        raw = gguf.quants.quantize(rng.standard_normal((n, k)).astype(np.float32), gguf.GGMLQuantizationType[type_name])
    weight = gq.QuantizedWeight.from_gguf(type_name, raw, (n, k))
    x = torch.from_numpy(rng.standard_normal((batch, k)).astype(np.float32))
    together = weight.matmul(x).numpy()
    for r in range(batch):
        np.testing.assert_array_equal(weight.matmul(x[r : r + 1]).numpy()[0], together[r], err_msg=f"{type_name} row {r}")


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q6_K"])
def test_a_product_split_across_threads_gives_the_bits_of_one_thread(type_name, monkeypatch):
    """``ggml_quants`` runs a large product as a numba parallel region whose iterations call the
    serial loop (an inlined copy of it): both builds must round alike, or a row's bits would
    change with the size of its forward (small products stay on the calling thread)."""
    import numba

    gguf = pytest.importorskip("gguf")
    import torch

    from engine.layers import ggml_quants as gq

    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("one numba thread")
    rng = np.random.default_rng(5)
    n, k = 96, 768
    if type_name in gq.K_TYPES:
        block, size = gguf.constants.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name]]
        blocks = rng.integers(0, 256, (n, k // block, size), dtype=np.uint8)
        for off in [208] if type_name == "Q6_K" else [0, 2]:
            blocks[..., off : off + 2] = rng.uniform(0.001, 0.02, blocks.shape[:2] + (1,)).astype(np.float16).view(np.uint8)
        raw = blocks.reshape(n, -1)
    else:
        raw = gguf.quants.quantize(rng.standard_normal((n, k)).astype(np.float32), gguf.GGMLQuantizationType[type_name])
    weight = gq.QuantizedWeight.from_gguf(type_name, raw, (n, k))
    x = torch.from_numpy(rng.standard_normal((5, k)).astype(np.float32))
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(2)
        monkeypatch.setattr(gq, "THREADED_MIN_MACS", 0)
        split = weight.matmul(x).numpy()
        monkeypatch.setattr(gq, "THREADED_MIN_MACS", 1 << 62)
        alone = weight.matmul(x).numpy()
    finally:
        numba.set_num_threads(before)
    np.testing.assert_array_equal(split, alone)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(0, 41))
def test_float_dot_sums_every_product_of_any_length(seed, n):
    """The minimum terms' dot product: eight lanes and a scalar tail (lengths that are not a
    multiple of eight included), to float32 accuracy."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    expected = float(np.dot(a.astype(np.float64), b.astype(np.float64)))
    assert abs(_float_dot(a, b) - expected) <= 1e-5 * (1 + np.abs(a.astype(np.float64) * b).sum())


def _nibble_rows_built(avx2: bool, vnni: bool = False):
    """A fresh compile of Q4_K's nibble products, one row alone and groups of 2-4, with the x86
    intrinsics (VNNI's or AVX2's) or the generic IR (``int_dot._AVX2`` and ``_VNNI`` are read
    while numba lowers the call)."""
    from engine.layers import int_dot

    saved = int_dot._AVX2, int_dot._VNNI
    int_dot._AVX2, int_dot._VNNI = avx2, vnni
    try:

        @njit(cache=False)
        def rows(qs, x, d, sc, xd):  # pragma: no cover - compiled
            out = np.zeros((x.shape[0], qs.shape[0]), np.float32)
            group = np.empty(int_dot.MAX_GROUP, np.float32)
            blocks = sc.shape[1]
            for n in range(qs.shape[0]):
                w, dn, sn = qs[n].ctypes.data, d[n].ctypes.data, sc[n].ctypes.data
                out[0, n] = int_dot.nibble_k_row_dot(w, x[0].ctypes.data, dn, sn, xd[0].ctypes.data, blocks)
                for size in range(2, min(x.shape[0], int_dot.MAX_GROUP) + 1):
                    int_dot.nibble_k_rows(w, x[0].ctypes.data, x.strides[0], dn, sn, xd[0].ctypes.data, xd.strides[0], blocks, group.ctypes.data, size)
                    for i in range(size):
                        out[i, n] += group[i]
            return out

        one = np.ones((1, 1), np.float32)
        rows(np.zeros((1, 16), np.uint8), np.zeros((1, 32), np.int8), one, np.ones((1, 1), np.uint8), one)  # compile now, while the flag holds
        return rows
    finally:
        int_dot._AVX2, int_dot._VNNI = saved


def test_nibble_products_give_the_same_bits_with_and_without_x86_intrinsics():
    """VNNI (vpdpbusd), the AVX2 pair (pmaddubsw, pmaddwd) and the generic IR sum the same elements
    per lane, so every row's float32 result is identical bit for bit, the int8 extremes included."""
    from engine.layers import int_dot

    if not int_dot._AVX2:
        pytest.skip("this host compiles the generic IR only")
    x16, qs, _ = _data(11, 7, 4, 9, False)
    x16[1] = -128
    qs[2] = 0xFF
    rng = np.random.default_rng(11)
    d = rng.uniform(1e-4, 1e-3, (7, 2)).astype(np.float32)
    sc = rng.integers(1, 64, (7, 9)).astype(np.uint8)
    xd = rng.uniform(1e-3, 2e-2, (4, 9)).astype(np.float32)
    x8, w = nibble_activation_codes(x16), _loop_nibbles(qs)
    builds = {"avx2": _nibble_rows_built(True), "generic": _nibble_rows_built(False)}
    if int_dot._vnni_intrinsics():  # the host's own choice, whatever FORMCAST_INT_DOT_VNNI says
        builds["vnni"] = _nibble_rows_built(True, vnni=True)
    results = {name: build(w, x8, d, sc, xd) for name, build in builds.items()}
    assert np.abs(results["generic"]).max() > 0
    for name, result in results.items():
        np.testing.assert_array_equal(result.view(np.int32), results["generic"].view(np.int32), err_msg=name)
