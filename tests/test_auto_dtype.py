"""``dtype="auto"`` keeps the checkpoint's declared dtype where the device runs it fast
(``models.loader.auto_dtype``); the CPU's bfloat16 timing probe is replaced by a stub, so each
case is decided by the rule, not by this machine.
"""

from __future__ import annotations

import pytest
import torch

from engine.models import loader

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


@pytest.fixture
def bf16_speed(monkeypatch):
    """Set the probe's answer; a probe that must not run raises."""
    calls = []

    def set_speed(value: float | None) -> list[int]:
        def probe() -> float:
            if value is None:
                raise AssertionError("the bfloat16 timing probe ran")
            calls.append(1)
            return value

        monkeypatch.setattr(loader, "cpu_bf16_speedup", probe)
        return calls

    return set_speed


@pytest.mark.parametrize("declared", ["float32", "torch.float32", "float16"])
def test_cpu_runs_float32_and_float16_checkpoints_in_float32_without_probing(bf16_speed, declared):
    bf16_speed(None)
    assert loader.resolve_dtype("auto", CPU, declared=declared) == torch.float32


@pytest.mark.parametrize("declared", ["bfloat16", None])
@pytest.mark.parametrize("speedup, want", [(2.0, torch.bfloat16), (0.2, torch.float32)])
def test_cpu_runs_bfloat16_checkpoints_in_bfloat16_only_where_fast(bf16_speed, declared, speedup, want):
    calls = bf16_speed(speedup)
    assert loader.resolve_dtype("auto", CPU, declared=declared) == want
    assert calls == [1]


@pytest.mark.parametrize("declared, bf16_ok, want", [
    ("bfloat16", True, torch.bfloat16), ("bfloat16", False, torch.float16), ("float16", True, torch.float16),
    ("float32", True, torch.bfloat16), ("float32", False, torch.float16), (None, True, torch.bfloat16),
])  # fmt: skip
def test_cuda_runs_half_precision(monkeypatch, declared, bf16_ok, want):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bf16_ok)
    assert loader.resolve_dtype("auto", CUDA, declared=declared) == want


def test_gguf_and_explicit_dtypes_ignore_the_declaration(bf16_speed):
    bf16_speed(None)
    assert loader.resolve_dtype("auto", CPU, quantized=True, declared="bfloat16") == torch.float32
    assert loader.resolve_dtype("bfloat16", CPU, declared="float32") == torch.bfloat16
    assert loader.resolve_dtype(torch.float16, CPU, declared="float32") == torch.float16


@pytest.mark.parametrize("declared, want", [("bfloat16", torch.bfloat16), ("float32", torch.float32)])
def test_model_runner_keeps_the_checkpoints_dtype(tmp_path, bf16_speed, declared, want):
    import transformers as tf

    from engine.model_executor.model_runner import ModelRunner

    bf16_speed(2.0 if declared == "bfloat16" else None)
    cfg = tf.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)  # fmt: skip
    tf.LlamaForCausalLM(cfg).to(getattr(torch, declared)).save_pretrained(str(tmp_path))
    runner = ModelRunner(tmp_path, max_total_tokens=64, max_running_requests=2)
    assert runner.model_config.torch_dtype == declared
    assert runner.dtype == want and runner.model.layers[0].self_attn.qkv_proj.dtype == want
