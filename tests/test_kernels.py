"""formcast_kernels.apply_token_bitmask_inplace: torch paths and the Triton kernel against the reference.

The Triton kernel runs on the CPU under ``TRITON_INTERPRET=1`` in a subprocess (the flag is read
when ``@triton.jit`` decorates, so it must be set before the kernel module is imported, and other
test modules may import it first in this process).
"""

from __future__ import annotations

import ast
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import torch

from grammar.bitmask import bitmask_width, pack_bool_mask
from formcast_kernels import apply_token_bitmask_inplace
from formcast_kernels.bitmask_torch import apply_token_bitmask_inplace_reference, apply_token_bitmask_inplace_torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
VOCABS = [49152, 151936, 151643, 32001]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _bits(t: torch.Tensor) -> torch.Tensor:
    """Integer view for bit-for-bit comparison (torch.equal treats -0.0 == 0.0)."""
    return t.view({torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}[t.dtype])


def _random_case(batch: int, vocab: int, logit_cols: int, dtype: torch.dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, logit_cols, generator=g).to(dtype)
    logits[:, :4] = torch.tensor([0.0, -0.0, 1.0, -1.0]).to(dtype)  # signed zeros must survive
    bitmask = torch.randint(-(2**31), 2**31 - 1, (batch, bitmask_width(vocab)), dtype=torch.int32, generator=g)
    return logits, bitmask


def _oracle(logits: torch.Tensor, bitmask: torch.Tensor, rows=None) -> torch.Tensor:
    """Direct computation from grammar.bitmask's numpy unpacking."""
    out = logits.clone()
    cols = logits.shape[1]
    words = bitmask.numpy().view(np.uint32)
    bits = np.unpackbits(words.view(np.uint8), axis=-1, bitorder="little").astype(bool)
    allowed = np.zeros((logits.shape[0], cols), dtype=bool)
    n = min(cols, bits.shape[1])
    allowed[:, :n] = bits[:, :n]
    selected = np.zeros((logits.shape[0], 1), dtype=bool)
    selected[list(range(logits.shape[0])) if rows is None else rows] = True
    masked = torch.from_numpy(~allowed & selected)
    return torch.where(masked, torch.tensor(float("-inf"), dtype=logits.dtype), out)


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("batch", [1, 3, 64])
def test_fast_path_matches_reference_and_oracle(vocab: int, batch: int) -> None:
    logits, bitmask = _random_case(batch, vocab, vocab, torch.float32, seed=vocab + batch)
    expected = _oracle(logits, bitmask)
    ref = logits.clone()
    apply_token_bitmask_inplace_reference(ref, bitmask)
    fast = logits.clone()
    apply_token_bitmask_inplace(fast, bitmask)
    assert torch.equal(_bits(ref), _bits(expected))
    assert torch.equal(_bits(fast), _bits(expected))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab,logit_cols", [(151643, 151936), (32001, 32064), (49152, 49152), (151936, 151000)])
def test_dtypes_and_padded_logits(dtype: torch.dtype, vocab: int, logit_cols: int) -> None:
    logits, bitmask = _random_case(2, vocab, logit_cols, dtype, seed=7)
    ref = logits.clone()
    apply_token_bitmask_inplace_reference(ref, bitmask)
    fast = logits.clone()
    apply_token_bitmask_inplace(fast, bitmask)
    assert torch.equal(_bits(ref), _bits(fast))
    width = bitmask.shape[1] * 32
    if logit_cols > width:
        assert torch.isneginf(fast[:, width:]).all()  # columns beyond the bitmask are always masked


def test_indices_leave_other_rows_untouched() -> None:
    logits, bitmask = _random_case(6, 32001, 32001, torch.float32, seed=3)
    fast = logits.clone()
    apply_token_bitmask_inplace(fast, bitmask, indices=[4, 1])
    assert torch.equal(_bits(fast), _bits(_oracle(logits, bitmask, rows=[4, 1])))
    for r in (0, 2, 3, 5):
        assert torch.equal(_bits(fast[r]), _bits(logits[r]))
    same = logits.clone()
    apply_token_bitmask_inplace(same, bitmask, indices=torch.tensor([], dtype=torch.long))
    assert torch.equal(same, logits)


def test_vocab_size_masks_trailing_bits_and_1d_inputs() -> None:
    vocab = 100
    allowed = np.ones(vocab, dtype=bool)
    allowed[[3, 50, 99]] = False
    bitmask = torch.from_numpy(pack_bool_mask(allowed[None]))  # trailing bits 100..127 are zero here
    bitmask[0, -1] |= torch.tensor(-(2**31), dtype=torch.int32)  # set bit 127, beyond vocab
    logits = torch.zeros(128)
    apply_token_bitmask_inplace(logits, bitmask[0], vocab_size=vocab)
    masked = torch.isneginf(logits).nonzero().flatten().tolist()
    assert masked == [3, 50, 99] + list(range(100, 128))


def test_all_allowed_and_none_allowed() -> None:
    logits, _ = _random_case(2, 32001, 32001, torch.bfloat16, seed=1)
    full = torch.full((2, bitmask_width(32001)), -1, dtype=torch.int32)
    out = logits.clone()
    apply_token_bitmask_inplace(out, full)
    assert torch.equal(_bits(out[:, :32001]), _bits(logits[:, :32001]))
    out = logits.clone()
    apply_token_bitmask_inplace(out, torch.zeros_like(full))
    assert torch.isneginf(out).all()


def test_non_contiguous_logits() -> None:
    base, bitmask = _random_case(4, 32001, 32001, torch.float32, seed=5)
    wide = torch.zeros(4, 40000)
    wide[:, :32001] = base
    view = wide[:, :32001]
    apply_token_bitmask_inplace_torch(view, bitmask)
    assert torch.equal(_bits(wide[:, :32001]), _bits(_oracle(base, bitmask)))
    assert (wide[:, 32001:] == 0).all()


@pytest.mark.parametrize(
    "logits,bitmask,match",
    [
        (torch.zeros(2, 64), torch.zeros(2, 2, dtype=torch.int64), "int32"),
        (torch.zeros(2, 64), torch.zeros(3, 2, dtype=torch.int32), "rows"),
        (torch.zeros(2, 64, dtype=torch.int32), torch.zeros(2, 2, dtype=torch.int32), "floating"),
    ],
)
def test_bad_arguments(logits: torch.Tensor, bitmask: torch.Tensor, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        apply_token_bitmask_inplace(logits, bitmask)
    with pytest.raises(ValueError, match="indices"):
        apply_token_bitmask_inplace(torch.zeros(2, 64), torch.zeros(2, 2, dtype=torch.int32), indices=[2])


_TRITON_SCRIPT = r"""
import json, os, sys, torch
sys.path.insert(0, os.environ["FORMCAST_ROOT"])
from formcast_kernels.bitmask_triton import apply_token_bitmask_inplace_triton
from formcast_kernels.bitmask_torch import apply_token_bitmask_inplace_reference
views = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}
cases = json.loads(sys.argv[1])
results = []
for batch, vocab, cols, dtype_name, use_idx in cases:
    dtype = getattr(torch, dtype_name)
    g = torch.Generator().manual_seed(batch * 7 + vocab)
    logits = torch.randn(batch, cols, generator=g).to(dtype)
    bitmask = torch.randint(-2**31, 2**31 - 1, (batch, (vocab + 31) // 32), dtype=torch.int32, generator=g)
    idx = torch.arange(0, batch, 2) if use_idx else None
    ref = logits.clone(); apply_token_bitmask_inplace_reference(ref, bitmask, idx)
    for full_store in (False, True):  # masked partial stores, and whole-tile read-modify-write
        tri = logits.clone(); apply_token_bitmask_inplace_triton(tri, bitmask, idx, min(cols, bitmask.shape[1] * 32), full_store)
        results.append(bool(torch.equal(ref.view(views[dtype]), tri.view(views[dtype]))))
print(json.dumps(results))
"""

# Interpreted Triton is slow: full-size odd vocabularies with few rows, batch 64 on a small vocab.
_TRITON_CASES = [
    [1, 49152, 49152, "float32", False],
    [2, 151936, 151936, "bfloat16", False],
    [1, 151643, 151936, "float16", False],
    [3, 32001, 32064, "float32", True],
    [5, 32001, 32001, "bfloat16", True],
    [64, 1000, 1100, "float32", False],
    [64, 1000, 1000, "float16", True],
]


def test_triton_kernel_matches_reference_under_interpreter() -> None:
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", FORMCAST_ROOT=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-c", _TRITON_SCRIPT, json.dumps(_TRITON_CASES)],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert results == [True] * (2 * len(_TRITON_CASES)), list(zip([c for c in _TRITON_CASES for _ in (0, 1)], results))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", DTYPES)
def test_triton_on_gpu_matches_cpu(dtype: torch.dtype) -> None:
    logits, bitmask = _random_case(64, 151643, 151936, dtype, seed=11)
    cpu = logits.clone()
    apply_token_bitmask_inplace(cpu, bitmask)
    gpu = logits.cuda()
    apply_token_bitmask_inplace(gpu, bitmask.cuda(), indices=None)
    assert torch.equal(_bits(gpu.cpu()), _bits(cpu))


def test_kernels_import_only_torch_and_triton() -> None:
    allowed = {"torch", "triton", "__future__", "sys"}
    paths = sorted((ROOT / "formcast_kernels").glob("*.py"))
    assert len(paths) > 5, "formcast_kernels/ not found"
    for path in paths:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [] if node.level else [node.module or ""]
            else:
                continue
            for name in names:
                assert name.split(".")[0] in allowed, f"{path.name} imports {name}"


@pytest.mark.parametrize("tile", [96, 2048, 70000])  # column tiles, row tiles of one row, several rows
@pytest.mark.parametrize("vocab,logit_cols", [(1000, 1000), (1001, 1100), (32001, 32064)])
def test_fast_path_tiling(tile: int, vocab: int, logit_cols: int, monkeypatch) -> None:
    import formcast_kernels.bitmask_torch as bitmask_torch

    monkeypatch.setattr(bitmask_torch, "_TILE_ELEMENTS", tile)
    monkeypatch.setattr(bitmask_torch, "_TILE_ELEMENTS_THREADED", tile)
    logits, bitmask = _random_case(5, vocab, logit_cols, torch.bfloat16, seed=tile + vocab)
    ref = logits.clone()
    apply_token_bitmask_inplace_reference(ref, bitmask)
    fast = logits.clone()
    apply_token_bitmask_inplace_torch(fast, bitmask, indices=None if tile != 2048 else [0, 2, 4])
    if tile == 2048:
        ref = logits.clone()
        apply_token_bitmask_inplace_reference(ref, bitmask, [0, 2, 4])
    assert torch.equal(_bits(ref), _bits(fast))


def test_first_call_under_inference_mode_does_not_poison_later_calls():
    from formcast_kernels import bitmask_torch

    bitmask_torch._CAP_TABLES.clear()
    bitmask_torch._WORKSPACES.clear()
    bitmask = torch.tensor([[0b101]], dtype=torch.int32)
    with torch.inference_mode():
        logits = torch.zeros(1, 3)
        apply_token_bitmask_inplace(logits, bitmask)
    logits = torch.zeros(1, 3)
    apply_token_bitmask_inplace(logits, bitmask)
    assert logits.tolist() == [[0.0, float("-inf"), 0.0]]
