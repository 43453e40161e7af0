"""The sparse MLP of the mixture-of-experts families: Qwen2-MoE (with a shared expert and its
sigmoid gate), Qwen3-MoE, Mixtral and OLMoE.

A router (one linear layer, softmax in float32) picks ``top_k`` experts per token; their weights
are renormalized to sum to one where the family does (``norm_topk_prob``; always for Mixtral).
Experts are stacked: ``gate_up_proj`` [E, 2I, H] and ``down_proj`` [E, H, I]. The expert path
groups the (token, choice) pairs by expert and runs each chosen expert once over its tokens, so a
step reads only the chosen experts' weights: at batch 1 about top_k / num_experts of the expert
bytes, which is what makes a sparse model's decode step cost like a dense model of its active size.
On the CPU, a decode-sized batch runs every chosen expert in two compiled loops (``layers.cpu_moe``:
gate/up with the activation, then down, over (expert group, output block) tasks); a prefill
runs each chosen expert as two ``cpu_linear.linear`` calls over its tokens. On CUDA the experts
run as ``formcast_kernels.fused_moe``'s Triton grouped GEMM instead (the same grouping, one launch for
gate/up with the activation and one for down, every chosen expert in it), when the stacked
weights are plain tensors (GGUF experts kept quantized take the per-expert path).

Every forward keeps its routing (``last_ids`` [T, top_k] int64, ``last_weights`` [T, top_k]) on
the block: the tensors exist anyway, so recording costs nothing, and the model collects them only
when a batch asks for routed experts (``ForwardBatch.capture_routed_experts``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from formcast_kernels.fused_moe import fused_moe

from ..layers import cpu_moe
from ..layers.activation import activation
from ..layers.cpu_linear import linear
from .config import ModelConfig


def _weight(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(shape), requires_grad=False)


def route(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [T, k] float32, expert ids [T, k]) of the ``top_k`` largest softmax probabilities,
    in descending order, as transformers' routers compute them."""
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


class SparseMoeBlock(nn.Module):
    """``shared_expert``: the dense MLP every token also runs (Qwen2-MoE), built by the caller."""

    def __init__(self, cfg: ModelConfig, layer_id: int, shared_expert: nn.Module | None = None) -> None:
        super().__init__()
        assert cfg.moe is not None
        moe = cfg.moe
        self.layer_id = layer_id
        self.num_experts, self.top_k, self.renormalize = moe.num_experts, moe.top_k, moe.norm_topk_prob
        self.intermediate = moe.intermediate_size
        self.act = cfg.hidden_act
        self.gate = _weight(moe.num_experts, cfg.hidden_size)  # the router
        self.gate_up_proj = _weight(moe.num_experts, 2 * moe.intermediate_size, cfg.hidden_size)
        self.down_proj = _weight(moe.num_experts, cfg.hidden_size, moe.intermediate_size)
        self.shared_expert = shared_expert
        if shared_expert is not None:
            self.shared_expert_gate = _weight(1, cfg.hidden_size)
        self.last_ids: torch.Tensor | None = None
        self.last_weights: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The router stays in torch's F.linear, the op transformers runs: its logits decide
        # discrete choices, so they should not differ in the last bits from the reference.
        weights, ids = route(F.linear(x, self.gate), self.top_k, self.renormalize)
        self.last_ids, self.last_weights = ids, weights
        out = self.experts(x, ids, weights.to(x.dtype))
        if self.shared_expert is not None:
            shared = self.shared_expert.forward(x)
            out = out + torch.sigmoid(F.linear(x, self.shared_expert_gate)) * shared
        return out

    def experts(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """Sum over each token's chosen experts of weight * expert(token)."""
        if x.device.type == "cuda" and all(type(w) in (torch.Tensor, nn.Parameter) for w in (self.gate_up_proj, self.down_proj)):
            return fused_moe(x, self.gate_up_proj, self.down_proj, ids, weights, self.act)
        if cpu_moe.available(x, self.gate_up_proj) and cpu_moe.available(x, self.down_proj):
            return cpu_moe.moe_experts(x, self.gate_up_proj, self.down_proj, ids, weights, self.act)
        return self.experts_on_cpu(x, ids, weights)

    def experts_on_cpu(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """One pass per chosen expert over the tokens that chose it (``cpu_linear.linear``, which
        multiplies weights kept in a ggml block format with their own kernels)."""
        out = torch.zeros_like(x)
        flat = ids.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=self.num_experts).tolist()
        tokens = order // self.top_k
        scale = weights.reshape(-1)[order].unsqueeze(1)
        start = 0
        for expert, n in enumerate(counts):
            if n == 0:
                continue
            rows = tokens[start : start + n]
            gate_up = linear(x.index_select(0, rows), self.gate_up_proj[expert])
            gate, up = gate_up.split(self.intermediate, dim=-1)
            ye = linear(activation(self.act, gate) * up, self.down_proj[expert])
            out.index_add_(0, rows, ye * scale[start : start + n])
            start += n
        return out
