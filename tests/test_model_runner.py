"""ModelRunner numerics against transformers' own models on the same weights (fp32, 1e-4).

Covered: the embedded SmolLM2 (tied embeddings), tiny random Qwen2 (q/k/v bias, GQA), Llama with
llama3 RoPE scaling, Llama with linear scaling in the transformers-4 config spelling, Mistral
(GQA, sliding window) and a sharded checkpoint. Each is run as one batched prefill of prompts of
different lengths, then 16 decode steps in which a late prompt is prefilled beside the decoding
rows (a MIXED batch), and as a chunked prefill of a long prompt.
"""

from __future__ import annotations

import json
import random

import pytest
import torch

from engine.model_executor.forward_batch import ForwardMode
from engine.model_executor.model_runner import ModelRunner
from engine.models.config import ModelLoadError

from model_loop import GreedyLoop

TOL = 1e-4


def _save_tiny(kind: str, folder, **overrides) -> None:
    import transformers as tf

    common = dict(
        vocab_size=320, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, initializer_range=0.08, rms_norm_eps=1e-6,
    )
    common.update(overrides)
    config_cls, model_cls = {
        "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM),
        "llama": (tf.LlamaConfig, tf.LlamaForCausalLM),
        "mistral": (tf.MistralConfig, tf.MistralForCausalLM),
    }[kind]
    torch.manual_seed(0)
    model = model_cls(config_cls(**common)).eval()
    if kind == "qwen2":  # random init leaves biases at zero: make them matter
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                torch.nn.init.normal_(proj.bias, std=0.2)
    model.save_pretrained(str(folder), max_shard_size=overrides.pop("_shard", None) or "2GB")


def _tiny(kind: str, tmp_path_factory, **overrides):
    folder = tmp_path_factory.mktemp(kind)
    _save_tiny(kind, folder, **overrides)
    return folder


TINY = {
    "qwen2": dict(),
    "llama3-rope": dict(rope_parameters={
        "rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 32,
    }),
    "mistral": dict(sliding_window=4096),
}  # fmt: skip


@pytest.fixture(scope="module", params=sorted(TINY))
def tiny_pair(request, tmp_path_factory):
    import transformers as tf

    kind = "llama" if request.param.startswith("llama") else request.param
    folder = _tiny(kind, tmp_path_factory, **TINY[request.param])
    hf = tf.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    runner = ModelRunner(folder, dtype="float32", max_total_tokens=2048, max_running_requests=8)
    return runner, hf


@pytest.fixture(scope="module")
def smollm2_pair(smollm2_model):
    from engine.hf.model_files import default_model_dir

    # the folder transformers loads too: the oracle compares the same fp32 weights
    runner = ModelRunner(default_model_dir(), dtype="float32", max_total_tokens=8192, max_running_requests=24)
    return runner, smollm2_model


def _hf_logits(hf, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([tokens])).logits[0].float()


def _check_prefill_then_mixed_decode(runner: ModelRunner, hf, vocab: int) -> None:
    rng = random.Random(0)
    prompts = [[rng.randrange(3, vocab) for _ in range(n)] for n in (5, 17, 40, 9)]
    late = [rng.randrange(3, vocab) for _ in range(12)]
    loop = GreedyLoop(runner)
    free_before = runner.token_to_kv_pool.available_size()
    rows = [loop.add(p) for p in prompts]
    logits = loop.step(rows)
    for row, got in zip(rows, logits):
        assert torch.allclose(got, _hf_logits(hf, row.tokens)[-1], atol=TOL), "prefill logits differ"
    late_row = None
    for step in range(16):
        for row, got in zip(rows, logits.argmax(-1).tolist()):
            row.tokens.append(got)
        active = list(rows)
        if step == 3:
            late_row = loop.add(late)  # prefilled while the others decode: a MIXED batch
            active.append(late_row)
        elif late_row is not None and step > 3:
            active.append(late_row)
        logits = loop.step(active)
        if late_row is not None:
            late_row.tokens.append(int(logits[-1].argmax()))
            logits = logits[:-1] if len(active) > len(rows) else logits
        for row, got in zip(rows, logits):
            assert torch.allclose(got, _hf_logits(hf, row.tokens)[-1], atol=TOL), f"decode step {step} logits differ"
    assert late_row is not None
    expect = _hf_logits(hf, late_row.tokens[:-1])[-1]
    assert int(expect.argmax()) == late_row.tokens[-1]
    for row in [*rows, late_row]:
        loop.release(row)
    assert runner.token_to_kv_pool.available_size() == free_before


def test_tiny_models_match_transformers(tiny_pair):
    runner, hf = tiny_pair
    _check_prefill_then_mixed_decode(runner, hf, runner.vocab_size)


def test_smollm2_matches_transformers(smollm2_pair, smollm2_tokenizer):
    runner, hf = smollm2_pair
    _check_prefill_then_mixed_decode(runner, hf, 49152)


def test_chunked_prefill_matches_one_pass(tiny_pair):
    runner, hf = tiny_pair
    loop = GreedyLoop(runner)
    prompt = [random.Random(1).randrange(3, runner.vocab_size) for _ in range(70)]
    row = loop.add(prompt)
    for _ in range(6):  # 70 tokens in chunks of 16: extends with a cached prefix
        logits = loop.step([row], chunk=16)
        if row.cached == len(prompt):
            break
    assert torch.allclose(logits[0], _hf_logits(hf, prompt)[-1], atol=TOL)
    loop.release(row)


def test_forward_modes_are_inferred(tiny_pair):
    from engine.model_executor.forward_batch import ForwardBatch, ForwardInput

    runner, _ = tiny_pair
    pools = (runner.req_to_token_pool, runner.token_to_kv_pool)
    slots = runner.req_to_token_pool.alloc(2)
    locs = runner.token_to_kv_pool.alloc(4)
    first = ForwardBatch.init_new([ForwardInput(slots[0], 0, [5, 6, 7], locs[:3])], *pools)
    assert first.forward_mode == ForwardMode.EXTEND
    runner.forward(first)
    mixed = ForwardBatch.init_new(
        [ForwardInput(slots[0], 3, [8], locs[3:4]), ForwardInput(slots[1], 0, [9], runner.token_to_kv_pool.alloc(1))], *pools
    )
    assert mixed.forward_mode == ForwardMode.MIXED
    runner.forward(mixed)
    runner.token_to_kv_pool.free(locs)
    runner.token_to_kv_pool.free(mixed.out_cache_loc[1:])
    runner.req_to_token_pool.free(slots)


def test_target_verify_scores_every_position(tiny_pair):
    from engine.model_executor.forward_batch import ForwardBatch, ForwardInput

    runner, hf = tiny_pair
    pools = (runner.req_to_token_pool, runner.token_to_kv_pool)
    slot = runner.req_to_token_pool.alloc()[0]
    tokens = [11, 12, 13, 14, 15, 16]
    locs = runner.token_to_kv_pool.alloc(len(tokens))
    runner.forward(ForwardBatch.init_new([ForwardInput(slot, 0, tokens[:3], locs[:3])], *pools))
    verify = ForwardBatch.init_new(
        [ForwardInput(slot, 3, tokens[3:], locs[3:])], *pools, forward_mode=ForwardMode.TARGET_VERIFY
    )
    out = runner.forward(verify)
    assert out.next_token_logits.shape[0] == 3
    assert torch.allclose(out.next_token_logits, _hf_logits(hf, tokens)[3:], atol=TOL)
    runner.token_to_kv_pool.free(locs)
    runner.req_to_token_pool.free(slot)


def test_input_logprobs_and_hidden_states(tiny_pair):
    from engine.model_executor.forward_batch import CaptureHiddenMode, ForwardBatch, ForwardInput

    runner, hf = tiny_pair
    pools = (runner.req_to_token_pool, runner.token_to_kv_pool)
    slot = runner.req_to_token_pool.alloc()[0]
    tokens = [21, 22, 23, 24, 25]
    locs = runner.token_to_kv_pool.alloc(len(tokens))
    batch = ForwardBatch.init_new(
        [ForwardInput(slot, 0, tokens, locs, return_input_logprob=True)], *pools,
        capture_hidden_mode=CaptureHiddenMode.LAST,
    )
    out = runner.forward(batch)
    ref = torch.log_softmax(_hf_logits(hf, tokens), dim=-1)
    expect = ref[:-1].gather(1, torch.tensor(tokens[1:]).unsqueeze(1)).squeeze(1)
    assert torch.allclose(out.input_token_logprobs[0], expect, atol=TOL)
    with torch.no_grad():
        hidden = hf(torch.tensor([tokens]), output_hidden_states=True).hidden_states[-1][0, -1]
    assert out.hidden_states.shape == (1, hf.config.hidden_size)
    assert torch.allclose(out.hidden_states[0], hidden, atol=TOL)
    runner.token_to_kv_pool.free(locs)
    runner.req_to_token_pool.free(slot)


def test_old_config_spelling_and_sharded_checkpoint(tmp_path):
    import transformers as tf

    _save_tiny("llama", tmp_path, _shard="60KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    cfg = json.loads((tmp_path / "config.json").read_text())
    params = cfg.pop("rope_parameters")
    cfg["rope_theta"] = params["rope_theta"]
    cfg["rope_scaling"] = {"type": "linear", "factor": 2.0}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    hf = tf.AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    assert hf.config.rope_parameters["rope_type"] == "linear"
    runner = ModelRunner(tmp_path, dtype="float32", max_total_tokens=256, max_running_requests=2)
    loop = GreedyLoop(runner)
    row = loop.add(list(range(3, 40)))
    assert torch.allclose(loop.step([row])[0], _hf_logits(hf, row.tokens)[-1], atol=TOL)


def test_clear_errors_for_unsupported_models(tmp_path):
    _save_tiny("llama", tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ModelLoadError, match="GPT2LMHeadModel"):
        ModelRunner(tmp_path, dtype="float32", max_total_tokens=64)
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4}}))
    with pytest.raises(ModelLoadError, match="yarn"):
        ModelRunner(tmp_path, dtype="float32", max_total_tokens=64)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    from safetensors.torch import load_file, save_file

    weights = load_file(str(tmp_path / "model.safetensors"))
    del weights["model.layers.1.mlp.up_proj.weight"]
    save_file(weights, str(tmp_path / "model.safetensors"))
    with pytest.raises(ModelLoadError, match="model.layers.1.mlp.up_proj.weight"):
        ModelRunner(tmp_path, dtype="float32", max_total_tokens=64)
    with pytest.raises(FileNotFoundError):
        ModelRunner(tmp_path / "nowhere", dtype="float32", max_total_tokens=64)
    with pytest.raises(ValueError, match="dtype"):
        ModelRunner(tmp_path, dtype="int8", max_total_tokens=64)


@pytest.mark.slow
def test_smollm2_greedy_matches_generate(smollm2_pair, smollm2_tokenizer):
    """20 prompts, greedy, 24 new tokens: token-identical to transformers' greedy decoding.

    transformers judges each continuation in one forward over prompt + our tokens (teacher
    forcing): its argmax at every position must be our next token. By induction on the position
    that is the same statement as ``generate(do_sample=False)`` returning our tokens, and stopping
    where we stopped (our loop stops only at EOS or after 24 tokens, as ``generate`` does), for
    one forward per prompt instead of 25."""
    runner, hf = smollm2_pair
    tok = smollm2_tokenizer
    topics = ["the sea", "a robot", "prime numbers", "Paris", "coffee", "the moon", "a violin", "winter",
              "bees", "chess", "volcanoes", "a lighthouse", "rivers", "bread", "trains", "clouds",
              "a library", "tigers", "glass", "the number 42"]  # fmt: skip
    prompts = [
        tok.apply_chat_template([{"role": "user", "content": f"Write one sentence about {t}."}], tokenize=True, add_generation_prompt=True)
        for t in topics
    ]
    prompts = [list(p["input_ids"]) if hasattr(p, "keys") else list(p) for p in prompts]
    ours = GreedyLoop(runner).greedy(prompts, 24, eos={2})
    for prompt, got in zip(prompts, ours):
        greedy = _hf_logits(hf, prompt + got[:-1])[len(prompt) - 1 :].argmax(-1).tolist()
        assert got == greedy, tok.decode(prompt)
