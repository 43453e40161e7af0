"""Benchmark: speculative decoding per drafter, JSON whitespace mode and dtype, on extraction
(flat and nested schemas), tool calls and free text.

    python bench/spec_bench.py [--drafters none,ngram,grammar,ngram+grammar,draft_model]
                               [--workloads extraction,nested,tool_call,free_text] [--batches 1,8]
                               [--whitespace any,compact,pretty] [--dtypes float32,bfloat16]
                               [--requests N] [--max-new-tokens N] [--draft-layers 8] [--threads N]

Every drafter runs the same greedy requests on the same weights in one run (greedy, so outputs
must be identical to ``none`` of the same dtype and whitespace mode; the script checks it). For
each dtype, workload, whitespace mode (``SamplingParams.json_whitespace``; free text has none),
drafter and batch size: output tokens/s, the speed-up over ``none`` measured in the same run,
output tokens per target forward (jump-forward tokens count as output), the acceptance rate
(accepted / drafted free tokens), the mean accepted length per verification, and whether the
outputs equal ``none``'s. Batch 1 runs the requests one after another; batch 8 submits them
together. Not collected by pytest.
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

PEOPLE = [
    ("Maria Lopez", "Acme Robotics", "Madrid", "maria.lopez@acme-robotics.es", "2019-04-12", 34),
    ("Kenji Watanabe", "Blue Harbor Logistics", "Osaka", "kenji.w@blueharbor.jp", "2021-11-02", 41),
    ("Amara Okafor", "Greenfield Energy", "Lagos", "amara.okafor@greenfield.ng", "2018-07-23", 29),
    ("Lukas Becker", "Nordlicht Software", "Hamburg", "lukas.becker@nordlicht.de", "2020-01-15", 37),
    ("Sofia Rossi", "Vela Textiles", "Milan", "s.rossi@velatextiles.it", "2017-09-30", 45),
    ("David Cohen", "Cedar Analytics", "Haifa", "david.cohen@cedar-analytics.co.il", "2022-03-08", 26),
    ("Priya Raman", "Monsoon Foods", "Chennai", "priya.raman@monsoonfoods.in", "2016-12-01", 52),
    ("Ewa Nowak", "Baltic Shipping", "Gdansk", "ewa.nowak@balticshipping.pl", "2023-06-19", 31),
]
EXTRACT_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"}, "company": {"type": "string"}, "city": {"type": "string"},
        "email": {"type": "string"}, "joined": {"type": "string", "format": "date"}, "age": {"type": "integer"},
    },
    "required": ["name", "company", "city", "email", "joined", "age"],
    "additionalProperties": False,
}  # fmt: skip
TOOL_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"const": "send_email"},
        "arguments": {
            "type": "object",
            "properties": {"to": {"type": "string"}, "subject": {"type": "string", "maxLength": 60}, "body": {"type": "string", "maxLength": 200}},
            "required": ["to", "subject", "body"], "additionalProperties": False,
        },
    },
    "required": ["name", "arguments"], "additionalProperties": False,
}  # fmt: skip


INVOICE_SCHEMA = {
    "type": "object",
    "properties": {
        "customer": {"type": "object", "properties": {"name": {"type": "string"}, "city": {"type": "string"}, "email": {"type": "string"}},
                     "required": ["name", "city", "email"], "additionalProperties": False},
        "date": {"type": "string", "format": "date"},
        "items": {"type": "array", "minItems": 1, "maxItems": 4, "items": {
            "type": "object", "properties": {"product": {"type": "string"}, "quantity": {"type": "integer"}, "price": {"type": "number"}},
            "required": ["product", "quantity", "price"], "additionalProperties": False}},
        "total": {"type": "number"},
    },
    "required": ["customer", "date", "items", "total"],
    "additionalProperties": False,
}  # fmt: skip
PRODUCTS = [("desk lamp", 2, 24.5), ("office chair", 1, 189.0), ("notebook", 10, 3.25), ("monitor arm", 1, 74.99)]


def _invoice(i: int, p: tuple) -> str:
    name, company, city, email, joined, age = p
    items = [PRODUCTS[(i + j) % len(PRODUCTS)] for j in range(2 + i % 2)]
    lines = "; ".join(f"{q} x {prod} at {price} EUR" for prod, q, price in items)
    total = round(sum(q * price for _, q, price in items), 2)
    return f"Invoice of {joined} for {name}, {city} ({email}). Items: {lines}. Total due: {total} EUR."


def _doc(p: tuple) -> str:
    name, company, city, email, joined, age = p
    return (f"{name} ({age}) works at {company} in {city}. {name.split()[0]} joined {company} on {joined} "
            f"and can be reached at {email}. Colleagues describe {name.split()[0]} as precise and friendly.")  # fmt: skip


def workload(name: str, engine: Engine) -> tuple[list[list[int]], list[dict]]:
    chat = lambda text: engine.apply_chat_template([{"role": "user", "content": text}])  # noqa: E731
    if name == "extraction":
        prompts = [chat(f"Document: {_doc(p)}\nExtract the person as JSON with keys name, company, city, email, joined, age.") for p in PEOPLE]
        params = {"temperature": 0.0, "max_new_tokens": 120, "json_schema": EXTRACT_SCHEMA}
    elif name == "nested":
        prompts = [chat(f"Document: {_invoice(i, p)}\nExtract the invoice as JSON: customer (name, city, email), date, "
                        f"items (product, quantity, price) and total.") for i, p in enumerate(PEOPLE)]  # fmt: skip
        params = {"temperature": 0.0, "max_new_tokens": 200, "json_schema": INVOICE_SCHEMA}
    elif name == "tool_call":
        prompts = [chat(f"Email {p[3]} with subject 'Welcome to {p[1]}' and a short welcome note for {p[0]}. "
                        f"Call the tool send_email with arguments to, subject and body, as JSON.") for p in PEOPLE]  # fmt: skip
        params = {"temperature": 0.0, "max_new_tokens": 120, "json_schema": TOOL_SCHEMA}
    elif name == "free_text":
        prompts = [chat(f"Rewrite this note in your own words: {_doc(p)}") for p in PEOPLE]
        params = {"temperature": 0.0, "max_new_tokens": 80}
    else:
        raise SystemExit(f"unknown workload {name}")
    return prompts, [params] * len(prompts)


def run(engine: Engine, prompts: list[list[int]], params: list[dict], batch: int) -> dict:
    sched = engine.scheduler
    spec_before = dict(sched.spec.stats) if sched.spec else {}
    forwards = sched.stats["forwards"]
    start = time.perf_counter()
    outs = []
    for i in range(0, len(prompts), batch):
        got = engine.generate(input_ids=prompts[i : i + batch], sampling_params=params[i : i + batch])
        outs += got
    wall = time.perf_counter() - start
    tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
    result = {"tokens": tokens, "wall": wall, "forwards": sched.stats["forwards"] - forwards, "outs": outs,
              "jump": sum(o["meta_info"]["jump_forward_tokens"] for o in outs)}  # fmt: skip
    if sched.spec:
        delta = {k: sched.spec.stats[k] - spec_before.get(k, 0) for k in sched.spec.stats}
        result.update(delta)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--drafters", default="none,ngram,grammar,ngram+grammar,draft_model")
    ap.add_argument("--workloads", default="extraction,nested,tool_call,free_text")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--whitespace", default="any,compact,pretty", help="json_whitespace modes for the JSON workloads")
    ap.add_argument("--dtypes", "--dtype", default="float32", help="comma-separated: float32, bfloat16, float16")
    ap.add_argument("--requests", type=int, default=len(PEOPLE), help="requests per workload (at most 8)")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="override each workload's limit (short runs)")
    ap.add_argument("--draft-layers", type=int, default=8)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    drafters = args.drafters.split(",")
    if drafters[0] != "none":
        drafters.insert(0, "none")  # the speed-up and identity columns need it, in the same run
    batches = [int(b) for b in args.batches.split(",")]
    rows, reference = [], {}
    for dtype in args.dtypes.split(","):
        for drafter in drafters:
            options = dict(dtype=dtype, max_total_tokens=20_000, num_threads=args.threads, speculative_algorithm=drafter)
            if drafter.startswith("draft_model"):
                options["speculative_draft_num_layers"] = args.draft_layers
            with Engine(**options) as engine:
                engine.generate("warm up", {"max_new_tokens": 2})
                for name in args.workloads.split(","):
                    prompts, params = workload(name, engine)
                    prompts, params = prompts[: args.requests], params[: args.requests]
                    if args.max_new_tokens:
                        params = [dict(p, max_new_tokens=args.max_new_tokens) for p in params]
                    modes = args.whitespace.split(",") if "json_schema" in params[0] else ["-"]
                    for mode in modes:
                        mode_params = [dict(p, json_whitespace=mode) for p in params] if mode != "-" else params
                        for batch in batches:
                            r = run(engine, prompts, mode_params, batch)
                            ids = [o["output_ids"] for o in r.pop("outs")]
                            key = (dtype, name, mode, batch)
                            same = reference.setdefault(key, ids) == ids
                            rows.append((key, drafter, r, same))
                            print(json.dumps({"dtype": dtype, "workload": name, "whitespace": mode, "batch": batch, "drafter": drafter,
                                              "same_as_none": same, **r}), flush=True)  # fmt: skip
    _table(rows)


def _table(rows: list) -> None:
    base = {key: r for key, d, r, _ in rows if d == "none"}
    print("\n| dtype | workload | whitespace | batch | drafter | output tok/s | speed-up vs none | output tokens / forward "
          "| acceptance rate | mean accepted per verify | jump-forward share | identical to none |")  # fmt: skip
    print("|---|---|---|---:|---|---:|---:|---:|---:|---:|---:|---|")
    for key, drafter, r, same in rows:
        dtype, name, mode, batch = key
        tps = r["tokens"] / r["wall"]
        ref = base.get(key)
        speed = f"{tps / (ref['tokens'] / ref['wall']):.2f}x" if ref else ""
        acc = f"{r['accepted'] / r['drafted']:.0%}" if r.get("drafted") else ""
        mean = f"{r['accepted'] / r['steps']:.2f}" if r.get("steps") else ""
        print(f"| {dtype} | {name} | {mode} | {batch} | {drafter} | {tps:.1f} | {speed} | {r['tokens'] / r['forwards']:.2f} "
              f"| {acc} | {mean} | {r['jump'] / r['tokens']:.0%} | {'yes' if same else 'NO'} |")


if __name__ == "__main__":
    main()
