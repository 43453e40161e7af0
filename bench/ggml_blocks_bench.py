"""GGUF block matrices on CUDA: ``BlockMatrix.matmul`` (Triton, weights kept quantized) against a
bfloat16 ``F.linear`` on the dequantized weight.

Contract: ``bench_block_kernels(quick)`` prints one Markdown table (type, N, K, M, formcast µs,
bf16 dense µs, dense/formcast, and at M=1 the weight bytes read per µs as GB/s and as a share of
the H200's ~4.3 TB/s). Times are CUDA events, best of 3 rounds of 50 calls after a warm-up. Random
raw blocks (sane fp16 scales), so the numbers measure the kernels, not a model. Nothing runs at
import; ``python bench/ggml_blocks_bench.py [--quick]`` runs it (about a minute on an H200,
``--quick`` a few types and shapes).
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
QUICK_TYPES = ["Q4_0", "Q4_K", "Q6_K"]
SHAPES = [(2048, 2048), (8192, 2048), (2048, 8192), (4096, 4096), (14336, 4096)]
QUICK_SHAPES = [(4096, 4096), (14336, 4096)]
MS = [1, 4, 16, 128]


def random_block_matrix(type_name: str, n: int, k: int, seed: int) -> BlockMatrix:
    """Random ggml blocks for [n, k], repacked on the GPU as the loader would."""
    return BlockMatrix.from_gguf(type_name, random_block_bytes(type_name, n, k, seed=seed), (n, k))


def bench_block_kernels(quick: bool) -> None:
    if not torch.cuda.is_available():
        print("bench_block_kernels: no CUDA device, skipped")
        return
    types, shapes = (QUICK_TYPES, QUICK_SHAPES) if quick else (TYPES, SHAPES)
    print(f"\n## GGUF block matmul on {torch.cuda.get_device_name()} (µs per call)\n")
    print("| type | N | K | M | formcast µs | bf16 dense µs | dense/formcast | M=1 GB/s | of 4.3 TB/s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for ti, type_name in enumerate(types):
        for n, k in shapes:
            bm = random_block_matrix(type_name, n, k, seed=ti)
            dense = bm.dequantize(torch.bfloat16)
            for m in MS:
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                ours = cuda_time_ms(lambda: bm.matmul(x), reps=50) * 1e3
                theirs = cuda_time_ms(lambda: F.linear(x, dense), reps=50) * 1e3
                bandwidth = share = ""
                if m == 1:
                    gbps = bm.nbytes / (ours * 1e-6) / 1e9
                    bandwidth, share = f"{gbps:.0f}", f"{gbps / PEAK_GBPS:.0%}"
                print(f"| {type_name} | {n} | {k} | {m} | {ours:.1f} | {theirs:.1f} | {theirs / ours:.2f} | {bandwidth} | {share} |")
            del bm, dense
    torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="three types, two shapes")
    args = parser.parse_args()
    bench_block_kernels(args.quick)


if __name__ == "__main__":
    main()
