"""The two pools behind the paged KV cache (SGLang's split, page size 1).

* ``ReqToTokenPool``: a request slot is a row of ``req_to_token`` [slots, context_len]; entry
  ``[r, i]`` is the KV slot holding token ``i`` of request ``r``.
* ``TokenToKVPool``: K and V buffers per layer, ``[kv_slots + 1, kv_heads, head_dim]``, and the
  allocator of their slots. Slot 0 is never handed out: it stays zero, and attention points padding
  at it, so a padded row reads finite zeros instead of whatever a freed slot held.

Allocation never raises in the hot path: ``alloc`` returns ``None`` when the pool is short and the
scheduler decides (wait, retract, evict). Freeing is exact and checked: freeing a slot that is not
allocated raises, because a double free would hand one token's memory to two requests.

A float32 pool on the CPU takes a forward's new K and V in one compiled loop (``set_kv``): two
``index_copy_`` calls cost 28 µs a layer in a SmolLM2 decode step, a thirtieth of it. The pool
runs it once at construction (zeros into slot 0, which stays zero), so no request compiles it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from numba import njit


@njit(nogil=True, cache=True, boundscheck=False)
def _copy_kv(k_pool, v_pool, locs, k, v):  # pragma: no cover - compiled
    """Rows ``locs`` of one layer's pools [slots, kv_heads, dim] take k and v [T, kv_heads, dim]."""
    tokens, heads, dim = k.shape
    for t in range(tokens):
        slot = locs[t]
        for h in range(heads):
            for j in range(dim):
                k_pool[slot, h, j] = k[t, h, j]
                v_pool[slot, h, j] = v[t, h, j]


def _rows(x: torch.Tensor) -> np.ndarray:
    return x.float().contiguous().numpy()


class KVPoolError(RuntimeError):
    """A slot freed twice or never allocated: an internal bookkeeping bug, never user input."""


class ReqToTokenPool:
    def __init__(self, size: int, context_len: int, device: torch.device | str = "cpu") -> None:
        if size < 1 or context_len < 1:
            raise ValueError(f"ReqToTokenPool needs size >= 1 and context_len >= 1, got {size}, {context_len}")
        self.size = size
        self.context_len = context_len
        self.req_to_token = torch.zeros((size, context_len), dtype=torch.int64, device=device)
        self._free: list[int] = list(range(size - 1, -1, -1))  # pop() hands out slot 0 first
        self._in_use = [False] * size

    def available_size(self) -> int:
        return len(self._free)

    def alloc(self, n: int = 1) -> list[int] | None:
        if n > len(self._free):
            return None
        slots = [self._free.pop() for _ in range(n)]
        for s in slots:
            self._in_use[s] = True
        return slots

    def free(self, slots: int | Sequence[int]) -> None:
        for s in [slots] if isinstance(slots, int) else slots:
            if not self._in_use[s]:
                raise KVPoolError(f"request slot {s} freed but not allocated")
            self._in_use[s] = False
            self._free.append(s)

    def write(self, slot: int, start: int, locs: torch.Tensor) -> None:
        """Record that tokens ``start .. start+len(locs)-1`` of the request in ``slot`` live at ``locs``."""
        self.req_to_token[slot, start : start + locs.numel()] = locs


class TokenSlotAllocator:
    """Free list of KV slots ``1 .. size``. Frees are batched and sorted back in before the next
    allocation, so a request's tokens tend to sit in adjacent slots (cheaper gathers)."""

    def __init__(self, size: int, device: torch.device | str = "cpu") -> None:
        self.size = size
        self.device = torch.device(device)
        self._free = torch.arange(1, size + 1, dtype=torch.int64, device=self.device)
        self._released: list[torch.Tensor] = []
        self._released_count = 0
        self._in_use = torch.zeros(size + 1, dtype=torch.bool, device=self.device)

    def available_size(self) -> int:
        return self._free.numel() + self._released_count

    def alloc(self, n: int) -> torch.Tensor | None:
        if n > self.available_size():
            return None
        if n > self._free.numel():
            self._merge_released()
        out, self._free = self._free[:n], self._free[n:]
        self._in_use[out] = True
        return out

    def free(self, locs: torch.Tensor) -> None:
        if locs.numel() == 0:
            return
        locs = locs.to(self.device, torch.int64)
        if not bool(self._in_use[locs].all()) or locs.unique().numel() != locs.numel():
            raise KVPoolError("KV slots freed twice or never allocated")
        self._in_use[locs] = False
        self._released.append(locs)
        self._released_count += locs.numel()

    def _merge_released(self) -> None:
        self._free = torch.cat([self._free, *self._released]).sort().values
        self._released.clear()
        self._released_count = 0


class TokenToKVPool:
    """K and V buffers of every layer, plus the allocator of their slots."""

    def __init__(
        self,
        size: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
    ) -> None:
        if size < 1:
            raise ValueError(f"the KV pool needs at least one slot, got {size}")
        self.size = size
        self.dtype = dtype
        self.device = torch.device(device)
        self.allocator = TokenSlotAllocator(size, self.device)
        shape = (num_layers, size + 1, num_kv_heads, head_dim)
        # empty, not zeros: touching gigabytes at start-up costs seconds; only slot 0 is read unwritten.
        self.k_buffer = torch.empty(shape, dtype=dtype, device=self.device)
        self.v_buffer = torch.empty(shape, dtype=dtype, device=self.device)
        self.k_buffer[:, 0].zero_()
        self.v_buffer[:, 0].zero_()
        self.compiled_copy = dtype == torch.float32 and self.device.type == "cpu"
        self._arrays: tuple[np.ndarray, np.ndarray] | None = None  # numpy views, made on first use
        if self.compiled_copy:  # compiles or loads the loop now, with a forward's array types
            zeros = torch.zeros(1, num_kv_heads, head_dim)
            self.set_kv(0, torch.zeros(1, dtype=torch.int64), zeros, zeros)

    def available_size(self) -> int:
        return self.allocator.available_size()

    def alloc(self, n: int) -> torch.Tensor | None:
        return self.allocator.alloc(n)

    def free(self, locs: torch.Tensor) -> None:
        self.allocator.free(locs)

    def set_kv(self, layer: int, locs: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        if self.compiled_copy:
            _copy_kv(self.k_buffer[layer].numpy(), self.v_buffer[layer].numpy(), locs.numpy(), _rows(k), _rows(v))
            return
        self.k_buffer[layer].index_copy_(0, locs, k.to(self.dtype))
        self.v_buffer[layer].index_copy_(0, locs, v.to(self.dtype))

    def set_kv_arrays(self, layer: int, locs: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
        """``set_kv`` of a float32 CPU pool from numpy arrays (C-ordered k, v [T, kv_heads, dim],
        int64 ``locs``): the numpy forward of quantized models (``models.row_forward``)."""
        k_pool, v_pool = self.layer_arrays(layer)
        _copy_kv(k_pool, v_pool, locs, k, v)

    def layer_arrays(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """Layer ``layer``'s K and V buffers as numpy views (float32 CPU pool)."""
        assert self.compiled_copy, "numpy views of a float32 CPU pool only"
        if self._arrays is None:
            self._arrays = (self.k_buffer.numpy(), self.v_buffer.numpy())
        return self._arrays[0][layer], self._arrays[1][layer]

    @staticmethod
    def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        return 2 * num_layers * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()
