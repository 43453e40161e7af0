"""GGUF files as models: tiny random Llama-shaped files written by the test (tests/gguf_files.py).

- An F32 GGUF runs exactly as the Hugging Face folder holding the same weights (names, the q/k row
  permutation of llama.cpp's converter, the config from metadata), prefill and decode.
- Each block type, quantized by ``gguf.quants``, runs within activation-quantization noise of the
  float model holding its dequantized weights (the quantized kernels against plain float math).
- Against llama.cpp itself (``llama_cpp``; required in CI): every supported type, quantized by
  llama.cpp's own quantizer, gives logits within tolerance of llama.cpp's at prompt positions and
  at decode positions.
- Broken files are refused with a ``ModelLoadError`` naming the file, the tensor and the type.
- ``Engine(model_path="x.gguf")`` serves a Q4_1 file end to end, tokenizer included, with a
  constraint and with a self-speculative draft made of its first layer.
"""

from __future__ import annotations

import dataclasses
import struct

import numpy as np
import pytest
import torch

from engine.model_executor.model_runner import ModelRunner
from engine.models.config import ModelLoadError

from conftest import llama_cpp_model, require_optional
from gguf_files import TINY, quantize, tiny_state, write_gguf, write_tiny_pair
from model_loop import GreedyLoop

PROMPT = [72, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100, 33, 10, 5, 200, 17]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gguf")
    hf_dir, f32, state = write_tiny_pair(folder)
    return folder, hf_dir, f32, state


def _runner(path, **kw) -> ModelRunner:
    return ModelRunner(path, max_total_tokens=1024, max_running_requests=24, **kw)


def _prefix_logits(runner: ModelRunner, prompt: list[int]) -> torch.Tensor:
    """Next-token logits after every prefix of ``prompt`` [len, V] (one request per prefix: each
    row's math is independent of the others')."""
    loop = GreedyLoop(runner)
    rows = [loop.add(prompt[:n]) for n in range(1, len(prompt) + 1)]
    out = loop.step(rows)
    for row in rows:
        loop.release(row)
    return out


def _greedy_logits(runner: ModelRunner, prompt: list[int], steps: int) -> tuple[list[int], torch.Tensor]:
    """Greedy continuation and the logits of each decode step [steps, V]."""
    loop = GreedyLoop(runner)
    row = loop.add(prompt)
    logits, tokens = [], []
    for _ in range(steps):
        step = loop.step([row])[0]
        logits.append(step)
        tokens.append(int(step.argmax()))
        row.tokens.append(tokens[-1])
    loop.release(row)
    return tokens, torch.stack(logits)


def test_f32_gguf_runs_as_the_hf_folder(tiny):
    _, hf_dir, f32, _ = tiny
    hf, gg = _runner(hf_dir, dtype="float32"), _runner(f32)
    assert dataclasses.replace(gg.model_config, torch_dtype=hf.model_config.torch_dtype) == hf.model_config
    torch.testing.assert_close(_prefix_logits(gg, PROMPT), _prefix_logits(hf, PROMPT), atol=1e-4, rtol=0)
    tokens_hf, logits_hf = _greedy_logits(hf, PROMPT, 8)
    tokens_gg, logits_gg = _greedy_logits(gg, PROMPT, 8)
    assert tokens_gg == tokens_hf
    torch.testing.assert_close(logits_gg, logits_hf, atol=1e-4, rtol=0)


@pytest.mark.parametrize("type_name", ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"])
def test_quantized_kernels_track_the_dequantized_float_model(tiny, type_name):
    import gguf

    folder, _, _, state = tiny
    kind = gguf.GGMLQuantizationType[type_name]
    quantized, dequantized = folder / f"gq-{type_name}.gguf", folder / f"gq-{type_name}-deq.gguf"
    write_gguf(quantized, state, qtype=type_name)
    deq_state = {k: (gguf.quants.dequantize(gguf.quants.quantize(v, kind), kind) if v.ndim == 2 else v) for k, v in state.items()}
    write_gguf(dequantized, deq_state)
    q, f = _runner(quantized), _runner(dequantized)
    assert type(q.model.layers[0].mlp.down_proj).__name__ == "QuantizedWeight"
    got, ref = _prefix_logits(q, PROMPT), _prefix_logits(f, PROMPT)
    scale = ref.abs().max()
    # Only the activations' 8-bit quantization separates the two (about 1% of the logit range).
    assert (got - ref).abs().max() < 0.03 * scale
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean() >= 0.8


# --- llama.cpp as the oracle ------------------------------------------------------------------------

LLAMA_TYPES = ["F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"]


def _llama_cpp_logits(path, prompt: list[int], steps: int) -> tuple[np.ndarray, list[int], np.ndarray]:
    llm = llama_cpp_model(path, n_ctx=256, n_batch=64, n_threads=1, logits_all=True)  # no spinning barrier beside another worker
    llm.eval(prompt)
    prompt_logits = np.array(llm.scores[: len(prompt)])
    tokens, decode = [], []
    for _ in range(steps):
        nxt = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        tokens.append(nxt)
        llm.eval([nxt])
        decode.append(np.array(llm.scores[llm.n_tokens - 1]))
    del llm
    return prompt_logits, tokens, np.stack(decode)


@pytest.mark.parametrize("type_name", LLAMA_TYPES)
def test_logits_match_llama_cpp(tiny, type_name):
    require_optional("llama_cpp")
    folder, _, f32, state = tiny
    path = folder / f"ll-{type_name}.gguf"
    assert quantize(f32, path, type_name, state) == "llama.cpp"
    ref_prompt, ref_tokens, ref_decode = _llama_cpp_logits(path, PROMPT, 6)
    runner = _runner(path)
    got_prompt = _prefix_logits(runner, PROMPT).numpy()
    scale = np.abs(ref_prompt).max()
    # llama.cpp keeps K/V in fp16 (formcast: float32) and sums in another order; measured here up to
    # 2.7% of the largest logit on this random 2-layer model. A wrong block layout is off by ~100%.
    tol = 0.05 * scale
    assert np.abs(got_prompt - ref_prompt).max() < tol, f"{type_name}: prompt logits differ"
    # decode positions, fed llama.cpp's own greedy tokens
    loop = GreedyLoop(runner)
    row = loop.add(PROMPT)
    loop.step([row])
    for i, tok in enumerate(ref_tokens):
        row.tokens.append(tok)
        got = loop.step([row])[0].numpy()
        assert np.abs(got - ref_decode[i]).max() < tol, f"{type_name}: decode step {i} logits differ"
    loop.release(row)


# --- broken files --------------------------------------------------------------------------------


def _tensor_type_offset(data: bytes, name: str) -> int:
    """Byte offset of the ggml type id in ``name``'s tensor info (after its name, dims count, dims)."""
    at = data.index(struct.pack("<Q", len(name)) + name.encode())
    pos = at + 8 + len(name)
    n_dims = struct.unpack_from("<I", data, pos)[0]
    return pos + 4 + 8 * n_dims


def test_broken_files_are_refused_by_name(tiny, tmp_path):
    _, hf_dir, f32, _ = tiny
    data = f32.read_bytes()

    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match=r"truncated\.gguf.*tensor '.*'.*past the end of the file"):
        _runner(truncated)
    cut_header = tmp_path / "cut-header.gguf"
    cut_header.write_bytes(data[:200])
    with pytest.raises(ModelLoadError, match="cut-header.gguf: corrupt or truncated"):
        _runner(cut_header)

    name = "blk.1.ffn_up.weight"
    at = _tensor_type_offset(data, name)
    unknown = tmp_path / "unknown-type.gguf"
    unknown.write_bytes(data[:at] + struct.pack("<I", 250) + data[at + 4 :])
    with pytest.raises(ModelLoadError, match=r"unknown-type\.gguf: tensor 'blk\.1\.ffn_up\.weight' has unknown ggml type id 250"):
        _runner(unknown)
    unsupported = tmp_path / "iq2.gguf"
    unsupported.write_bytes(data[:at] + struct.pack("<I", 16) + data[at + 4 :])  # IQ2_XXS
    with pytest.raises(ModelLoadError, match=r"iq2\.gguf: tensor 'blk\.1\.ffn_up\.weight' has type IQ2_XXS"):
        _runner(unsupported)

    arch = tmp_path / "mamba.gguf"
    arch.write_bytes(data.replace(b"\x05\x00\x00\x00\x00\x00\x00\x00llama", b"\x05\x00\x00\x00\x00\x00\x00\x00mamba", 1))
    with pytest.raises(ModelLoadError, match=r"mamba\.gguf: general\.architecture 'mamba' is not supported"):
        _runner(arch)
    not_gguf = tmp_path / "weights.bin"
    not_gguf.write_bytes(b"PK\x03\x04" + data[4:100])
    with pytest.raises(ModelLoadError, match="not a GGUF file"):
        _runner(not_gguf)
    missing_state = {k: v for k, v in tiny_state_of(hf_dir).items() if k != "model.layers.1.mlp.up_proj.weight"}
    missing = tmp_path / "missing.gguf"
    write_gguf(missing, missing_state)
    with pytest.raises(ModelLoadError, match=r"missing\.gguf: tensor 'blk\.1\.ffn_up\.weight' is missing"):
        _runner(missing)


def tiny_state_of(hf_dir) -> dict[str, np.ndarray]:
    import transformers as tf

    return tiny_state(tf.AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32))


def test_engine_serves_a_gguf_file(tiny):
    from engine import Engine

    folder, _, _, state = tiny
    path = folder / "engine-Q4_1.gguf"
    write_gguf(path, state, qtype="Q4_1")
    engine = Engine(str(path), max_total_tokens=512, max_running_requests=4, grammar_workers=1)
    try:
        assert engine.tokenizer.eos_token_id == TINY["eos_token_id"]
        out = engine.generate("Hello", {"max_new_tokens": 6, "temperature": 0.0, "ignore_eos": True})
        assert out["meta_info"]["completion_tokens"] == 6
        constrained = engine.generate("Hi", {"max_new_tokens": 8, "temperature": 0.0, "regex": "[0-9]{3}"})
        assert len(constrained["text"]) == 3 and constrained["text"].isdigit()
    finally:
        engine.shutdown()
    # a self-speculative draft shares the target's quantized layers; greedy stays token-identical
    spec = Engine(str(path), max_total_tokens=512, max_running_requests=4, speculative_algorithm="draft_model",
                  speculative_draft_num_layers=1)  # fmt: skip
    try:
        drafted = spec.generate("Hello", {"max_new_tokens": 6, "temperature": 0.0, "ignore_eos": True})
        assert drafted["output_ids"] == out["output_ids"]
    finally:
        spec.shutdown()


def _mapped_rss_kb(path) -> int:
    """Resident kB of this process's mappings of ``path`` (``/proc/self/smaps``)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()
            if "-" in head[0] and len(head) >= 5:  # a mapping's first line: range perms offset dev inode [path]
                inside = line.rstrip().endswith(str(path))
            elif inside and head[0] == "Rss:":
                total += int(head[1])
    return total


def test_a_load_hands_the_files_pages_back(tiny, monkeypatch):
    # Issue 24's memory target: read pages of the memory-mapped file count in resident memory, so
    # a load that kept them peaked at the file's size plus the weights'. Each tensor's pages are
    # handed back once the loader holds its own copy, and the mapping still reads the same bytes.
    import os

    from engine.models import gguf_file
    from engine.models.gguf_loader import load_gguf_model, open_gguf

    if not os.path.exists("/proc/self/smaps"):
        pytest.skip("no /proc/self/smaps on this system")
    _, _, f32, _ = tiny
    gf = open_gguf(f32)
    big = max(gf.tensors.values(), key=lambda t: t.data.nbytes)
    assert big.data.nbytes >= 16 * 4096, "the tiny file's largest tensor spans many pages"
    before = np.array(big.data)  # reads every page of it
    touched = _mapped_rss_kb(f32)
    gf.release(big)
    assert touched - _mapped_rss_kb(f32) >= big.data.nbytes // 1024 - 8  # all but the two edge pages
    np.testing.assert_array_equal(np.asarray(big.data), before)

    released: list[str] = []
    release = gguf_file.GGUFFile.release
    monkeypatch.setattr(gguf_file.GGUFFile, "release", lambda self, t: (released.append(t.name), release(self, t)))
    load_gguf_model(f32, torch.float32, torch.device("cpu"))
    assert released and set(released) == set(gf.tensors), sorted(set(gf.tensors) - set(released))
