"""The compiled CPU linear loop equals ``F.linear`` (float32, bfloat16 and float16 weights, with
and without bias, row counts on both sides of the float32 switch-over) and is the path taken."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.layers import cpu_linear


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
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


def test_grad_mode_uses_torch_and_half_the_loop():
    x, w = torch.randn(2, 8), torch.randn(4, 8)
    assert not cpu_linear.uses_compiled_loop(x, w)  # autograd on: torch keeps the graph
    with torch.inference_mode():
        assert cpu_linear.uses_compiled_loop(x, w)
        # float16 too: torch's half GEMM on CPUs with half arithmetic depends on the batch
        assert cpu_linear.uses_compiled_loop(x.half(), w.half())
        assert not cpu_linear.uses_compiled_loop(x, w.t())  # not contiguous


def test_half_weights_widen_exactly():
    """The float16 table widens every one of the 65,536 values as torch does (infinities,
    subnormals and signed zeros included, bit for bit; NaNs stay NaNs: torch also sets their
    quiet bit)."""
    import numpy as np

    wide = torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).view(torch.float16).float().numpy()
    table = cpu_linear._halves().view(np.float32)
    nan = np.isnan(wide)
    assert nan.sum() == 2046 and np.array_equal(np.isnan(table), nan)
    assert np.array_equal(table[~nan].view(np.uint32), wide[~nan].view(np.uint32))


# --- bit-exact batch invariance: a row's output alone equals its output beside other rows, on
# every numba thread or on one (``prange`` splits the loops over blocks of output rows, never over
# a reduction)


@pytest.fixture
def split_all():
    """split_all(True): the loops' blocks spread over every numba thread; (False): all on one."""
    import numba

    before = numba.get_num_threads()
    yield lambda split: numba.set_num_threads(numba.config.NUMBA_NUM_THREADS if split else 1)
    numba.set_num_threads(before)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_linear_rows_do_not_depend_on_their_batch_or_split(split_all, dtype):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(9, 203, generator=g)  # odd widths: vector remainders on every row
    w = torch.randn(301, 203, generator=g).to(dtype)
    with torch.inference_mode():
        split_all(True)
        together = cpu_linear.linear(x, w)
        split_all(False)
        assert torch.equal(cpu_linear.linear(x, w), together), "the split changed bits"
        for m in (0, 3, 4, 8):  # in the first four-row group, its last row, the second group, the remainder
            assert torch.equal(cpu_linear.linear(x[m : m + 1].clone(), w)[0], together[m]), f"row {m}"
        assert torch.equal(cpu_linear.linear(x[3:8].clone(), w), together[3:8]), "rows 3-7 regrouped"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_moe_tokens_do_not_depend_on_their_batch_or_split(split_all, dtype):
    from engine.layers import cpu_moe

    g = torch.Generator().manual_seed(8)
    experts, hidden, inter, tokens = 5, 72, 40, 6
    x = torch.randn(tokens, hidden, generator=g)
    gate_up = torch.randn(experts, 2 * inter, hidden, generator=g).to(dtype)
    down = torch.randn(experts, hidden, inter, generator=g).to(dtype)
    ids = torch.stack([torch.randperm(experts, generator=g)[:2] for _ in range(tokens)])
    weights = torch.rand(tokens, 2, generator=g)
    with torch.inference_mode():
        split_all(True)
        together = cpu_moe.moe_experts(x, gate_up, down, ids, weights, "silu")
        split_all(False)
        assert torch.equal(cpu_moe.moe_experts(x, gate_up, down, ids, weights, "silu"), together), "the split changed bits"
        for t in (0, 5):
            alone = cpu_moe.moe_experts(x[t : t + 1].clone(), gate_up, down, ids[t : t + 1].clone(), weights[t : t + 1].clone(), "silu")
            assert torch.equal(alone[0], together[t]), f"token {t}"


@pytest.mark.parametrize("agree", [True, False])
def test_four_row_groups_only_where_they_agree(monkeypatch, agree):
    """The loop groups rows four at a time only where ``rows_agree`` found that the grouping keeps
    every row's bits; otherwise each row runs alone. Forced on, the rows are the grouped kernel's;
    they equal the rows computed alone only on a machine whose probe says so (on some CPUs the
    grouped code rounds differently, which is what the probe is there to find)."""
    import numpy as np

    agrees_here = cpu_linear.rows_agree(torch.float32)  # the real probe, before it is forced
    seen = []
    kernel = cpu_linear._linear_f32
    monkeypatch.setattr(cpu_linear, "_ROWS_AGREE", {torch.float32: agree, torch.bfloat16: agree})
    monkeypatch.setattr(cpu_linear, "_linear_f32", lambda x, w, out, grouped: (seen.append(grouped), kernel(x, w, out, grouped)))
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(6, 203, generator=g), torch.randn(70, 203, generator=g)
    with torch.inference_mode():
        got = cpu_linear.linear(x, w)
        cpu_linear.linear(x[:3].clone(), w)
    assert seen == [agree, False]  # three rows never group
    want = {}
    for grouped in (True, False):
        want[grouped] = np.empty((6, 70), np.float32)
        kernel(x.numpy(), w.numpy(), want[grouped], grouped)
    assert torch.equal(got, torch.from_numpy(want[agree]))
    if agrees_here:
        assert torch.equal(got, torch.from_numpy(want[False]))
