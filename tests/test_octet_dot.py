"""engine.layers.octet_dot: block products of eight weight rows at once (Q4_0, Q4_1, Q8_0, Q4_K,
Q5_K, Q6_K), and ``ggml_quants``' loops around them.

- Packing into octets and back gives the codes and per-row values again, any row count (a last
  octet padded).
- With unit scales every result is the exact integer sum numpy computes in int64, over the whole
  code ranges (nibbles 0..15 with Q4_0's offset, int8 -128..127 stored plus 128, Q6_K's 0..63
  minus 32, activation codes -128..127), the minimum terms and the K-quants' signed and unsigned
  sub-scales included.
- Scaled: the formats' sums to float32 accuracy.
- Bits: one row's results are the same whether 1, 2, 3 or 4 activation rows share a call, with
  VNNI, the AVX2 pair and the generic IR, within a batch of any size, and split across threads.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import njit

from engine.layers import ggml_quants as gq
from engine.layers import int_dot, octet_dot

FORMATS = tuple(octet_dot.FORMATS)
KERNELS = {name: getattr(octet_dot, f"octet_rows_{name.lower()}") for name in FORMATS}


def _built(fmt: str, avx2: bool, vnni: bool):  # type: ignore[no-untyped-def]
    """A fresh compile of ``fmt``'s octet products with the given instruction choice (``int_dot``'s
    flags are read while numba lowers the call), taking activation rows ``count`` at a time."""
    kernel = KERNELS[fmt]
    saved = int_dot._AVX2, int_dot._VNNI
    int_dot._AVX2, int_dot._VNNI = avx2, vnni
    try:

        @njit(cache=False)
        def rows(w, wd, wm, sc, mn, x8, xd, xt, xs, count):  # pragma: no cover - compiled
            m_rows, blocks = x8.shape[0], xd.shape[1]
            out = np.zeros((m_rows, w.shape[0] * 8), np.float32)
            for g in range(w.shape[0]):
                r = 0
                while r < m_rows:
                    size = min(m_rows - r, count)
                    weights = (w[g].ctypes.data, wd[g].ctypes.data, wm[g].ctypes.data, sc[g].ctypes.data, mn[g].ctypes.data)
                    kernel(*weights, x8[r].ctypes.data, xd[r].ctypes.data, xt[r].ctypes.data, xs[r].ctypes.data, blocks, out[r].ctypes.data + g * 32, out.strides[0], size)
                    r += size
            return out

        return rows
    finally:
        int_dot._AVX2, int_dot._VNNI = saved


_BUILDS: dict[tuple[str, bool, bool], object] = {}


def _product(fmt: str, weight: dict, x: np.ndarray, xd: np.ndarray, xs: np.ndarray, count: int = octet_dot.MAX_ROWS, avx2=None, vnni=None):  # type: ignore[no-untyped-def]
    """``weight``: per-row arrays as ``ggml_quants._file_rows`` gives them; ``x`` int8 [M, K], ``xd`` /
    ``xs`` [M, K / block] -> [M, N]."""
    key = (fmt, int_dot._AVX2 if avx2 is None else avx2, int_dot._VNNI if vnni is None else vnni)
    if key not in _BUILDS:
        _BUILDS[key] = _built(*key)
    a = gq._octet_arrays(fmt, weight)
    w, wd = a["octets"], a["octet_d"]
    xt = x.reshape(x.shape[0], xd.shape[1], -1).sum(-1, dtype=np.int32)
    build = _BUILDS[key]
    out = build(w, wd, a.get("octet_m", wd), a.get("octet_sc", w), a.get("octet_mn", w), x, xd, xt, xs, count)  # type: ignore[operator]
    return out[:, : weight["codes"].shape[0]]


def _weight(fmt: str, rng, n: int, k: int, unit: bool, extremes: bool = False) -> dict:  # type: ignore[no-untyped-def]
    """Random per-row arrays of ``fmt``: codes over the format's whole range (or its extreme), scales
    of 1 and small integer minimums and sub-scales (``unit``: every sum exact), or float ones."""
    spec = octet_dot.FORMATS[fmt]
    if fmt == "Q8_0":
        codes = np.full((n, k), -128, np.int8) if extremes else rng.integers(-128, 128, (n, k)).astype(np.int8)
    else:
        top = {"Q4_0": 16, "Q4_1": 16, "Q4_K": 16, "Q5_K": 32, "Q6_K": 64}[fmt]
        codes = np.full((n, k), top - 1, np.uint8) if extremes else rng.integers(0, top, (n, k)).astype(np.uint8)
    blocks = k // spec.block
    scales = blocks // spec.super_blocks if spec.super_blocks else blocks
    weight = {"codes": codes}
    # Scales are float16 values, as in a file (the octets keep their half-precision bits).
    weight["d"] = np.ones((n, scales), np.float32) if unit else rng.uniform(1e-3, 2e-2, (n, scales)).astype(np.float16).astype(np.float32)
    if spec.minimum:
        m = rng.integers(-3, 4, (n, scales)) if unit else rng.uniform(-0.1, 0.1, (n, scales))
        weight["m"] = m.astype(np.float16).astype(np.float32)
    if spec.super_blocks:
        weight["sc"] = rng.integers(-3, 4, (n, blocks)).astype(np.int8) if spec.signed_scales else rng.integers(0, 64 if not unit else 4, (n, blocks)).astype(np.uint8)
        if spec.minimum:
            weight["mn"] = rng.integers(0, 64 if not unit else 4, (n, blocks)).astype(np.uint8)
    return weight


def _expected(fmt: str, weight: dict, x: np.ndarray, xd: np.ndarray, xs: np.ndarray) -> np.ndarray:
    """The format's sum in float64 (in int64 where every term is an integer)."""
    spec = octet_dot.FORMATS[fmt]
    n, k = weight["codes"].shape
    blocks = k // spec.block
    values = weight["codes"].astype(np.int64) + spec.bias - spec.offset  # the stored code minus the offset
    isum = np.einsum("nbj,rbj->rnb", values.reshape(n, blocks, spec.block), x.astype(np.int64).reshape(x.shape[0], blocks, spec.block))
    scale, minimum = weight["d"].astype(np.float64), weight.get("m")
    if spec.super_blocks:
        scale = np.repeat(scale, spec.super_blocks, axis=1) * weight["sc"].astype(np.float64)
        if minimum is not None:
            minimum = np.repeat(minimum.astype(np.float64), spec.super_blocks, axis=1) * weight["mn"].astype(np.float64)
    out = (isum * scale[None] * xd.astype(np.float64)[:, None, :]).sum(-1)
    if minimum is not None:
        out += xs.astype(np.float64) @ np.asarray(minimum, np.float64).T
    return out


def _k(fmt: str, units: int) -> int:
    return units * (256 if octet_dot.FORMATS[fmt].super_blocks else 32)


@settings(max_examples=30, deadline=None)
@given(fmt=st.sampled_from(FORMATS), n=st.integers(1, 20), units=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_packing_round_trips(fmt, n, units, seed):
    rng = np.random.default_rng(seed)
    weight = _weight(fmt, rng, n, _k(fmt, units), False)
    arrays = gq._octet_arrays(fmt, weight)
    assert arrays["octets"].shape == (-(-n // 8), _k(fmt, units) // octet_dot.FORMATS[fmt].block, octet_dot.FORMATS[fmt].block_bytes)
    back = gq.QuantizedWeight(fmt, (n, _k(fmt, units)), arrays)._rows()
    assert back.keys() == weight.keys()
    for key, value in weight.items():  # scales come back as their half-precision bits
        np.testing.assert_array_equal(back[key], gq._half_bits(value) if key in ("d", "m") else value, err_msg=key)


def test_half_to_float_widens_every_half_exactly():
    """All 65,536 bit patterns against numpy's float16 -> float32 (zeros, subnormals, infinities and
    NaN payloads included), compared bit for bit."""

    @njit(cache=False)
    def widen(bits, out):  # pragma: no cover - compiled
        for i in range(bits.shape[0]):
            out[i] = octet_dot.half_to_float(bits[i])

    bits = np.arange(2**16, dtype=np.uint32).astype(np.uint16)
    out = np.empty(bits.shape, np.float32)
    widen(bits, out)
    np.testing.assert_array_equal(out.view(np.uint32), bits.view(np.float16).astype(np.float32).view(np.uint32))


@settings(max_examples=40, deadline=None)
@given(
    fmt=st.sampled_from(FORMATS), n=st.integers(1, 19), rows=st.integers(1, 6), units=st.integers(1, 3),
    extremes=st.booleans(), seed=st.integers(0, 2**16),
)  # fmt: skip
def test_unit_scales_give_the_exact_integer_sum(fmt, n, rows, units, extremes, seed):
    rng = np.random.default_rng(seed)
    k = _k(fmt, units)
    blocks = k // octet_dot.FORMATS[fmt].block
    weight = _weight(fmt, rng, n, k, True, extremes)
    x = np.full((rows, k), -128, np.int8) if extremes else rng.integers(-128, 128, (rows, k)).astype(np.int8)
    xs = rng.integers(-3, 4, (rows, blocks)).astype(np.float32)
    got = _product(fmt, weight, x, np.ones((rows, blocks), np.float32), xs)
    expected = _expected(fmt, weight, x, np.ones((rows, blocks), np.float32), xs)
    assert np.abs(expected).max() < 2**24  # every partial sum exact in float32
    np.testing.assert_array_equal(got, expected.astype(np.float32))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("units", [1, 3])
def test_scaled_blocks_sum_as_the_format_defines(fmt, units):
    rng = np.random.default_rng(units)
    n, rows, k = 13, 3, _k(fmt, units)
    blocks = k // octet_dot.FORMATS[fmt].block
    weight = _weight(fmt, rng, n, k, False)
    x = rng.integers(-127, 128, (rows, k)).astype(np.int8)
    xd, xs = rng.uniform(1e-3, 2e-2, (rows, blocks)).astype(np.float32), rng.uniform(-1, 1, (rows, blocks)).astype(np.float32)
    expected = _expected(fmt, weight, x, xd, xs)
    np.testing.assert_allclose(_product(fmt, weight, x, xd, xs), expected, rtol=0, atol=2e-6 * np.abs(expected).max())


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_rows_bits_do_not_depend_on_its_call_or_the_instructions(fmt):
    """1 to ``MAX_ROWS`` activation rows a call, and VNNI (``vpdpbusd``) / the AVX2 pair (codes under 128) /
    the generic IR: the same integers, so every row's float32 results are identical bit for bit."""
    rng = np.random.default_rng(7)
    n, rows, k = 21, octet_dot.MAX_ROWS + 3, _k(fmt, 2)
    blocks = k // octet_dot.FORMATS[fmt].block
    weight = _weight(fmt, rng, n, k, False)
    weight["codes"][3] = _weight(fmt, rng, 1, k, False, extremes=True)["codes"][0]
    x = rng.integers(-128, 128, (rows, k)).astype(np.int8)
    x[1] = -128
    xd, xs = rng.uniform(1e-3, 2e-2, (rows, blocks)).astype(np.float32), rng.uniform(-1, 1, (rows, blocks)).astype(np.float32)
    reference = _product(fmt, weight, x, xd, xs, count=1)
    for count in range(2, octet_dot.MAX_ROWS + 1):
        np.testing.assert_array_equal(_product(fmt, weight, x, xd, xs, count=count), reference, err_msg=f"{count} rows a call")
    builds = [(False, False)]
    if int_dot._AVX2:
        builds.append((True, False))
    if int_dot._vnni_intrinsics():  # the host's own choice, whatever FORMCAST_INT_DOT_VNNI says
        builds.append((True, True))
    for avx2, vnni in builds:
        got = _product(fmt, weight, x, xd, xs, avx2=avx2, vnni=vnni)
        np.testing.assert_array_equal(got, reference, err_msg=f"avx2={avx2} vnni={vnni}")


# --- the loops around the kernel, through QuantizedWeight --------------------------------------


def _random_matrix(type_name: str, rng, n: int, k: int):  # type: ignore[no-untyped-def]
    """A random [n, k] matrix in ``type_name``'s file encoding (gguf's quantizer where it has one;
    for the K-quants random blocks with fp16 scales of sane size)."""
    gguf = pytest.importorskip("gguf")
    if type_name not in gq.K_TYPES:
        return gguf.quants.quantize(rng.standard_normal((n, k)).astype(np.float32), gguf.GGMLQuantizationType[type_name])
    block, size = gguf.constants.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name]]
    blocks = rng.integers(0, 256, (n, k // block, size), dtype=np.uint8)
    for off in [208] if type_name == "Q6_K" else [0, 2]:
        blocks[..., off : off + 2] = rng.uniform(0.001, 0.02, blocks.shape[:2] + (1,)).astype(np.float16).view(np.uint8)
    return blocks.reshape(n, -1)


@pytest.mark.parametrize("type_name", FORMATS)
@pytest.mark.parametrize("batch", [2, 3, 4, 5, 6, 7, 8, 9, 11, 19])
def test_row_groups_give_each_row_its_bits_alone(type_name, batch):
    """``ggml_quants``' loops take activation rows up to ``octet_dot.MAX_ROWS`` a call (a last,
    smaller group with them): every row of a batch of any size must equal its product alone, bit
    for bit. 44 outputs: a last octet of four padded rows."""
    import torch

    rng = np.random.default_rng(1)
    n, k = 44, 512
    weight = gq.QuantizedWeight.from_gguf(type_name, _random_matrix(type_name, rng, n, k), (n, k))
    x = torch.from_numpy(rng.standard_normal((batch, k)).astype(np.float32))
    together = weight.matmul(x).numpy()
    assert together.shape == (batch, n)
    for r in range(batch):
        np.testing.assert_array_equal(weight.matmul(x[r : r + 1]).numpy()[0], together[r], err_msg=f"{type_name} row {r}")


@pytest.mark.parametrize("type_name", FORMATS)
def test_a_product_split_across_threads_gives_the_bits_of_one_thread(type_name, monkeypatch):
    """``ggml_quants`` runs a large product as a numba parallel region whose iterations call the
    serial loop (an inlined copy of it): both builds must round alike, or a row's bits would
    change with the size of its forward (small products stay on the calling thread)."""
    import numba
    import torch

    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("one numba thread")
    rng = np.random.default_rng(5)
    n, k = 96, 768
    weight = gq.QuantizedWeight.from_gguf(type_name, _random_matrix(type_name, rng, n, k), (n, k))
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
