"""engine.layers.row_ops: a quantized model's small per-row operations as compiled loops.

- Against torch: RMSNorm and SiLU-and-multiply to float32 accuracy; the rotary bit for bit (each
  product rounds before the sum, as torch's separate operations do).
- Batch invariance: a row's bits alone equal its bits among other rows.
- Only quantized models switch to them (``ModelRunner`` on a GGUF file); float models keep
  torch's operations, which the transformers oracle tests pin.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.layers import row_ops
from engine.layers.layernorm import RMSNorm


def _rows(seed: int, rows: int, dim: int, scale: float = 1.0) -> torch.Tensor:
    return torch.from_numpy((np.random.default_rng(seed).standard_normal((rows, dim)) * scale).astype(np.float32))


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 9), st.sampled_from([8, 64, 576]), st.sampled_from([1e-3, 1.0, 300.0]))
def test_rms_norm_agrees_with_torch_and_keeps_each_rows_bits(seed, rows, dim, scale):
    x = _rows(seed, rows, dim, scale)
    weight = _rows(seed + 1, 1, dim)[0]
    ours = row_ops.rms_norm(x, weight, 1e-5)
    torch.testing.assert_close(ours, F.rms_norm(x, (dim,), weight, 1e-5), rtol=2e-6, atol=1e-6)
    for r in range(rows):
        assert torch.equal(row_ops.rms_norm(x[r : r + 1], weight, 1e-5)[0], ours[r])


def test_rms_norm_module_switches_to_the_loop_only_when_told():
    norm = RMSNorm(64, 1e-6)
    norm.weight.data = _rows(3, 1, 64)[0]
    x = _rows(4, 3, 64, 50.0)
    assert torch.equal(norm.forward(x), F.rms_norm(x, (64,), norm.weight, 1e-6))
    norm.row_kernel = True
    assert torch.equal(norm.forward(x), row_ops.rms_norm(x, norm.weight, 1e-6))
    assert torch.equal(norm.forward(x.view(3, 4, 16).reshape(3, 64)), norm.forward(x))


def test_rotary_equals_torchs_bit_for_bit():
    from engine.layers.rotary import RotaryEmbedding
    from engine.models.config import RopeConfig

    rotary = RotaryEmbedding(RopeConfig(theta=10000.0), 64, 512, torch.float32, torch.device("cpu"))
    positions = torch.tensor([0, 7, 300, 511, 3])
    cos, sin = rotary.cos_sin(positions)
    x = _rows(5, 5 * 6, 64, 3.0).view(5, 6, 64)
    expected = rotary.apply(x, cos, sin)
    rotary.row_kernel = True
    assert torch.equal(rotary.apply(x, cos, sin), expected)
    assert torch.equal(rotary.apply(x[1:2], cos[1:2], sin[1:2])[0], expected[1])


def test_silu_and_mul_agrees_with_torch():
    gate_up = _rows(6, 4, 2 * 48, 6.0)
    gate, up = gate_up.split(48, dim=-1)
    torch.testing.assert_close(row_ops.silu_and_mul(gate_up), F.silu(gate) * up, rtol=2e-6, atol=1e-6)
    assert torch.equal(row_ops.silu_and_mul(gate_up[2:3])[0], row_ops.silu_and_mul(gate_up)[2])


@pytest.mark.slow
def test_only_a_quantized_model_runs_the_loops():
    from engine.hf.model_files import default_model_dir, gguf_path
    from engine.model_executor.model_runner import ModelRunner

    quantized = ModelRunner(gguf_path(), max_total_tokens=64, max_running_requests=1).model
    assert quantized.norm.row_kernel and quantized.layers[0].mlp.row_kernel and quantized.rotary.row_kernel
    plain = ModelRunner(default_model_dir(), dtype="float32", max_total_tokens=64, max_running_requests=1).model
    assert not plain.norm.row_kernel and not plain.layers[0].mlp.row_kernel and not plain.rotary.row_kernel
