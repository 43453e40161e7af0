"""``models.row_forward``: a quantized model's decoder layers on numpy arrays give the torch
path's logits bit for bit.

Tiny random models of five families (Llama, Qwen3 with its per-head q/k norms, Phi-3 with a
partial rotary, Gemma 2 whose sandwich layers fall back to torch, Qwen3-MoE whose expert layers
do), written as F32 GGUF files and encoded at load (int4 / int8 blocks), run one sequence of
forwards twice on one runner: two prompts of different lengths prefilled together, decode steps,
then a four-token extend after a cached prefix beside a decode row (a verification's shape). Once
with the numpy path, once with it switched off; every logit must be equal, with the decode
kernel's layout and with attention through the backend's ``forward``, in both attention
precisions.
"""

from __future__ import annotations

import pytest
import torch

from engine.layers.attention import TorchAttention
from engine.model_executor.model_runner import ModelRunner
from engine.models import row_forward
from engine.models.loader import load_model
from engine.models.weight_quantization import quantize_model

from gguf_family_files import build, write_family_gguf
from gguf_files import write_tiny_pair
from model_loop import GreedyLoop

FAMILIES = {"llama": "int4", "qwen3": "int8", "phi3": "int4", "gemma2": "int8", "qwen3_moe": "int8"}
COVERED = {"llama": True, "qwen3": True, "phi3": True, "gemma2": False, "qwen3_moe": False}
PROMPTS = ([3, 17, 99, 250, 64, 12, 7, 42, 5], [72, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100, 33, 10, 5, 200, 17, 99, 3, 250])


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def quantized_runner(request, tmp_path_factory, one_thread):
    family = request.param
    folder = tmp_path_factory.mktemp(family)
    if family == "llama":
        _, path, _ = write_tiny_pair(folder)
    else:
        path = folder / f"{family}.gguf"
        write_family_gguf(path, family, build(family))
    model = load_model(path, torch.float32, torch.device("cpu"))
    quantize_model(model, FAMILIES[family])
    return family, ModelRunner(model=model, max_total_tokens=512, max_running_requests=4)


def _forwards(runner: ModelRunner) -> list[torch.Tensor]:
    loop = GreedyLoop(runner)
    rows = [loop.add(list(p)) for p in PROMPTS]
    logits = [loop.step(rows)]
    for _ in range(3):
        for row, token in zip(rows, logits[-1].argmax(-1).tolist()):
            row.tokens.append(token)
        logits.append(loop.step(rows))
    rows[0].tokens += [5, 6, 7, int(logits[-1][0].argmax())]
    rows[1].tokens.append(int(logits[-1][1].argmax()))
    logits.append(loop.step(rows))
    for row in rows:
        loop.release(row)
    return logits


@pytest.mark.parametrize("f16", [False, True], ids=["float32-attention", "float16-attention"])
@pytest.mark.parametrize("attention", ["kernel", "backend"])
def test_numpy_layers_equal_the_torch_layers(quantized_runner, f16, attention, monkeypatch):
    family, runner = quantized_runner
    model = runner.model
    assert model.row_forward is not None, "a quantized model on the CPU runs the numpy layers"
    assert all(row_forward.covers(layer) == COVERED[family] for layer in model.layers)
    monkeypatch.setattr(runner, "attn_backend", TorchAttention(f16=f16, every_query_alone=True))
    if attention == "backend":
        monkeypatch.setattr(row_forward, "_paged_layout", lambda *args: None)
    calls = []
    numpy_forward = row_forward.RowForward.forward
    monkeypatch.setattr(row_forward.RowForward, "forward", lambda *args: calls.append(1) or numpy_forward(*args))

    numpy_logits = _forwards(runner)
    assert calls, "the numpy path ran"
    saved, model.row_forward = model.row_forward, None
    try:
        torch_logits = _forwards(runner)
    finally:
        model.row_forward = saved
    for step, (got, want) in enumerate(zip(numpy_logits, torch_logits)):
        assert torch.equal(got, want), f"{family}: forward {step} differs by {(got - want).abs().max().item()}"
