"""Tiny random models of the families beyond Llama, built with transformers and written to F32
GGUF files the way llama.cpp's converter writes them (its architecture names, metadata keys and
tensor names; q/k rows permuted for the llama architecture, Gemma norms stored as 1 + w, Phi-3's
fused projections kept fused, experts stacked per layer, LongRoPE factors as tensors).

``write_family_gguf(path, family, model)`` writes ``model`` (a transformers model of ``family``)
to ``path``; ``build(family)`` makes the random model from ``FAMILIES``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from gguf_files import TINY, _permute, add_tiny_tokenizer

COMMON = dict(
    vocab_size=TINY["vocab_size"], hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, max_position_embeddings=512, initializer_range=0.08, rms_norm_eps=1e-6,
    pad_token_id=0, bos_token_id=TINY["bos_token_id"], eos_token_id=TINY["eos_token_id"], tie_word_embeddings=False,
)  # fmt: skip
WINDOW = 8
# family -> (GGUF architecture, transformers config class, model class, config overrides). Every
# value llama.cpp derives instead of reading (Gemma's query scale, Gemma 3's local RoPE base and
# layer pattern) is set here to what llama.cpp derives, so the file describes this very model.
FAMILIES = {
    "qwen3": ("qwen3", "Qwen3Config", "Qwen3ForCausalLM", dict()),
    "gemma2": ("gemma2", "Gemma2Config", "Gemma2ForCausalLM", dict(
        num_hidden_layers=4, sliding_window=WINDOW, query_pre_attn_scalar=16, attn_logit_softcapping=1.5,
        final_logit_softcapping=2.0, tie_word_embeddings=True,
    )),
    "gemma3": ("gemma3", "Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        num_hidden_layers=6, sliding_window=WINDOW, query_pre_attn_scalar=16, tie_word_embeddings=True,
        rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 100000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
    )),
    "phi3": ("phi3", "Phi3Config", "Phi3ForCausalLM", dict(
        # llama.cpp pads its context to 256 and picks LongRoPE's long table past the original
        # length: at 256 a 256-token context still runs the short table, as transformers does here
        max_position_embeddings=1024, original_max_position_embeddings=256, sliding_window=None,
        rope_parameters={
            "rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
            "short_factor": [1.0, 1.3, 1.7, 2.2, 3.0, 4.0], "long_factor": [1.0, 2.0, 4.0, 8.0, 16.0, 32.0],
            "original_max_position_embeddings": 256,
        },
    )),
    "qwen2_moe": ("qwen2moe", "Qwen2MoeConfig", "Qwen2MoeForCausalLM", dict(
        num_experts=6, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48,
        norm_topk_prob=False,
    )),
    "qwen3_moe": ("qwen3moe", "Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(
        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True,
    )),
    "mixtral": ("llama", "MixtralConfig", "MixtralForCausalLM", dict(
        num_local_experts=4, num_experts_per_tok=2, sliding_window=None, head_dim=None,
    )),
    # llama.cpp sizes OLMoE's k norm by the hidden width: as in the released models, no grouped heads
    "olmoe": ("olmoe", "OlmoeConfig", "OlmoeForCausalLM", dict(
        num_experts=6, num_experts_per_tok=2, norm_topk_prob=False, num_key_value_heads=4,
    )),
}  # fmt: skip

_TOP = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}
_LAYER = {
    "input_layernorm": "attn_norm", "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.qkv_proj": "attn_qkv", "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down", "mlp.gate_up_proj": "ffn_up",
    "mlp.gate": "ffn_gate_inp", "block_sparse_moe.gate": "ffn_gate_inp",
    "mlp.shared_expert.gate_proj": "ffn_gate_shexp", "mlp.shared_expert.up_proj": "ffn_up_shexp",
    "mlp.shared_expert.down_proj": "ffn_down_shexp", "mlp.shared_expert_gate": "ffn_gate_inp_shexp",
}  # fmt: skip


def build(family: str, **overrides):  # type: ignore[no-untyped-def]
    """The random transformers model of ``family``, norms and biases randomized so that a norm or
    bias loaded wrongly (or Gemma's 1 + w applied twice) shows in the logits."""
    import transformers as tf

    _, config_name, model_name, extra = FAMILIES[family]
    torch.manual_seed(0)
    model = getattr(tf, model_name)(getattr(tf, config_name)(**{**COMMON, **extra, **overrides})).eval()
    gemma = family.startswith("gemma")
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(torch.randn_like(param) * 0.2 + (0.0 if gemma else 1.0))
            elif name.endswith("bias"):
                torch.nn.init.normal_(param, std=0.2)
    return model


def write_family_gguf(path: Path, family: str, model, qtype: str | None = None) -> None:  # type: ignore[no-untyped-def]
    """``qtype``: encode the matrices whose rows fill whole blocks with ``gguf.quants`` (for
    machines without llama.cpp's quantizer), else F32."""
    import gguf

    arch = FAMILIES[family][0]
    c = model.config
    heads, kv_heads = c.num_attention_heads, c.num_key_value_heads
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
    w = gguf.GGUFWriter(str(path), arch)
    # not "phi3" in the name: llama.cpp then looks up Phi-3's own special tokens by text
    w.add_name("formcast-tiny")
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    rope = dict(c.rope_parameters or {})
    if family == "gemma3":
        rope = rope["full_attention"]
    partial = float(rope.get("partial_rotary_factor", 1.0))
    w.add_rope_dimension_count(int(head_dim * partial))
    w.add_rope_freq_base(float(rope.get("rope_theta", 10000.0)))
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_vocab_size(c.vocab_size)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    if rope.get("rope_type") == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(float(rope["factor"]))
    if family in ("gemma2", "gemma3"):
        w.add_sliding_window(c.sliding_window)
    if family == "gemma2":
        w.add_attn_logit_softcapping(c.attn_logit_softcapping)
        w.add_final_logit_softcapping(c.final_logit_softcapping)
    experts = getattr(c, "num_experts", None) or getattr(c, "num_local_experts", None)
    if experts:
        w.add_expert_count(experts)
        w.add_expert_used_count(c.num_experts_per_tok)
        if family not in ("mixtral", "olmoe"):  # their experts are feed_forward_length wide
            w.add_expert_feed_forward_length(c.moe_intermediate_size)
        if family == "qwen2_moe":
            w.add_expert_shared_feed_forward_length(c.shared_expert_intermediate_size)
    add_tiny_tokenizer(w)
    state = {k: v.detach().float().numpy().copy() for k, v in model.state_dict().items()}
    if family == "phi3":  # the converter writes LongRoPE's tables as tensors, with the factor it derives
        orig = rope["original_max_position_embeddings"]
        w.add_rope_scaling_orig_ctx_len(orig)
        scale = c.max_position_embeddings / orig
        w.add_rope_scaling_attn_factors(float(np.sqrt(1 + np.log(scale) / np.log(orig))) if scale > 1 else 1.0)
        w.add_tensor("rope_factors_long.weight", np.asarray(rope["long_factor"], dtype=np.float32))
        w.add_tensor("rope_factors_short.weight", np.asarray(rope["short_factor"], dtype=np.float32))
    kind = gguf.GGMLQuantizationType[qtype] if qtype else None
    for name, value in _gguf_tensors(family, state, heads, kv_heads, c.tie_word_embeddings):
        value = np.ascontiguousarray(value, dtype=np.float32)
        # routers stay float, as llama.cpp's quantizer keeps them
        if kind is not None and value.ndim >= 2 and "gate_inp" not in name and value.shape[-1] % gguf.GGML_QUANT_SIZES[kind][0] == 0:
            w.add_tensor(name, gguf.quants.quantize(value, kind), raw_dtype=kind)
        else:
            w.add_tensor(name, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _gguf_tensors(family: str, state: dict[str, np.ndarray], heads: int, kv_heads: int, tied: bool):  # type: ignore[no-untyped-def]
    gemma = family.startswith("gemma")
    for name, value in state.items():
        if name in _TOP:
            if name == "lm_head.weight" and tied:
                continue
            yield _TOP[name], (value + 1.0 if gemma and name.endswith("norm.weight") else value)
            continue
        i, rest = name[len("model.layers.") :].split(".", 1)
        p = f"blk.{i}."
        if rest.endswith("experts.gate_up_proj"):  # [E, 2I, H]: gate rows first
            gate, up = np.split(value, 2, axis=1)
            yield p + "ffn_gate_exps.weight", gate
            yield p + "ffn_up_exps.weight", up
            continue
        if rest.endswith("experts.down_proj"):
            yield p + "ffn_down_exps.weight", value
            continue
        stem, _, kind = rest.rpartition(".")
        if stem == "post_attention_layernorm":
            target = "post_attention_norm" if gemma else "ffn_norm"
        else:
            target = _LAYER[stem]
        if family == "mixtral" and stem in ("self_attn.q_proj", "self_attn.k_proj"):
            value = _permute(value, heads if stem.endswith("q_proj") else kv_heads)
        if gemma and stem.endswith("norm"):
            value = value + 1.0
        yield f"{p}{target}.{kind}", value
