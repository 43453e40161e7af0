"""``ModelConfig``: what formcast needs from a Hugging Face ``config.json``, checked on load.

Both spellings of RoPE settings are read: ``rope_theta`` + ``rope_scaling`` (transformers 4) and
``rope_parameters`` (transformers 5; Gemma 3 keys it by layer type). Anything the decoder of
``models.llama`` cannot run exactly (another architecture, an unknown RoPE type or layer type, an
activation it lacks, OLMoE's ``clip_qkv``) is a ``ModelLoadError`` naming the field, never a
silently different model.

``SUPPORTED_ARCHITECTURES`` is the architecture registry (architecture -> family); a family's
differences from the Llama block are plain fields here (q/k norms, Gemma's sandwich norms and
soft-capping, per-layer sliding windows, partial rotary, mixture of experts), read once from the
config so that any loader (safetensors, GGUF) can fill the same ``ModelConfig``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# architectures -> family; every one of them is a variant of the Llama block (RMSNorm, RoPE, GQA,
# gated MLP or a mixture of gated experts), its differences listed in ``ModelConfig``.
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "MistralForCausalLM": "mistral",
    "Qwen3ForCausalLM": "qwen3",
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3_text",
    "Phi3ForCausalLM": "phi3",
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "MixtralForCausalLM": "mixtral",
    "OlmoeForCausalLM": "olmoe",
}
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "longrope", "su")
_GEMMA = ("gemma2", "gemma3_text")
# Gemma configs spell the activation hidden_activation; gelu_pytorch_tanh is GELU's tanh form.
_ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh"}
LAYER_TYPES = ("full_attention", "sliding_attention")


class ModelLoadError(ValueError):
    """A model folder formcast cannot run: the message names the file, field or tensor."""


@dataclass(frozen=True)
class RopeConfig:
    theta: float = 10000.0
    type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int | None = None
    # longrope ("su"): per-frequency divisors below / above original_max_position_embeddings, and
    # the factor cos/sin are multiplied by (None: derived from the context extension).
    short_factor: tuple[float, ...] | None = None
    long_factor: tuple[float, ...] | None = None
    attention_factor: float | None = None


@dataclass(frozen=True)
class MoeConfig:
    """A sparse MLP: ``top_k`` of ``num_experts`` gated experts per token, chosen by a softmax
    router; optionally a shared expert every token runs, scaled by sigmoid(shared_expert_gate)."""

    num_experts: int
    top_k: int
    intermediate_size: int
    norm_topk_prob: bool
    shared_intermediate_size: int = 0
    sparse_layers: tuple[bool, ...] = ()  # per layer: experts (True) or the dense MLP


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool  # Qwen2 always; Llama when attention_bias
    o_bias: bool
    mlp_bias: bool
    rope: RopeConfig
    sliding_window: int | None = None
    torch_dtype: str | None = None  # the checkpoint's dtype, for dtype="auto"
    eos_token_ids: tuple[int, ...] = ()
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    # Family differences from the Llama block (defaults: Llama).
    hidden_act: str = "silu"  # "silu" | "gelu_tanh"
    qk_norm: str | None = None  # "head": RMSNorm per head (Qwen3, Gemma 3); "full": over all heads (OLMoE)
    norm_plus_one: bool = False  # Gemma: RMSNorm scales by (1 + w); the loader stores 1 + w
    sandwich_norm: bool = False  # Gemma 2/3: norms after attention and MLP too
    embed_scale: float | None = None  # Gemma: embeddings times sqrt(hidden)
    attn_scale: float | None = None  # query scaling; None = head_dim ** -0.5
    attn_softcap: float | None = None  # Gemma 2: cap * tanh(score / cap)
    final_softcap: float | None = None  # Gemma 2/3: on the logits
    layer_windows: tuple[int | None, ...] = ()  # per layer: sliding window (keys seen), None = global
    local_rope: RopeConfig | None = None  # Gemma 3: the sliding layers' RoPE
    rotary_dim: int | None = None  # partial rotary (Phi-4 mini); None = head_dim
    moe: MoeConfig | None = None
    # llama.cpp's numerics outside the matrix products (GGUF files, opt-in: FORMCAST_GGML_NUMERICS=1):
    # attention at float16 (layers.attention) and RoPE angles tabulated its way (layers.rotary).
    ggml_numerics: bool = False

    @property
    def context_len(self) -> int:
        """Longest sequence the model runs. Sliding-window layers attend within their window at any
        length; LongRoPE switches to its long factors past ``original_max_position_embeddings``
        (``layers.rotary``)."""
        return self.max_position_embeddings

    def window(self, layer: int) -> int | None:
        return self.layer_windows[layer] if self.layer_windows else None

    @classmethod
    def from_dict(cls, cfg: dict[str, Any]) -> ModelConfig:
        archs = cfg.get("architectures") or [_arch_from_model_type(cfg.get("model_type"))]
        arch = archs[0]
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ModelLoadError(
                f"config.json: architecture {arch!r} is not supported (supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
            )
        family = SUPPORTED_ARCHITECTURES[arch]
        act_key = "hidden_activation" if cfg.get("hidden_activation") else "hidden_act"
        act = cfg.get(act_key) or "silu"
        if act not in _ACTIVATIONS:
            raise ModelLoadError(f"config.json: {act_key} {act!r} is not supported (supported: {', '.join(_ACTIVATIONS)})")
        if cfg.get("clip_qkv") is not None:
            raise ModelLoadError(f"config.json: clip_qkv {cfg['clip_qkv']!r} is not supported")
        if cfg.get("use_bidirectional_attention"):
            raise ModelLoadError("config.json: use_bidirectional_attention is not supported (causal models only)")
        heads = _required(cfg, "num_attention_heads")
        hidden = _required(cfg, "hidden_size")
        num_layers = _required(cfg, "num_hidden_layers")
        head_dim = cfg.get("head_dim") or hidden // heads
        gemma = family in _GEMMA
        rope = _rope(cfg)
        partial = float((cfg.get("rope_parameters") or {}).get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0)) or 1.0)
        return cls(
            architecture=arch,
            family=family,
            vocab_size=_required(cfg, "vocab_size"),
            hidden_size=hidden,
            intermediate_size=_required(cfg, "intermediate_size"),
            num_layers=num_layers,
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=head_dim,
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", gemma)),
            qkv_bias=family in ("qwen2", "qwen2_moe") or bool(cfg.get("attention_bias", False)),
            o_bias=family not in ("qwen2", "qwen2_moe") and bool(cfg.get("attention_bias", False)),
            mlp_bias=bool(cfg.get("mlp_bias", False)),
            rope=rope,
            sliding_window=_sliding_window(cfg, family),
            torch_dtype=cfg.get("torch_dtype") or cfg.get("dtype"),
            eos_token_ids=_eos_ids(cfg.get("eos_token_id")),
            raw=cfg,
            hidden_act=_ACTIVATIONS[act],
            qk_norm="head" if family in ("qwen3", "qwen3_moe", "gemma3_text") else "full" if family == "olmoe" else None,
            norm_plus_one=gemma,
            sandwich_norm=gemma,
            embed_scale=hidden**0.5 if gemma else None,
            attn_scale=float(cfg.get("query_pre_attn_scalar", 256)) ** -0.5 if gemma else None,
            attn_softcap=_positive(cfg, "attn_logit_softcapping") if gemma else None,
            final_softcap=_positive(cfg, "final_logit_softcapping") if gemma else None,
            layer_windows=_layer_windows(cfg, family, num_layers),
            local_rope=_rope(cfg, "sliding_attention") if family == "gemma3_text" else None,
            rotary_dim=int(head_dim * partial) if partial != 1.0 else None,
            moe=_moe(cfg, family, num_layers),
        )

    @classmethod
    def from_folder(cls, folder: str | Path) -> ModelConfig:
        path = Path(folder) / "config.json"
        if not path.is_file():
            raise ModelLoadError(f"{path} does not exist (a model folder needs config.json)")
        try:
            cfg = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ModelLoadError(f"{path} is not valid JSON: {exc}") from None
        config = cls.from_dict(cfg)
        # generation_config.json lists the end-of-turn ids too (Qwen3: <|im_end|>, Gemma: <end_of_turn>)
        gen_path = Path(folder) / "generation_config.json"
        if gen_path.is_file():
            try:
                gen_eos = _eos_ids(json.loads(gen_path.read_text(encoding="utf-8")).get("eos_token_id"))
            except (json.JSONDecodeError, TypeError, ValueError) as exc:
                raise ModelLoadError(f"{gen_path}: eos_token_id unreadable: {exc}") from None
            merged = tuple(dict.fromkeys(config.eos_token_ids + gen_eos))
            if merged != config.eos_token_ids:
                import dataclasses

                config = dataclasses.replace(config, eos_token_ids=merged)
        return config


def _arch_from_model_type(model_type: Any) -> str:
    for arch, family in SUPPORTED_ARCHITECTURES.items():
        if family == model_type:
            return arch
    return str(model_type)


def _required(cfg: dict[str, Any], key: str) -> int:
    if key not in cfg:
        raise ModelLoadError(f"config.json: missing field {key!r}")
    return int(cfg[key])


def _eos_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(int(v) for v in (value if isinstance(value, list) else [value]))


def _positive(cfg: dict[str, Any], key: str) -> float | None:
    value = cfg.get(key)
    return float(value) if value else None


def _sliding_window(cfg: dict[str, Any], family: str) -> int | None:
    window = cfg.get("sliding_window")
    if family in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe") and not cfg.get("use_sliding_window"):
        return None
    return int(window) if window else None


def _layer_windows(cfg: dict[str, Any], family: str, num_layers: int) -> tuple[int | None, ...]:
    """Per layer, the sliding window or None; () when every layer is global. ``layer_types``
    when the config lists them, else each family's default pattern as transformers derives it."""
    window = _sliding_window(cfg, family)
    if window is None or family == "olmoe":  # transformers' OLMoE masks causally only
        return ()
    types = cfg.get("layer_types")
    if not types:
        if family == "gemma2":
            types = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(num_layers)]
        elif family == "gemma3_text":
            pattern = int(cfg.get("sliding_window_pattern", cfg.get("_sliding_window_pattern", 6)))
            types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(num_layers)]
        elif family in ("qwen2", "qwen3", "qwen2_moe"):  # the layers from max_window_layers on slide
            first = int(cfg.get("max_window_layers", num_layers))
            types = ["sliding_attention" if i >= first else "full_attention" for i in range(num_layers)]
        else:  # Mistral, Mixtral, Phi-3, Qwen3-MoE: every layer
            types = ["sliding_attention"] * num_layers
    if len(types) != num_layers:
        raise ModelLoadError(f"config.json: layer_types lists {len(types)} layers, num_hidden_layers is {num_layers}")
    for i, kind in enumerate(types):
        if kind not in LAYER_TYPES:
            raise ModelLoadError(f"config.json: layer_types[{i}] {kind!r} is not supported (supported: {', '.join(LAYER_TYPES)})")
    windows = tuple(window if kind == "sliding_attention" else None for kind in types)
    return windows if any(w is not None for w in windows) else ()


def _moe(cfg: dict[str, Any], family: str, num_layers: int) -> MoeConfig | None:
    if family not in ("qwen2_moe", "qwen3_moe", "mixtral", "olmoe"):
        return None
    experts = cfg.get("num_experts") or cfg.get("num_local_experts")
    if not experts:
        raise ModelLoadError("config.json: missing field 'num_experts' (or 'num_local_experts')")
    qwen = family in ("qwen2_moe", "qwen3_moe")
    only_dense = set(cfg.get("mlp_only_layers") or [])
    step = int(cfg.get("decoder_sparse_step", 1) or 1) if qwen else 1
    sparse = tuple(i not in only_dense and (i + 1) % step == 0 for i in range(num_layers))
    return MoeConfig(
        num_experts=int(experts),
        top_k=_required(cfg, "num_experts_per_tok"),
        intermediate_size=int(cfg["moe_intermediate_size"]) if qwen else _required(cfg, "intermediate_size"),
        norm_topk_prob=family == "mixtral" or bool(cfg.get("norm_topk_prob", False)),
        shared_intermediate_size=int(cfg.get("shared_expert_intermediate_size") or 0) if family == "qwen2_moe" else 0,
        sparse_layers=sparse,
    )


def _rope(cfg: dict[str, Any], layer_type: str | None = None) -> RopeConfig:
    params = dict(cfg.get("rope_parameters") or {})
    if set(params) & set(LAYER_TYPES):  # Gemma 3: one entry per layer type
        params = dict(params.get(layer_type or "full_attention") or {})
    elif layer_type == "sliding_attention":  # transformers 4 spelling of Gemma 3's local base
        return RopeConfig(theta=float(cfg.get("rope_local_base_freq", 10000.0)))
    scaling = cfg.get("rope_scaling") or {}
    params = {**scaling, **params}
    theta = float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    kind = params.get("rope_type", params.get("type", "default")) or "default"
    if kind not in SUPPORTED_ROPE_TYPES:
        raise ModelLoadError(f"config.json: rope type {kind!r} is not supported (supported: {', '.join(SUPPORTED_ROPE_TYPES)})")
    original = params.get("original_max_position_embeddings", cfg.get("original_max_position_embeddings"))
    floats = lambda key: tuple(float(x) for x in params[key]) if params.get(key) else None  # noqa: E731
    if kind in ("longrope", "su") and not (params.get("short_factor") and params.get("long_factor") and original):
        raise ModelLoadError("config.json: rope type longrope needs short_factor, long_factor and original_max_position_embeddings")
    return RopeConfig(
        theta=theta,
        type=kind,
        factor=float(params.get("factor") or 1.0),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(original) if original else None,
        short_factor=floats("short_factor"),
        long_factor=floats("long_factor"),
        attention_factor=_longrope_attention_factor(params, cfg, original) if kind in ("longrope", "su") else None,
    )


def _longrope_attention_factor(params: dict[str, Any], cfg: dict[str, Any], original: int) -> float:
    """cos/sin scale of LongRoPE, as transformers derives it when the config does not state it."""
    if params.get("attention_factor") is not None:
        return float(params["attention_factor"])
    factor = float(params.get("factor") or int(cfg.get("max_position_embeddings", original)) / int(original))
    return 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(int(original)))
