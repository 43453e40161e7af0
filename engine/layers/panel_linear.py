"""Dense float matrices packed in column panels, multiplied by a register-tiled loop (CPU).

A weight [N, K] is stored as ``N / 16`` panels of [K, 16] (``PanelWeight``): the 16 columns of a
panel side by side for every k, one contiguous block a panel. The loop keeps a tile of up to six
activation rows by 16 outputs in registers (two 8-lane vectors a row) and walks k once: each step
loads 16 weights, broadcasts one activation element a row and does one fused multiply-add a
vector. So a loaded weight serves every row of the tile, with no horizontal sums.

Every output is one sequential chain ``acc = fma(x[m, k], w[k, n], acc)`` for k = 0 .. K-1 from
zero: its bits depend only on its own row and column, never on the tile, the number of rows, the
thread or the machine (``llvm.fma`` rounds once whatever the target). So the loop runs at every
row count and a prompt's bits never depend on the batch or the chunk it was computed in, without
the probe ``cpu_linear.rows_agree`` needs for its dot-product loop.

bfloat16 and float16 panels are widened in registers (bfloat16: the top half of a float32;
float16: the exact ``fpext``); accumulation is float32. The last panel of an N that is not a
multiple of 16 is zero-padded; its extra outputs are dropped.
"""

from __future__ import annotations

import numpy as np
import torch
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.core.extending import intrinsic

PANEL = 16  # columns a panel: two 8-lane float32 vectors
TILE_ROWS = 6  # activation rows a register tile: 12 accumulators, 2 weight vectors, 1 broadcast

_I16, _I32, _F32, _F16 = ir.IntType(16), ir.IntType(32), ir.FloatType(), ir.HalfType()
_V8F32, _V8I16, _V8I32, _V8F16 = ir.VectorType(_F32, 8), ir.VectorType(_I16, 8), ir.VectorType(_I32, 8), ir.VectorType(_F16, 8)


def _weights(builder: ir.IRBuilder, w: ir.Value, k: ir.Value, kind: str) -> tuple[ir.Value, ir.Value]:
    """The panel's 16 weights of step ``k`` as two float32 vectors (two 8-lane loads, each
    widened on its own: no shuffle between them)."""
    two_k = builder.mul(k, ir.Constant(k.type, 2))
    halves = (two_k, builder.add(two_k, ir.Constant(k.type, 1)))
    if kind == "f32":
        lanes = builder.inttoptr(w, _V8F32.as_pointer())
        return tuple(builder.load(builder.gep(lanes, [i]), align=4) for i in halves)  # type: ignore[return-value]
    if kind == "bf16":  # the top half of a float32
        bits = builder.inttoptr(w, _V8I16.as_pointer())
        wide = (builder.zext(builder.load(builder.gep(bits, [i]), align=2), _V8I32) for i in halves)
        return tuple(builder.bitcast(builder.shl(v, ir.Constant(_V8I32, [16] * 8)), _V8F32) for v in wide)  # type: ignore[return-value]
    halfs = builder.inttoptr(w, _V8F16.as_pointer())  # f16: exact widening
    return tuple(builder.fpext(builder.load(builder.gep(halfs, [i]), align=2), _V8F32) for i in halves)  # type: ignore[return-value]


def _tile(context, builder: ir.IRBuilder, sig, args: list[ir.Value], rows: int) -> ir.Value:  # type: ignore[no-untyped-def]
    """out[r, 0:16] = sum_k x[r, k] * w[k, 0:16] for r < ``rows``, each output one fma chain.
    ``out`` / ``x``: addresses of the first row, ``*_step``: bytes between rows; the panel starts
    ``offset`` bytes into the array ``panels``, whose dtype says the encoding (``_KINDS``)."""
    out, out_step, x, x_step, panels, offset, k_dim = args
    kind = _KINDS[str(sig.args[4].dtype)]
    data = context.make_array(sig.args[4])(context, builder, panels).data
    w = builder.add(builder.ptrtoint(data, offset.type), offset)
    zero = ir.Constant(_V8F32, [0.0] * 8)
    fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V8F32, [_V8F32] * 3), "llvm.fma.v8f32")
    accs = [[cgutils.alloca_once_value(builder, zero) for _ in range(2)] for _ in range(rows)]
    x_rows = [builder.inttoptr(builder.add(x, builder.mul(x_step, ir.Constant(x_step.type, r))), _F32.as_pointer()) for r in range(rows)]
    broadcast = ir.Constant(ir.VectorType(_I32, 8), [0] * 8)
    with cgutils.for_range(builder, k_dim) as loop:
        w_lo, w_hi = _weights(builder, w, loop.index, kind)
        for r in range(rows):
            one = builder.insert_element(ir.Constant(_V8F32, None), builder.load(builder.gep(x_rows[r], [loop.index])), ir.Constant(_I32, 0))
            xr = builder.shuffle_vector(one, one, broadcast)
            for half, w_half in enumerate((w_lo, w_hi)):
                builder.store(builder.call(fma, [xr, w_half, builder.load(accs[r][half])]), accs[r][half])
    for r in range(rows):
        dst = builder.inttoptr(builder.add(out, builder.mul(out_step, ir.Constant(out_step.type, r))), _V8F32.as_pointer())
        for half in range(2):
            builder.store(builder.load(accs[r][half]), builder.gep(dst, [ir.Constant(_I32, half)]), align=4)
    return ir.Constant(ir.IntType(64), 0)


# The numpy dtype a panel array is stored in -> the encoding its 16-bit or 32-bit values hold.
_KINDS = {"float32": "f32", "int16": "bf16", "uint16": "f16"}
_STORAGE = {torch.float32: np.float32, torch.bfloat16: np.int16, torch.float16: np.uint16}


def _make_tile(rows: int):  # type: ignore[no-untyped-def]
    def tile(typingctx, out, out_step, x, x_step, panels, offset, k_dim):  # type: ignore[no-untyped-def]
        sig = types.int64(types.uintp, types.intp, types.uintp, types.intp, panels, types.intp, types.intp)
        return sig, lambda context, builder, sig, args: _tile(context, builder, sig, args, rows)

    tile.__name__ = tile.__qualname__ = f"tile_{rows}_rows"
    return intrinsic(tile)


_tile_1, _tile_2, _tile_3, _tile_4, _tile_5, _tile_6 = (_make_tile(r) for r in range(1, TILE_ROWS + 1))


@njit(parallel=True, nogil=True, cache=True)
def _product(x, panels, out):  # pragma: no cover - compiled
    """out[:, 16p : 16p + 16] = x @ panel p, panels split across numba's threads, the rows of x six
    at a time (the last tile smaller). One compiled version a panel dtype."""
    m_rows, k_dim = x.shape
    x_step, out_step = x.strides[0], out.strides[0]
    panel_bytes = panels.strides[0]
    for p in prange(panels.shape[0]):
        offset = p * panel_bytes
        for m0 in range(0, m_rows, TILE_ROWS):
            o = out.ctypes.data + m0 * out_step + p * PANEL * 4
            xa = x.ctypes.data + m0 * x_step
            r = min(TILE_ROWS, m_rows - m0)
            if r == 6:
                _tile_6(o, out_step, xa, x_step, panels, offset, k_dim)
            elif r == 5:
                _tile_5(o, out_step, xa, x_step, panels, offset, k_dim)
            elif r == 4:
                _tile_4(o, out_step, xa, x_step, panels, offset, k_dim)
            elif r == 3:
                _tile_3(o, out_step, xa, x_step, panels, offset, k_dim)
            elif r == 2:
                _tile_2(o, out_step, xa, x_step, panels, offset, k_dim)
            else:
                _tile_1(o, out_step, xa, x_step, panels, offset, k_dim)


PANEL_DTYPES = tuple(_STORAGE)


class PanelWeight:
    """A dense [N, K] weight matrix packed in panels; ``cpu_linear.linear`` and ``embedding``
    use it as is. Looks enough like a weight tensor for the model code around it (``shape``,
    ``dtype``: the checkpoint's, ``device``)."""

    def __init__(self, weight: torch.Tensor) -> None:
        if weight.dim() != 2 or weight.dtype not in _STORAGE or weight.device.type != "cpu":
            raise ValueError(f"panels hold 2-D CPU float32 / bfloat16 / float16 matrices, got {tuple(weight.shape)} {weight.dtype} on {weight.device}")
        n, k = weight.shape
        self.shape = torch.Size((n, k))
        self.dtype = weight.dtype
        self.device = weight.device
        n_pad = -(-n // PANEL) * PANEL
        w = weight.detach()
        if n_pad != n:
            w = torch.cat([w, w.new_zeros(n_pad - n, k)])
        if w.dtype != torch.float32:  # the 16-bit patterns, in the numpy dtype that names them
            w = w.view(torch.int16)
        # [N/16, 16, K] -> [N/16, K, 16]: the 16 columns of a panel side by side for every k
        panels = w.reshape(n_pad // PANEL, PANEL, k).transpose(1, 2).numpy()
        self.panels = np.ascontiguousarray(panels).view(_STORAGE[weight.dtype])

    @property
    def nbytes(self) -> int:
        return self.panels.nbytes

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x [M, K] -> x @ W.T [M, N] float32, each row's bits as it gets alone."""
        x32 = np.ascontiguousarray(x.detach().float().numpy())
        n = self.shape[0]
        out = np.empty((x32.shape[0], self.panels.shape[0] * PANEL), np.float32)
        if x32.shape[0]:
            _product(x32, self.panels, out)
        result = torch.from_numpy(out)
        return result if n == out.shape[1] else result[:, :n].contiguous()

    def embedding(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows ``ids`` of the matrix (a tied embedding reads the head's panels), in its dtype."""
        index = ids.reshape(-1).cpu().numpy().astype(np.int64)
        if index.size and not 0 <= int(index.min()) <= int(index.max()) < self.shape[0]:  # padding rows are not rows
            raise IndexError(f"row ids must be in [0, {self.shape[0]}), got {int(index.min())}..{int(index.max())}")
        rows = torch.from_numpy(np.ascontiguousarray(self.panels[index // PANEL, :, index % PANEL]))
        rows = rows if self.dtype == torch.float32 else rows.view(torch.int16).view(self.dtype)
        return rows.reshape(*ids.shape, self.shape[1])

    def dense(self) -> torch.Tensor:
        """The [N, K] matrix (tests, conversions)."""
        return self.embedding(torch.arange(self.shape[0]))


def panel_weights(model: torch.nn.Module) -> list[PanelWeight]:
    """Every packed matrix ``model``'s modules hold, each once."""
    seen: dict[int, PanelWeight] = {}
    for module in model.modules():
        for value in vars(module).values():
            if isinstance(value, PanelWeight):
                seen.setdefault(id(value), value)
    return list(seen.values())


def warm_up(dtype: torch.dtype) -> None:
    """Compile (or load) the product for ``dtype`` panels with the types a forward passes it (one
    compiled version holds every tile height)."""
    weight = PanelWeight(torch.zeros(PANEL, 8, dtype=dtype))
    weight.matmul(torch.zeros(TILE_ROWS * 2 - 1, 8))
