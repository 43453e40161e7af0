"""The decoder-only transformer of every supported family, in plain torch: Llama / SmolLM2 (tied
embeddings), Qwen2 (q/k/v bias), Mistral (GQA, sliding window), Qwen3 (RMSNorm on q and k per
head), Gemma 2 / 3 (scaled embeddings, GeGLU, norms before and after attention and MLP, soft-capped
scores and logits, alternating sliding-window / global layers with their own RoPE bases), Phi-3 /
Phi-4 (LongRoPE, partial rotary) and the mixtures of experts of ``models.moe``. One decoder block
takes the family's differences from ``ModelConfig`` fields; nothing is looked up by family name.

Weights are stored fused where the math allows one matmul instead of several: ``qkv_proj`` holds
q, k and v stacked, ``gate_up_proj`` holds gate and up. On the CPU a decode step is bound by
reading the weights once; fewer, larger matmuls also mean fewer Python-side calls per layer.
The forward takes the flat tokens of a ``ForwardBatch`` (no batch dimension, no padding) and
returns final-normed hidden states [T, hidden]; the logits head lives in ``layers.logits``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from ..layers import row_ops
from ..layers.activation import activation
from ..layers.cpu_linear import linear
from ..layers.ggml_quants import embedding
from ..layers.layernorm import RMSNorm
from ..layers.rotary import RotaryEmbedding
from .config import ModelConfig
from .moe import SparseMoeBlock
from .row_forward import RowForward

if TYPE_CHECKING:
    from ..layers.attention import TorchAttention
    from ..forward.forward_batch import ForwardBatch


def _weight(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(shape), requires_grad=False)


class LlamaAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_size = cfg.num_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        self.qkv_proj = _weight(self.q_size + 2 * self.kv_size, cfg.hidden_size)
        self.qkv_bias = _weight(self.q_size + 2 * self.kv_size) if cfg.qkv_bias else None
        self.o_proj = _weight(cfg.hidden_size, self.q_size)
        self.o_bias = _weight(cfg.hidden_size) if cfg.o_bias else None
        self.qk_norm = cfg.qk_norm
        if cfg.qk_norm == "head":
            self.q_norm, self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps), RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        elif cfg.qk_norm == "full":
            self.q_norm, self.k_norm = RMSNorm(self.q_size, cfg.rms_norm_eps), RMSNorm(self.kv_size, cfg.rms_norm_eps)
        self.window = cfg.window(layer_id)
        self.scale = cfg.attn_scale
        self.softcap = cfg.attn_softcap

    def forward(
        self,
        hidden: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        rotary: RotaryEmbedding,
        attn: TorchAttention,
        batch: ForwardBatch,
    ) -> torch.Tensor:
        tokens = hidden.shape[0]
        qkv = linear(hidden, self.qkv_proj, self.qkv_bias)
        if self.qk_norm is None:
            qk, v = qkv.split([self.q_size + self.kv_size, self.kv_size], dim=-1)
            qk = qk.view(tokens, self.num_heads + self.num_kv_heads, self.head_dim)
        else:
            q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
            if self.qk_norm == "head":
                q = self.q_norm.forward(q.reshape(tokens, self.num_heads, self.head_dim))
                k = self.k_norm.forward(k.reshape(tokens, self.num_kv_heads, self.head_dim))
            else:
                q, k = self.q_norm.forward(q), self.k_norm.forward(k)
            qk = torch.cat([q.reshape(tokens, -1, self.head_dim), k.reshape(tokens, -1, self.head_dim)], dim=1)
        # q and k heads rotate together: one rotary application instead of two.
        qk = rotary.apply(qk, cos, sin)
        q, k = qk.split([self.num_heads, self.num_kv_heads], dim=1)
        v = v.reshape(tokens, self.num_kv_heads, self.head_dim)
        if self.window is None and self.scale is None and self.softcap is None:
            out = attn.forward(q, k, v, self.layer_id, batch)
        else:
            out = attn.forward(q, k, v, self.layer_id, batch, window=self.window, scale=self.scale, softcap=self.softcap)
        return linear(out.reshape(tokens, self.q_size), self.o_proj, self.o_bias)


class LlamaMLP(nn.Module):
    def __init__(self, cfg: ModelConfig, intermediate_size: int | None = None) -> None:
        super().__init__()
        self.intermediate = intermediate_size or cfg.intermediate_size
        self.act = cfg.hidden_act
        self.gate_up_proj = _weight(2 * self.intermediate, cfg.hidden_size)
        self.gate_up_bias = _weight(2 * self.intermediate) if cfg.mlp_bias else None
        self.down_proj = _weight(cfg.hidden_size, self.intermediate)
        self.down_bias = _weight(cfg.hidden_size) if cfg.mlp_bias else None
        self.row_kernel = False  # quantized models: silu(gate) * up in one compiled loop

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = linear(x, self.gate_up_proj, self.gate_up_bias)
        if self.row_kernel and self.act == "silu" and gate_up.dtype == torch.float32:
            return linear(row_ops.silu_and_mul(gate_up), self.down_proj, self.down_bias)
        gate, up = gate_up.split(self.intermediate, dim=-1)
        return linear(activation(self.act, gate) * up, self.down_proj, self.down_bias)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int) -> None:
        super().__init__()
        eps = cfg.rms_norm_eps
        self.input_layernorm = RMSNorm(cfg.hidden_size, eps)
        self.self_attn = LlamaAttention(cfg, layer_id)
        # Llama: post_attention_layernorm is the MLP's input norm. Gemma (sandwich): it normalizes
        # the attention output, and pre/post_feedforward_layernorm wrap the MLP.
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, eps)
        self.sandwich = cfg.sandwich_norm
        if cfg.sandwich_norm:
            self.pre_feedforward_layernorm = RMSNorm(cfg.hidden_size, eps)
            self.post_feedforward_layernorm = RMSNorm(cfg.hidden_size, eps)
        if cfg.moe is not None and cfg.moe.sparse_layers[layer_id]:
            shared = LlamaMLP(cfg, cfg.moe.shared_intermediate_size) if cfg.moe.shared_intermediate_size else None
            self.mlp: nn.Module = SparseMoeBlock(cfg, layer_id, shared)
        else:
            self.mlp = LlamaMLP(cfg)

    def forward(self, hidden, cos, sin, rotary, attn, batch):  # type: ignore[no-untyped-def]
        # Submodules are called through .forward: no hooks are used, and nn.Module.__call__ costs
        # a measurable share of a CPU decode step (150 calls a step for 30 layers).
        attn_out = self.self_attn.forward(self.input_layernorm.forward(hidden), cos, sin, rotary, attn, batch)
        if not self.sandwich:
            hidden = hidden + attn_out
            return hidden + self.mlp.forward(self.post_attention_layernorm.forward(hidden))
        hidden = hidden + self.post_attention_layernorm.forward(attn_out)
        mlp_out = self.mlp.forward(self.pre_feedforward_layernorm.forward(hidden))
        return hidden + self.post_feedforward_layernorm.forward(mlp_out)


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embed_tokens = _weight(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        # Tied models point lm_head at embed_tokens after loading (one tensor, not two).
        self.lm_head = self.embed_tokens if cfg.tie_word_embeddings else _weight(cfg.vocab_size, cfg.hidden_size)
        self.rotary: RotaryEmbedding | None = None  # built by the loader, in the model's dtype
        self.rotary_local: RotaryEmbedding | None = None  # Gemma 3's sliding layers, when they differ
        self._local = [cfg.local_rope is not None and cfg.window(i) is not None for i in range(cfg.num_layers)]
        self.row_forward: RowForward | None = None  # quantized models on the CPU: see use_row_kernels

    def forward(self, batch: ForwardBatch, attn: TorchAttention) -> torch.Tensor:
        """Final-normed hidden states [T, hidden] of the flat tokens of ``batch``."""
        assert self.rotary is not None, "load the model through models.loader"
        hidden = embedding(batch.input_ids, self.embed_tokens)
        if hidden.dtype != self.norm.weight.dtype:  # a block-format embedding on a GPU dequantizes to float32
            hidden = hidden.to(self.norm.weight.dtype)
        if self.config.embed_scale is not None:
            # transformers multiplies by the scale rounded to the weights' dtype
            hidden = hidden * torch.tensor(self.config.embed_scale, dtype=hidden.dtype)
        rows = (batch.seq_lens_cpu, batch.extend_seq_lens_cpu)  # LongRoPE picks its table per row
        cos, sin = self.rotary.cos_sin(batch.positions, *rows)
        local = self.rotary_local.cos_sin(batch.positions, *rows) if self.rotary_local is not None else None
        tables = [(local[0], local[1], self.rotary_local) if local is not None and local_layer else (cos, sin, self.rotary)
                  for local_layer in self._local]  # fmt: skip
        if self.row_forward is not None and hidden.dtype == torch.float32 and hidden.device.type == "cpu":
            hidden = self.row_forward.forward(batch, attn, hidden, tables)
        else:
            for layer, (layer_cos, layer_sin, rotary) in zip(self.layers, tables):
                hidden = layer.forward(hidden, layer_cos, layer_sin, rotary, attn, batch)
            hidden = self.norm.forward(hidden)
        if batch.capture_routed_experts:
            blocks = [layer.mlp for layer in self.layers if isinstance(layer.mlp, SparseMoeBlock)]
            if blocks:
                ids = torch.stack([b.last_ids for b in blocks], dim=1)  # type: ignore[misc]
                weights = torch.stack([b.last_weights for b in blocks], dim=1)  # type: ignore[misc]
                batch.routed_experts = (ids, weights)
        return hidden

    def use_row_kernels(self) -> None:
        """Run the norms, the rotary and the SwiGLU activation as ``row_ops``' compiled loops
        (quantized models: their 8-bit activation blocks need every row's bits fixed whatever
        the batch, and a decode step is mostly the dispatch of these small operations), and the
        decoder layers on numpy arrays between those loops (``models.row_forward``)."""
        for module in self.modules():
            if hasattr(module, "row_kernel"):
                module.row_kernel = True
        for rotary in (self.rotary, self.rotary_local):
            if rotary is not None:
                rotary.row_kernel = True
        self.row_forward = RowForward(self)

    def first_layers(self, num_layers: int) -> LlamaForCausalLM:
        """A model made of this one's first ``num_layers`` decoder layers, its final norm and its
        head, sharing their tensors: a self-speculative draft that costs no extra weights."""
        import dataclasses

        if not 1 <= num_layers <= self.config.num_layers:
            raise ValueError(f"num_layers must be in [1, {self.config.num_layers}], got {num_layers}")
        windows = self.config.layer_windows[:num_layers]
        moe = self.config.moe
        if moe is not None:
            moe = dataclasses.replace(moe, sparse_layers=moe.sparse_layers[:num_layers])
        cfg = dataclasses.replace(self.config, num_layers=num_layers, layer_windows=windows, moe=moe)
        with torch.device("meta"):
            draft = LlamaForCausalLM(dataclasses.replace(cfg, num_layers=0, layer_windows=(), moe=None))
        draft.config = cfg
        for name in ("embed_tokens", "lm_head"):  # tensors, or weights kept quantized (not Parameters)
            draft._parameters.pop(name, None)
            setattr(draft, name, getattr(self, name))
        draft.layers = nn.ModuleList(self.layers[:num_layers])
        draft.norm = self.norm
        draft.rotary = self.rotary
        draft.rotary_local = self.rotary_local
        draft._local = self._local[:num_layers]
        if self.row_forward is not None:
            draft.row_forward = RowForward(draft)
        return draft.eval()
