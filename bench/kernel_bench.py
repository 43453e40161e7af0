"""Benchmark: token bitmask application and the Sampler's cost per step.

    python bench/kernel_bench.py [--threads N] [--density 0.5] [--quick]

Table 1: ``formcast_kernels.apply_token_bitmask_inplace`` on CPU logits [B, V] for B in 1, 8, 64, 256 and
V in 49152, 151936, next to XGrammar's CPU ``apply_token_bitmask_inplace`` and a naive torch
mask (unpack bits, boolean-index assignment); times in microseconds (best of repeats) and ratios
formcast / other (< 1 means formcast is faster).
Table 2: ``Sampler.sample`` per step at batch 64 under several parameter mixes.
Table 3 (CUDA only): the Triton kernel against XGrammar's Triton kernel.
Not collected by pytest.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time
from collections.abc import Callable

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from engine.sampling import Sampler, SamplingBatchInfo  # noqa: E402
from engine.sampling_params import SamplingParams  # noqa: E402
from formcast_kernels import apply_token_bitmask_inplace  # noqa: E402

BATCHES = [1, 8, 64, 256]
VOCABS = [49152, 151936]
_SHIFTS = torch.arange(32, dtype=torch.int32)


def best_time_us(fn: Callable[[], object], min_time: float = 0.2, repeats: int = 5, sync: bool = False) -> float:
    """Best mean time per call over ``repeats`` rounds of about ``min_time`` seconds each."""
    fn()
    if sync:
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if sync:
        torch.cuda.synchronize()
    once = max(time.perf_counter() - start, 1e-6)
    n = max(1, int(min_time / once))
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        if sync:
            torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - start) / n)
    return best * 1e6


def naive_apply(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """What one writes first: unpack every bit, then boolean-index assignment."""
    bits = ((bitmask.unsqueeze(-1) >> _SHIFTS) & 1).reshape(bitmask.shape[0], -1)[:, : logits.shape[1]]
    logits[bits == 0] = float("-inf")


def random_bitmask(batch: int, vocab: int, density: float, device: str = "cpu") -> torch.Tensor:
    g = torch.Generator().manual_seed(batch * 31 + vocab)
    allowed = torch.rand(batch, (vocab + 31) // 32 * 32, generator=g) < density
    weights = (1 << torch.arange(32, dtype=torch.int64))
    words = (allowed.view(batch, -1, 32).to(torch.int64) * weights).sum(-1)
    return words.to(torch.int64).where(words < 2**31, words - 2**32).to(torch.int32).to(device)


def bench_cpu_apply(density: float, quick: bool) -> None:
    try:
        import xgrammar
    except ImportError:  # pragma: no cover - bench extra not installed
        xgrammar = None
    print(f"\n## Bitmask apply, CPU, float32, mask density {density} (us per call; threads={torch.get_num_threads()})\n")
    print("| batch | vocab | formcast | xgrammar | naive torch | formcast/xgrammar | formcast/naive |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for batch in BATCHES[:3] if quick else BATCHES:
        for vocab in VOCABS:
            logits = torch.randn(batch, vocab)
            bitmask = random_bitmask(batch, vocab, density)
            ours = best_time_us(lambda: apply_token_bitmask_inplace(logits, bitmask))
            naive = best_time_us(lambda: naive_apply(logits, bitmask))
            xg = best_time_us(lambda: xgrammar.apply_token_bitmask_inplace(logits, bitmask)) if xgrammar else float("nan")
            print(f"| {batch} | {vocab} | {ours:.0f} | {xg:.0f} | {naive:.0f} | {ours / xg:.2f} | {ours / naive:.2f} |", flush=True)


def _sampler_mixes(batch: int) -> dict[str, list[SamplingParams]]:
    half = batch // 2
    return {
        "greedy": [SamplingParams(temperature=0.0)] * batch,
        "temperature 0.7": [SamplingParams(temperature=0.7)] * batch,
        "top_p 0.9": [SamplingParams(top_p=0.9)] * batch,
        "top_k 50 + top_p 0.9 + min_p": [SamplingParams(top_k=50, top_p=0.9, min_p=0.05)] * batch,
        "seeded (all rows)": [SamplingParams(sampling_seed=i) for i in range(batch)],
        "penalties": [SamplingParams(frequency_penalty=0.5, presence_penalty=0.5, repetition_penalty=1.1)] * batch,
        "grammar on half the rows": [SamplingParams(regex="x")] * half + [SamplingParams()] * (batch - half),
        "logprobs top 5": [SamplingParams(logprobs=True, top_logprobs_num=5)] * batch,
        FLAT_TOP_P: [SamplingParams(top_p=0.9)] * batch,
    }


# Logits for the sampler table: N(0, 1) * 5, peaked like a language model's (top-p 0.9 falls within
# the top-1024 candidates); the FLAT_TOP_P row uses N(0, 1), where top-p 0.9 spans ~half the
# vocabulary and the sampler falls back to a full sort (its worst case).
LOGIT_SCALE = 5.0
FLAT_TOP_P = "top_p 0.9, flat logits (full-sort fallback)"


def bench_sampler(batch: int, quick: bool, device: str = "cpu") -> None:
    print(f"\n## Sampler.sample per step, batch {batch}, {device} (us per step; threads={torch.get_num_threads()})\n")
    print("| params | " + " | ".join(f"V={v}" for v in VOCABS) + " |")
    print("| --- | " + " | ".join("---:" for _ in VOCABS) + " |")
    sampler = Sampler()
    mixes = _sampler_mixes(batch)
    rows: dict[str, list[str]] = {name: [] for name in mixes}
    for vocab in VOCABS:
        peaked = torch.randn(batch, vocab, device=device) * LOGIT_SCALE
        for name, params in mixes.items():
            logits = peaked / LOGIT_SCALE if name == FLAT_TOP_P else peaked
            info = SamplingBatchInfo.from_params(params, vocab, device)
            if info.vocab_mask is not None:
                info.vocab_mask.copy_(random_bitmask(batch, vocab, 0.5))
            work = torch.empty_like(logits)

            def step() -> None:
                work.copy_(logits)
                sampler.sample(work, info)

            rows[name].append(f"{best_time_us(step, min_time=0.1 if quick else 0.3, repeats=3, sync=device == 'cuda'):.0f}")
    for name, cells in rows.items():
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)


def bench_gpu_apply(density: float) -> None:
    from xgrammar.kernels.apply_token_bitmask_inplace_triton import apply_token_bitmask_inplace_triton as xg_triton

    print(f"\n## Bitmask apply, CUDA ({torch.cuda.get_device_name()}), mask density {density} (us per call)\n")
    from formcast_kernels.bitmask_triton import apply_token_bitmask_inplace_triton

    print("| batch | vocab | dtype | formcast triton | xgrammar triton | ratio | masked stores | whole tiles |")
    print("| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for dtype in (torch.float32, torch.bfloat16):
        for batch in BATCHES:
            for vocab in VOCABS:
                logits = torch.randn(batch, vocab, device="cuda", dtype=dtype)
                bitmask = random_bitmask(batch, vocab, density, "cuda")
                ours = best_time_us(lambda: apply_token_bitmask_inplace(logits, bitmask), sync=True)
                xg = best_time_us(lambda: xg_triton(logits, bitmask), sync=True)
                variants = [
                    best_time_us(lambda: apply_token_bitmask_inplace_triton(logits, bitmask, None, vocab, full), sync=True)
                    for full in (False, True)
                ]
                print(f"| {batch} | {vocab} | {str(dtype)[6:]} | {ours:.1f} | {xg:.1f} | {ours / xg:.2f} | {variants[0]:.1f} | {variants[1]:.1f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--density", type=float, default=0.5, help="fraction of allowed tokens in the masks")
    parser.add_argument("--quick", action="store_true", help="fewer sizes, shorter timing")
    parser.add_argument("--skip-sampler", action="store_true")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    bench_cpu_apply(args.density, args.quick)
    if not args.skip_sampler:
        bench_sampler(64, args.quick)
    if torch.cuda.is_available():
        bench_gpu_apply(args.density)
        if not args.skip_sampler:
            bench_sampler(64, args.quick, "cuda")


if __name__ == "__main__":
    main()
