"""GGUF file -> ``LlamaForCausalLM`` with its weights in their encoding (no transformers, no conversion).

    model = load_gguf_model("model.gguf", torch.float32, torch.device("cpu"))

GGUF tensor names map onto the fused layout of ``models.llama``: ``attn_q``/``attn_k``/``attn_v``
stack into ``qkv_proj``, ``ffn_gate``/``ffn_up`` into ``gate_up_proj``. A quantized matrix becomes
a ``layers.ggml_quants.QuantizedWeight`` (a ``StackedWeight`` where fused parts differ in type, as
Q4_K_M files mix Q4_K and Q6_K); F32 / F16 matrices become float tensors in ``dtype`` and BF16
ones stay bfloat16 (``layers.cpu_linear`` multiplies both); norms are float tensors in ``dtype``.

Architectures whose GGUF rotates adjacent pairs (``GGUFArchitecture.rope_interleaved``: llama)
had their q / k rows permuted by llama.cpp's converter; the rows are put back in rotate-half order
(whole rows move, so quantized blocks are reordered, never re-encoded).

Only ``GGUFFile.open`` touches the file; every tensor is built before the model object is, so an
error leaves nothing behind.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch
from torch import nn

from ..layers.ggml_quants import QUANT_TYPES, QuantizedWeight, StackedWeight
from ..layers.rotary import RotaryEmbedding
from .config import ModelConfig, ModelLoadError
from .gguf_file import GGUFFile, GGUFTensor
from .llama import LlamaForCausalLM

FLOAT_TYPES = ("F32", "F16", "BF16")
SUPPORTED_TYPES = frozenset(QUANT_TYPES + FLOAT_TYPES)

Weight = Any  # torch.Tensor | QuantizedWeight | StackedWeight


def open_gguf(path: str | os.PathLike[str]) -> GGUFFile:
    return GGUFFile.open(path, SUPPORTED_TYPES)


def load_gguf_model(path: str | os.PathLike[str], dtype: torch.dtype, device: torch.device) -> LlamaForCausalLM:
    if device.type != "cpu":
        raise ModelLoadError(f"{path}: GGUF weights run on the CPU only (device {device} requested)")
    gf = open_gguf(path)
    cfg = gf.model_config()
    weights = _Weights(gf, cfg, dtype)
    tensors: dict[str, Weight] = {
        "embed_tokens": weights.matrix("token_embd.weight"),
        "norm": weights.vector("output_norm.weight"),
    }
    if not cfg.tie_word_embeddings:
        tensors["lm_head"] = weights.matrix("output.weight")
    layers = [_layer_weights(weights, cfg, i) for i in range(cfg.num_layers)]
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    put_weight(model, "embed_tokens", tensors["embed_tokens"])
    put_weight(model.norm, "weight", tensors["norm"])
    put_weight(model, "lm_head", tensors.get("lm_head", tensors["embed_tokens"]))
    for layer, named in zip(model.layers, layers):
        for dotted, value in named.items():
            owner, _, name = dotted.rpartition(".")
            put_weight(layer.get_submodule(owner), name, value)
    model.rotary = RotaryEmbedding(cfg.rope, cfg.head_dim, cfg.context_len, dtype, device, ggml=cfg.ggml_numerics)
    return model.eval()


def put_weight(module: nn.Module, name: str, value: Weight) -> None:
    """Set a weight on a module built on the meta device: a tensor as a frozen Parameter, a
    quantized matrix as a plain attribute (it is not a tensor)."""
    if isinstance(value, torch.Tensor):
        setattr(module, name, nn.Parameter(value, requires_grad=False))
    else:
        module._parameters.pop(name, None)
        setattr(module, name, value)


def _layer_weights(w: _Weights, cfg: ModelConfig, i: int) -> dict[str, Weight]:
    p = f"blk.{i}."
    q_rows, k_rows = w.rope_rows(cfg.num_heads), w.rope_rows(cfg.num_kv_heads)
    out: dict[str, Weight] = {
        "self_attn.qkv_proj": w.stack([w.matrix(p + "attn_q.weight", q_rows), w.matrix(p + "attn_k.weight", k_rows),
                                       w.matrix(p + "attn_v.weight")]),
        "self_attn.o_proj": w.matrix(p + "attn_output.weight"),
        "mlp.gate_up_proj": w.stack([w.matrix(p + "ffn_gate.weight"), w.matrix(p + "ffn_up.weight")]),
        "mlp.down_proj": w.matrix(p + "ffn_down.weight"),
        "input_layernorm.weight": w.vector(p + "attn_norm.weight"),
        "post_attention_layernorm.weight": w.vector(p + "ffn_norm.weight"),
    }  # fmt: skip
    if cfg.qkv_bias:
        out["self_attn.qkv_bias"] = torch.cat(
            [w.vector(p + "attn_q.bias", q_rows), w.vector(p + "attn_k.bias", k_rows), w.vector(p + "attn_v.bias")]
        )
    if cfg.o_bias:
        out["self_attn.o_bias"] = w.vector(p + "attn_output.bias")
    return out


class _Weights:
    def __init__(self, gf: GGUFFile, cfg: ModelConfig, dtype: torch.dtype) -> None:
        self.gf, self.cfg, self.dtype = gf, cfg, dtype

    def rope_rows(self, heads: int) -> np.ndarray | None:
        """Row order that undoes the converter's q/k permutation (None: the rows are in order)."""
        if not self.gf.arch.rope_interleaved:
            return None
        hd = self.cfg.head_dim
        return np.arange(heads * hd).reshape(heads, hd // 2, 2).transpose(0, 2, 1).reshape(-1)

    def _get(self, name: str, ndim: int) -> GGUFTensor:
        t = self.gf.tensor(name)
        if len(t.shape) != ndim:
            raise ModelLoadError(f"{self.gf.path}: tensor {name!r} has shape {list(t.shape)}, expected {ndim} dimensions")
        return t

    def _float(self, t: GGUFTensor) -> torch.Tensor:
        data = np.asarray(t.data)
        if t.ggml_type == "BF16":
            return torch.from_numpy(np.ascontiguousarray(data).view(np.int16).reshape(t.shape).copy()).view(torch.bfloat16)
        return torch.from_numpy(np.array(data, dtype=np.float32).reshape(t.shape))

    def vector(self, name: str, rows: np.ndarray | None = None) -> torch.Tensor:
        t = self._get(name, 1)
        if t.ggml_type not in FLOAT_TYPES:
            raise ModelLoadError(f"{self.gf.path}: tensor {name!r} has type {t.ggml_type}; a 1-D tensor must be F32, F16 or BF16")
        v = self._float(t).to(self.dtype)
        return v if rows is None else v[torch.from_numpy(rows)].contiguous()

    def matrix(self, name: str, rows: np.ndarray | None = None) -> Weight:
        t = self._get(name, 2)
        try:
            if t.ggml_type in FLOAT_TYPES:
                m = self._float(t)
                if t.ggml_type != "BF16":  # bfloat16 matrices stay as they are (cpu_linear widens them)
                    m = m.to(self.dtype)
                return m if rows is None else m[torch.from_numpy(rows)].contiguous()
            w = QuantizedWeight.from_gguf(t.ggml_type, np.asarray(t.data), t.shape)
        except (ValueError, TypeError) as exc:
            raise ModelLoadError(f"{self.gf.path}: tensor {name!r} ({t.ggml_type}, shape {list(t.shape)}): {exc}") from None
        return w if rows is None else w.take_rows(rows)

    @staticmethod
    def stack(parts: list[Weight]) -> Weight:
        if all(isinstance(p, torch.Tensor) for p in parts) and len({p.dtype for p in parts}) == 1:
            return torch.cat(parts)
        if all(isinstance(p, QuantizedWeight) for p in parts) and len({p.type_name for p in parts}) == 1:
            return QuantizedWeight.cat(parts)
        return StackedWeight(parts)
