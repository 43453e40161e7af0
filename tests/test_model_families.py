"""The model families beyond Llama against transformers' own classes on the same random weights
(fp32, 1e-4): Qwen3, Gemma 2, Gemma 3, Phi-3 (LongRoPE, partial rotary, sliding window), Qwen2-MoE (shared
expert), Qwen3-MoE, Mixtral and OLMoE.

Each tiny model is built here from a transformers config, its norm weights randomized (so a norm
loaded wrongly, or Gemma's 1 + w forgotten, shows), saved with safetensors and loaded by
formcast. Checked per family: a batched prefill then decode steps with a prompt prefilled beside
them (MIXED batches), a chunked prefill, and verification scoring. The sliding-window models use a
window of 8 keys, far below the prompts, so the window is crossed in prefill, chunked prefill and
decode; Gemma's soft-capping uses caps small enough to bend these logits. MoE routing: the expert
ids formcast reports equal the top-k of transformers' router logits at every position whose
k-th and (k+1)-th probabilities are not within float noise of each other.
"""

from __future__ import annotations

import json
import random

import pytest
import torch

from engine.model_executor.forward_batch import ForwardBatch, ForwardInput, ForwardMode
from engine.model_executor.model_runner import ModelRunner
from engine.models.config import ModelConfig, ModelLoadError

from model_loop import GreedyLoop
from test_model_runner import TOL, _check_prefill_then_mixed_decode, _hf_logits

COMMON = dict(
    vocab_size=320, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, max_position_embeddings=512, initializer_range=0.08, rms_norm_eps=1e-6,
    pad_token_id=0, bos_token_id=1, eos_token_id=2,
)  # fmt: skip
WINDOW = 8
FAMILIES = {
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict()),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(
        sliding_window=WINDOW, query_pre_attn_scalar=24, attn_logit_softcapping=1.5, final_logit_softcapping=2.0,
    )),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        sliding_window=WINDOW, query_pre_attn_scalar=24, final_logit_softcapping=3.0,
        layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 100000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1000.0},
        },
    )),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(
        original_max_position_embeddings=128,  # 512 / 128: the cos/sin attention factor is not 1
        sliding_window=WINDOW,  # Phi-3 slides every layer when the config sets a window
        rope_parameters={
            "rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
            "short_factor": [1.0, 1.3, 1.7, 2.2, 3.0, 4.0], "long_factor": [1.0, 2.0, 4.0, 8.0, 16.0, 32.0],
            "original_max_position_embeddings": 128,
        },
    )),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM", dict(
        num_experts=6, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48,
        mlp_only_layers=[1],
    )),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(
        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True,
    )),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(num_local_experts=4, num_experts_per_tok=2, sliding_window=None)),
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM", dict(num_experts=6, num_experts_per_tok=2)),
}  # fmt: skip
MOE = ("qwen2_moe", "qwen3_moe", "mixtral", "olmoe")


def save_tiny(family: str, folder, **overrides):
    """A random tiny model of ``family`` saved to ``folder``; returns the transformers model."""
    import transformers as tf

    config_name, model_name, extra = FAMILIES[family]
    torch.manual_seed(0)
    model = getattr(tf, model_name)(getattr(tf, config_name)(**{**COMMON, **extra, **overrides})).eval()
    gemma = family.startswith("gemma")
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):  # init leaves them at 1 (Gemma: 0); make them matter
                param.copy_(torch.randn_like(param) * 0.2 + (0.0 if gemma else 1.0))
            elif name.endswith("bias"):
                torch.nn.init.normal_(param, std=0.2)
    model.save_pretrained(str(folder))
    return model


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family_pair(request, tmp_path_factory, one_thread):
    folder = tmp_path_factory.mktemp(request.param)
    hf = save_tiny(request.param, folder)
    runner = ModelRunner(folder, dtype="float32", max_total_tokens=2048, max_running_requests=8)
    return request.param, runner, hf


def test_config_fields(family_pair):
    family, runner, _ = family_pair
    cfg = runner.model_config
    assert cfg.family == {"gemma3": "gemma3_text"}.get(family, family)
    if family.startswith("gemma"):
        assert cfg.sandwich_norm and cfg.norm_plus_one and cfg.embed_scale == 8.0 and cfg.final_softcap
        assert cfg.layer_windows[0] == WINDOW and None in cfg.layer_windows
    if family == "gemma3":
        assert cfg.local_rope is not None and cfg.local_rope.theta == 1000.0 and cfg.rope.type == "linear"
    if family == "phi3":
        assert cfg.rotary_dim == 12 and cfg.context_len == 512 and cfg.rope.attention_factor > 1.1
        assert cfg.layer_windows == (WINDOW,) * 4
    assert (cfg.moe is not None) == (family in MOE)
    if family == "qwen2_moe":
        assert cfg.moe.sparse_layers == (True, False, True, True) and cfg.moe.shared_intermediate_size == 48


def test_prefill_and_mixed_decode_match_transformers(family_pair):
    _, runner, hf = family_pair
    _check_prefill_then_mixed_decode(runner, hf, runner.vocab_size)


def test_chunked_prefill_matches_transformers(family_pair):
    _, runner, hf = family_pair
    loop = GreedyLoop(runner)
    prompt = [random.Random(1).randrange(3, runner.vocab_size) for _ in range(70)]
    row = loop.add(prompt)
    for chunk in (5, 16, 3, 16, 30):  # extends after a cached prefix, shorter and longer than the window
        logits = loop.step([row], chunk=chunk)
        if row.cached == len(prompt):
            break
    assert row.cached == len(prompt)
    assert torch.allclose(logits[0], _hf_logits(hf, prompt)[-1], atol=TOL)
    loop.release(row)


def test_verification_scores_every_position(family_pair):
    _, runner, hf = family_pair
    pools = (runner.req_to_token_pool, runner.token_to_kv_pool)
    slot = runner.req_to_token_pool.alloc()[0]
    tokens = [random.Random(2).randrange(3, runner.vocab_size) for _ in range(30)]
    locs = runner.token_to_kv_pool.alloc(len(tokens))
    runner.forward(ForwardBatch.init_new([ForwardInput(slot, 0, tokens[:20], locs[:20])], *pools))
    verify = ForwardBatch.init_new([ForwardInput(slot, 20, tokens[20:], locs[20:])], *pools, forward_mode=ForwardMode.TARGET_VERIFY)
    out = runner.forward(verify)
    assert torch.allclose(out.next_token_logits, _hf_logits(hf, tokens)[20:], atol=TOL)
    runner.token_to_kv_pool.free(locs)
    runner.req_to_token_pool.free(slot)


def _oracle_routes(hf, tokens: list[int], top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' top-k expert ids [T, moe_layers, k] and whether each (position, layer) is
    decided beyond float noise (the k-th and (k+1)-th probabilities apart)."""
    with torch.no_grad():
        out = hf(torch.tensor([tokens]), output_router_logits=True)
    probs = torch.stack([torch.softmax(r.float().reshape(len(tokens), -1), -1) for r in out.router_logits], dim=1)
    top = torch.topk(probs, top_k + 1, dim=-1)
    decided = (top.values[..., top_k - 1] - top.values[..., top_k]) > 1e-4
    return top.indices[..., :top_k], decided


def test_routed_experts_equal_the_oracle_router(family_pair):
    family, runner, hf = family_pair
    if family not in MOE:
        pytest.skip("dense model")
    top_k = runner.model_config.moe.top_k
    pools = (runner.req_to_token_pool, runner.token_to_kv_pool)
    rng = random.Random(3)
    prompts = [[rng.randrange(3, runner.vocab_size) for _ in range(n)] for n in (23, 7)]
    slots = runner.req_to_token_pool.alloc(2)
    locs = [runner.token_to_kv_pool.alloc(64) for _ in prompts]
    # prefill both, every position scored, then three decode steps: routes at every position
    batch = ForwardBatch.init_new(
        [ForwardInput(s, 0, p, loc[: len(p)], num_logits=len(p)) for s, p, loc in zip(slots, prompts, locs)], *pools
    )
    batch.capture_routed_experts = True
    out = runner.forward(batch)
    got = list(out.routed_experts.split([len(p) for p in prompts]))
    for _ in range(3):
        nxt = [int(x) for x in out.next_token_logits.reshape(-1, out.next_token_logits.shape[-1])[[len(prompts[0]) - 1, -1]].argmax(-1)]
        inputs = []
        for s, p, loc, t in zip(slots, prompts, locs, nxt):
            p.append(t)
            inputs.append(ForwardInput(s, len(p) - 1, [t], loc[len(p) - 1 : len(p)]))
        batch = ForwardBatch.init_new(inputs, *pools)
        batch.capture_routed_experts = True
        out = runner.forward(batch)
        got = [torch.cat([g, out.routed_experts[i : i + 1]]) for i, g in enumerate(got)]
        prompts_last = [len(p) for p in prompts]
        out.next_token_logits = torch.stack([out.next_token_logits[0]] * (prompts_last[0]) + [out.next_token_logits[1]])
    checked = 0
    for p, ids in zip(prompts, got):
        expect, decided = _oracle_routes(hf, p, top_k)
        assert ids.shape == expect.shape
        same = torch.sort(ids, -1).values == torch.sort(expect, -1).values
        assert bool(same.all(-1)[decided].all()), "routed experts differ from the router's top-k"
        checked += int(decided.sum())
    assert checked > 0.9 * sum(len(p) for p in prompts) * got[0].shape[1]
    for loc in locs:
        runner.token_to_kv_pool.free(loc)
    runner.req_to_token_pool.free(slots)


def test_routing_is_not_recorded_unless_asked(family_pair):
    family, runner, _ = family_pair
    loop = GreedyLoop(runner)
    row = loop.add([5, 6, 7, 8])
    pools = (runner.req_to_token_pool, runner.token_to_kv_pool)
    locs = runner.token_to_kv_pool.alloc(4)
    out = runner.forward(ForwardBatch.init_new([ForwardInput(row.slot, 0, row.tokens, locs)], *pools))
    assert out.routed_experts is None
    runner.token_to_kv_pool.free(locs)
    loop.release(row)


def test_refusals_name_the_field(tmp_path):
    save_tiny("qwen3", tmp_path, num_hidden_layers=2)
    cfg = json.loads((tmp_path / "config.json").read_text())
    for patch, needle in [
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0}}, "yarn"),
        ({"layer_types": ["full_attention", "chunked_attention"], "use_sliding_window": True, "sliding_window": 4}, "chunked_attention"),
        ({"hidden_act": "relu2"}, "relu2"),
        ({"architectures": ["Gemma3ForConditionalGeneration"]}, "Gemma3ForConditionalGeneration"),
    ]:
        with pytest.raises(ModelLoadError, match=needle):
            ModelConfig.from_dict({**cfg, **patch})
    with pytest.raises(ModelLoadError, match="clip_qkv"):
        ModelConfig.from_dict({**cfg, "architectures": ["OlmoeForCausalLM"], "num_experts": 4, "num_experts_per_tok": 2, "clip_qkv": 8.0})


def test_eos_ids_from_config_and_generation_config(tmp_path):
    save_tiny("qwen3", tmp_path, num_hidden_layers=1)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 2]}))
    assert ModelConfig.from_folder(tmp_path).eos_token_ids == (2, 7)
    (tmp_path / "generation_config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="generation_config.json"):
        ModelConfig.from_folder(tmp_path)
