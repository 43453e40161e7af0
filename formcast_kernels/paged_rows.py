"""Which slots of a paged KV pool each query row reads: the layout every paged-attention kernel takes.

Row ``b`` attends to slots ``kv_index[kv_start[b] : kv_start[b] + kv_len[b]]`` (int64 tensors on
the pool's device, every row at least one slot, no padding). Imports only torch.
"""

from __future__ import annotations

import torch


class PagedRows:
    """(A plain class: this package imports nothing beyond torch and triton.)"""

    __slots__ = ("kv_index", "kv_start", "kv_len", "max_len")

    def __init__(self, kv_index: torch.Tensor, kv_start: torch.Tensor, kv_len: torch.Tensor, max_len: int | None = None) -> None:
        self.kv_index = kv_index  # the rows' slots, one row after another
        self.kv_start = kv_start  # [rows]
        self.kv_len = kv_len  # [rows]
        # The longest row, when the caller knows it: spares a kernel a device read of kv_len.
        self.max_len = max_len

    def longest(self) -> int:
        return int(self.kv_len.max()) if self.max_len is None else self.max_len
