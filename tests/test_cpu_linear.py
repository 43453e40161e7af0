"""The compiled CPU linear loop equals ``F.linear`` (float32 and bfloat16 weights, with and
without bias, row counts on both sides of the float32 switch-over) and is the path taken."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.layers import cpu_linear


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 3, 17, 64, 70])
@pytest.mark.parametrize("with_bias", [False, True])
def test_linear_equals_torch(dtype, rows, with_bias):
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 200, generator=g).to(dtype)
    w = torch.randn(301, 200, generator=g).to(dtype)  # not a multiple of the 64-row block
    b = torch.randn(301, generator=g).to(dtype) if with_bias else None
    with torch.inference_mode():
        got = cpu_linear.linear(x, w, b)
        compiled = cpu_linear.uses_compiled_loop(x, w)
    # Reference in float32 from the same (rounded) inputs; the loop accumulates in float32.
    want = F.linear(x.float(), w.float(), None if b is None else b.float())
    assert got.dtype == dtype and got.shape == (rows, 301)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    assert torch.allclose(got.float(), want.to(dtype).float(), rtol=tol, atol=tol * 10)
    # bfloat16 takes the loop at every row count (row invariance: a cached prefix changes nothing)
    assert compiled == (rows <= cpu_linear.MAX_ROWS_F32 or dtype in cpu_linear.ROW_INVARIANT_DTYPES)


def test_grad_mode_and_half_use_torch():
    x, w = torch.randn(2, 8), torch.randn(4, 8)
    assert not cpu_linear.uses_compiled_loop(x, w)  # autograd on: torch keeps the graph
    with torch.inference_mode():
        assert cpu_linear.uses_compiled_loop(x, w)
        assert not cpu_linear.uses_compiled_loop(x.half(), w.half())
        assert not cpu_linear.uses_compiled_loop(x, w.t())  # not contiguous
