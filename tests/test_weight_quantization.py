"""``quantization="int8" | "int4"``: a Hugging Face folder's dense matrices encoded at load.

Oracles: ggml's block definitions written out here in numpy (Q8_0: scale = max|w| / 127, codes
rounded; Q4_0: scale = the signed weight of largest magnitude / -8, codes clipped to 0..15), and
the float model whose dense matrices are replaced by their dequantized values: the quantized
model must compute that model's logits up to the 8-bit activation rounding of the kernels, and
stay close to the original float model. Refusals name the option.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from engine.model_executor.model_runner import ModelRunner
from engine.models.config import ModelLoadError
from engine.layers.panel_linear import PanelWeight
from engine.models.weight_quantization import SCHEMES, check_scheme, quantize_matrix, quantize_model, replace_matrix

from model_loop import GreedyLoop
from test_model_runner import _save_tiny


def _q8_0_reference(w: np.ndarray) -> np.ndarray:
    blocks = w.reshape(w.shape[0], -1, 32).astype(np.float32)
    d = (np.abs(blocks).max(-1, keepdims=True) / 127).astype(np.float16).astype(np.float32)
    inv = np.where(d == 0, 0, 1 / np.where(d == 0, 1, (np.abs(blocks).max(-1, keepdims=True) / 127)))
    q = np.round(blocks * inv)
    return (q * d).reshape(w.shape)


def _q4_0_reference(w: np.ndarray) -> np.ndarray:
    blocks = w.reshape(w.shape[0], -1, 32).astype(np.float32)
    idx = np.abs(blocks).argmax(-1)[..., None]
    signed_max = np.take_along_axis(blocks, idx, -1)
    d_exact = signed_max / -8
    inv = np.where(d_exact == 0, 0, 1 / np.where(d_exact == 0, 1, d_exact))
    q = np.clip(np.trunc(blocks * inv + 8.5), 0, 15)
    d = d_exact.astype(np.float16).astype(np.float32)
    return ((q - 8) * d).reshape(w.shape)


@pytest.mark.parametrize("scheme,reference", [("int8", _q8_0_reference), ("int4", _q4_0_reference)])
def test_matrices_encode_as_ggml_defines_the_blocks(scheme, reference):
    rng = np.random.default_rng(0)
    w = rng.normal(size=(12, 96)).astype(np.float32)
    w[3, :32] = 0.0  # an all-zero block: scale 0, codes 0
    q = quantize_matrix(torch.from_numpy(w), scheme)
    assert q.type_name == SCHEMES[scheme] and tuple(q.shape) == w.shape
    got = q.dequantize().numpy()
    np.testing.assert_allclose(got, reference(w), rtol=0, atol=1e-6)
    # The encoding's own error bound, in steps of each block's scale: half a step of rounding
    # plus the fp16 rounding of the scale times the largest code (int8); Q4_0's asymmetric
    # range clips the extreme of the opposite sign by up to one step (int4).
    step = np.abs(w.reshape(12, -1, 32)).max(-1, keepdims=True) / (127 if scheme == "int8" else 8)
    bound = 0.5 + 127 * 2.0**-11 if scheme == "int8" else 1.0 + 8 * 2.0**-11
    assert np.all(np.abs(got - w).reshape(12, -1, 32) <= step * bound + 1e-7)


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("quant_llama")
    _save_tiny("llama", folder, tie_word_embeddings=False)
    return folder


def _logits(runner: ModelRunner, prompt: list[int]) -> torch.Tensor:
    loop = GreedyLoop(runner)
    row = loop.add(prompt)
    first = loop.step([row])
    row.tokens.append(int(first.argmax()))
    second = loop.step([row])  # a decode step after the prefill
    loop.release(row)
    return torch.cat([first, second]).float()


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_quantized_model_computes_the_dequantized_models_logits(tiny_folder, scheme):
    prompt = [5, 17, 99, 3, 250, 41, 8, 77]
    quantized = ModelRunner(tiny_folder, dtype="auto", quantization=scheme, max_total_tokens=256, max_running_requests=2)
    assert quantized.dtype == torch.float32
    model = quantized.model
    assert type(model.lm_head).__name__ == "QuantizedWeight" and model.lm_head.type_name == SCHEMES[scheme]
    assert type(model.layers[0].self_attn.qkv_proj).__name__ == "QuantizedWeight"
    assert type(model.layers[0].mlp.down_proj).__name__ == "QuantizedWeight"

    exact = ModelRunner(tiny_folder, dtype="float32", max_total_tokens=256, max_running_requests=2)
    original = _logits(exact, prompt)
    with torch.no_grad():
        for owner, name in [(exact.model, "lm_head")] + [
            (getattr(layer, part), attr) for layer in exact.model.layers
            for part, attr in (("self_attn", "qkv_proj"), ("self_attn", "o_proj"), ("mlp", "gate_up_proj"), ("mlp", "down_proj"))
        ]:  # fmt: skip
            # the float model's matrices are packed at load (``weight_panels``): replace, not copy into
            replace_matrix(owner, name, PanelWeight(quantize_matrix(getattr(owner, name).dense(), scheme).dequantize()))
    dequantized = _logits(exact, prompt)
    got = _logits(quantized, prompt)
    scale = original.abs().max()
    # Only the kernels' 8-bit activation blocks separate the quantized model from the dequantized one.
    assert (got - dequantized).abs().max() <= 0.02 * scale
    # And the encoding stays close to the float model: int8 much closer than int4.
    limit = {"int8": 0.03, "int4": 0.3}[scheme]
    assert (got - original).abs().max() <= limit * scale
    assert (dequantized - original).abs().max() > 0  # the dequantized model is another model


def test_memory_and_report(tiny_folder):
    from engine.models.loader import load_model

    model = load_model(tiny_folder, torch.float32, torch.device("cpu"))
    report = quantize_model(model, "int4")
    assert "lm_head" in report.quantized and "layers.2.mlp.down_proj" in report.quantized
    assert report.quantized_bytes * 6 < report.float_bytes  # Q4_0: 18 bytes per 32 weights against 128


def test_tied_embedding_is_encoded_once_and_read_by_rows(tmp_path):
    _save_tiny("llama", tmp_path, tie_word_embeddings=True)
    runner = ModelRunner(tmp_path, quantization="int8", max_total_tokens=128, max_running_requests=2)
    assert runner.model.embed_tokens is runner.model.lm_head
    exact = ModelRunner(tmp_path, dtype="float32", max_total_tokens=128, max_running_requests=2)
    got, want = _logits(runner, [4, 9, 16]), _logits(exact, [4, 9, 16])
    assert (got - want).abs().max() <= 0.03 * want.abs().max()


def test_refusals_name_the_option(tiny_folder, tmp_path):
    with pytest.raises(ValueError, match="quantization"):
        check_scheme("int3")
    with pytest.raises(ModelLoadError, match="quantization"):
        ModelRunner(tiny_folder, quantization="fp8", max_total_tokens=64)
    with pytest.raises(ModelLoadError, match="float32"):
        ModelRunner(tiny_folder, dtype="bfloat16", quantization="int8", max_total_tokens=64)
    gguf_file = tmp_path / "m.gguf"
    gguf_file.write_bytes(b"GGUF")
    from engine.models.loader import load_model

    with pytest.raises(ModelLoadError, match="GGUF"):
        load_model(gguf_file, torch.float32, torch.device("cpu"), "int8")


def test_engine_option_reaches_the_loader(tiny_folder):
    from engine.entrypoints.engine_args import EngineArgs

    assert EngineArgs.from_options(str(tiny_folder), quantization="int4").quantization == "int4"
    config = json.loads((tiny_folder / "config.json").read_text())
    assert config["hidden_size"] % 32 == 0  # the tiny model's rows are whole groups


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_the_warm_up_compiles_what_a_forward_uses(tiny_folder, scheme, monkeypatch):
    """After ``warm_up_quantized`` a decode step and a long prefill add no compiled kernel version
    (the engine calls it before it reports ready: no request waits for a JIT compile): neither
    the products (on one thread and, for large ones, across threads) nor ``row_ops``' loops."""
    from numba.core.registry import CPUDispatcher

    from engine.layers import cpu_kernel_warmup, ggml_quants, row_ops

    runner = ModelRunner(tiny_folder, quantization=scheme, max_total_tokens=256, max_running_requests=2)
    monkeypatch.setattr(ggml_quants, "THREADED_MIN_MACS", 1 << 12)  # the tiny model's products split too
    cpu_kernel_warmup.warm_up_quantized(runner.model)
    kernels = {f"{m.__name__}.{n}": d for m in (ggml_quants, row_ops) for n, d in vars(m).items() if isinstance(d, CPUDispatcher)}
    before = {n: len(d.signatures) for n, d in kernels.items()}
    assert sum(before.values()) > 0
    loop = GreedyLoop(runner)
    row = loop.add(list(range(3, 43)))  # a prefill: groups of four rows
    row.tokens.append(int(loop.step([row]).argmax()))
    loop.step([row])  # a decode step
    loop.release(row)
    assert {n: len(d.signatures) for n, d in kernels.items()} == before
