"""Benchmark: weight-only int8 / int4 quantization at load against float32, on the embedded SmolLM2.

    python bench/quantization_bench.py [--prompts 16] [--tokens 32] [--threads 1] [--gguf]

For each of float32, int8 and int4 (the Hugging Face folder converted from the embedded model;
``--gguf`` adds the embedded Q4_1 file itself): weight bytes of the multiplied matrices, greedy
agreement with float32 (prompts whose first ``--tokens`` greedy tokens are identical, and the
mean length of the common prefix), batch-1 decode tokens/s, and the schema-valid share of a small
JSON extraction job. Agreement and validity do not depend on machine load; tokens/s is a ratio
within one run. Not collected by pytest.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine import Engine  # noqa: E402

TOPICS = ["the tides", "photosynthesis", "a bicycle gear", "the Roman calendar", "compound interest", "volcanoes",
          "the printing press", "honey bees", "rainbows", "the metric system", "chess openings", "glaciers",
          "sourdough bread", "lighthouses", "the immune system", "electric motors"]  # fmt: skip
SCHEMA = {"type": "object", "properties": {"topic": {"type": "string", "maxLength": 40}, "facts": {"type": "array", "items": {"type": "string", "maxLength": 60}, "maxItems": 3}},
          "required": ["topic", "facts"], "additionalProperties": False}  # fmt: skip


def weight_bytes(engine: Engine) -> int:
    model = engine.runner.model
    seen, total = set(), 0
    mats = [model.lm_head] + [getattr(getattr(layer, part), name) for layer in model.layers
                              for part, name in (("self_attn", "qkv_proj"), ("self_attn", "o_proj"), ("mlp", "gate_up_proj"), ("mlp", "down_proj"))]  # fmt: skip
    for w in mats:
        if id(w) in seen:
            continue
        seen.add(id(w))
        total += w.nbytes if not hasattr(w, "element_size") else w.numel() * w.element_size()
    return total


def run(label: str, model_path: str | None, quantization: str | None, args: argparse.Namespace) -> dict:
    engine = Engine(model_path, dtype="float32", quantization=quantization, num_threads=args.threads)
    try:
        chat = lambda text: engine.apply_chat_template([{"role": "user", "content": text}])  # noqa: E731
        prompts = [chat(f"Explain {t} in two sentences.") for t in TOPICS[: args.prompts]]
        greedy = {"temperature": 0.0, "max_new_tokens": args.tokens, "ignore_eos": True}
        outs = []
        start = time.perf_counter()
        for p in prompts:  # batch 1, one after another
            outs.append(engine.generate(input_ids=[p], sampling_params=[greedy])[0]["output_ids"])
        wall = time.perf_counter() - start
        json_prompts = [chat(f"Give three facts about {t} as JSON.") for t in TOPICS[: args.prompts]]
        params = [{"temperature": 0.0, "max_new_tokens": 96, "json_schema": SCHEMA}] * len(json_prompts)
        valid = 0
        for o in engine.generate(input_ids=json_prompts, sampling_params=params):
            try:
                doc = json.loads(o["text"])
                valid += isinstance(doc, dict) and set(doc) == {"topic", "facts"}
            except json.JSONDecodeError:
                pass
        return {"label": label, "bytes": weight_bytes(engine), "outs": outs, "tok_s": sum(map(len, outs)) / wall, "valid": valid}
    finally:
        engine.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--gguf", action="store_true", help="also the embedded Q4_1 GGUF file")
    args = ap.parse_args()
    from engine.hf.model_files import default_model_dir, gguf_path

    folder = str(default_model_dir())
    rows = [run("float32", folder, None, args), run("int8 (Q8_0)", folder, "int8", args), run("int4 (Q4_0)", folder, "int4", args)]
    if args.gguf:
        rows.append(run("GGUF Q4_1 file", str(gguf_path()), None, args))
    base = rows[0]
    print(f"{args.prompts} prompts x {args.tokens} greedy tokens, batch 1, {args.threads} thread(s); JSON job: {args.prompts} prompts\n")
    print("| weights | matrix bytes | vs float32 | prompts identical to float32 | mean common prefix | decode tok/s | vs float32 | schema-valid |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        same = sum(a == b for a, b in zip(r["outs"], base["outs"]))
        prefix = [next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b))) for a, b in zip(r["outs"], base["outs"])]
        print(f"| {r['label']} | {r['bytes'] / 1e6:,.1f} MB | {r['bytes'] / base['bytes']:.2f}x | {same}/{len(r['outs'])} | "
              f"{sum(prefix) / len(prefix):.1f} | {r['tok_s']:.1f} | {r['tok_s'] / base['tok_s']:.2f}x | {r['valid']}/{args.prompts} |")


if __name__ == "__main__":
    main()
