"""A mixture-of-experts layer's chosen experts on the CPU as two compiled loops (numba), for
decode-sized batches.

Per-expert ``cpu_linear`` calls cost two parallel loops and a dozen small torch ops for every
chosen expert of every layer: at batch 1 with 8 chosen experts, 16 thread fork/joins per layer,
which on a busy machine made the MoE step cost three times a dense model of its active size. Here
the (token, choice) pairs are grouped by expert (``group_pairs``) and one parallel loop runs every
group's gate/up rows (the activation applied in the loop), a second every group's down rows
(scaled by the router weight), each over (group, block of output rows) tasks, so each chosen
expert's weights are read once per step and the threads fork twice per layer. The k
contributions of each token are summed in torch afterwards.

Float32 accumulation and activation (SiLU or GELU-tanh); weights float32 or bfloat16 (rows
widened as ``cpu_linear`` does). ``available(x, weight)`` says when the layer should use it: at
most ``cpu_linear.MAX_ROWS_F32`` tokens (beyond, torch's GEMM per expert has the reuse to win).
"""

from __future__ import annotations

import numpy as np
import torch

from .cpu_linear import MAX_ROWS_F32, njit

_BLOCK = 32  # output rows per parallel task



def _widen(w_row, buf):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled, see the overload
    """buf[:] = the weight row as float32 (bfloat16 rows come as their uint16 bits)."""
    raise NotImplementedError


if njit is not None:
    from numba import prange, types
    from numba.extending import overload

    @overload(_widen, inline="always")
    def _widen_typed(w_row, buf):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
        if w_row.dtype == types.uint16:

            def widen_bits(w_row, buf):  # type: ignore[no-untyped-def]
                bits = buf.view(np.uint32)
                for k in range(w_row.shape[0]):
                    bits[k] = np.uint32(w_row[k]) << np.uint32(16)

            return widen_bits

        def copy(w_row, buf):  # type: ignore[no-untyped-def]
            for k in range(w_row.shape[0]):
                buf[k] = w_row[k]

        return copy

    @njit(parallel=True, fastmath=True, nogil=True, cache=True, boundscheck=False)
    def _gate_up(x, w, tokens, starts, experts, inter, gelu, h):  # pragma: no cover - compiled
        """h[p, n] = act(x[tokens[p]] . w[e, n]) * (x[tokens[p]] . w[e, inter + n]) for the pairs
        p of each group (starts[g]:starts[g+1], expert experts[g]); w [E, 2I, H]."""
        groups = experts.shape[0]
        blocks = (inter + _BLOCK - 1) // _BLOCK
        hidden = x.shape[1]
        for task in prange(groups * blocks):
            g, blk = task // blocks, task % blocks
            e = experts[g]
            gate_row = np.empty(hidden, dtype=np.float32)
            up_row = np.empty(hidden, dtype=np.float32)
            for n in range(blk * _BLOCK, min(inter, blk * _BLOCK + _BLOCK)):
                _widen(w[e, n], gate_row)
                _widen(w[e, inter + n], up_row)
                for p in range(starts[g], starts[g + 1]):
                    t = tokens[p]
                    a = np.float32(0.0)
                    b = np.float32(0.0)
                    for k in range(hidden):
                        a += x[t, k] * gate_row[k]
                        b += x[t, k] * up_row[k]
                    if gelu:
                        act = np.float32(0.5) * a * (np.float32(1.0) + np.tanh(np.float32(0.7978845608028654) * (a + np.float32(0.044715) * a * a * a)))
                    else:
                        act = a / (np.float32(1.0) + np.exp(-a))
                    h[p, n] = act * b

    @njit(parallel=True, fastmath=True, nogil=True, cache=True, boundscheck=False)
    def _down(h, w, scale, starts, experts, out):  # pragma: no cover - compiled
        """out[p, n] = scale[p] * (h[p] . w[e, n]) for the pairs of each group; w [E, H, I]."""
        groups = experts.shape[0]
        hidden, inter = w.shape[1], w.shape[2]
        blocks = (hidden + _BLOCK - 1) // _BLOCK
        for task in prange(groups * blocks):
            g, blk = task // blocks, task % blocks
            e = experts[g]
            row = np.empty(inter, dtype=np.float32)
            for n in range(blk * _BLOCK, min(hidden, blk * _BLOCK + _BLOCK)):
                _widen(w[e, n], row)
                for p in range(starts[g], starts[g + 1]):
                    acc = np.float32(0.0)
                    for k in range(inter):
                        acc += h[p, k] * row[k]
                    out[p, n] = acc * scale[p]


def available(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return (
        njit is not None and x.device.type == "cpu" and x.dim() == 2 and 0 < x.shape[0] <= MAX_ROWS_F32
        and type(weight) in (torch.Tensor, torch.nn.Parameter) and weight.dtype in (torch.float32, torch.bfloat16)
        and weight.is_contiguous() and not torch.is_grad_enabled()
    )  # fmt: skip


def group_pairs(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(pair order sorted by expert, group starts [G + 1], expert per group [G]) of ids [T, k]."""
    flat = ids.reshape(-1)
    order = np.argsort(flat, kind="stable")
    sorted_ids = flat[order]
    cut = np.flatnonzero(np.diff(sorted_ids)) + 1
    starts = np.concatenate(([0], cut, [flat.shape[0]])).astype(np.int64)
    return order.astype(np.int64), starts, sorted_ids[starts[:-1]].astype(np.int64)


def _bits(w: torch.Tensor) -> np.ndarray:
    return w.view(torch.uint16).numpy() if w.dtype == torch.bfloat16 else w.numpy()


def moe_experts(
    x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, act: str
) -> torch.Tensor:
    """x [T, H], gate_up [E, 2I, H], down [E, H, I], ids / weights [T, k] -> [T, H] in x's dtype."""
    tokens, top_k = ids.shape
    inter = down.shape[2]
    order, starts, experts = group_pairs(ids.numpy())
    x32 = x.float().contiguous().numpy()
    h = np.empty((order.shape[0], inter), dtype=np.float32)
    _gate_up(x32, _bits(gate_up), order // top_k, starts, experts, inter, act == "gelu_tanh", h)
    scale = weights.float().reshape(-1).numpy()[order]
    y = np.empty((order.shape[0], x.shape[1]), dtype=np.float32)
    _down(h, _bits(down), np.ascontiguousarray(scale), starts, experts, y)
    per_pair = torch.empty(order.shape[0], x.shape[1], dtype=torch.float32)
    per_pair[torch.from_numpy(order)] = torch.from_numpy(y)  # back to (token, choice) order
    return per_pair.view(tokens, top_k, -1).sum(dim=1).to(x.dtype)


def warm_up(weight_dtype: torch.dtype) -> None:
    """Compile (or load) both loops for ``weight_dtype`` weights on tiny arrays of a forward's types."""
    if njit is None or weight_dtype not in (torch.float32, torch.bfloat16):
        return
    w_dtype = np.uint16 if weight_dtype == torch.bfloat16 else np.float32
    zero = np.zeros(1, np.int64)
    starts = np.array([0, 1], np.int64)
    h = np.empty((1, 2), np.float32)
    _gate_up(np.ones((1, 4), np.float32), np.zeros((1, 4, 4), w_dtype), zero, starts, zero, 2, False, h)
    _down(h, np.zeros((1, 4, 2), w_dtype), np.ones(1, np.float32), starts, zero, np.empty((1, 4), np.float32))
