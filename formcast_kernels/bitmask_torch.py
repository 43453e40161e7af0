"""Token bitmask application on CPU tensors, in plain torch.

Two implementations of the same operation (see ``grammar/bitmask.py`` for the layout):

* ``apply_token_bitmask_inplace_reference``: the obvious one (expand bits with a shift table,
  ``masked_fill_``). Written for clarity; the tests use it as the oracle.
* ``apply_token_bitmask_inplace_torch``: the fast CPU path. Measured on a 2-core machine
  (BENCHMARKS.md), ``masked_fill_``/``torch.where`` with a bool mask run element by element and
  fresh intermediates pay page faults, so this path instead
  1. turns each bitmask *byte* into 8 ready-made logit caps with a 256x8 lookup table
     (``+inf`` = allowed, ``-inf`` = masked) via ``index_select`` -- 8 KiB, stays in L1;
  2. applies them with ``torch.minimum(logits, caps, out=logits)``, a vectorized in-place pass;
  3. works tile by tile through a reused workspace, so nothing large is allocated per call.
  ``min(x, +inf) == x`` bit for bit (including ``-0.0``) and ``min(x, -inf) == -inf``, so the result
  equals the reference for every non-NaN logit. A masked NaN logit stays NaN here (``minimum``
  propagates NaN) where the reference and the Triton kernel write ``-inf``.

Imports only torch.
"""

from __future__ import annotations

import sys

import torch

BITS_PER_WORD = 32
# Logits per tile of the fast path. With one torch thread: 2^20, big enough that Python overhead
# vanishes (2^15 tiles measured 1.6-4x slower there). With several threads: 2^15, at torch's
# intra-op grain size, so every op runs on the calling thread. On the 2-core shared machine of
# BENCHMARKS.md, torch's 2-thread versions of these ops stalled 10-70x (barrier waits on a
# descheduled worker) while one thread already beats XGrammar's single-threaded CPU kernel 2-3x;
# predictable beats a parallel speedup that only a quiet machine delivers.
_TILE_ELEMENTS = 1 << 20
_TILE_ELEMENTS_THREADED = 1 << 15


def _tile_elements() -> int:
    return _TILE_ELEMENTS if torch.get_num_threads() == 1 else _TILE_ELEMENTS_THREADED

_SHIFTS = torch.arange(BITS_PER_WORD, dtype=torch.int32)
_BYTE_BITS = (torch.arange(256, dtype=torch.int32).unsqueeze(-1) >> torch.arange(8, dtype=torch.int32)) & 1
_CAP_TABLES: dict[torch.dtype, torch.Tensor] = {}
_WORKSPACES: dict[torch.dtype, torch.Tensor] = {}


def _cap_table(dtype: torch.dtype) -> torch.Tensor:
    """[256, 8] table: for a byte value, the cap of each of its 8 tokens (+inf allowed, -inf masked)."""
    table = _CAP_TABLES.get(dtype)
    if table is None:
        # Cached across calls: never let it be born an inference tensor (a first call under
        # torch.inference_mode would otherwise poison every later call outside it).
        with torch.inference_mode(False):
            table = torch.where(_BYTE_BITS.bool(), float("inf"), float("-inf")).to(dtype)
        _CAP_TABLES[dtype] = table
    return table


def clear_workspaces() -> None:
    """Drop the reused buffers and cap tables (they are rebuilt on the next call)."""
    _WORKSPACES.clear()
    _CAP_TABLES.clear()


def _workspace(dtype: torch.dtype, numel: int) -> torch.Tensor:
    """A reused flat buffer of at least ``numel`` elements (grows, never shrinks)."""
    buf = _WORKSPACES.get(dtype)
    if buf is None or buf.numel() < numel:
        with torch.inference_mode(False):  # see _cap_table
            buf = torch.empty(numel, dtype=dtype)
        _WORKSPACES[dtype] = buf
    return buf[:numel]


def normalize_args(
    logits: torch.Tensor, bitmask: torch.Tensor, indices: torch.Tensor | list[int] | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Check shapes and dtypes; return 2-D views and ``indices`` as an int64 tensor (or None)."""
    if logits.dim() == 1:
        logits = logits.unsqueeze(0)
    if bitmask.dim() == 1:
        bitmask = bitmask.unsqueeze(0)
    if logits.dim() != 2 or bitmask.dim() != 2:
        raise ValueError(f"logits and bitmask must be 1-D or 2-D, got {tuple(logits.shape)} and {tuple(bitmask.shape)}")
    if bitmask.dtype != torch.int32:
        raise ValueError(f"bitmask must be int32, got {bitmask.dtype}")
    if not logits.is_floating_point():
        raise ValueError(f"logits must be a floating-point tensor, got {logits.dtype}")
    if logits.shape[0] != bitmask.shape[0]:
        raise ValueError(f"bitmask has {bitmask.shape[0]} rows for {logits.shape[0]} rows of logits")
    if indices is not None:
        indices = torch.as_tensor(indices, dtype=torch.int64, device=logits.device).reshape(-1)
        if indices.numel() and (int(indices.min()) < 0 or int(indices.max()) >= logits.shape[0]):
            raise ValueError(f"indices out of range for {logits.shape[0]} rows")
    return logits, bitmask, indices


def effective_cols(logits: torch.Tensor, bitmask: torch.Tensor, vocab_size: int | None) -> int:
    """Columns governed by the bitmask; every column at or beyond it is masked."""
    cols = min(logits.shape[1], bitmask.shape[1] * BITS_PER_WORD)
    return cols if vocab_size is None else min(cols, vocab_size)


def apply_token_bitmask_inplace_reference(
    logits: torch.Tensor,
    bitmask: torch.Tensor,
    indices: torch.Tensor | list[int] | None = None,
    *,
    vocab_size: int | None = None,
) -> None:
    """Reference semantics: ``logits[r, t] = -inf`` where bit t of row r is 0 or t is beyond the mask."""
    logits, bitmask, indices = normalize_args(logits, bitmask, indices)
    rows = torch.arange(logits.shape[0]) if indices is None else indices.cpu()
    cols = effective_cols(logits, bitmask, vocab_size)
    for r in rows.tolist():
        bits = (bitmask[r].cpu().unsqueeze(-1) >> _SHIFTS) & 1
        masked = torch.ones(logits.shape[1], dtype=torch.bool)
        masked[:cols] = bits.reshape(-1)[:cols] == 0
        logits[r].masked_fill_(masked.to(logits.device), float("-inf"))


def apply_token_bitmask_inplace_torch(
    logits: torch.Tensor,
    bitmask: torch.Tensor,
    indices: torch.Tensor | list[int] | None = None,
    *,
    vocab_size: int | None = None,
) -> None:
    """Fast vectorized path for CPU tensors (any float dtype); same result as the reference."""
    assert sys.byteorder == "little", "the byte lookup assumes little-endian int32 words"
    logits, bitmask, indices = normalize_args(logits, bitmask, indices)
    if indices is not None:
        if indices.numel() == 0:
            return
        n = logits.shape[0]
        if indices.numel() == n and bitmask.shape[0] >= n and bool((indices == torch.arange(n, device=indices.device)).all()):
            # every row, in order (a speculative verification of one request): no gather/scatter copies
            bitmask, indices = bitmask[:n], None
    if indices is not None:
        sub = logits.index_select(0, indices)
        _apply_rows(sub, bitmask.index_select(0, indices), vocab_size)
        logits.index_copy_(0, indices, sub)
        return
    if not logits.is_contiguous():
        work = logits.contiguous()
        _apply_rows(work, bitmask, vocab_size)
        logits.copy_(work)
        return
    _apply_rows(logits, bitmask, vocab_size)


def _apply_rows(logits: torch.Tensor, bitmask: torch.Tensor, vocab_size: int | None) -> None:
    """Apply to every row of a contiguous 2-D ``logits``, tile by tile."""
    n_rows, n_cols = logits.shape
    cols = effective_cols(logits, bitmask, vocab_size)
    if cols < n_cols:
        logits[:, cols:].fill_(float("-inf"))
    if cols == 0 or n_rows == 0:
        return
    words = (cols + BITS_PER_WORD - 1) // BITS_PER_WORD
    mask_bytes = bitmask[:, :words].contiguous().view(torch.uint8)  # [rows, 4 * words], LSB byte first
    table = _cap_table(logits.dtype)
    tile = _tile_elements()
    tile_words = min(words, tile // BITS_PER_WORD)
    tile_rows = max(1, tile // (words * BITS_PER_WORD)) if tile_words == words else 1
    for r0 in range(0, n_rows, tile_rows):
        r1 = min(n_rows, r0 + tile_rows)
        for w0 in range(0, words, tile_words):
            w1 = min(words, w0 + tile_words)
            c0, c1 = w0 * BITS_PER_WORD, min(cols, w1 * BITS_PER_WORD)
            idx = mask_bytes[r0:r1, 4 * w0 : 4 * w1].reshape(-1).to(torch.int32)
            caps = _workspace(logits.dtype, idx.numel() * 8).view(-1, 8)
            torch.index_select(table, 0, idx, out=caps)
            target = logits[r0:r1, c0:c1]
            torch.minimum(target, caps.view(r1 - r0, -1)[:, : c1 - c0], out=target)
