"""GGUF weights on a CUDA GPU: ``formcast_kernels.ggml_blocks.BlockMatrix`` in the model.

A model loaded with its block-format matrices as ``BlockMatrix``es must compute what the same
file's weights, dequantized and written as F32, compute through the ordinary float model: the
GPU kernels multiply float activations by the dequantized blocks (no 8-bit activation blocks, as
llama.cpp's CUDA backend also does for its dequantize-then-multiply paths). On the CPU the loader
is patched to build ``BlockMatrix``es, which then run their torch path; on a GPU (tests named
``gpu``) the real load on ``device="cuda"`` runs the Triton kernels, in float32 and in the
"auto" dtype (bfloat16).
"""

from __future__ import annotations

import pytest
import torch

from engine.model_executor.model_runner import ModelRunner
from engine.models import gguf_loader

from gguf_files import write_gguf, write_tiny_pair
from model_loop import GreedyLoop

PROMPT = [72, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100, 33, 10, 5, 200, 17]
TYPES = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"]  # the types gguf.quants writes (the K-quants: tests/test_ggml_blocks_kernels.py)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """type name -> (the quantized GGUF, the same weights dequantized into an F32 GGUF); "hf": the
    Hugging Face folder of the float weights."""
    import gguf

    folder = tmp_path_factory.mktemp("gguf-cuda")
    hf_dir, _, state = write_tiny_pair(folder)
    out = {"hf": hf_dir}
    for type_name in TYPES:
        kind = gguf.GGMLQuantizationType[type_name]
        quantized, dequantized = folder / f"{type_name}.gguf", folder / f"{type_name}-deq.gguf"
        write_gguf(quantized, state, qtype=type_name)
        deq = {k: (gguf.quants.dequantize(gguf.quants.quantize(v, kind), kind) if v.ndim == 2 else v) for k, v in state.items()}
        write_gguf(dequantized, deq)
        out[type_name] = (quantized, dequantized)
    return out


def _runner(path, **kw) -> ModelRunner:
    return ModelRunner(path, max_total_tokens=1024, max_running_requests=24, **kw)


def _logits(runner: ModelRunner, steps: int = 6) -> tuple[torch.Tensor, list[int]]:
    """Next-token logits after every prefix of PROMPT (one request each), then of ``steps`` greedy
    decode steps; and the greedy tokens."""
    loop = GreedyLoop(runner)
    rows = [loop.add(PROMPT[:n]) for n in range(1, len(PROMPT) + 1)]
    prefixes = loop.step(rows).float().cpu()
    for row in rows[:-1]:
        loop.release(row)
    row, decoded, tokens = rows[-1], [], []
    row.tokens.append(int(prefixes[-1].argmax()))
    for _ in range(steps):
        step = loop.step([row])[0].float().cpu()
        decoded.append(step)
        tokens.append(int(step.argmax()))
        row.tokens.append(tokens[-1])
    loop.release(row)
    return torch.cat([prefixes, torch.stack(decoded)]), tokens


def _matrix_types(runner: ModelRunner) -> set[str]:
    layer = runner.model.layers[0]
    return {type(w).__name__ for w in (layer.self_attn.qkv_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj, runner.model.lm_head)}


@pytest.mark.parametrize("type_name", TYPES)
def test_block_matrices_compute_the_dequantized_model(files, type_name, monkeypatch):
    quantized, dequantized = files[type_name]
    monkeypatch.setattr(gguf_loader, "keeps_block_matrices", lambda device: True)
    blocks = _runner(quantized)
    monkeypatch.undo()
    assert _matrix_types(blocks) == {"BlockMatrix"}
    got, got_tokens = _logits(blocks)
    ref, ref_tokens = _logits(_runner(dequantized))
    assert (got - ref).abs().max() <= 1e-4 * ref.abs().max()
    assert got_tokens == ref_tokens


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("type_name", TYPES)
def test_gguf_runs_on_cuda_gpu(files, type_name):
    quantized, dequantized = files[type_name]
    ref, ref_tokens = _logits(_runner(dequantized))
    scale = ref.abs().max()
    f32 = _runner(quantized, device="cuda", dtype="float32")
    assert _matrix_types(f32) == {"BlockMatrix"}
    assert f32.model.layers[0].mlp.down_proj.device.type == "cuda"
    got, tokens = _logits(f32)
    assert (got - ref).abs().max() <= 1e-3 * scale
    assert tokens == ref_tokens
    half = _runner(quantized, device="cuda")  # "auto": bfloat16 activations and KV cache
    assert half.dtype == torch.bfloat16
    got, _ = _logits(half)
    prompt = len(PROMPT)  # past it, bfloat16's greedy tokens may leave the reference's and the logits with them
    assert (got[:prompt] - ref[:prompt]).abs().max() <= 0.05 * scale
    assert (got[:prompt].argmax(-1) == ref[:prompt].argmax(-1)).float().mean() >= 0.8


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_weight_only_int4_on_cuda_gpu(files):
    """``quantization="int4"`` of a Hugging Face folder on a GPU: Q4_0 ``BlockMatrix``es, within
    the activations' 8-bit rounding of the CPU's int4 model (the same Q4_0 blocks)."""
    ref, _ = _logits(_runner(files["hf"], quantization="int4"))
    int4 = _runner(files["hf"], device="cuda", dtype="float32", quantization="int4")
    assert _matrix_types(int4) == {"BlockMatrix"}
    got, _ = _logits(int4)
    assert (got - ref).abs().max() <= 0.03 * ref.abs().max()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_engine_serves_gguf_on_cuda_gpu(files):
    """The Engine on a GPU from a GGUF file: plain, regex-constrained and JSON-schema requests in
    one batch (CUDA graphs on, the default), then a self-speculative draft sharing the target's
    block matrices, token-identical to plain greedy decoding (float32 here: on a GPU, verification
    rows and decode rows may reach attention through kernels that split their sums differently,
    and bfloat16 rounding of those differences can flip a tie)."""
    import json

    from engine import Engine

    path, _ = files["Q4_1"]
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"], "additionalProperties": False}
    with Engine(str(path), device="cuda", dtype="float32", max_total_tokens=2048, max_running_requests=8) as engine:
        plain, constrained, shaped = engine.generate(
            ["Hello", "Hi", "A record:"],
            [{"max_new_tokens": 6, "temperature": 0.0, "ignore_eos": True}, {"max_new_tokens": 8, "temperature": 0.0, "regex": "[0-9]{3}"},
             {"max_new_tokens": 24, "temperature": 0.0, "json_schema": schema}],
        )  # fmt: skip
    assert plain["meta_info"]["completion_tokens"] == 6
    assert len(constrained["text"]) == 3 and constrained["text"].isdigit()
    assert set(json.loads(shaped["text"])) == {"n"}
    with Engine(str(path), device="cuda", dtype="float32", max_total_tokens=2048, max_running_requests=8, speculative_algorithm="draft_model",
                speculative_draft_num_layers=1) as spec:  # fmt: skip
        drafted = spec.generate("Hello", {"max_new_tokens": 6, "temperature": 0.0, "ignore_eos": True})
    assert drafted["output_ids"] == plain["output_ids"]
    # the n-gram and grammar drafters on CUDA (their point masses and the verifier's chosen rows
    # are GPU tensors there): a constrained request, token-identical to the plain engine's
    with Engine(str(path), device="cuda", dtype="float32", max_total_tokens=2048, max_running_requests=8,
                speculative_algorithm="ngram+grammar") as spec:  # fmt: skip
        again = spec.generate("A record:", {"max_new_tokens": 24, "temperature": 0.0, "json_schema": schema})
    assert again["output_ids"] == shaped["output_ids"]


def _moe_file(tmp_path):  # type: ignore[no-untyped-def]
    """A tiny Qwen2-MoE GGUF whose experts are Q8_0 (a shared expert too): written by llama.cpp's
    quantizer where llama-cpp-python is installed, else by ``gguf.quants`` (the GPU machine)."""
    from gguf_family_files import build, write_family_gguf
    from gguf_files import llama_cpp_module, quantize

    f32, q8 = tmp_path / "moe-f32.gguf", tmp_path / "moe-q8.gguf"
    if llama_cpp_module() is None:
        write_family_gguf(q8, "qwen2_moe", build("qwen2_moe"), qtype="Q8_0")
        return q8
    write_family_gguf(f32, "qwen2_moe", build("qwen2_moe"))
    assert quantize(f32, q8, "Q8_0", {}) == "llama.cpp"
    return q8


def _expert_logits(runner: ModelRunner) -> torch.Tensor:
    loop = GreedyLoop(runner)
    rows = [loop.add(PROMPT[:n]) for n in range(1, len(PROMPT) + 1)]
    return loop.step(rows).float().cpu()


def test_quantized_experts_run_as_block_matrices(tmp_path, monkeypatch):
    """A mixture of experts whose experts are ``BlockMatrix``es (the GPU's form) runs them one by
    one through ``linear`` (``SparseMoeBlock.experts_on_cpu``, the path CUDA takes for quantized
    experts), within the CPU model's 8-bit activation rounding of its logits."""
    q8 = _moe_file(tmp_path)
    ref = _expert_logits(_runner(q8))
    monkeypatch.setattr(gguf_loader, "keeps_block_matrices", lambda device: True)
    blocks = _runner(q8)
    mlp = blocks.model.layers[0].mlp
    assert isinstance(mlp.gate_up_proj, list) and {type(w).__name__ for w in mlp.gate_up_proj + mlp.down_proj} == {"BlockMatrix"}
    got = _expert_logits(blocks)
    assert (got - ref).abs().max() < 0.05 * ref.abs().max()
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean() >= 0.8


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_quantized_experts_on_cuda_gpu(tmp_path):
    q8 = _moe_file(tmp_path)
    ref = _expert_logits(_runner(q8))
    gpu = _runner(q8, device="cuda", dtype="float32")
    assert gpu.cuda_graph_runner is None  # a mixture of experts runs eagerly
    got = _expert_logits(gpu)
    assert (got - ref).abs().max() < 0.05 * ref.abs().max()
