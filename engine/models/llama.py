"""The Llama family in plain torch: Llama / SmolLM2 (tied embeddings), Qwen2 (q/k/v bias),
Mistral (GQA), one decoder block for all of them.

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

from ..layers.cpu_linear import linear
from ..layers.ggml_quants import embedding
from ..layers.layernorm import RMSNorm
from ..layers.rotary import RotaryEmbedding
from .config import ModelConfig

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
        qk, v = qkv.split([self.q_size + self.kv_size, self.kv_size], dim=-1)
        # q and k heads rotate together: one rotary application instead of two.
        qk = rotary.apply(qk.view(tokens, self.num_heads + self.num_kv_heads, self.head_dim), cos, sin)
        q, k = qk.split([self.num_heads, self.num_kv_heads], dim=1)
        out = attn.forward(q, k, v.view(tokens, self.num_kv_heads, self.head_dim), self.layer_id, batch)
        return linear(out.view(tokens, self.q_size), self.o_proj, self.o_bias)


class LlamaMLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.intermediate = cfg.intermediate_size
        self.gate_up_proj = _weight(2 * cfg.intermediate_size, cfg.hidden_size)
        self.gate_up_bias = _weight(2 * cfg.intermediate_size) if cfg.mlp_bias else None
        self.down_proj = _weight(cfg.hidden_size, cfg.intermediate_size)
        self.down_bias = _weight(cfg.hidden_size) if cfg.mlp_bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = linear(x, self.gate_up_proj, self.gate_up_bias)
        gate, up = gate_up.split(self.intermediate, dim=-1)
        return linear(F.silu(gate) * up, self.down_proj, self.down_bias)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = LlamaAttention(cfg, layer_id)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = LlamaMLP(cfg)

    def forward(self, hidden, cos, sin, rotary, attn, batch):  # type: ignore[no-untyped-def]
        # Submodules are called through .forward: no hooks are used, and nn.Module.__call__ costs
        # a measurable share of a CPU decode step (150 calls a step for 30 layers).
        hidden = hidden + self.self_attn.forward(self.input_layernorm.forward(hidden), cos, sin, rotary, attn, batch)
        return hidden + self.mlp.forward(self.post_attention_layernorm.forward(hidden))


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

    def forward(self, batch: ForwardBatch, attn: TorchAttention) -> torch.Tensor:
        """Final-normed hidden states [T, hidden] of the flat tokens of ``batch``."""
        assert self.rotary is not None, "load the model through models.loader"
        hidden = embedding(batch.input_ids, self.embed_tokens)
        cos, sin = self.rotary.cos_sin(batch.positions)
        for layer in self.layers:
            hidden = layer.forward(hidden, cos, sin, self.rotary, attn, batch)
        return self.norm.forward(hidden)

    def first_layers(self, num_layers: int) -> LlamaForCausalLM:
        """A model made of this one's first ``num_layers`` decoder layers, its final norm and its
        head, sharing their tensors: a self-speculative draft that costs no extra weights."""
        import dataclasses

        if not 1 <= num_layers <= self.config.num_layers:
            raise ValueError(f"num_layers must be in [1, {self.config.num_layers}], got {num_layers}")
        cfg = dataclasses.replace(self.config, num_layers=num_layers)
        with torch.device("meta"):
            draft = LlamaForCausalLM(dataclasses.replace(cfg, num_layers=0))
        draft.config = cfg
        for name in ("embed_tokens", "lm_head"):  # tensors, or weights kept quantized (not Parameters)
            draft._parameters.pop(name, None)
            setattr(draft, name, getattr(self, name))
        draft.layers = nn.ModuleList(self.layers[:num_layers])
        draft.norm = self.norm
        draft.rotary = self.rotary
        return draft.eval()
