"""Benchmark: ``ModelRunner.forward`` against ``transformers`` on the same weights and dtype.

    python bench/forward_bench.py [--dtypes float32,bfloat16] [--batches 1,8,32] [--steps 8]
                                  [--threads N] [--agreement 100] [--model PATH]

For each dtype and batch size, contexts are drawn (seeded) between 64 and 1,024 tokens:
* prefill tokens/s: formcast prefills every row in one forward (no padding); transformers runs
  one left-padded batch with an attention mask, as ``generate`` does;
* decode ms/step: the mean over ``--steps`` steps that each add one token to every row
  (formcast: paged KV cache; transformers: its ``DynamicCache``).
The memory-bandwidth bound of a batch-1 decode step is measured in the same run: a
matrix-vector product over a float32 matrix as large as the model's weights gives GB/s, and
bound = weight bytes (in the dtype) / GB/s. Each engine's batch-1 decode is reported as a share of
it. ``--agreement N``: greedy outputs of N prompts (32 tokens) in each half-precision dtype
against float32, as the share of prompts whose outputs are identical and of tokens before the
first difference. Not collected by pytest.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.model_executor.forward_batch import ForwardBatch, ForwardInput  # noqa: E402
from engine.model_executor.model_runner import ModelRunner  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def measure_bandwidth(weight_bytes: int) -> float:
    """GB/s of a float32 matrix-vector product over ``weight_bytes`` of matrix (best of 5)."""
    cols = 1024
    w = torch.randn(weight_bytes // (4 * cols), cols)
    x = torch.randn(1, cols)
    best = float("inf")
    with torch.inference_mode():
        F.linear(x, w)
        for _ in range(5):
            start = time.perf_counter()
            F.linear(x, w)
            best = min(best, time.perf_counter() - start)
    return w.numel() * 4 / best / 1e9


def weight_bytes(runner: ModelRunner) -> int:
    """Bytes a decode step must read: every weight (the embedding only when tied to the head)."""
    seen, total = set(), 0
    for name, p in runner.model.named_parameters(remove_duplicate=False):
        if id(p) in seen or (name == "embed_tokens" and not runner.model_config.tie_word_embeddings):
            continue
        seen.add(id(p))
        total += p.numel() * p.element_size()
    return total


def contexts(batch: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(100, 40000) for _ in range(rng.randint(64, 1024))] for _ in range(batch)]


# ------------------------------------------------------------------ formcast


def formcast_run(runner: ModelRunner, prompts: list[list[int]], steps: int) -> tuple[float, float]:
    """(prefill tokens/s, mean decode ms/step); frees everything afterwards."""
    pools = (runner.req_to_token_pool, runner.token_to_kv_pool)
    slots = runner.req_to_token_pool.alloc(len(prompts))
    held = []
    inputs = []
    for slot, p in zip(slots, prompts):
        locs = runner.token_to_kv_pool.alloc(len(p))
        held.append(locs)
        inputs.append(ForwardInput(slot, 0, p, locs))
    start = time.perf_counter()
    out = runner.forward(ForwardBatch.init_new(inputs, *pools))
    prefill = sum(map(len, prompts)) / (time.perf_counter() - start)
    lens = [len(p) for p in prompts]
    times = []
    for _ in range(steps):
        nxt = out.next_token_logits.argmax(-1).tolist()
        inputs = []
        for i, slot in enumerate(slots):
            locs = runner.token_to_kv_pool.alloc(1)
            held.append(locs)
            inputs.append(ForwardInput(slot, lens[i], [nxt[i]], locs))
            lens[i] += 1
        _sync(runner.device)
        start = time.perf_counter()
        out = runner.forward(ForwardBatch.init_new(inputs, *pools))
        out.next_token_logits.argmax(-1).tolist()
        times.append(time.perf_counter() - start)
    for locs in held:
        runner.token_to_kv_pool.free(locs)
    runner.req_to_token_pool.free(slots)
    return prefill, statistics.mean(times[1:] if len(times) > 2 else times) * 1e3


# ------------------------------------------------------------------ transformers


def hf_run(model, prompts: list[list[int]], steps: int, pad_id: int) -> tuple[float, float]:
    import inspect

    from transformers import DynamicCache

    # transformers 5.2x names the cache argument ``cache``; earlier releases ``past_key_values``.
    cache_arg = "cache" if "cache" in inspect.signature(type(model).forward).parameters else "past_key_values"

    longest = max(map(len, prompts))
    ids = torch.tensor([[pad_id] * (longest - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (longest - len(p)) + [1] * len(p) for p in prompts])
    device = next(model.parameters()).device
    ids, mask = ids.to(device), mask.to(device)
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        start = time.perf_counter()
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, **{cache_arg: cache})
        prefill = sum(map(len, prompts)) / (time.perf_counter() - start)
        times = []
        for _ in range(steps):
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            mask = torch.cat([mask, torch.ones_like(nxt)], dim=1)
            pos = pos[:, -1:] + 1
            _sync(device)
            start = time.perf_counter()
            out = model(input_ids=nxt, attention_mask=mask, position_ids=pos, use_cache=True, **{cache_arg: cache})
            out.logits[:, -1].argmax(-1)
            _sync(device)
            times.append(time.perf_counter() - start)
    return prefill, statistics.mean(times[1:] if len(times) > 2 else times) * 1e3


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


# ------------------------------------------------------------------ greedy agreement


def greedy_outputs(runner: ModelRunner, prompts: list[list[int]], new_tokens: int, batch: int = 16) -> list[list[int]]:
    outs = []
    for i in range(0, len(prompts), batch):
        group = prompts[i : i + batch]
        pools = (runner.req_to_token_pool, runner.token_to_kv_pool)
        slots = runner.req_to_token_pool.alloc(len(group))
        seqs = [list(p) for p in group]
        held, cached = [], [0] * len(group)
        for _ in range(new_tokens):
            inputs = []
            for r, slot in enumerate(slots):
                new = seqs[r][cached[r] :]
                locs = runner.token_to_kv_pool.alloc(len(new))
                held.append(locs)
                inputs.append(ForwardInput(slot, cached[r], new, locs))
                cached[r] = len(seqs[r])
            logits = runner.forward(ForwardBatch.init_new(inputs, *pools)).next_token_logits
            for r, tok in enumerate(logits.argmax(-1).tolist()):
                seqs[r].append(tok)
        for locs in held:
            runner.token_to_kv_pool.free(locs)
        runner.req_to_token_pool.free(slots)
        outs += [s[len(p) :] for s, p in zip(seqs, group)]
    return outs


def chat_prompts(tokenizer, n: int) -> list[list[int]]:
    subjects = ["a city", "a river", "an animal", "a tool", "a planet", "a food", "a sport", "a color", "a job", "a song"]
    asks = ["Describe", "Name three facts about", "Write a haiku about", "Give a JSON object describing", "Explain", "List two uses of", "Invent", "Compare two kinds of", "Summarize the history of", "Tell a joke about"]  # fmt: skip
    out = []
    for i in range(n):
        text = f"{asks[i % 10]} {subjects[(i // 10) % 10]}."
        ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=True, add_generation_prompt=True)
        out.append(list(ids["input_ids"]) if hasattr(ids, "keys") else list(ids))
    return out


# ------------------------------------------------------------------ main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--agreement", type=int, default=100, help="prompts for the greedy-agreement check (0: skip)")
    ap.add_argument("--model", default=None, help="a Hugging Face folder (default: the embedded SmolLM2)")
    ap.add_argument("--skip-hf", action="store_true")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    batches = [int(b) for b in args.batches.split(",")]
    dtypes = args.dtypes.split(",")
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, steps {args.steps}")
    rows, b1 = [], {}
    runners = {}
    for dtype in dtypes:
        runner = ModelRunner(args.model, dtype=dtype, max_total_tokens=40_000, max_running_requests=max(batches + [16]))
        runners[dtype] = runner
        hf = None if args.skip_hf else AutoModelForCausalLM.from_pretrained(str(runner.model_path), dtype=DTYPES[dtype]).eval()
        wbytes = weight_bytes(runner)
        bandwidth = measure_bandwidth(weight_bytes(runners[dtypes[0]]) if dtype != "float32" else wbytes)
        bound_ms = wbytes / (bandwidth * 1e9) * 1e3
        warm = contexts(2, seed=99)  # first calls pay one-time costs (allocator, kernels loaded from cache)
        formcast_run(runner, warm, 2)
        if hf is not None:
            hf_run(hf, warm, 2, pad_id=0)
        print(f"\n{dtype}: weights {wbytes / 1e6:.0f} MB, GEMV bandwidth {bandwidth:.1f} GB/s, batch-1 bound {bound_ms:.1f} ms/step")
        for batch in batches:
            prompts = contexts(batch, seed=batch)
            ours = formcast_run(runner, prompts, args.steps)
            theirs = hf_run(hf, prompts, args.steps, pad_id=0) if hf is not None else (float("nan"), float("nan"))
            rows.append((dtype, batch, sum(map(len, prompts)) // batch, ours, theirs, bound_ms))
            print(f"  batch {batch}: formcast prefill {ours[0]:,.0f} tok/s, decode {ours[1]:.1f} ms/step; "
                  f"transformers prefill {theirs[0]:,.0f} tok/s, decode {theirs[1]:.1f} ms/step", flush=True)
            if batch == 1:
                b1[dtype] = (ours[1], theirs[1], bound_ms)
        del hf
    print("\n| dtype | batch | avg ctx | formcast prefill tok/s | transformers prefill tok/s | formcast decode ms/step | "
          "transformers decode ms/step | formcast/transformers decode time | formcast share of bound | transformers share of bound |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for dtype, batch, ctx, (fp, fd), (hp, hd), bound in rows:
        share = lambda t: f"{bound / t:.0%}" if batch == 1 else ""  # noqa: E731
        print(f"| {dtype} | {batch} | {ctx} | {fp:,.0f} | {hp:,.0f} | {fd:.1f} | {hd:.1f} | {fd / hd:.2f}x | {share(fd)} | {share(hd)} |")
    if "float32" in b1:
        for dtype, (fd, hd, _) in b1.items():
            if dtype != "float32":
                print(f"\nbatch-1 decode speed-up of {dtype} over float32: formcast {b1['float32'][0] / fd:.2f}x, "
                      f"transformers {b1['float32'][1] / hd:.2f}x")
    if args.agreement and "float32" in runners and len(runners) > 1:
        tok = AutoTokenizer.from_pretrained(str(runners["float32"].model_path))
        prompts = chat_prompts(tok, args.agreement)
        ref = greedy_outputs(runners["float32"], prompts, 32)
        for dtype, runner in runners.items():
            if dtype == "float32":
                continue
            got = greedy_outputs(runner, prompts, 32)
            same = sum(a == b for a, b in zip(ref, got))
            prefix = sum(next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a)) for a, b in zip(ref, got))
            print(f"greedy agreement {dtype} vs float32 on {len(prompts)} prompts x 32 tokens: identical outputs "
                  f"{same}/{len(prompts)}, tokens before the first difference {prefix / (32 * len(prompts)):.0%}")


if __name__ == "__main__":
    main()
