"""The panel product (``engine/layers/panel_linear.py``) and the packing at load
(``engine/models/weight_panels.py``): the float64 product as the oracle, and the bit-level
promises (a row's result never depends on the rows beside it or the threads; a 16-bit panel
computes what its exact float32 widening computes)."""

from __future__ import annotations

import numba
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from property_budget import examples

from engine.layers.cpu_linear import linear
from engine.layers.ggml_quants import embedding
from engine.layers.panel_linear import PANEL, TILE_ROWS, PanelWeight, panel_weights

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _matrix(n: int, k: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, k, generator=gen).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n, k", [(16, 8), (37, 203), (160, 576), (5, 1)])
def test_product_is_the_float64_product(dtype, n, k):
    w = _matrix(n, k, dtype)
    panels = PanelWeight(w)
    x = torch.randn(2 * TILE_ROWS + 1, k, generator=torch.Generator().manual_seed(1))
    got = panels.matmul(x)
    want = x.double() @ w.double().T
    assert got.dtype == torch.float32 and got.shape == (x.shape[0], n)
    # float32 accumulation over k terms: a bound on its rounding, relative to the magnitudes summed
    bound = k * 2.0**-23 * (x.double().abs() @ w.double().abs().T) + 1e-30
    assert bool(((got.double() - want).abs() <= bound).all())


@settings(max_examples=examples(25), deadline=None)
@given(
    m=st.integers(1, 3 * TILE_ROWS + 2), n=st.integers(1, 50), k=st.integers(1, 70),
    row=st.integers(0, 100), dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**16),
)
def test_a_rows_bits_do_not_depend_on_its_batch(m, n, k, row, dtype, seed):
    panels = PanelWeight(_matrix(n, k, dtype, seed))
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(seed + 1))
    row %= m
    whole = panels.matmul(x)
    assert torch.equal(panels.matmul(x[row : row + 1])[0], whole[row])
    assert torch.equal(panels.matmul(x[row:])[0], whole[row])  # at another place in its tile
    assert torch.equal(panels.matmul(torch.cat([x, x]))[m + row], whole[row])


def test_threads_do_not_change_the_bits():
    panels = PanelWeight(_matrix(200, 96, torch.bfloat16))
    x = torch.randn(9, 96)
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = panels.matmul(x)
        numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
        many = panels.matmul(x)
    finally:
        numba.set_num_threads(before)
    assert torch.equal(one, many)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_16_bit_panel_computes_its_exact_float32_widening(dtype):
    w = _matrix(48, 100, dtype)
    x = torch.randn(7, 100)
    assert torch.equal(PanelWeight(w).matmul(x), PanelWeight(w.float()).matmul(x))


@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_come_back_exactly(dtype):
    w = _matrix(35, 24, dtype)  # N not a multiple of the panel width: padding never leaks out
    panels = PanelWeight(w)
    assert panels.shape == (35, 24) and panels.dtype == dtype and panels.nbytes >= w.numel() * w.element_size()
    ids = torch.tensor([[0, 34], [16, 3]])
    rows = embedding(ids, panels)
    assert rows.dtype == dtype and torch.equal(rows, w[ids])
    assert torch.equal(panels.dense(), w)
    for outside in (35, 47, -1):  # 35..47 are the last panel's padding
        with pytest.raises(IndexError, match="row ids"):
            panels.embedding(torch.tensor([outside]))


def test_linear_takes_panels_with_bias_and_keeps_the_activation_dtype():
    w = _matrix(20, 32, torch.bfloat16)
    bias = torch.randn(20).to(torch.bfloat16)
    x = torch.randn(3, 32).to(torch.bfloat16)
    with torch.inference_mode():
        got = linear(x, PanelWeight(w), bias)
    assert got.dtype == torch.bfloat16
    want = (x.double() @ w.double().T + bias.double()).to(torch.bfloat16)
    assert (got.float() - want.float()).abs().max() <= 0.05
    assert PanelWeight(w).matmul(torch.empty(0, 32)).shape == (0, 20)


@pytest.mark.parametrize(
    "bad", [torch.zeros(2, 3, 4), torch.zeros(4, 4, dtype=torch.int32), torch.zeros(4)], ids=["3d", "int", "1d"]
)
def test_what_panels_refuse(bad):
    with pytest.raises(ValueError, match="panels hold"):
        PanelWeight(bad)


def test_models_load_packed_and_tied_heads_share_their_panels(tmp_path):
    from test_model_runner import _save_tiny

    from engine.model_executor.model_runner import ModelRunner

    _save_tiny("llama", tmp_path, tie_word_embeddings=True)
    runner = ModelRunner(tmp_path, dtype="float32", max_total_tokens=64, max_running_requests=2)
    model = runner.model
    assert isinstance(model.lm_head, PanelWeight) and model.embed_tokens is model.lm_head
    assert isinstance(model.layers[0].self_attn.qkv_proj, PanelWeight) and isinstance(model.layers[-1].mlp.down_proj, PanelWeight)
    assert "lm_head" not in dict(model.named_parameters()) and "embed_tokens" not in dict(model.named_parameters())
    assert len(panel_weights(model)) == 1 + 4 * len(model.layers)
    assert all(w.panels.shape[2] == PANEL for w in panel_weights(model))
