"""Benchmark: formcast's Engine against ``transformers`` ``generate`` end to end.

    python bench/e2e_bench.py [--dtypes float32,bfloat16] [--batches 1,8,32] [--threads N]
                              [--requests 32] [--skip-hf]

Same prompts, same weights, same dtype, greedy, in one run:
* unconstrained rows: chat prompts of mixed length (20 to ~400 tokens), each with its own output
  length (16 to 128 tokens, EOS ignored so lengths are fixed). formcast batches them continuously;
  ``generate`` runs each batch until its longest row ends (the rows' own lengths count as output);
* JSON-schema rows: the realistic schemas of ``schemas/e2e`` (tool arguments, records); formcast
  with its own grammar, ``generate`` with xgrammar's ``LogitsProcessor`` on the same schemas.
Batch 1 runs requests one at a time; batch B submits B at a time. Reported: output tokens/s,
per-request latency p50/p90, and formcast/transformers ratios.
Also: formcast's constrained overhead (the JSON rows rerun unconstrained with each row's output
length fixed to what the grammar produced: same tokens per row, no grammar; jump-forward off so
forwards match), the share of output tokens that jump-forward appended without a forward, the
prefix-cache hit rate on 32 questions about one shared document, and batch-1 decode against the
memory-bandwidth bound measured in the same run. Not collected by pytest.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine import Engine  # noqa: E402
from forward_bench import measure_bandwidth, weight_bytes  # noqa: E402

TOPICS = ["the sea", "a robot", "prime numbers", "Paris", "coffee", "the moon", "a violin", "winter", "bees", "chess",
          "volcanoes", "a lighthouse", "rivers", "bread", "trains", "clouds"]  # fmt: skip
DOCUMENT = (
    "The Aurora Rail Company was founded in 1887 in Trondheim. It built the first electric line across the "
    "Dovre mountains in 1921, merged with Nordbane in 1954, and today runs 412 trains a day on 2,300 km of "
    "track. Its headquarters moved to Oslo in 1979. The company employs 8,900 people, of whom 31% are "
    "engineers, and its current chief executive is Ingrid Halvorsen, appointed in 2018. "
) * 6
QUESTIONS = ["When was the company founded?", "Where is the headquarters?", "How many trains run a day?",
             "Who is the chief executive?", "When did it merge with Nordbane?", "How long is the track?",
             "How many people work there?", "What share are engineers?"] * 4  # fmt: skip


def unconstrained_requests(engine: Engine, n: int) -> tuple[list[list[int]], list[int]]:
    rng = random.Random(0)
    prompts, lengths = [], []
    for i in range(n):
        filler = " ".join(["Please be thorough and precise."] * rng.randint(0, 40))
        prompts.append(engine.apply_chat_template([{"role": "user", "content": f"{filler} Write about {TOPICS[i % 16]}."}]))
        lengths.append(rng.choice([16, 32, 64, 96, 128]))
    return prompts, lengths


def json_requests(engine: Engine, n: int) -> tuple[list[list[int]], list[dict]]:
    cases = json.loads((ROOT / "schemas" / "e2e" / "supported.json").read_text())
    cases = (cases * (n // len(cases) + 1))[:n]
    prompts = [engine.apply_chat_template([{"role": "user", "content": c["prompt"]}]) for c in cases]
    return prompts, [c["schema"] for c in cases]


# ------------------------------------------------------------------ formcast


def formcast(engine: Engine, prompts: list[list[int]], params: list[dict], batch: int) -> dict:
    sched = engine.scheduler
    before = dict(sched.stats)
    start = time.perf_counter()
    outs = []
    for i in range(0, len(prompts), batch):
        outs += engine.generate(input_ids=prompts[i : i + batch], sampling_params=params[i : i + batch])
    wall = time.perf_counter() - start
    tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
    return {
        "tokens": tokens, "wall": wall, "latencies": [o["meta_info"]["e2e_latency"] for o in outs],
        "forced": sum(o["meta_info"]["jump_forward_tokens"] for o in outs), "forwards": sched.stats["forwards"] - before["forwards"],
        "lengths": [o["meta_info"]["completion_tokens"] for o in outs],
    }  # fmt: skip


# ------------------------------------------------------------------ transformers


def hf_generate(model, tokenizer, prompts: list[list[int]], lengths: list[int], batch: int, processor_factory=None) -> dict:
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    tokens, latencies = 0, []
    start = time.perf_counter()
    for i in range(0, len(prompts), batch):
        rows, limits = prompts[i : i + batch], lengths[i : i + batch]
        longest = max(map(len, rows))
        ids = torch.tensor([[pad] * (longest - len(p)) + p for p in rows])
        mask = torch.tensor([[0] * (longest - len(p)) + [1] * len(p) for p in rows])
        kwargs = {"logits_processor": [processor_factory(i, len(rows))]} if processor_factory else {"min_new_tokens": max(limits)}
        t = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max(limits), do_sample=False, pad_token_id=pad, **kwargs)
        latencies += [time.perf_counter() - t] * len(rows)
        for row, limit in zip(out[:, longest:].tolist(), limits):
            if processor_factory:  # constrained: the row's tokens up to its EOS
                eos = next((k for k, t_ in enumerate(row) if t_ in (2, 0)), len(row))
                tokens += min(eos + 1, len(row))
            else:
                tokens += limit
    return {"tokens": tokens, "wall": time.perf_counter() - start, "latencies": latencies}


def xgrammar_factory(tokenizer, schemas: list[dict], vocab_size: int):  # type: ignore[no-untyped-def]
    import xgrammar as xgr

    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
    compiler = xgr.GrammarCompiler(info)
    compiled = [compiler.compile_json_schema(json.dumps(s)) for s in schemas]
    return lambda start, n: xgr.contrib.hf.LogitsProcessor(compiled[start : start + n])


# ------------------------------------------------------------------ main


def _row(name: str, dtype: str, batch: int, ours: dict, theirs: dict | None) -> str:
    tps = ours["tokens"] / ours["wall"]
    p50, p90 = (statistics.quantiles(ours["latencies"], n=10)[i] for i in (4, 8)) if len(ours["latencies"]) > 1 else (ours["latencies"][0],) * 2
    if theirs is None:
        return f"| {name} | {dtype} | {batch} | {tps:.1f} | | | {p50:.1f} | | |"
    htps = theirs["tokens"] / theirs["wall"]
    hp50 = statistics.median(theirs["latencies"])
    return f"| {name} | {dtype} | {batch} | {tps:.1f} | {htps:.1f} | {tps / htps:.2f}x | {p50:.1f} / {p90:.1f} | {hp50:.1f} | {ours['forced'] / max(1, ours['tokens']):.0%} |"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtypes", default="float32")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--skip-hf", action="store_true")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    batches = [int(b) for b in args.batches.split(",")]
    lines = []
    for dtype in args.dtypes.split(","):
        with Engine(dtype=dtype, max_total_tokens=60_000, max_running_requests=64, num_threads=args.threads) as engine:
            hf = None
            if not args.skip_hf:
                from transformers import AutoModelForCausalLM

                hf = AutoModelForCausalLM.from_pretrained(str(engine.runner.model_path), dtype=engine.runner.dtype).eval()
            engine.generate("warm up", {"max_new_tokens": 4})
            prompts, lengths = unconstrained_requests(engine, args.requests)
            jprompts, schemas = json_requests(engine, args.requests)
            free = [{"temperature": 0.0, "max_new_tokens": n, "ignore_eos": True} for n in lengths]
            constrained = [{"temperature": 0.0, "max_new_tokens": 128, "json_schema": s} for s in schemas]
            factory = xgrammar_factory(engine.tokenizer, schemas, engine.runner.vocab_size) if hf is not None else None
            for batch in batches:
                n = args.requests if batch > 1 else min(args.requests, 8)  # batch 1 is slow: 8 requests
                ours = formcast(engine, prompts[:n], free[:n], batch)
                theirs = hf_generate(hf, engine.tokenizer, prompts[:n], lengths[:n], batch) if hf is not None else None
                lines.append(_row("unconstrained", dtype, batch, ours, theirs))
                print(lines[-1], flush=True)
                ours_j = formcast(engine, jprompts[:n], constrained[:n], batch)
                theirs_j = hf_generate(hf, engine.tokenizer, jprompts[:n], [128] * n, batch, factory) if hf is not None else None
                lines.append(_row("json_schema", dtype, batch, ours_j, theirs_j))
                print(lines[-1], flush=True)
            _overhead(engine, jprompts[:8], schemas[:8], dtype)
            _prefix_cache(engine)
            _bound(engine, prompts[0], dtype)
            del hf
    print("\n| workload | dtype | batch | formcast tok/s | transformers tok/s | formcast/transformers | formcast latency p50 / p90 s | transformers latency p50 s | jump-forward share |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    print("\n".join(lines))


def _overhead(engine: Engine, prompts: list[list[int]], schemas: list[dict], dtype: str) -> None:
    """Constrained vs unconstrained with identical per-row token counts, jump-forward off."""
    engine.scheduler.outputs.enable_jump_forward = False
    try:
        params = [{"temperature": 0.0, "max_new_tokens": 128, "json_schema": s} for s in schemas]
        con = formcast(engine, prompts, params, 8)
        free = [{"temperature": 0.0, "max_new_tokens": n, "ignore_eos": True} for n in con["lengths"]]
        unc = formcast(engine, prompts, free, 8)
        for _ in range(2):  # interleave again to damp machine noise; keep the best of each
            con2 = formcast(engine, prompts, params, 8)
            unc2 = formcast(engine, prompts, free, 8)
            con["wall"], unc["wall"] = min(con["wall"], con2["wall"]), min(unc["wall"], unc2["wall"])
    finally:
        engine.scheduler.outputs.enable_jump_forward = engine.args.enable_jump_forward
    print(f"\n{dtype}: constrained overhead at batch 8 (same tokens per row, jump-forward off): "
          f"{con['wall'] / unc['wall'] - 1:+.1%} ({con['tokens']} tokens, {con['wall']:.1f} s vs {unc['wall']:.1f} s)", flush=True)  # fmt: skip


def _prefix_cache(engine: Engine) -> None:
    engine.flush_cache()
    prompts = [engine.apply_chat_template([{"role": "user", "content": f"{DOCUMENT}\nQuestion: {q}"}]) for q in QUESTIONS]
    outs = engine.generate(input_ids=prompts, sampling_params={"temperature": 0.0, "max_new_tokens": 8})
    cached = sum(o["meta_info"]["cached_tokens"] for o in outs)
    total = sum(o["meta_info"]["prompt_tokens"] for o in outs)
    print(f"prefix cache: 32 questions over one {len(prompts[0])}-token document: {cached}/{total} prompt tokens reused ({cached / total:.0%})", flush=True)


def _bound(engine: Engine, prompt: list[int], dtype: str) -> None:
    runner = engine.runner
    bandwidth = measure_bandwidth(weight_bytes(runner) if runner.dtype == torch.float32 else 2 * weight_bytes(runner))
    bound = weight_bytes(runner) / (bandwidth * 1e9)
    out = engine.generate(input_ids=prompt, sampling_params={"temperature": 0.0, "max_new_tokens": 64, "ignore_eos": True})
    per_token = out["meta_info"]["e2e_latency"] / 64
    print(f"{dtype}: batch-1 decode {1 / per_token:.1f} tok/s = {bound / per_token:.0%} of the memory-bandwidth bound "
          f"({bandwidth:.1f} GB/s, {bound * 1e3:.1f} ms/token)", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
