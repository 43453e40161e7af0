"""The experts of a mixture-of-experts layer: each token's ``top_k`` chosen gated experts, summed
with its router weights.

``fused_moe`` dispatches by device: the Triton grouped GEMM (``fused_moe_triton``) on CUDA, and
``fused_moe_reference`` elsewhere (the (token, choice) pairs grouped by expert, one torch
``F.linear`` pair per chosen expert, the plainest correct form; what the kernel is tested against).

Layout (transformers 5's stacked experts): ``gate_up`` [E, 2I, H] holds each expert's gate rows
then its up rows; ``down`` [E, H, I]. ``act``: ``"silu"`` (SwiGLU) or ``"gelu_tanh"`` (GeGLU).
Imports only torch (triton lazily, on CUDA).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

ACTIVATIONS = ("silu", "gelu_tanh")


def fused_moe(
    x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, act: str = "silu"
) -> torch.Tensor:
    """x [T, H], ids [T, k] expert ids, weights [T, k] (any float dtype) -> [T, H] in x's dtype."""
    if act not in ACTIVATIONS:
        raise ValueError(f"act must be one of {ACTIVATIONS}, got {act!r}")
    if x.device.type == "cuda":
        from .fused_moe_triton import fused_moe_triton

        return fused_moe_triton(x, gate_up, down, ids, weights, act)
    return fused_moe_reference(x, gate_up, down, ids, weights, act)


def _act(act: str, x: torch.Tensor) -> torch.Tensor:
    return F.silu(x) if act == "silu" else F.gelu(x, approximate="tanh")


def fused_moe_reference(
    x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, act: str = "silu"
) -> torch.Tensor:
    top_k, inter = ids.shape[1], down.shape[2]
    out = torch.zeros_like(x)
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=gate_up.shape[0]).tolist()
    tokens = order // top_k
    scale = weights.reshape(-1)[order].to(x.dtype).unsqueeze(1)
    start = 0
    for expert, n in enumerate(counts):
        if n == 0:
            continue
        rows = tokens[start : start + n]
        gate, up = F.linear(x.index_select(0, rows), gate_up[expert]).split(inter, dim=-1)
        ye = F.linear(_act(act, gate) * up, down[expert])
        out.index_add_(0, rows, ye * scale[start : start + n])
        start += n
    return out
