"""RMSNorm computed in float32, then cast back, as the Llama family is trained (and as
``transformers`` computes it, so logits agree to 1e-5). One fused ``rms_norm`` call per use: a
decode step runs 61 of them, and on the CPU each separate elementwise op costs a dispatch.
``row_kernel`` (quantized models): the compiled loop of ``row_ops`` instead."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from . import row_ops


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)
        self.eps = eps
        self.row_kernel = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:
            if self.row_kernel:
                return row_ops.rms_norm(x, self.weight, self.eps)
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        normed = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype)
        return self.weight * normed
