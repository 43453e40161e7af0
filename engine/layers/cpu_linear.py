"""Linear layers on the CPU: the entry point for every matrix, and a compiled loop for the
float tensors that reach it unpacked.

A model loaded for the CPU holds its dense matrices as ``panel_linear.PanelWeight`` (packed at
load by ``models.weight_panels``) or in a ggml block format (``ggml_quants``); ``linear`` hands
those to their own products. What follows is the loop for plain float tensors: models built
in memory (tests, a draft assembled by hand), a mixture of experts' per-expert fallback and the
float parts of a stacked GGUF matrix.

A decode step of a small batch, or a speculative verification of a few positions, multiplies a
handful of activation rows by every weight matrix: the work is reading the weights once. torch's
CPU GEMM does that well for one float32 row, but from two rows on it packs the weights, and in
bfloat16 (on CPUs without bfloat16 arithmetic, such as AVX2 ones) it runs one matrix-vector
product per row, so the cost grows with the rows. This loop reads each weight row once, widens a
bfloat16 row to float32 in a small buffer, and multiplies it by every activation row while it
sits in L1, four activation rows at a time (one load of a weight element feeds four of them:
0.55-0.7x the time of row after row at 4 to 16 rows, one thread, a SmolLM2-sized matrix). Output
rows are split across numba's threads and the GIL is released, so the grammar's mask worker runs
meanwhile. A row's bits never depend on the rows beside it (``rows_agree``).

Measured on the 2-core AMD EPYC box (one run, another job on the machine), ms per call:

| weights | rows | torch | this loop |
| --- | ---: | ---: | ---: |
| 141 MB float32 | 1 / 2 / 5 | 18 / 72 / 93 | 14 / 24 / 20 |
| 70 MB bfloat16 | 1 / 2 / 5 | 15 / 17 / 42 | 8 / 9 / 14 |
| 28 MB float32 | 8 / 64 / 256 | 10 / 22 / 53 | 4 / 18 / 73 |
| 14 MB bfloat16 | 8 / 64 / 256 | 8.5 / 67 / 272 | 2.9 / 21 / 90 |

So float32 uses the loop up to ``MAX_ROWS_F32`` rows (beyond, torch's blocked GEMM has the reuse
to win), and so does bfloat16 by default. With ``ROW_INVARIANT_DTYPES`` (bfloat16, when the
Engine's ``enable_deterministic_inference`` is on) the loop runs at every row count: a row's
result then never depends on how many rows share its forward, so a cached prefix (which shortens
a prompt's last chunk) never changes a greedy output; a long prefill then takes longer (the loop
does not reuse a weight tile across rows as GEMM does: 512-token SmolLM2 prefill +70%).
Without the loop (no numba, a non-contiguous weight), bfloat16 and float16 weights are widened to
float32 for torch's GEMM. float16 weights take the loop as bfloat16 ones do, widened exactly
through a table: torch's half GEMM on CPUs with half arithmetic (AVX512-FP16, AMX) gives a row
other bits in another batch, which broke verification's batch invariance on such a CPU.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
import torch.nn.functional as F

from .ggml_quants import is_quantized
from .panel_linear import PanelWeight

try:  # numba is a dependency; keep the engine importable (torch path) if its install is broken
    from numba import njit, prange
except ImportError:  # pragma: no cover
    njit = None

MAX_ROWS_F32 = 64  # float32 activation rows up to which the loop replaces torch's GEMM
# Weight dtypes the loop multiplies (float16 too: torch's half GEMM on CPUs with half arithmetic,
# AVX512-FP16 / AMX, gives a row other bits in another batch, which would break batch invariance).
LOOP_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# Weight dtypes multiplied by the loop at every row count: a row's result then never depends on
# how many rows share its forward (a cached prefix changes a prompt's last chunk; see
# ``uses_compiled_loop``).
ROW_INVARIANT_DTYPES: tuple[torch.dtype, ...] = ()  # (torch.bfloat16,) with set_row_invariant_prefill
_BLOCK = 64  # output rows per parallel task (one widening buffer each)

if njit is not None:

    @njit(parallel=True, fastmath=True, nogil=True, cache=True, boundscheck=False)
    def _linear_f32(x, w, out, grouped):  # pragma: no cover - compiled
        """out[m, n] = x[m, :] . w[n, :]; x [M, K] float32, w [N, K] float32. ``grouped``: rows
        four at a time, the rest one at a time (``_dot_rows``)."""
        rows = x.shape[0]
        n_out = w.shape[0]
        full = rows - rows % 4 if grouped else 0
        for blk in prange((n_out + _BLOCK - 1) // _BLOCK):
            for n in range(blk * _BLOCK, min(n_out, blk * _BLOCK + _BLOCK)):
                _dot_rows(x, w[n], out, n, full)

    @njit(parallel=True, fastmath=True, nogil=True, cache=True, boundscheck=False)
    def _linear_u16(x, w_bits, halves, out, grouped):  # pragma: no cover - compiled
        """As ``_linear_f32`` with w [N, K] as 16-bit float bits (uint16): each row is widened to
        float32 once, then used for every row of x. bfloat16 (``halves`` empty): its bits are the
        top half of a float32; float16: ``halves`` holds the float32 bits of each of the 65,536
        values (exact)."""
        rows, k_dim = x.shape
        n_out = w_bits.shape[0]
        full = rows - rows % 4 if grouped else 0
        for blk in prange((n_out + _BLOCK - 1) // _BLOCK):
            row = np.empty(k_dim, dtype=np.float32)
            bits = row.view(np.uint32)
            for n in range(blk * _BLOCK, min(n_out, blk * _BLOCK + _BLOCK)):
                if halves.shape[0] == 0:
                    for k in range(k_dim):
                        bits[k] = np.uint32(w_bits[n, k]) << np.uint32(16)
                else:
                    for k in range(k_dim):
                        bits[k] = halves[w_bits[n, k]]
                _dot_rows(x, row, out, n, full)

    # Inlined into both loops (compiled with their flags). Rows [0, full) four at a time: one read
    # of a weight element serves four activation rows, so a verification or a batch of 8 is less
    # bound by loads than row after row. LLVM gives the four-row loop the same vector lanes as the
    # one-row loop, so a row gets the same bits in a group as alone; ``rows_agree`` checks that on
    # this machine before the grouping is used (a row's result must not depend on its batch).
    @njit(fastmath=True, boundscheck=False, inline="always")
    def _dot_rows(x, row, out, n, full):  # pragma: no cover - compiled
        rows, k_dim = x.shape
        for m in range(0, full, 4):
            x0 = x[m]
            x1 = x[m + 1]
            x2 = x[m + 2]
            x3 = x[m + 3]
            a0 = np.float32(0.0)
            a1 = np.float32(0.0)
            a2 = np.float32(0.0)
            a3 = np.float32(0.0)
            for k in range(k_dim):
                wk = row[k]
                a0 += x0[k] * wk
                a1 += x1[k] * wk
                a2 += x2[k] * wk
                a3 += x3[k] * wk
            out[m, n] = a0
            out[m + 1, n] = a1
            out[m + 2, n] = a2
            out[m + 3, n] = a3
        for m in range(full, rows):
            acc = np.float32(0.0)
            for k in range(k_dim):
                acc += x[m, k] * row[k]
            out[m, n] = acc


_NO_HALVES = np.zeros(0, dtype=np.uint32)


@functools.cache
def _halves() -> np.ndarray:
    """The float32 bits of every float16 value, indexed by its 16 bits (256 KB, made on first use)."""
    return np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32).view(np.uint32)


def _run_loop(x32: np.ndarray, weight: torch.Tensor, out: np.ndarray, grouped: bool) -> None:
    """The loop for ``weight``'s dtype (float32, bfloat16 or float16)."""
    if weight.dtype == torch.float32:
        _linear_f32(x32, weight.numpy(), out, grouped)
    else:
        halves = _halves() if weight.dtype == torch.float16 else _NO_HALVES
        _linear_u16(x32, weight.view(torch.uint16).numpy(), halves, out, grouped)


_ROWS_AGREE: dict[torch.dtype, bool] = {}


def rows_agree(dtype: torch.dtype) -> bool:
    """Whether the loop's four-row groups give every row the bits it gets alone, on this machine's
    compiled code (checked once per weight dtype on random rows of a few widths, vector remainders
    included). Where they would not, every row runs alone: slower at four rows and more, never
    a result that depends on the batch."""
    known = _ROWS_AGREE.get(dtype)
    if known is None:
        gen = torch.Generator().manual_seed(0)
        known = True
        for k_dim in (203, 576, 1536):
            x = torch.randn(5, k_dim, generator=gen).numpy()
            w = torch.randn(70, k_dim, generator=gen).to(dtype)
            grouped, alone = np.empty((5, 70), np.float32), np.empty((5, 70), np.float32)
            _run_loop(x, w, grouped, True)
            _run_loop(x, w, alone, False)
            known = known and bool(np.array_equal(grouped, alone))
        _ROWS_AGREE[dtype] = known
    return known


def uses_compiled_loop(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """The loop for up to ``MAX_ROWS_F32`` rows, and for every row count of a weight dtype in
    ``ROW_INVARIANT_DTYPES``: a bfloat16 model's greedy tokens flip at the rounding differences
    between the loop and GEMM, so a prompt whose last rows were computed after a cached prefix (a
    few rows: the loop) may continue differently from the same prompt prefilled whole (GEMM)."""
    rows_ok = 0 < x.shape[0] <= MAX_ROWS_F32 or (x.shape[0] > 0 and weight.dtype in ROW_INVARIANT_DTYPES)
    return (
        njit is not None and x.device.type == "cpu" and x.dim() == 2 and rows_ok
        and weight.dtype in LOOP_DTYPES and weight.is_contiguous() and not torch.is_grad_enabled()
    )  # fmt: skip


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``, through the compiled loop where it is faster (float32
    accumulation; the result in ``x``'s dtype). A weight kept in a ggml block format
    (``ggml_quants``) or packed in panels (``panel_linear``) multiplies with its own kernels."""
    if is_quantized(weight) or isinstance(weight, PanelWeight):
        out = weight.matmul(x)  # type: ignore[union-attr]
        if bias is not None:
            out += bias
        return out if x.dtype == torch.float32 else out.to(x.dtype)
    if not uses_compiled_loop(x, weight):
        if weight.dtype in (torch.bfloat16, torch.float16) and x.device.type == "cpu" and not torch.is_grad_enabled():
            wide_bias = None if bias is None else bias.float()
            return F.linear(x.float(), weight.float(), wide_bias).to(x.dtype)
        return F.linear(x, weight, bias)
    x32 = x.float().contiguous()
    out = torch.empty(x.shape[0], weight.shape[0], dtype=torch.float32)
    _run_loop(x32.numpy(), weight, out.numpy(), x.shape[0] >= 4 and rows_agree(weight.dtype))
    if bias is not None:
        out += bias
    return out if x.dtype == torch.float32 else out.to(x.dtype)
