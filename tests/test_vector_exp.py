"""``engine.layers.vector_exp.exp32`` against the exact exponential (numpy's float64 exp), and the
loops that use it against the C library's ``expf``: the same values within float32 rounding."""

from __future__ import annotations

import math

import numpy as np
import pytest
from numba import njit

from engine.layers import row_ops
from engine.layers.vector_exp import exp32


@njit(boundscheck=False)
def _exp_all(x, out):  # pragma: no cover - compiled
    for i in range(x.shape[0]):
        out[i] = exp32(x[i])


@njit(boundscheck=False)
def _expf_all(x, out):  # pragma: no cover - compiled
    for i in range(x.shape[0]):
        out[i] = np.float32(math.exp(x[i]))


def _ulps(got: np.ndarray, x: np.ndarray) -> np.ndarray:
    exact = np.exp(x.astype(np.float64))
    return np.abs(got.astype(np.float64) - exact) / np.spacing(exact.astype(np.float32)).astype(np.float64)


def test_correctly_rounded_but_for_a_few_in_a_million():
    """A dense sweep of the finite range (every float32 step near 0 too) plus the float32
    neighbours of every multiple of ln 2 / 2, where the reduction's n flips: never more than half
    an ulp and a hair from the exact exp, and the correctly rounded float32 (numpy's float64 exp,
    rounded) on all but about 10 in a million (19 of this sweep's 2.2 million)."""
    x = np.concatenate([
        np.linspace(-103, 88.7, 2_000_001, dtype=np.float32),
        np.linspace(-1e-3, 1e-3, 200_001, dtype=np.float32),
        np.array([np.nextafter(np.float32(k * math.log(2) / 2), d) for k in range(-250, 253) for d in (-np.inf, np.inf)], np.float32),
    ])  # fmt: skip
    got = np.empty_like(x)
    _exp_all(x, got)
    normal = got >= np.finfo(np.float32).tiny
    ulps = _ulps(got[normal], x[normal])
    worst = int(ulps.argmax())
    assert ulps.max() <= 0.501, f"exp32({x[normal][worst]!r}) = {got[normal][worst]!r}: {ulps.max():.4f} ulp"
    rounded = np.exp(x.astype(np.float64)).astype(np.float32)
    assert np.count_nonzero(got != rounded) <= x.size // 50_000, np.flatnonzero(got != rounded)[:10]  # 20 a million


def test_exact_and_special_values():
    x = np.array([0.0, -0.0, 1.0, np.inf, -np.inf, np.nan, -90.0, -104.0, -200.0, 88.5, 89.0, 1000.0], np.float32)
    got = np.empty_like(x)
    _exp_all(x, got)
    assert got[0] == 1.0 and got[1] == 1.0  # exp(0) exactly 1
    assert got[2] == np.float32(math.e)  # the correctly rounded e
    assert got[3] == np.inf and got[4] == 0.0
    assert np.isnan(got[5])
    assert got[6] == np.float32(math.exp(-90.0)) and 0 < got[6] < np.finfo(np.float32).tiny  # a subnormal
    assert got[7] == 0.0 and got[8] == 0.0
    assert got[9] == np.float32(math.exp(88.5)) and got[10] == np.inf and got[11] == np.inf


def test_a_value_does_not_depend_on_its_place_in_a_vectorized_loop():
    """Elements in the vector body and in the scalar remainder of the loop get the same bits."""
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(1031) * 20).astype(np.float32)
    whole = np.empty_like(x)
    _exp_all(x, whole)
    for i in (0, 7, 8, 1030):
        one = np.empty(1, np.float32)
        _exp_all(x[i : i + 1], one)
        assert one[0] == whole[i]


@pytest.mark.parametrize("scale", [1.0, 30.0])
def test_silu_loop_matches_the_c_librarys_exp_within_rounding(scale):
    """``row_ops``' SwiGLU with ``exp32`` against the same formula with ``expf``: float32 rounding
    apart (the quotient and the product add half an ulp each), never more."""
    rng = np.random.default_rng(4)
    gate_up = (rng.standard_normal((3, 2 * 515)) * scale).astype(np.float32)
    got = row_ops.silu_and_mul_rows(gate_up)
    gate, up = gate_up[:, :515], gate_up[:, 515:]
    e = np.empty(gate.size, np.float32)
    _expf_all(-gate.reshape(-1), e)
    expected = (gate / (np.float32(1) + e.reshape(gate.shape))) * up
    np.testing.assert_allclose(got, expected, rtol=5e-7, atol=1e-30)
    for r in range(3):  # a row's bits do not depend on the others
        np.testing.assert_array_equal(row_ops.silu_and_mul_rows(gate_up[r : r + 1])[0], got[r])
