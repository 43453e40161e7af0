"""engine.layers.octet_dot: block products of eight weight rows at once (Q4_0, Q4_1, Q8_0).

- Packing into octets and back gives the codes and scales again, any row count (a last octet
  padded).
- With unit scales every result is the exact integer sum numpy computes in int64, over the whole
  code ranges (nibbles 0..15 with Q4_0's offset, int8 -128..127 stored plus 128, activation codes
  -128..127), Q4_1's minimum terms included.
- Scaled: the formats' sums to float32 accuracy.
- Bits: one row's results are the same whether 1, 2, 3 or 4 activation rows share a call, and the
  same with VNNI, the AVX2 pair and the generic IR.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import njit

from engine.layers import int_dot, octet_dot

FORMATS = ("Q4_0", "Q4_1", "Q8_0")
OFFSET = {"Q4_0": 8, "Q4_1": 0, "Q8_0": 0}


def _built(fmt: str, avx2: bool, vnni: bool):  # type: ignore[no-untyped-def]
    """A fresh compile of ``fmt``'s octet products with the given instruction choice (``int_dot``'s
    flags are read while numba lowers the call), taking activation rows ``count`` at a time."""
    kernel = {"Q4_0": octet_dot.octet_rows_q4_0, "Q4_1": octet_dot.octet_rows_q4_1, "Q8_0": octet_dot.octet_rows_q8_0}[fmt]
    saved = int_dot._AVX2, int_dot._VNNI
    int_dot._AVX2, int_dot._VNNI = avx2, vnni
    try:

        @njit(cache=False)
        def rows(w, wd, wm, x8, xd, xt, xs, count):  # pragma: no cover - compiled
            m_rows, blocks = x8.shape[0], xd.shape[1]
            out = np.zeros((m_rows, w.shape[0] * 8), np.float32)
            for g in range(w.shape[0]):
                r = 0
                while r < m_rows:
                    size = min(m_rows - r, count)
                    args = (w[g].ctypes.data, wd[g].ctypes.data, wm[g].ctypes.data, x8[r].ctypes.data)
                    kernel(*args, xd[r].ctypes.data, xt[r].ctypes.data, xs[r].ctypes.data, blocks, out[r].ctypes.data + g * 32, out.strides[0], size)
                    r += size
            return out

        one = np.zeros((1, 1, octet_dot.OCTET_BYTES[fmt]), np.uint8), np.ones((1, 1, 8), np.float32)
        rows(one[0], one[1], one[1], np.zeros((1, 32), np.int8), np.ones((1, 1), np.float32), np.zeros((1, 1), np.int32), np.ones((1, 1), np.float32), 1)
        return rows
    finally:
        int_dot._AVX2, int_dot._VNNI = saved


_BUILDS: dict[tuple[str, bool, bool], object] = {}


def _product(fmt: str, codes, d, m, x, xd, xs, count: int = octet_dot.MAX_ROWS, avx2: bool | None = None, vnni: bool | None = None):  # type: ignore[no-untyped-def]
    """codes [N, K] (nibbles or int8), d / m [N, K/32]; x int8 [M, K], xd / xs [M, K/32] -> [M, N]."""
    key = (fmt, int_dot._AVX2 if avx2 is None else avx2, int_dot._VNNI if vnni is None else vnni)
    if key not in _BUILDS:
        _BUILDS[key] = _built(fmt, key[1], key[2])
    n = codes.shape[0]
    wd = octet_dot.pack_scales(d)
    wm = octet_dot.pack_scales(m) if m is not None else wd
    xt = x.reshape(x.shape[0], -1, 32).sum(-1, dtype=np.int32)
    out = _BUILDS[key](octet_dot.pack_octets(codes, fmt), wd, wm, x, xd, xt, xs, count)  # type: ignore[operator]
    return out[:, :n]


def _codes(fmt: str, rng, n: int, k: int, extremes: bool) -> np.ndarray:  # type: ignore[no-untyped-def]
    if fmt == "Q8_0":
        return np.full((n, k), -128, np.int8) if extremes else rng.integers(-128, 128, (n, k)).astype(np.int8)
    return np.full((n, k), 15, np.uint8) if extremes else rng.integers(0, 16, (n, k)).astype(np.uint8)


@settings(max_examples=30, deadline=None)
@given(fmt=st.sampled_from(FORMATS), n=st.integers(1, 20), blocks=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_packing_round_trips(fmt, n, blocks, seed):
    rng = np.random.default_rng(seed)
    codes = _codes(fmt, rng, n, 32 * blocks, False)
    packed = octet_dot.pack_octets(codes, fmt)
    assert packed.shape == (-(-n // 8), blocks, octet_dot.OCTET_BYTES[fmt])
    np.testing.assert_array_equal(octet_dot.unpack_octets(packed, n, fmt), codes)
    scales = rng.standard_normal((n, blocks)).astype(np.float32)
    np.testing.assert_array_equal(octet_dot.unpack_scales(octet_dot.pack_scales(scales), n), scales)


@settings(max_examples=40, deadline=None)
@given(
    fmt=st.sampled_from(FORMATS), n=st.integers(1, 19), rows=st.integers(1, 6), blocks=st.integers(1, 9),
    extremes=st.booleans(), seed=st.integers(0, 2**16),
)  # fmt: skip
def test_unit_scales_give_the_exact_integer_sum(fmt, n, rows, blocks, extremes, seed):
    rng = np.random.default_rng(seed)
    k = 32 * blocks
    codes = _codes(fmt, rng, n, k, extremes)
    x = np.full((rows, k), -128, np.int8) if extremes else rng.integers(-128, 128, (rows, k)).astype(np.int8)
    m = rng.integers(-3, 4, (n, blocks)).astype(np.float32) if fmt == "Q4_1" else None
    xs = rng.integers(-3, 4, (rows, blocks)).astype(np.float32)
    got = _product(fmt, codes, np.ones((n, blocks), np.float32), m, x, np.ones((rows, blocks), np.float32), xs)
    expected = x.astype(np.int64) @ (codes.astype(np.int64) - OFFSET[fmt]).T
    if m is not None:
        expected += (xs.astype(np.int64) @ m.astype(np.int64).T)
    np.testing.assert_array_equal(got, expected.astype(np.float32))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("blocks", [1, 5, 18])
def test_scaled_blocks_sum_as_the_format_defines(fmt, blocks):
    rng = np.random.default_rng(blocks)
    n, rows, k = 13, 3, 32 * blocks
    codes = _codes(fmt, rng, n, k, False)
    d, xd = rng.uniform(1e-3, 2e-2, (n, blocks)).astype(np.float32), rng.uniform(1e-3, 2e-2, (rows, blocks)).astype(np.float32)
    m = rng.uniform(-0.1, 0.1, (n, blocks)).astype(np.float32) if fmt == "Q4_1" else None
    xs = rng.uniform(-1, 1, (rows, blocks)).astype(np.float32)
    x = rng.integers(-127, 128, (rows, k)).astype(np.int8)
    isum = np.einsum("nbj,rbj->rnb", codes.astype(np.int64).reshape(n, blocks, 32) - OFFSET[fmt], x.astype(np.int64).reshape(rows, blocks, 32))
    expected = (isum * d.astype(np.float64)[None] * xd.astype(np.float64)[:, None]).sum(-1)
    if m is not None:
        expected += xs.astype(np.float64) @ m.astype(np.float64).T
    got = _product(fmt, codes, d, m, x, xd, xs)
    np.testing.assert_allclose(got, expected, rtol=0, atol=2e-6 * np.abs(expected).max())


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_rows_bits_do_not_depend_on_its_call_or_the_instructions(fmt):
    """1 to 4 activation rows a call, and VNNI (``vpdpbusd``) / the AVX2 pair (nibbles) / the
    generic IR: the same integers, so every row's float32 results are identical bit for bit."""
    rng = np.random.default_rng(7)
    n, rows, blocks = 21, 7, 6
    codes = _codes(fmt, rng, n, 32 * blocks, False)
    codes[3] = _codes(fmt, rng, 1, 32 * blocks, True)  # a row of extreme codes
    d = rng.uniform(1e-3, 2e-2, (n, blocks)).astype(np.float32)
    m = rng.uniform(-0.1, 0.1, (n, blocks)).astype(np.float32) if fmt == "Q4_1" else None
    x = rng.integers(-128, 128, (rows, 32 * blocks)).astype(np.int8)
    x[1] = -128
    xd, xs = rng.uniform(1e-3, 2e-2, (rows, blocks)).astype(np.float32), rng.uniform(-1, 1, (rows, blocks)).astype(np.float32)
    reference = _product(fmt, codes, d, m, x, xd, xs, count=1)
    for count in range(2, octet_dot.MAX_ROWS + 1):
        np.testing.assert_array_equal(_product(fmt, codes, d, m, x, xd, xs, count=count), reference, err_msg=f"{count} rows a call")
    builds = [(False, False)]
    if int_dot._AVX2:
        builds.append((True, False))
    if int_dot._vnni_intrinsics():  # the host's own choice, whatever FORMCAST_INT_DOT_VNNI says
        builds.append((True, True))
    for avx2, vnni in builds:
        got = _product(fmt, codes, d, m, x, xd, xs, avx2=avx2, vnni=vnni)
        np.testing.assert_array_equal(got, reference, err_msg=f"avx2={avx2} vnni={vnni}")
