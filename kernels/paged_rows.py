"""Which slots of a paged KV pool each query row reads: the layout every paged-attention kernel takes.

Row ``b`` attends to slots ``kv_index[kv_start[b] : kv_start[b] + kv_len[b]]`` (int64 tensors on
the pool's device, every row at least one slot, no padding). Imports only torch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PagedRows:
    kv_index: torch.Tensor  # the rows' slots, one row after another
    kv_start: torch.Tensor  # [rows]
    kv_len: torch.Tensor  # [rows]
    # The longest row, when the caller knows it: spares a kernel a device read of kv_len.
    max_len: int | None = None

    def longest(self) -> int:
        return int(self.kv_len.max()) if self.max_len is None else self.max_len
