"""The gated MLPs' activations by config name: SiLU (SwiGLU: Llama, Qwen, Mistral, Phi, the MoE
families) and GELU in its tanh form (GeGLU: Gemma's ``gelu_pytorch_tanh``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def activation(name: str, x: torch.Tensor) -> torch.Tensor:
    return F.silu(x) if name == "silu" else F.gelu(x, approximate="tanh")
