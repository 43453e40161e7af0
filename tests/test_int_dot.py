"""engine.layers.int_dot: ``float_dot`` (Q5_1's minimum terms) sums any length to float32 accuracy.
``quad_sums``, the integer multiply-adds, is tested through the products that use it
(tests/test_octet_dot.py: exact integer sums, and the same bits with each instruction choice).
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import njit

from engine.layers.int_dot import float_dot


@njit(cache=False)
def _float_dot(a, b):  # pragma: no cover - compiled
    return float_dot(a.ctypes.data, b.ctypes.data, a.shape[0])


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
