"""What a GGUF file's metadata says about the model families beyond Llama / Qwen2, as the
``config.json`` fields ``ModelConfig.from_dict`` reads (llama.cpp's keys and conventions).

    family_config(gf, cfg)   # adds the family's fields to cfg, the config dict of gf's base keys

- ``qwen3`` / ``qwen3moe``: RMSNorm on q and k per head (implied by the family);
- ``qwen2moe`` / ``qwen3moe`` / ``olmoe`` / ``llama`` with ``expert_count`` (Mixtral): the experts'
  count, top-k and widths (OLMoE's and Mixtral's experts are ``feed_forward_length`` wide); every
  layer is sparse (llama.cpp has no dense layers in these); top-k weights renormalized as llama.cpp
  does (``expert_weights_norm`` when the file states it, else Qwen2-MoE and OLMoE no, Qwen3-MoE and
  Mixtral yes); OLMoE's q/k norms span all heads (implied by the family);
- ``gemma2`` / ``gemma3``: GELU-tanh, the sliding window, soft-capping; the query scale llama.cpp
  uses (1/sqrt(head_dim), or 1/sqrt(hidden / heads) for the 27B sizes it recognizes by layer
  count); Gemma 3's local RoPE base is 10000 and every sixth layer global, as llama.cpp fixes them;
- ``phi3``: a partial rotary where ``rope.dimension_count`` < head_dim; LongRoPE from the
  ``rope_factors_short`` / ``rope_factors_long`` tensors with ``rope.scaling.attn_factor`` and
  ``rope.scaling.original_context_length``; the sliding window.

Gemma's converter stores norm weights as 1 + w, which is what ``ModelConfig.norm_plus_one``
models store too, so the GGUF loader takes them as they are.

Only names and numbers are read here (``gf`` is a ``gguf_file.GGUFFile``; this module does not
import it); a key a family needs but the file lacks is a ``ModelLoadError`` naming it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .config import ModelLoadError

# llama.cpp's Gemma sizes whose query scale is 1/sqrt(hidden / heads): the 27B ones, by layer count
_GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3": 62}
_MOE_ARCHS = ("olmoe", "qwen2moe", "qwen3moe")  # besides llama, whose experts make it Mixtral


def family_config(gf: Any, cfg: dict[str, Any]) -> None:
    arch = gf.architecture_name
    rot = gf.get("rope.dimension_count")
    if rot and int(rot) != int(cfg["head_dim"]) and arch != "phi3":
        raise ModelLoadError(f"{gf.path}: {arch}.rope.dimension_count {rot} differs from the head width {cfg['head_dim']} (partial rotary is read for phi3 only)")
    expert_count = int(gf.get("expert_count") or 0)
    if expert_count:
        if arch == "llama":
            cfg["architectures"] = ["MixtralForCausalLM"]
        elif arch not in _MOE_ARCHS:
            raise ModelLoadError(f"{gf.path}: {arch}.expert_count is set; formcast runs experts for llama, {', '.join(_MOE_ARCHS)} only")
        _moe(gf, cfg, arch, expert_count)
    elif arch in _MOE_ARCHS:
        raise ModelLoadError(f"{gf.path}: metadata {arch}.expert_count is missing")
    if arch in _GEMMA_27B_LAYERS:
        _gemma(gf, cfg, arch)
    elif arch == "phi3":
        _phi3(gf, cfg)


def _moe(gf: Any, cfg: dict[str, Any], arch: str, expert_count: int) -> None:
    used = gf.get("expert_used_count")
    if not used:
        raise ModelLoadError(f"{gf.path}: metadata {arch}.expert_used_count is missing")
    norm = gf.get("expert_weights_norm")
    cfg.update(num_experts=expert_count, num_experts_per_tok=int(used),
               norm_topk_prob=bool(norm) if norm is not None else arch not in ("qwen2moe", "olmoe"))  # fmt: skip
    width = gf.get("expert_feed_forward_length")
    if arch in ("llama", "olmoe"):  # Mixtral, OLMoE: intermediate_size is the experts' width
        if width:
            cfg["intermediate_size"] = int(width)
        return
    if not width:
        raise ModelLoadError(f"{gf.path}: metadata {arch}.expert_feed_forward_length is missing")
    cfg["moe_intermediate_size"] = int(width)
    if arch == "qwen2moe":
        shared = gf.get("expert_shared_feed_forward_length")
        if shared is None and "blk.0.ffn_up_shexp.weight" in gf.tensors:
            shared = gf.tensor("blk.0.ffn_up_shexp.weight").shape[0]
        cfg["shared_expert_intermediate_size"] = int(shared or 0)


def _gemma(gf: Any, cfg: dict[str, Any], arch: str) -> None:
    cfg["hidden_activation"] = "gelu_pytorch_tanh"
    if int(cfg["num_hidden_layers"]) == _GEMMA_27B_LAYERS[arch]:
        cfg["query_pre_attn_scalar"] = int(cfg["hidden_size"]) // int(cfg["num_attention_heads"])
    else:
        cfg["query_pre_attn_scalar"] = int(cfg["head_dim"])
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        value = gf.get(key)
        cfg[key] = float(value) if value and arch == "gemma2" else None  # llama.cpp's Gemma 3 caps nothing
    window = gf.get("attention.sliding_window")
    if not window:
        raise ModelLoadError(f"{gf.path}: metadata {arch}.attention.sliding_window is missing")
    cfg["sliding_window"] = int(window)
    if arch == "gemma3":
        cfg["sliding_window_pattern"] = 6
        cfg["rope_local_base_freq"] = 10000.0


def _phi3(gf: Any, cfg: dict[str, Any]) -> None:
    rot = gf.get("rope.dimension_count")
    if rot and int(rot) != int(cfg["head_dim"]):
        cfg["partial_rotary_factor"] = int(rot) / int(cfg["head_dim"])
    names = ("rope_factors_short.weight", "rope_factors_long.weight")
    present = [n in gf.tensors for n in names]
    if any(present):
        if not all(present):
            raise ModelLoadError(f"{gf.path}: tensor {names[present.index(False)]!r} is missing (LongRoPE needs both tables)")
        original = gf.get("rope.scaling.original_context_length")
        if not original:
            raise ModelLoadError(f"{gf.path}: metadata phi3.rope.scaling.original_context_length is missing")
        short, long = (np.asarray(gf.tensor(n).data, dtype=np.float64).reshape(-1).tolist() for n in names)
        scaling: dict[str, Any] = {"rope_type": "longrope", "short_factor": short, "long_factor": long,
                                   "original_max_position_embeddings": int(original)}  # fmt: skip
        if gf.get("rope.scaling.attn_factor") is not None:
            scaling["attention_factor"] = float(gf.get("rope.scaling.attn_factor"))
        cfg["rope_scaling"] = scaling
    window = gf.get("attention.sliding_window")
    if window:
        cfg["sliding_window"] = int(window)
