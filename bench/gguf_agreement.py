"""Benchmark: how often greedy outputs on a GGUF file agree, formcast against llama.cpp and llama.cpp against itself.

    python bench/gguf_agreement.py [--tokens 32] [--threads 2]

The 16 chat prompts of ``tests/test_gguf_smollm2.py`` on the embedded SmolLM2-135M-Instruct
Q4_1 file, ``--tokens`` greedy tokens each (or up to ``<|im_end|>``), the same prompt ids for
every run. The reference is llama-cpp-python with its defaults (``n_batch`` 512: a prompt is
one micro-batch). Each other run counts the prompts whose continuation is token-identical to
the reference's, with the first differing token of each other one:

* formcast on the GGUF (quantized products, the greedy loop of the runner tests);
* llama.cpp with the prompt fed one token at a time (``n_ubatch`` 1: its decode kernels);
* llama.cpp with flash attention;
* llama.cpp with one thread and with 8-token micro-batches (checks that the counts are not noise).

Greedy continuations of a 135M model at 4-bit turn on logit gaps of a few thousandths, so the
counts say how far apart two numerically sound implementations of the same file land, which is
the scale any agreement target has to be read against. Not collected by pytest.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from model_loop import GreedyLoop  # noqa: E402
from test_gguf_smollm2 import EOS, chat_prompt_ids, llama_cpp_greedy  # noqa: E402

from common import machine_line, markdown_table  # noqa: E402


def llama_cpp_run(path: Path, prompts: list[list[int]], tokens: int, **options: object) -> list[list[int]]:
    return llama_cpp_greedy(path, prompts, tokens, **options)


def formcast_greedy(path: Path, prompts: list[list[int]], tokens: int) -> list[list[int]]:
    from engine.model_executor.model_runner import ModelRunner

    runner = ModelRunner(path, max_total_tokens=4096, max_running_requests=len(prompts))
    return GreedyLoop(runner).greedy(prompts, tokens, eos={EOS})


def agreement(reference: list[list[int]], other: list[list[int]]) -> tuple[int, str]:
    same = sum(a == b for a, b in zip(reference, other))
    first = [
        f"{i}:{next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))}"
        for i, (a, b) in enumerate(zip(reference, other)) if a != b
    ]  # fmt: skip
    return same, " ".join(first)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    from engine.hf.model_files import gguf_path

    path = gguf_path()
    prompts = chat_prompt_ids(path)
    threads = args.threads
    reference = llama_cpp_run(path, prompts, args.tokens, n_batch=512, n_threads=threads)
    runs = {
        "formcast (GGUF, quantized products)": lambda: formcast_greedy(path, prompts, args.tokens),
        "llama.cpp, prompt one token at a time (n_ubatch 1)": lambda: llama_cpp_run(path, prompts, args.tokens, n_batch=1, n_ubatch=1, n_threads=threads),
        "llama.cpp, flash attention": lambda: llama_cpp_run(path, prompts, args.tokens, n_batch=512, n_threads=threads, flash_attn=True),
        "llama.cpp, one thread": lambda: llama_cpp_run(path, prompts, args.tokens, n_batch=512, n_threads=1),
        "llama.cpp, 8-token micro-batches": lambda: llama_cpp_run(path, prompts, args.tokens, n_batch=8, n_ubatch=8, n_threads=threads),
    }  # fmt: skip
    rows = []
    for name, run in runs.items():
        same, first = agreement(reference, run())
        rows.append([name, f"{same}/{len(prompts)}", first or "-"])
        print(f"{name}: {same}/{len(prompts)}", flush=True)
    print(machine_line())
    print(f"reference: llama.cpp defaults (n_batch 512, {threads} threads); {args.tokens} greedy tokens per prompt")
    print(markdown_table(["run", "identical to the reference", "prompt:first differing token"], rows))


if __name__ == "__main__":
    main()
