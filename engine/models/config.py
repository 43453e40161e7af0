"""``ModelConfig``: what formcast needs from a Hugging Face ``config.json``, checked on load.

Both spellings of RoPE settings are read: ``rope_theta`` + ``rope_scaling`` (transformers 4) and
``rope_parameters`` (transformers 5). Anything the Llama-family implementation cannot run exactly
(another architecture, an unknown RoPE type, a non-SiLU activation) is a ``ModelLoadError`` naming
the field, never a silently different model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# architectures -> family; every one of them is the Llama block (RMSNorm, RoPE, GQA, SwiGLU).
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "MistralForCausalLM": "mistral",
}
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


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

    @property
    def context_len(self) -> int:
        """Longest sequence the model runs exactly (a sliding window caps it: formcast never
        lets a token see past the window, so it never needs the window mask)."""
        if self.sliding_window:
            return min(self.max_position_embeddings, int(self.sliding_window))
        return self.max_position_embeddings

    @classmethod
    def from_dict(cls, cfg: dict[str, Any]) -> ModelConfig:
        archs = cfg.get("architectures") or [_arch_from_model_type(cfg.get("model_type"))]
        arch = archs[0]
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ModelLoadError(
                f"config.json: architecture {arch!r} is not supported (supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
            )
        family = SUPPORTED_ARCHITECTURES[arch]
        act = cfg.get("hidden_act", "silu")
        if act not in ("silu", "swish"):
            raise ModelLoadError(f"config.json: hidden_act {act!r} is not supported (only silu)")
        heads = _required(cfg, "num_attention_heads")
        hidden = _required(cfg, "hidden_size")
        sliding = cfg.get("sliding_window") if (family == "mistral" or cfg.get("use_sliding_window")) else None
        return cls(
            architecture=arch,
            family=family,
            vocab_size=_required(cfg, "vocab_size"),
            hidden_size=hidden,
            intermediate_size=_required(cfg, "intermediate_size"),
            num_layers=_required(cfg, "num_hidden_layers"),
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or hidden // heads,
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=family == "qwen2" or bool(cfg.get("attention_bias", False)),
            o_bias=family != "qwen2" and bool(cfg.get("attention_bias", False)),
            mlp_bias=bool(cfg.get("mlp_bias", False)),
            rope=_rope(cfg),
            sliding_window=int(sliding) if sliding else None,
            torch_dtype=cfg.get("torch_dtype") or cfg.get("dtype"),
            eos_token_ids=_eos_ids(cfg.get("eos_token_id")),
            raw=cfg,
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
        return cls.from_dict(cfg)


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


def _rope(cfg: dict[str, Any]) -> RopeConfig:
    params = dict(cfg.get("rope_parameters") or {})
    scaling = cfg.get("rope_scaling") or {}
    params = {**scaling, **params}
    theta = float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    kind = params.get("rope_type", params.get("type", "default")) or "default"
    if kind not in SUPPORTED_ROPE_TYPES:
        raise ModelLoadError(f"config.json: rope type {kind!r} is not supported (supported: {', '.join(SUPPORTED_ROPE_TYPES)})")
    return RopeConfig(
        theta=theta,
        type=kind,
        factor=float(params.get("factor", 1.0)),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=params.get("original_max_position_embeddings"),
    )
