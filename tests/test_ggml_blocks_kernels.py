"""``formcast_kernels.ggml_blocks``: ggml block matrices repacked for the GPU, against ``gguf.quants``.

Random raw blocks of every type (random code and scale bytes, sane fp16 ``d`` / ``dmin`` / ``m``)
with row counts that are no multiple of any tile. The torch path's ``dequantize`` must equal
``gguf.quants.dequantize`` bit for bit; ``cat`` / ``take_rows`` / ``embedding`` must select whole
rows. The Triton kernels (GEMV for small M, tiled ``tl.dot`` above, the dequantize/embedding
kernel) run on the CPU under ``TRITON_INTERPRET=1`` in a subprocess (the flag is read when
``@triton.jit`` decorates, so it must be set before the kernel module is imported), and, named
``gpu``, compiled on a CUDA device with the same checks plus a CUDA-graph capture. Both GEMV
kernels (the grouped default and the elementwise first one) are also checked directly, with the
tiles the GPU uses as well as the interpreter's, on K that the steps tile exactly and K that
they do not.

A product is checked against float64 ``x @ W.T`` (x rounded to its dtype first) within
``tol * (|x| @ |W|.T)``: the error bound of rounding the weights to the dot's input dtype, which a
wrongly decoded weight exceeds by orders of magnitude.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants

from formcast_kernels.ggml_blocks import FORMATS, BlockMatrix

ROOT = pathlib.Path(__file__).resolve().parents[1]
TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"]
SHAPES = [(40, 256), (264, 512)]
MS = [1, 2, 3, 5, 8, 17, 70]
DTYPES = ["float32", "bfloat16", "float16"]
# per dtype: relative error allowed against |x| @ |W|.T (weights rounded to the dot's dtype)
TOLERANCE = {"float32": 1e-5, "float16": 1e-3, "bfloat16": 8e-3}

# byte offset and range of each fp16 field of a block: d, then m (Q4_1/Q5_1) or dmin (K-quants)
_FP16_FIELDS = {
    "Q4_0": [(0, 1e-3, 1e-2)],
    "Q4_1": [(0, 1e-3, 1e-2), (2, -0.1, 0.1)],
    "Q5_0": [(0, 1e-3, 1e-2)],
    "Q5_1": [(0, 1e-3, 1e-2), (2, -0.1, 0.1)],
    "Q8_0": [(0, 1e-3, 1e-2)],
    "Q4_K": [(0, 1e-3, 1e-2), (2, 1e-3, 1e-2)],
    "Q5_K": [(0, 1e-3, 1e-2), (2, 1e-3, 1e-2)],
    "Q6_K": [(208, 1e-3, 1e-2)],
}


def make_raw(type_name: str, n: int, k: int, seed: int) -> np.ndarray:
    """Random ggml blocks for an [n, k] matrix: uint8 [n, row_bytes] as a GGUF file stores them."""
    rng = np.random.default_rng(seed)
    block_elems, block_bytes = FORMATS[type_name][:2]
    nb = k // block_elems
    raw = rng.integers(0, 256, (n, nb, block_bytes), dtype=np.uint8)
    for at, lo, hi in _FP16_FIELDS[type_name]:
        raw[..., at : at + 2] = rng.uniform(lo, hi, (n, nb)).astype(np.float16).view(np.uint8).reshape(n, nb, 2)
    return raw.reshape(n, nb * block_bytes)


def reference(type_name: str, raw: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(quants.dequantize(raw, GGMLQuantizationType[type_name])))


def product_errors(got: torch.Tensor, x: torch.Tensor, w_ref: torch.Tensor) -> float:
    """max |got - x @ W.T| / (|x| @ |W|.T), in float64 from the same (dtype-rounded) x."""
    xd, wd = x.double().cpu(), w_ref.double()
    exact = xd @ wd.T
    bound = xd.abs() @ wd.abs().T + 1e-30
    return float(((got.double().cpu() - exact).abs() / bound).max())


def check_kernels(device: str, types: list[str], shapes: list[list[int]], ms: list[int], exact_dequant: bool) -> list[str]:
    """Every check of a BlockMatrix on ``device``'s path; returns the failures as strings."""
    failures: list[str] = []
    for ti, type_name in enumerate(types):
        for si, (n, k) in enumerate(shapes):
            raw = make_raw(type_name, n, k, seed=100 * ti + si)
            w_ref = reference(type_name, raw)
            bm = BlockMatrix.from_gguf(type_name, torch.from_numpy(raw).to(device), (n, k))
            case = f"{type_name} [{n}, {k}]"
            if bm.device.type != torch.device(device).type or bm.shape != (n, k) or bm.dtype != torch.float32:
                failures.append(f"{case}: device/shape/dtype {bm.device} {tuple(bm.shape)} {bm.dtype}")
            deq = bm.dequantize().cpu()
            scale = float(w_ref.abs().max())
            if exact_dequant:
                ok = torch.equal(deq, w_ref)
            else:  # a compiler may contract scale * code + bias into one fma
                ok = bool(torch.allclose(deq, w_ref, rtol=1e-6, atol=1e-6 * scale))
            if not ok:
                failures.append(f"{case}: dequantize differs by {float((deq - w_ref).abs().max())}")
            half = bm.dequantize(torch.float16).cpu()
            if half.dtype != torch.float16 or not torch.allclose(half.float(), w_ref, rtol=1e-3, atol=1e-4 * scale):
                failures.append(f"{case}: dequantize(float16) differs")
            ids = torch.tensor([n - 1, 0, 3, 3, n // 2], device=device)
            emb = bm.embedding(ids).cpu()
            if not torch.allclose(emb, w_ref[ids.cpu()], rtol=1e-6, atol=1e-6 * scale):
                failures.append(f"{case}: embedding differs")
            g = torch.Generator().manual_seed(7 * ti + si)
            for mi, m in enumerate(ms):
                dtype_name = DTYPES[(mi + si + ti) % len(DTYPES)] if device == "cpu" else None
                for dname in [dtype_name] if dtype_name else DTYPES:
                    x = torch.randn(m, k, generator=g).to(getattr(torch, dname))
                    got = bm.matmul(x.to(device))
                    if got.dtype != torch.float32 or tuple(got.shape) != (m, n):
                        failures.append(f"{case} M={m} {dname}: result {got.dtype} {tuple(got.shape)}")
                        continue
                    err = product_errors(got, x, w_ref)
                    if not err <= TOLERANCE[dname]:
                        failures.append(f"{case} M={m} {dname}: relative error {err:.3g}")
            # reordered rows of two halves, stacked back: the kernels on a cat / take_rows result
            perm = torch.randperm(n, generator=g)
            first, second = perm[: n // 3], perm[n // 3 :]
            joined = BlockMatrix.cat([bm.take_rows(first.to(device)), bm.take_rows(second.to(device))])
            x = torch.randn(3, k, generator=g)
            for rows_x in (x, torch.randn(20, k, generator=g)):
                err = product_errors(joined.matmul(rows_x.to(device)), rows_x, w_ref[perm])
                if not err <= TOLERANCE["float32"]:
                    failures.append(f"{case}: cat/take_rows product M={rows_x.shape[0]} error {err:.3g}")
    return failures


GEMV_MS = [1, 2, 3, 8]
# the smallest step (four units): several steps even at the test's small K
SMALL_STEP_TILE = (16, 64, 4)


def gemv_shapes(type_name: str) -> list[tuple[int, int]]:
    """Ragged N (13 fills no tile of rows; 21 spans programs of every tile); a K the
    interpreter's and the GPU's steps tile exactly, and one they do not."""
    return [(13, 1024), (21, 768)] if FORMATS[type_name][0] == 256 else [(13, 512), (21, 288)]


def check_gemv_variants(device: str, types: list[str]) -> list[str]:
    """Both GEMV kernels for every M in ``GEMV_MS``: ``gemv="elementwise"``, and the grouped
    kernel with the GPU's tile for that M and with ``SMALL_STEP_TILE`` (writing into NaNs, so a
    row or column left unwritten fails). ``block_matmul``'s default (the grouped kernel with the
    interpreter's tile here) is :func:`check_kernels`' GEMV."""
    import triton

    from formcast_kernels.ggml_blocks_triton import _GEMV_TILES, _gemv, block_matmul

    failures: list[str] = []
    for ti, type_name in enumerate(types):
        for si, (n, k) in enumerate(gemv_shapes(type_name)):
            raw = make_raw(type_name, n, k, seed=50 + 10 * ti + si)
            w_ref = reference(type_name, raw)
            bm = BlockMatrix.from_gguf(type_name, torch.from_numpy(raw).to(device), (n, k))
            g = torch.Generator().manual_seed(3 * ti + si)
            for mi, m in enumerate(GEMV_MS):
                dname = DTYPES[(mi + si + ti) % len(DTYPES)]
                x = torch.randn(m, k, generator=g).to(getattr(torch, dname))
                xd = x.to(device)
                results = {"elementwise": block_matmul(bm, xd, gemv="elementwise")}
                for name, tile in [("gpu tile", _GEMV_TILES[triton.next_power_of_2(m)]), ("small step", SMALL_STEP_TILE)]:
                    out = torch.full((m, n), float("nan"), device=device)
                    _gemv(bm, xd, out, "grouped", tile)
                    results[f"grouped {name} {tile}"] = out
                for name, got in results.items():
                    err = product_errors(got, x, w_ref)
                    if got.dtype != torch.float32 or tuple(got.shape) != (m, n) or not err <= TOLERANCE[dname]:
                        case = f"{type_name} [{n}, {k}] M={m} {dname} {name}"
                        failures.append(f"{case}: {got.dtype} {tuple(got.shape)} error {err:.3g}")
    return failures


# -- the torch path (CPU without the interpreter) ----------------------------------------------------


@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("n,k", SHAPES)
def test_dequantize_equals_gguf(type_name: str, n: int, k: int) -> None:
    raw = make_raw(type_name, n, k, seed=n + k)
    bm = BlockMatrix.from_gguf(type_name, torch.from_numpy(raw), (n, k))
    assert torch.equal(bm.dequantize(), reference(type_name, raw))
    assert bm.dequantize(torch.bfloat16).dtype == torch.bfloat16


@pytest.mark.parametrize("type_name", TYPES)
def test_torch_path_products_cat_take_rows_embedding(type_name: str) -> None:
    assert check_kernels("cpu", [type_name], [[40, 256]], MS, exact_dequant=True) == []


def test_a_wrong_code_fails_the_checks() -> None:
    """The checks can fail: one flipped nibble moves dequantize, and a product, off the reference."""
    raw = make_raw("Q4_0", 8, 64, seed=1)
    bm = BlockMatrix.from_gguf("Q4_0", torch.from_numpy(raw), (8, 64))
    bm.codes[2, 5] ^= 0x01
    w_ref = reference("Q4_0", raw)
    assert not torch.equal(bm.dequantize(), w_ref)
    x = torch.zeros(1, 64)
    x[0, 5] = 1.0
    assert product_errors(bm.matmul(x), x, w_ref) > 1e-3


@pytest.mark.parametrize("type_name", TYPES)
def test_layout_size_against_the_file(type_name: str) -> None:
    n, k = 40, 512
    raw = make_raw(type_name, n, k, seed=3)
    bm = BlockMatrix.from_gguf(type_name, torch.from_numpy(raw), (n, k))
    extra = {"Q4_K": 4 / 144, "Q5_K": 4 / 176}.get(type_name, 0.0)  # 16 bytes of scales and minimums, not 12
    assert bm.nbytes == pytest.approx(raw.nbytes * (1 + extra))


def test_cat_and_take_rows_copy_whole_rows() -> None:
    raw = make_raw("Q5_K", 12, 512, seed=5)
    whole = BlockMatrix.from_gguf("Q5_K", torch.from_numpy(raw), (12, 512))
    top = BlockMatrix.from_gguf("Q5_K", torch.from_numpy(raw[:5]), (5, 512))
    bottom = BlockMatrix.from_gguf("Q5_K", torch.from_numpy(raw[5:]), (7, 512))
    joined = BlockMatrix.cat([top, bottom])
    assert joined.shape == (12, 512)
    for a, b in zip(joined.tensors(), whole.tensors()):
        assert (a is None and b is None) or torch.equal(a, b)
    index = torch.tensor([11, 0, 0, 7])
    taken = whole.take_rows(index)
    assert taken.shape == (4, 512)
    assert torch.equal(taken.dequantize(), reference("Q5_K", raw)[index])
    assert torch.equal(whole.embedding(index, torch.float16), reference("Q5_K", raw)[index].half())


def test_bad_arguments() -> None:
    raw = torch.from_numpy(make_raw("Q4_0", 4, 64, seed=0))
    with pytest.raises(ValueError, match="unsupported"):
        BlockMatrix.from_gguf("Q3_K", raw, (4, 64))
    with pytest.raises(ValueError, match="raw bytes"):
        BlockMatrix.from_gguf("Q4_0", raw, (4, 96))
    with pytest.raises(ValueError, match="multiple"):
        BlockMatrix.from_gguf("Q4_K", raw, (4, 64))
    bm = BlockMatrix.from_gguf("Q4_0", raw, (4, 64))
    with pytest.raises(ValueError, match="x must be"):
        bm.matmul(torch.zeros(2, 32))
    other = BlockMatrix.from_gguf("Q8_0", torch.from_numpy(make_raw("Q8_0", 4, 64, seed=0)), (4, 64))
    with pytest.raises(ValueError, match="stack"):
        BlockMatrix.cat([bm, other])
    assert bm.matmul(torch.zeros(0, 64)).shape == (0, 4)


# -- the Triton kernels, interpreted on the CPU ------------------------------------------------------

_SCRIPT = """
import json, os, sys
sys.path.insert(0, os.environ["FORMCAST_ROOT"]); sys.path.insert(0, os.environ["FORMCAST_ROOT"] + "/tests")
import formcast_kernels.ggml_blocks as ggml_blocks
assert ggml_blocks.use_kernels(__import__("torch").zeros(1)), "the interpreter is not on"
from test_ggml_blocks_kernels import check_gemv_variants, check_kernels
if sys.argv[1] == "gemv":
    print(json.dumps(check_gemv_variants("cpu", json.loads(sys.argv[2]))))
else:
    pairs, ms = json.loads(sys.argv[1])
    print(json.dumps([f for t, shape in pairs for f in check_kernels("cpu", [t], [shape], ms, exact_dequant=True)]))
"""


def _interpret(*args: str) -> list[str]:
    env = dict(os.environ, TRITON_INTERPRET="1", FORMCAST_ROOT=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, *args], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# Interpreted Triton is slow: each type on one of the shapes (both shapes over the types), every M.
@pytest.mark.parametrize("types", [["Q4_0", "Q4_1", "Q5_0", "Q5_1"], ["Q8_0", "Q4_K", "Q5_K", "Q6_K"]])
def test_triton_kernels_under_interpreter(types: list[str]) -> None:
    pytest.importorskip("triton")
    assert _interpret(json.dumps([[(t, list(SHAPES[i % len(SHAPES)])) for i, t in enumerate(types)], MS])) == []


@pytest.mark.parametrize("types", [["Q4_0", "Q4_1", "Q5_0", "Q5_1"], ["Q8_0", "Q4_K", "Q5_K", "Q6_K"]])
def test_gemv_kernels_under_interpreter(types: list[str]) -> None:
    pytest.importorskip("triton")
    assert _interpret("gemv", json.dumps(types)) == []


def test_block_matmul_rejects_an_unknown_gemv() -> None:
    pytest.importorskip("triton")
    from formcast_kernels.ggml_blocks_triton import block_matmul

    bm = BlockMatrix.from_gguf("Q4_0", torch.from_numpy(make_raw("Q4_0", 4, 64, seed=0)), (4, 64))
    with pytest.raises(ValueError, match="gemv"):
        block_matmul(bm, torch.zeros(1, 64), gemv="fast")


# -- compiled on a GPU -------------------------------------------------------------------------------


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_kernels_match_gguf() -> None:
    shapes = [list(s) for s in SHAPES] + [[1000, 2048]]
    assert check_kernels("cuda", TYPES, shapes, MS + [16, 128, 300], exact_dequant=False) == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_gemv_variants_match_gguf() -> None:
    assert check_gemv_variants("cuda", TYPES) == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("type_name", ["Q4_0", "Q6_K"])
def test_gpu_matmul_is_cuda_graph_capturable(type_name: str) -> None:
    n, k = 264, 512
    raw = make_raw(type_name, n, k, seed=9)
    w_ref = reference(type_name, raw)
    bm = BlockMatrix.from_gguf(type_name, torch.from_numpy(raw).cuda(), (n, k))
    for m in (1, 70):
        static_x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        bm.matmul(static_x)  # compile outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = bm.matmul(static_x)
        fresh = torch.randn(m, k, dtype=torch.bfloat16)
        static_x.copy_(fresh.cuda())
        graph.replay()
        torch.cuda.synchronize()
        assert product_errors(static_out, fresh, w_ref) <= TOLERANCE["bfloat16"]


@pytest.mark.parametrize("type_name", ["Q5_K", "Q6_K", "Q4_0"])
def test_a_tall_matrix_repacks_in_slices(type_name: str, monkeypatch) -> None:
    """Matrices taller than ``REPACK_ROWS`` repack slice by slice and come out the same."""
    import formcast_kernels.ggml_blocks as ggml_blocks

    raw = make_raw(type_name, 40, 512, seed=11)
    whole = BlockMatrix.from_gguf(type_name, torch.from_numpy(raw), (40, 512))
    monkeypatch.setattr(ggml_blocks, "REPACK_ROWS", 16)
    sliced = BlockMatrix.from_gguf(type_name, torch.from_numpy(raw), (40, 512))
    for a, b in zip(sliced.tensors(), whole.tensors()):
        assert (a is None and b is None) or torch.equal(a, b)
    assert torch.equal(sliced.dequantize(), reference(type_name, raw))
