"""What a request with a schema the engine has not seen waits for its grammar, beside its prefill.

Runs the Engine on the embedded SmolLM2 GGUF (no compiled-grammar disk cache) and sends one chat
request per sampled MaskBench schema, one after another: the prompt asks for an instance and
quotes the schema (its first 1,000 characters), ``json_schema`` is the schema, greedy, streamed
and aborted once it has sampled its first token (``max_new_tokens`` 1,024: a budget below a
schema's shortest output is refused at admission). Each request's last output reports where its time to the first token went
(``meta_info``: ``grammar_wait``, the compile of its new schema in the engine's compile worker
plus the matcher; ``queue_wait``; ``prefill_latency``, its prompt's forward passes to the first
sampled token). Beside them, in the same run and on the same tokenizer: llguidance's time to
first mask for the same schema (compile, matcher, first mask), the anchor for the compile.

    python bench/schema_wait_bench.py --sample 100 --seed 0

Reported: p50 / p90 / p99 of each span over the requests whose schema compiled; the share of
requests that waited longer for their grammar than for their prefill; refusals.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import maskbench  # noqa: E402
from common import machine_line, markdown_table  # noqa: E402


def _llguidance_ttfm(anchor, schema, width: int) -> float | None:  # type: ignore[no-untyped-def]
    mask = np.zeros((1, width), dtype=np.int32)
    t0 = time.perf_counter()
    try:
        anchor.compile(schema)().fill(mask)
    except Exception:  # noqa: BLE001 - refused (or failed) by llguidance: no anchor figure
        return None
    return time.perf_counter() - t0


def _first_token_only(engine, prompt: str, params: dict, rid: str) -> dict:  # type: ignore[no-untyped-def]
    """The last output's meta_info of a streamed request aborted once it has sampled a token (the
    spans end there; generating the rest would only make the run longer)."""
    ids = engine.apply_chat_template([{"role": "user", "content": prompt}])
    aborted = False
    for chunk in engine.generate(input_ids=ids, sampling_params=params, rid=rid, stream=True):
        meta = chunk["meta_info"]
        if not aborted and meta["completion_tokens"] > meta["jump_forward_tokens"]:
            engine.abort(rid)
            aborted = True
        if meta["finish_reason"] is not None:
            return meta
    raise RuntimeError(f"request {rid} ended without a last output")


def _percentiles(values: list[float]) -> list[str]:
    if not values:
        return ["-"] * 3
    return [f"{v * 1e3:.1f}" for v in np.percentile(np.array(values), [50, 90, 99])]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--input", type=Path, default=Path("/work/shared/bench/maskbench/dev.jsonl.gz"))
    ap.add_argument("--sample", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-new-tokens", type=int, default=1024, help="the budget the schema's shortest output must fit")
    args = ap.parse_args()

    from engine import Engine

    records = maskbench.load_records(args.input, 0, None, args.sample, args.seed)
    tok = maskbench.load_tokenizer("smollm2")
    eos = int(tok.eos_token_id)
    width = (len(tok) + 31) // 32
    anchor = maskbench.LLGuidanceEngine(tok, eos)
    _llguidance_ttfm(anchor, {"type": "object", "properties": {"a": {"type": "string"}}}, width)  # per-tokenizer setup

    rows: dict[str, list[float]] = {"grammar_wait": [], "queue_wait": [], "prefill_latency": [], "llguidance": []}
    longer_wait = 0
    refusals: dict[str, int] = {}
    with Engine(grammar_cache_dir=None) as engine:
        warm = {"type": "object", "properties": {"a": {"type": "integer"}}}
        engine.chat([{"role": "user", "content": "Warm up."}], {"json_schema": warm, "max_new_tokens": 4})
        for record in records:
            schema = record["schema"]
            prompt = "Write one JSON instance of this JSON schema:\n" + json.dumps(schema)[:1000]
            params = {"json_schema": schema, "max_new_tokens": args.max_new_tokens, "temperature": 0.0}
            try:
                meta = _first_token_only(engine, prompt, params, f"schema-{len(rows['grammar_wait'])}-{sum(refusals.values())}")
            except Exception as exc:  # noqa: BLE001 - refused before admission (a bad schema)
                why = f"before admission: {type(exc).__name__}"
                refusals[why] = refusals.get(why, 0) + 1
                continue
            if meta["prefill_latency"] is None:  # refused at compile
                why = "at compile: " + meta["finish_reason"].get("message", "")[:60]
                refusals[why] = refusals.get(why, 0) + 1
                continue
            for key in ("grammar_wait", "queue_wait", "prefill_latency"):
                rows[key].append(meta[key])
            longer_wait += meta["grammar_wait"] > meta["prefill_latency"]
            ttfm = _llguidance_ttfm(anchor, schema, width)
            if ttfm is not None:
                rows["llguidance"].append(ttfm)
    served = len(rows["grammar_wait"])
    print(f"# {machine_line()}; SmolLM2-135M-Instruct Q4_1 GGUF; {args.sample} MaskBench schemas (seed {args.seed})\n")
    labels = {"grammar_wait": "formcast: wait for the grammar", "queue_wait": "formcast: wait for a batch",
              "prefill_latency": "formcast: prefill to first token", "llguidance": "llguidance: time to first mask (same schemas)"}  # fmt: skip
    print(markdown_table(["span (ms)", "p50", "p90", "p99", "n"], [[labels[k], *_percentiles(v), str(len(v))] for k, v in rows.items()]))
    print(f"\n{served} requests served; grammar wait longer than prefill in {longer_wait} of {served}")
    for why, count in sorted(refusals.items(), key=lambda kv: -kv[1]):
        print(f"refused {count}: {why}")


if __name__ == "__main__":
    main()
