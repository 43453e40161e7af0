"""GGUF files of the families beyond Llama: Qwen3, Qwen2-MoE, Qwen3-MoE, OLMoE, Gemma 2, Gemma 3,
Phi-3 and Mixtral (llama architecture with stacked experts), written by the test in F32 the way
llama.cpp's converter writes them (tests/gguf_family_files.py).

- The metadata reads into the ``ModelConfig`` the Hugging Face config gives (the same fields).
- formcast's logits on the file equal transformers' on the model it was written from (1e-4):
  every prompt position, the sliding window crossed, then greedy decode steps.
- llama.cpp (``llama_cpp``; required in CI) loads the same file and its prompt logits agree with
  transformers': the file is laid out as llama.cpp's converter lays it out, not only readable by
  formcast.
- MoE files: the expert ids formcast routes to equal the top-k of transformers' router at every
  prompt position decided beyond float noise.
- A family's missing metadata is a ``ModelLoadError`` naming the key.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from engine.model_executor.forward_batch import ForwardBatch, ForwardInput
from engine.model_executor.model_runner import ModelRunner
from engine.models.config import ModelConfig, ModelLoadError

from conftest import llama_cpp_model, require_optional
from gguf_family_files import FAMILIES, WINDOW, build, write_family_gguf
from model_loop import GreedyLoop
from test_model_families import _oracle_routes
from test_model_runner import TOL, _hf_logits

PROMPT = [72, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100, 33, 10, 5, 200, 17, 99, 3, 250, 64, 77, 12]
assert len(PROMPT) > 2 * WINDOW


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family_file(request, tmp_path_factory, one_thread):
    family = request.param
    model = build(family)
    path = tmp_path_factory.mktemp("gguf-" + family) / f"{family}-F32.gguf"
    write_family_gguf(path, family, model)
    runner = ModelRunner(path, max_total_tokens=1024, max_running_requests=24)
    return family, model, path, runner


def test_metadata_reads_as_the_hf_config(family_file):
    family, model, _, runner = family_file
    want = ModelConfig.from_dict(model.config.to_dict())
    got = dataclasses.replace(runner.model_config, torch_dtype=want.torch_dtype, eos_token_ids=want.eos_token_ids)
    if family == "phi3":  # LongRoPE's tables and factor are float32 in the file
        rope = got.rope
        for key in ("short_factor", "long_factor", "attention_factor"):
            assert getattr(rope, key) == pytest.approx(getattr(want.rope, key), rel=1e-6)
        got = dataclasses.replace(got, rope=want.rope)
    assert got == want


def test_logits_equal_transformers(family_file):
    _, model, _, runner = family_file
    loop = GreedyLoop(runner)
    rows = [loop.add(PROMPT[:n]) for n in range(1, len(PROMPT) + 1)]
    torch.testing.assert_close(loop.step(rows), _hf_logits(model, PROMPT), atol=TOL, rtol=0)
    for row in rows:
        loop.release(row)
    row = loop.add(PROMPT)
    tokens = list(PROMPT)
    for _ in range(4):
        step = loop.step([row])[0]
        torch.testing.assert_close(step, _hf_logits(model, tokens)[-1], atol=TOL, rtol=0)
        tokens.append(int(step.argmax()))
        row.tokens.append(tokens[-1])
    loop.release(row)


def test_routed_experts_equal_the_oracle_router(family_file):
    family, model, _, runner = family_file
    if runner.model_config.moe is None:
        pytest.skip("dense model")
    top_k = runner.model_config.moe.top_k
    slot = runner.req_to_token_pool.alloc()[0]
    locs = runner.token_to_kv_pool.alloc(len(PROMPT))
    batch = ForwardBatch.init_new([ForwardInput(slot, 0, PROMPT, locs, num_logits=len(PROMPT))],
                                  runner.req_to_token_pool, runner.token_to_kv_pool)  # fmt: skip
    batch.capture_routed_experts = True
    got = runner.forward(batch).routed_experts
    runner.token_to_kv_pool.free(locs)
    runner.req_to_token_pool.free(slot)
    expect, decided = _oracle_routes(model, PROMPT, top_k)
    assert got.shape == expect.shape
    same = (torch.sort(got, -1).values == torch.sort(expect, -1).values).all(-1)
    assert bool(same[decided].all()), f"{family}: routed experts differ from the router's top-k"
    assert int(decided.sum()) > 0.9 * decided.numel()


def test_llama_cpp_reads_the_file_as_the_same_model(family_file):
    family, model, path, _ = family_file
    # Phi-3: llama.cpp picks LongRoPE's table by context size; up to the original length it is the short one
    llm = llama_cpp_model(path, n_ctx=256, n_batch=64, n_threads=1, logits_all=True)
    llm.eval(PROMPT)
    got = np.array(llm.scores[: len(PROMPT)])
    del llm
    ref = _hf_logits(model, PROMPT).numpy()
    # llama.cpp sums in another order (and in F16 for some CPU kernels): agreement to a small share
    # of the logits' range; a misplaced tensor or a wrong convention moves them by far more.
    assert np.abs(got - ref).max() < 2e-3 * np.abs(ref).max() + 1e-3, f"{family}: llama.cpp's logits differ"
    assert (got.argmax(-1) == ref.argmax(-1)).all()


@pytest.mark.parametrize(
    "family, writer_method, key",
    [("qwen3_moe", "add_expert_used_count", "qwen3moe.expert_used_count"),
     ("gemma2", "add_sliding_window", "gemma2.attention.sliding_window")],
)  # fmt: skip
def test_missing_family_metadata_is_named(tmp_path, monkeypatch, family, writer_method, key):
    import gguf

    model = build(family, num_hidden_layers=2)
    monkeypatch.setattr(gguf.GGUFWriter, writer_method, lambda self, *a, **k: None)
    write_family_gguf(tmp_path / "bad.gguf", family, model)
    with pytest.raises(ModelLoadError, match=key.replace(".", r"\.")):
        ModelRunner(tmp_path / "bad.gguf", max_total_tokens=256, max_running_requests=2)


@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe"])
def test_quantized_experts_track_llama_cpp(tmp_path, one_thread, family):
    """Experts quantized by llama.cpp's own quantizer (Q8_0) stay quantized per expert in formcast
    and give llama.cpp's logits on the same file within activation-quantization noise."""
    require_optional("llama_cpp")
    from gguf_files import quantize

    f32, q8 = tmp_path / "f32.gguf", tmp_path / "q8.gguf"
    write_family_gguf(f32, family, build(family))
    assert quantize(f32, q8, "Q8_0", {}) == "llama.cpp"
    runner = ModelRunner(q8, max_total_tokens=1024, max_running_requests=24)
    block = runner.model.layers[0].mlp
    assert isinstance(block.gate_up_proj, list) and isinstance(block.gate, torch.Tensor)
    loop = GreedyLoop(runner)
    rows = [loop.add(PROMPT[:n]) for n in range(1, len(PROMPT) + 1)]
    got = loop.step(rows).numpy()
    llm = llama_cpp_model(q8, n_ctx=256, n_batch=64, n_threads=1, logits_all=True)
    llm.eval(PROMPT)
    ref = np.array(llm.scores[: len(PROMPT)])
    del llm
    assert np.abs(got - ref).max() < 0.05 * np.abs(ref).max()
    assert (got.argmax(-1) == ref.argmax(-1)).mean() >= 0.8
