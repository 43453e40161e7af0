"""Dense matrices of a CPU model packed in column panels at load (``layers.panel_linear``).

Each float32 / bfloat16 / float16 matrix the forward multiplies (``weight_quantization
.matrix_slots``: fused q/k/v, o, fused gate/up, down, the output head and with it a tied
embedding) becomes a ``PanelWeight``: the same values, laid out so that the CPU product keeps a
tile of activation rows in registers. A batch of 8 or a verification of 5 rows then costs little
more than one row, and every row's bits are what it gets alone at any row count (prefill
included), so no dtype needs the row-invariant switch of ``cpu_linear``. The panels replace the
tensors (no second copy); a tied embedding reads its rows from the head's panels.

What stays a tensor: norms, biases, routers, the stacked experts of a mixture of experts
(``cpu_moe`` has its own loops) and matrices kept in a block format (GGUF, ``quantization=``).
"""

from __future__ import annotations

import torch
from torch import nn

from ..layers.panel_linear import PANEL_DTYPES, PanelWeight
from .weight_quantization import matrix_slots, replace_matrix


def pack_model(model: nn.Module) -> int:
    """Pack ``model``'s dense CPU matrices in place; the number of matrices packed."""
    packed: dict[int, PanelWeight] = {}  # id(tensor) -> its panels: a tied head is packed once
    tied = model.embed_tokens is model.lm_head
    count = 0
    for owner, name, _ in matrix_slots(model):
        weight = getattr(owner, name, None)
        if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or weight.dtype not in PANEL_DTYPES or weight.device.type != "cpu":
            continue
        if id(weight) not in packed:
            packed[id(weight)] = PanelWeight(weight)
        replace_matrix(owner, name, packed[id(weight)])
        count += 1
    if tied and isinstance(model.lm_head, PanelWeight):
        replace_matrix(model, "embed_tokens", model.lm_head)
    return count
