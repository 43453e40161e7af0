"""GGUF file -> ``LlamaForCausalLM`` (any family of ``gguf_file.GGUF_ARCHITECTURES``) with its weights in their encoding (no transformers, no conversion).

    model = load_gguf_model("model.gguf", torch.float32, torch.device("cpu"))

GGUF tensor names map onto the fused layout of ``models.llama``: ``attn_q``/``attn_k``/``attn_v``
stack into ``qkv_proj``, ``ffn_gate``/``ffn_up`` into ``gate_up_proj``. A quantized matrix becomes
a ``layers.ggml_quants.QuantizedWeight`` (a ``StackedWeight`` where fused parts differ in type, as
Q4_K_M files mix Q4_K and Q6_K); F32 / F16 matrices become float tensors in ``dtype`` and BF16
ones stay bfloat16 (``layers.cpu_linear`` multiplies both); norms are float tensors in ``dtype``.

The other families' tensors map the same way: Phi-3's ``attn_qkv`` and ``ffn_up`` (gate and up)
are fused already; ``attn_q_norm`` / ``attn_k_norm`` are the per-head q/k norms; Gemma's
``post_attention_norm``, ``ffn_norm`` and ``post_ffw_norm`` are its sandwich norms (stored as
1 + w by the converter, as formcast stores them); ``ffn_gate_inp`` is the router and
``ffn_{gate,up,down}_exps`` the experts stacked per layer [E, N, K] (float: one tensor; quantized:
a list of per-expert matrices), ``*_shexp`` Qwen2-MoE's shared expert. ``models.gguf_families``
reads the families' metadata.

On a CUDA device (``device="cuda"``) a quantized matrix becomes a
``formcast_kernels.ggml_blocks.BlockMatrix`` instead, repacked on the GPU from the file's bytes
and multiplied by Triton kernels that dequantize in registers; float tensors there are kept in
``dtype`` (the loader's "auto" is bfloat16 on GPUs: the kernels accumulate in float32 whatever the
activations' dtype).

Architectures whose GGUF rotates adjacent pairs (``GGUFArchitecture.rope_interleaved``: llama)
had their q / k rows permuted by llama.cpp's converter; the rows are put back in rotate-half order
(whole rows move, so quantized blocks are reordered, never re-encoded).

Only ``GGUFFile.open`` touches the file; every tensor is built before the model object is, so an
error leaves nothing behind.
"""

from __future__ import annotations

import os
from typing import Any, TypeVar

import numpy as np
import torch
from torch import nn

from formcast_kernels.ggml_blocks import BlockMatrix

from ..layers.ggml_quants import QUANT_TYPES, QuantizedWeight, StackedWeight
from .config import ModelConfig, ModelLoadError
from .gguf_file import GGUFFile, GGUFTensor
from .llama import LlamaForCausalLM
from .loader import attach_rotary

FLOAT_TYPES = ("F32", "F16", "BF16")
SUPPORTED_TYPES = frozenset(QUANT_TYPES + FLOAT_TYPES)

Weight = Any  # torch.Tensor | QuantizedWeight | BlockMatrix | StackedWeight

W = TypeVar("W")


def open_gguf(path: str | os.PathLike[str]) -> GGUFFile:
    return GGUFFile.open(path, SUPPORTED_TYPES)


def load_gguf_model(path: str | os.PathLike[str], dtype: torch.dtype, device: torch.device) -> LlamaForCausalLM:
    if device.type not in ("cpu", "cuda"):
        raise ModelLoadError(f"{path}: GGUF weights run on the CPU or a CUDA GPU (device {device} requested)")
    gf = open_gguf(path)
    cfg = gf.model_config()
    weights = _Weights(gf, cfg, dtype, device)
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
    attach_rotary(model, cfg, dtype, device)
    return model.eval()


def keeps_block_matrices(device: torch.device) -> bool:
    """Whether block-format matrices load as ``BlockMatrix``es (the GPU kernels') rather than the
    CPU's ``QuantizedWeight``s (tests patch it to run the GPU layout through its torch path)."""
    return device.type != "cpu"


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
    if w.has(p + "attn_qkv.weight"):  # Phi-3 keeps q, k and v fused
        qkv = w.matrix(p + "attn_qkv.weight")
    else:
        qkv = w.stack([w.matrix(p + "attn_q.weight", q_rows), w.matrix(p + "attn_k.weight", k_rows), w.matrix(p + "attn_v.weight")])
    out: dict[str, Weight] = {
        "self_attn.qkv_proj": qkv,
        "self_attn.o_proj": w.matrix(p + "attn_output.weight"),
        "input_layernorm.weight": w.vector(p + "attn_norm.weight"),
    }
    # Gemma's sandwich: post_attention_norm after attention, ffn_norm before the MLP, post_ffw_norm
    # after it; elsewhere ffn_norm is the MLP's input norm (formcast's post_attention_layernorm).
    if cfg.sandwich_norm:
        out["post_attention_layernorm.weight"] = w.vector(p + "post_attention_norm.weight")
        out["pre_feedforward_layernorm.weight"] = w.vector(p + "ffn_norm.weight")
        out["post_feedforward_layernorm.weight"] = w.vector(p + "post_ffw_norm.weight")
    else:
        out["post_attention_layernorm.weight"] = w.vector(p + "ffn_norm.weight")
    if cfg.qk_norm is not None:
        out["self_attn.q_norm.weight"] = w.vector(p + "attn_q_norm.weight")
        out["self_attn.k_norm.weight"] = w.vector(p + "attn_k_norm.weight")
    if cfg.moe is not None and cfg.moe.sparse_layers[i]:
        out.update(_expert_weights(w, p))
    else:
        out.update(_mlp_weights(w, p, "", "mlp."))
    if cfg.qkv_bias:
        out["self_attn.qkv_bias"] = torch.cat(
            [w.vector(p + "attn_q.bias", q_rows), w.vector(p + "attn_k.bias", k_rows), w.vector(p + "attn_v.bias")]
        )
    if cfg.o_bias:
        out["self_attn.o_bias"] = w.vector(p + "attn_output.bias")
    return out


def _mlp_weights(w: _Weights, p: str, suffix: str, into: str) -> dict[str, Weight]:
    """A gated MLP (``suffix`` "_shexp": Qwen2-MoE's shared expert); Phi-3's ``ffn_up`` holds
    gate and up fused, as its checkpoint does."""
    if w.has(f"{p}ffn_gate{suffix}.weight"):
        gate_up = w.stack([w.matrix(f"{p}ffn_gate{suffix}.weight"), w.matrix(f"{p}ffn_up{suffix}.weight")])
    else:
        gate_up = w.matrix(f"{p}ffn_up{suffix}.weight")
    return {into + "gate_up_proj": gate_up, into + "down_proj": w.matrix(f"{p}ffn_down{suffix}.weight")}


def _expert_weights(w: _Weights, p: str) -> dict[str, Weight]:
    """Experts stacked per layer (``ffn_{gate,up,down}_exps`` [E, N, K]) into the layout of
    ``models.moe``: float tensors [E, N, K], or per expert a list of quantized matrices."""
    gate, up, down = (w.experts(f"{p}ffn_{n}_exps.weight") for n in ("gate", "up", "down"))
    if isinstance(gate, torch.Tensor) and isinstance(up, torch.Tensor) and gate.dtype == up.dtype:
        gate_up: Any = torch.cat([gate, up], dim=1)
    else:
        gate_up = [w.stack([g, u]) for g, u in zip(gate, up)]
    out: dict[str, Weight] = {"mlp.gate": w.dense(p + "ffn_gate_inp.weight"), "mlp.gate_up_proj": gate_up, "mlp.down_proj": down}
    if w.has(p + "ffn_up_shexp.weight"):
        out.update(_mlp_weights(w, p, "_shexp", "mlp.shared_expert."))
        out["mlp.shared_expert_gate"] = w.dense(p + "ffn_gate_inp_shexp.weight").reshape(1, -1)
    return out


class _Weights:
    def __init__(self, gf: GGUFFile, cfg: ModelConfig, dtype: torch.dtype, device: torch.device) -> None:
        self.gf, self.cfg, self.dtype, self.device = gf, cfg, dtype, device

    def _encoded(self, type_name: str, data: np.ndarray, shape: tuple[int, int]) -> Weight:
        """A block-format matrix from its file bytes: the CPU's ``QuantizedWeight``, or on a GPU a
        ``BlockMatrix`` repacked there from the bytes (the Triton kernels' layout)."""
        if not keeps_block_matrices(self.device):
            return QuantizedWeight.from_gguf(type_name, data, shape)
        raw = torch.from_numpy(np.array(data, dtype=np.uint8).reshape(shape[0], -1)).to(self.device)
        return BlockMatrix.from_gguf(type_name, raw, shape)

    def _placed(self, t: torch.Tensor) -> torch.Tensor:
        """A float tensor on the model's device; on a GPU in the model's dtype, BF16 ones too
        (the CPU keeps bfloat16 matrices as they are: ``cpu_linear`` widens them)."""
        return t if self.device.type == "cpu" else t.to(self.device, self.dtype)

    def rope_rows(self, heads: int) -> np.ndarray | None:
        """Row order that undoes the converter's q/k permutation (None: the rows are in order)."""
        if not self.gf.arch.rope_interleaved:
            return None
        hd = self.cfg.head_dim
        return np.arange(heads * hd).reshape(heads, hd // 2, 2).transpose(0, 2, 1).reshape(-1)

    def has(self, name: str) -> bool:
        return name in self.gf.tensors

    def dense(self, name: str) -> torch.Tensor:
        """A float tensor of any rank (a router: its logits pick experts, so it stays unquantized)."""
        t = self.gf.tensor(name)
        if t.ggml_type not in FLOAT_TYPES:
            raise ModelLoadError(f"{self.gf.path}: tensor {name!r} has type {t.ggml_type}; formcast needs it F32, F16 or BF16")
        return self._released(t, self._placed(self._float(t).to(self.dtype)))

    def experts(self, name: str) -> Weight:
        """[E, N, K] expert matrices: a float tensor, or a list of E quantized matrices."""
        t = self._get(name, 3)
        if t.ggml_type in FLOAT_TYPES:
            m = self._float(t)
            return self._released(t, self._placed(m if t.ggml_type == "BF16" else m.to(self.dtype)))
        data = np.asarray(t.data)
        try:
            return self._released(t, [self._encoded(t.ggml_type, data[e], t.shape[1:]) for e in range(t.shape[0])])
        except (ValueError, TypeError) as exc:
            raise ModelLoadError(f"{self.gf.path}: tensor {name!r} ({t.ggml_type}, shape {list(t.shape)}): {exc}") from None

    def _released(self, t: GGUFTensor, value: W) -> W:
        """``value`` (built from ``t``'s bytes, which it no longer needs) after the file's pages of
        ``t`` are handed back (``GGUFFile.release``): the load's peak memory is then about the
        weights', not the weights' plus the file's."""
        self.gf.release(t)
        return value

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
        v = self._released(t, self._placed(self._float(t).to(self.dtype)))
        return v if rows is None else v[torch.from_numpy(rows).to(v.device)].contiguous()

    def matrix(self, name: str, rows: np.ndarray | None = None) -> Weight:
        t = self._get(name, 2)
        try:
            if t.ggml_type in FLOAT_TYPES:
                m = self._float(t)
                if t.ggml_type != "BF16":  # bfloat16 matrices stay as they are (cpu_linear widens them)
                    m = m.to(self.dtype)
                m = self._placed(m)
                return self._released(t, m if rows is None else m[torch.from_numpy(rows).to(m.device)].contiguous())
            w = self._released(t, self._encoded(t.ggml_type, np.asarray(t.data), t.shape))
        except (ValueError, TypeError) as exc:
            raise ModelLoadError(f"{self.gf.path}: tensor {name!r} ({t.ggml_type}, shape {list(t.shape)}): {exc}") from None
        if rows is None:
            return w
        return w.take_rows(rows if isinstance(w, QuantizedWeight) else torch.from_numpy(rows).to(self.device))

    @staticmethod
    def stack(parts: list[Weight]) -> Weight:
        if all(isinstance(p, torch.Tensor) for p in parts) and len({p.dtype for p in parts}) == 1:
            return torch.cat(parts)
        for kind in (QuantizedWeight, BlockMatrix):
            if all(isinstance(p, kind) for p in parts) and len({p.type_name for p in parts}) == 1:
                return kind.cat(parts)
        return StackedWeight(parts)
