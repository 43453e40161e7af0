"""Benchmark: speculative decoding per drafter, JSON whitespace mode and dtype, on extraction
(flat and nested schemas), tool calls and free text.

    python bench/spec_bench.py [--drafters none,ngram,grammar,ngram+grammar,draft_model]
                               [--workloads extraction,nested,tool_call,free_text] [--batches 1,8]
                               [--whitespace any,compact,pretty] [--dtypes float32,bfloat16]
                               [--requests N] [--max-new-tokens N] [--draft-layers 8] [--threads N]

Every drafter runs the same greedy requests on the same weights in one engine per dtype, the
speculative worker swapped between runs, interleaved request by request (chunk by chunk at
batch 8) so that load from other processes falls on every drafter alike (greedy, so outputs
must be identical to ``none`` of the same dtype and whitespace mode; the script checks it). For
each dtype, workload, whitespace mode (``SamplingParams.json_whitespace``; free text has none),
drafter and batch size: output tokens/s, the speed-up over ``none`` measured in the same run,
output tokens per target forward (jump-forward tokens count as output), the acceptance rate
(accepted / drafted free tokens), the mean accepted length per verification, and whether the
outputs equal ``none``'s. Batch 1 runs the requests one after another; batch 8 submits them
together. A last table gives the target's mean forward time at batch 1 by the number of rows it
ran (1: a decode step; k + 1: a verification of k drafts) relative to a decode step: the cost
ratio speculation lives on. ``--model`` / ``--quantization`` run a GGUF file or int8 weights.
Not collected by pytest.
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


PHASES = ("schedule", "forward", "mask_wait", "sample", "process")  # the scheduler's own step timing


class ForwardTimer:
    """Wraps the target's forward: wall time per forward, by the number of token rows it ran
    (at batch 1: 1 = a decode step, k + 1 = a verification of k drafts)."""

    def __init__(self, runner) -> None:  # type: ignore[no-untyped-def]
        self.forward = runner.forward
        self.times: dict[int, list[float]] = {}
        self.on = False
        self.rows = 0  # token rows of all decode / verify forwards (timed or not)
        runner.forward = self

    def __call__(self, batch):  # type: ignore[no-untyped-def]
        if min(batch.extend_prefix_lens_cpu) == 0:  # prefills are not decode steps
            return self.forward(batch)
        self.rows += batch.num_tokens
        if not self.on:
            return self.forward(batch)
        start = time.perf_counter()
        out = self.forward(batch)
        self.times.setdefault(batch.num_tokens, []).append(time.perf_counter() - start)
        return out


# Each drafter is built once per engine and kept between the chunks it runs, as an engine keeps
# its own: drafters learn from the requests they have finished (NgramDrafter.history).
_WORKERS: dict[tuple[int, str], object] = {}


def use_drafter(engine: Engine, spec: str, draft_layers: int) -> None:
    """Swap the scheduler's speculative worker (between requests, on its thread) for ``spec``:
    ``none``, an algorithm (``ngram+grammar``), optionally with ``:k=N`` (draft tokens),
    ``:prompt`` (the n-gram drafter with issue 29's match rules: longest of 8, the prompt first,
    no structural matches; the default drafter is the one before them, ``:legacy`` names it), ``:noclose`` (the
    n-gram drafter without ``close_values``: copied values are not ended where the copy reaches punctuation), ``:nolookup`` (nor the grammar's
    lookup of a span of the prompt where no n-gram match fits), ``:nohistory`` (nor drafts from
    earlier requests' outputs under the same constraint) or ``:fixed`` (no adaptive k)."""
    from engine.speculative.drafters import ChainDrafter, NgramDrafter
    from engine.speculative.worker import SpeculativeConfig, SpeculativeWorker, build_drafter

    algorithm, *opts = spec.split(":")
    config = SpeculativeConfig(algorithm=algorithm, draft_num_layers=draft_layers)
    for opt in opts:
        if opt.startswith("k="):
            config.num_draft_tokens = int(opt[2:])
        elif opt == "fixed":
            config.adaptive = False
        elif opt.startswith("cost="):
            config.verify_cost = float(opt[5:])
        elif opt not in ("legacy", "prompt", "nofree", "noclose", "nolookup", "nohistory"):
            raise SystemExit(f"unknown drafter option {opt!r} in {spec!r}")

    def swap() -> None:
        sched = engine.scheduler
        if sched.spec is not None:
            for req in list(sched.running):
                sched.spec.release(req)
        worker = _WORKERS.get((id(engine), spec))
        if worker is None and algorithm != "none":
            config.jump_forward = sched.outputs.enable_jump_forward
            drafter = build_drafter(config, sched.runner, sched.outputs.tokenizer, sched.texts,
                                    sched.vocab.vocab_size, frozenset(sched.vocab.eos_token_ids))  # fmt: skip
            if "prompt" in opts:
                legacy = NgramDrafter(max_n=8, prefer_prompt=True, skip_structural=True)
                if isinstance(drafter, ChainDrafter):
                    legacy.tokenizer, legacy.texts, legacy.jump_forward = drafter.tokenizer, drafter.texts, drafter.jump_forward
                    drafter.first = legacy
                else:
                    legacy.tokenizer, legacy.texts, legacy.jump_forward = drafter.tokenizer, drafter.texts, drafter.jump_forward
                    drafter = legacy
            ngram = drafter.first if isinstance(drafter, ChainDrafter) else drafter
            if isinstance(ngram, NgramDrafter):
                ngram.close_values = ngram.close_values and "noclose" not in opts
                ngram.grammar_lookup = ngram.grammar_lookup and "nolookup" not in opts
                ngram.history = ngram.history and "nohistory" not in opts
            if "nofree" in opts:
                drafter.forced_after_free = False
            worker = _WORKERS[(id(engine), spec)] = SpeculativeWorker(drafter, sched.runner.sampler, config)
        sched.spec = sched.planner.spec = worker

    engine.scheduler.call(swap)


def run(engine: Engine, prompts: list[list[int]], params: list[dict], timer: ForwardTimer) -> dict:
    sched = engine.scheduler
    forwards, rows = sched.stats["forwards"], timer.rows
    before = dict(sched.timing)
    start = time.perf_counter()
    outs = engine.generate(input_ids=prompts, sampling_params=params)
    wall = time.perf_counter() - start
    phases = {f"{k}_s": sched.timing[k] - before[k] for k in PHASES}
    result = {**phases, "tokens": sum(o["meta_info"]["completion_tokens"] for o in outs), "wall": wall,
              "forwards": sched.stats["forwards"] - forwards, "outs": [o["output_ids"] for o in outs],
              "jump": sum(o["meta_info"]["jump_forward_tokens"] for o in outs), "rows": timer.rows - rows}  # fmt: skip
    if sched.spec:
        result.update(sched.spec.stats)  # a fresh worker per run: its stats are this run's
    return result


def _add(total: dict, r: dict) -> None:
    for k, v in r.items():
        total[k] = total.get(k, 0) + v if k != "outs" else total.get(k, []) + v


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--drafters", default="none,ngram,grammar,ngram+grammar,draft_model",
                    help="comma-separated; each may carry :k=N, :fixed, :prompt, :cost=X (see use_drafter)")
    ap.add_argument("--workloads", default="extraction,nested,tool_call,free_text")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--whitespace", default="any,compact,pretty", help="json_whitespace modes for the JSON workloads")
    ap.add_argument("--dtypes", "--dtype", default="float32", help="comma-separated: float32, bfloat16, float16")
    ap.add_argument("--model", default=None, help="model path (a GGUF file or HF folder); default: the embedded SmolLM2")
    ap.add_argument("--quantization", default=None, help="int8 / int4 at load")
    ap.add_argument("--requests", type=int, default=len(PEOPLE), help="requests per workload (at most 8)")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="override each workload's limit (short runs)")
    ap.add_argument("--draft-layers", type=int, default=8)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    drafters = args.drafters.split(",")
    if drafters[0] != "none":
        drafters.insert(0, "none")  # the speed-up and identity columns need it, in the same run
    batches = [int(b) for b in args.batches.split(",")]
    rows, costs = [], {}
    for dtype in args.dtypes.split(","):
        options = dict(dtype=dtype, max_total_tokens=20_000, num_threads=args.threads)
        if args.model:
            options["model_path"] = args.model
        if args.quantization:
            options["quantization"] = args.quantization
        with Engine(**options) as engine:
            engine.generate("warm up", {"max_new_tokens": 2})
            timer = ForwardTimer(engine.runner)
            for name in args.workloads.split(","):
                prompts, params = workload(name, engine)
                prompts, params = prompts[: args.requests], params[: args.requests]
                if args.max_new_tokens:
                    params = [dict(p, max_new_tokens=args.max_new_tokens) for p in params]
                modes = args.whitespace.split(",") if "json_schema" in params[0] else ["-"]
                for mode in modes:
                    mode_params = [dict(p, json_whitespace=mode) for p in params] if mode != "-" else params
                    # Compile (and cache) the constraint before timing: else the first drafter
                    # run (``none``) alone pays the compilation.
                    engine.generate(input_ids=prompts[:1], sampling_params=[dict(mode_params[0], max_new_tokens=2)])
                    for batch in batches:
                        totals: dict[str, dict] = {d: {} for d in drafters}
                        # Interleaved: every drafter runs each chunk of requests before the next
                        # chunk, so load from other processes falls on all of them alike.
                        for i in range(0, len(prompts), batch):
                            for drafter in drafters:
                                use_drafter(engine, drafter, args.draft_layers)
                                # Every drafter prefills the prompts from an empty prefix cache: a
                                # cached prefix changes how the prompt's last rows are computed
                                # (a chunk of another size), which alone can flip a bfloat16 argmax.
                                engine.flush_cache()
                                timer.on = batch == 1
                                r = run(engine, prompts[i : i + batch], mode_params[i : i + batch], timer)
                                timer.on = False
                                print(f"# {dtype} {name} {mode} b{batch} chunk {i}: {drafter} {r['tokens']} tokens "
                                      f"in {r['wall']:.1f} s, {r['forwards']} forwards", file=sys.stderr, flush=True)  # fmt: skip
                                _add(totals[drafter], r)
                        reference = totals["none"].get("outs")
                        for drafter in drafters:
                            r = totals[drafter]
                            same = r.pop("outs", None) == reference
                            key = (dtype, name, mode, batch)
                            rows.append((key, drafter, r, same))
                            print(json.dumps({"dtype": dtype, "workload": name, "whitespace": mode, "batch": batch, "drafter": drafter,
                                              "same_as_none": same, **r}), flush=True)  # fmt: skip
            use_drafter(engine, "none", args.draft_layers)
            costs[dtype] = timer.times
    _table(rows)
    _phase_table(rows)
    _cost_table(costs)


def _phase_table(rows: list) -> None:
    """Where the time goes, per output token: the scheduler's step phases (``other``: the rest of
    the wall time: waits between steps, prefill bookkeeping, detokenization, the client)."""
    cols = PHASES + ("other",)
    print("\n| dtype | workload | whitespace | batch | drafter | ms / output token | " + " | ".join(cols) + " |")
    print("|---|---|---|---:|---|---:|" + "---:|" * len(cols))
    for key, drafter, r, _ in rows:
        per = {k: 1e3 * r[f"{k}_s"] / r["tokens"] for k in PHASES}
        per["other"] = 1e3 * r["wall"] / r["tokens"] - sum(per.values())
        cells = " | ".join(f"{per[k]:.2f}" for k in cols)
        print(f"| {' | '.join(map(str, key))} | {drafter} | {1e3 * r['wall'] / r['tokens']:.2f} | {cells} |")


def _cost_table(costs: dict) -> None:
    """Mean forward time by the rows it verified, relative to a one-row decode step."""
    print("\n| dtype | rows per forward (batch 1) | forwards | mean ms | relative to a decode step |")
    print("|---|---:|---:|---:|---:|")
    for dtype, times in costs.items():
        base = sum(times[1]) / len(times[1]) if times.get(1) else None
        for rows in sorted(times):
            mean = sum(times[rows]) / len(times[rows])
            rel = f"{mean / base:.2f}" if base else ""
            print(f"| {dtype} | {rows} | {len(times[rows])} | {mean * 1000:.1f} | {rel} |")


def _table(rows: list) -> None:
    base = {key: r for key, d, r, _ in rows if d == "none"}
    print("\n| dtype | workload | whitespace | batch | drafter | output tok/s | speed-up vs none | output tokens / forward "
          "| decode rows / output token | acceptance rate | mean accepted per verify | jump-forward share | identical to none |")  # fmt: skip
    print("|---|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for key, drafter, r, same in rows:
        dtype, name, mode, batch = key
        tps = r["tokens"] / r["wall"]
        ref = base.get(key)
        speed = f"{tps / (ref['tokens'] / ref['wall']):.2f}x" if ref else ""
        acc = f"{r['accepted'] / r['drafted']:.0%}" if r.get("drafted") else ""
        mean = f"{r['accepted'] / r['steps']:.2f}" if r.get("steps") else ""
        print(f"| {dtype} | {name} | {mode} | {batch} | {drafter} | {tps:.1f} | {speed} | {r['tokens'] / r['forwards']:.2f} "
              f"| {r['rows'] / r['tokens']:.2f} | {acc} | {mean} | {r['jump'] / r['tokens']:.0%} | {'yes' if same else 'NO'} |")


if __name__ == "__main__":
    main()
