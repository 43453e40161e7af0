"""GGUF block matrices on CUDA: ``BlockMatrix.matmul`` (Triton, weights kept quantized) against a
bfloat16 ``F.linear`` on the dequantized weight, and the two GEMV kernels side by side.

Contract: ``bench_block_kernels(quick)`` prints one Markdown table: type, N, K, M, formcast µs
(``block_matmul``'s default path: the grouped GEMV for M <= ``GEMV_MAX_M``), the elementwise
GEMV's µs (``gemv="elementwise"``, the first GEMV; M <= ``GEMV_MAX_M`` only), bf16 dense µs,
dense/formcast, and at M=1 the weight bytes read per µs of each GEMV as GB/s and as a share of the
H200's ~4.3 TB/s. ``max diff`` is the largest difference between the two GEMVs' results over the
largest result (a miscompiled kernel shows there first). ``bench_gemv_tiles()`` (``--sweep``)
times the grouped GEMV with alternative tiles (BLOCK_N, code bytes of a row per step, warps) on
Q4_0 and Q4_K. Times are CUDA events, best of 3 rounds of 50 calls after a warm-up. Random raw
blocks (sane fp16 scales), so the numbers measure the kernels, not a model. Nothing runs at
import; ``python bench/ggml_blocks_bench.py [--quick] [--sweep]`` runs it (``--quick``: four
types, two shapes, M in 1, 4, 16, 128; Triton's compiles take most of its time).
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from formcast_kernels.ggml_blocks import BlockMatrix  # noqa: E402
from gpu_bench import cuda_time_ms, random_block_bytes  # noqa: E402  (bench/ is the script's folder)

PEAK_GBPS = 4300.0
TYPES = ["Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"]
QUICK_TYPES = ["Q4_0", "Q4_K", "Q6_K", "Q8_0"]
SHAPES = [(2048, 2048), (8192, 2048), (2048, 8192), (4096, 4096), (14336, 4096)]
QUICK_SHAPES = [(4096, 4096), (14336, 4096)]
MS = [1, 2, 4, 8, 16, 128]
QUICK_MS = [1, 4, 16, 128]
# --sweep: (BLOCK_N, code bytes of a row per step, warps) per M, the table's choice first
SWEEP_TILES = {
    1: [(4, 1024, 4), (8, 512, 4), (8, 1024, 4), (16, 256, 4), (2, 1024, 4), (4, 512, 2)],
    4: [(4, 512, 4), (8, 512, 4), (8, 256, 4), (4, 256, 2)],
}


def random_block_matrix(type_name: str, n: int, k: int, seed: int) -> BlockMatrix:
    """Random ggml blocks for [n, k], repacked on the GPU as the loader would."""
    return BlockMatrix.from_gguf(type_name, random_block_bytes(type_name, n, k, seed=seed), (n, k))


def _bandwidth(nbytes: int, us: float) -> tuple[str, str]:
    gbps = nbytes / (us * 1e-6) / 1e9
    return f"{gbps:.0f}", f"{gbps / PEAK_GBPS:.0%}"


def bench_block_kernels(quick: bool) -> None:
    from formcast_kernels.ggml_blocks_triton import GEMV_MAX_M, block_matmul

    if not torch.cuda.is_available():
        print("bench_block_kernels: no CUDA device, skipped")
        return
    types, shapes, ms = (QUICK_TYPES, QUICK_SHAPES, QUICK_MS) if quick else (TYPES, SHAPES, MS)
    print(f"\n## GGUF block matmul on {torch.cuda.get_device_name()} (µs per call)\n")
    print(
        "| type | N | K | M | formcast µs | elementwise GEMV µs | bf16 dense µs | dense/formcast "
        "| M=1 GB/s | of 4.3 TB/s | elementwise GB/s | of 4.3 TB/s | max diff |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for ti, type_name in enumerate(types):
        for n, k in shapes:
            bm = random_block_matrix(type_name, n, k, seed=ti)
            dense = bm.dequantize(torch.bfloat16)
            for m in ms:
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                ours = cuda_time_ms(lambda: bm.matmul(x), reps=50) * 1e3
                theirs = cuda_time_ms(lambda: F.linear(x, dense), reps=50) * 1e3
                old = bandwidth = share = old_bandwidth = old_share = diff = ""
                if m <= GEMV_MAX_M:
                    old_us = cuda_time_ms(lambda: block_matmul(bm, x, gemv="elementwise"), reps=50) * 1e3
                    old = f"{old_us:.1f}"
                    new_out, old_out = bm.matmul(x), block_matmul(bm, x, gemv="elementwise")
                    diff = f"{float((new_out - old_out).abs().max() / old_out.abs().max().clamp_min(1e-30)):.1e}"
                    if m == 1:
                        bandwidth, share = _bandwidth(bm.nbytes, ours)
                        old_bandwidth, old_share = _bandwidth(bm.nbytes, old_us)
                print(
                    f"| {type_name} | {n} | {k} | {m} | {ours:.1f} | {old} | {theirs:.1f} | {theirs / ours:.2f} "
                    f"| {bandwidth} | {share} | {old_bandwidth} | {old_share} | {diff} |"
                )
            del bm, dense
    torch.cuda.synchronize()


def bench_gemv_tiles() -> None:
    """The grouped GEMV with each tile of ``SWEEP_TILES`` (one compile per tile and type)."""
    from formcast_kernels.ggml_blocks_triton import _gemv

    if not torch.cuda.is_available():
        print("bench_gemv_tiles: no CUDA device, skipped")
        return
    print("\n## Grouped GEMV tiles (µs per call; GB/s at M=1)\n")
    print("| type | N | K | M | BLOCK_N | bytes/step | warps | µs | GB/s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for ti, type_name in enumerate(["Q4_0", "Q4_K"]):
        for n, k in QUICK_SHAPES:
            bm = random_block_matrix(type_name, n, k, seed=ti)
            for m, tiles in SWEEP_TILES.items():
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                out = torch.empty(m, n, device="cuda")
                for tile in tiles:
                    us = cuda_time_ms(lambda: _gemv(bm, x, out, "grouped", tile), reps=50) * 1e3
                    gbps = _bandwidth(bm.nbytes, us)[0] if m == 1 else ""
                    print(f"| {type_name} | {n} | {k} | {m} | {tile[0]} | {tile[1]} | {tile[2]} | {us:.1f} | {gbps} |")
            del bm
    torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="four types, two shapes, M in 1, 4, 16, 128")
    parser.add_argument("--sweep", action="store_true", help="also time the grouped GEMV's alternative tiles")
    args = parser.parse_args()
    bench_block_kernels(args.quick)
    if args.sweep:
        bench_gemv_tiles()


if __name__ == "__main__":
    main()
