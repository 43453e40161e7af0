"""Benchmark: ``formcast extract`` against a plain ``transformers`` + xgrammar loop, same records.

    python bench/extract_bench.py [--records 200] [--max-new-tokens 32] [--threads 1]
                                  [--ray-workers 1,2] [--ray-batch-size 32] [--no-chat]
                                  [--runners local,transformers,ray]

One run, the same records (short biographies, generated here, seeded), the same JSON schema
(name, city, year), the same prompts (the chat template around one instruction), greedy, float32,
the embedded SmolLM2-135M-Instruct:

* formcast, local runner: ``runner.run_records`` on one Engine (loaded before the clock starts),
  every result written to a JSON-lines file by the job's ``ResultWriter``.
* anchor: a loop over ``transformers`` ``generate`` in batches of 8 (left padding), with
  xgrammar's ``contrib.hf.LogitsProcessor`` on the schema compiled by xgrammar; output tokens are
  counted up to and including the first EOS.
* formcast, Ray runner (``ray_runner.ray_results``) on a local Ray instance (started before the
  clock), 1 and 2 workers, one Engine per actor: its wall time includes starting the actors and
  loading their Engines, shown apart as "first result s". On a 2-core machine these are scaling
  figures, not speed claims.

Columns: records, wall seconds, records/s and output tokens/s over the wall time, the records
whose output finished and validates against the schema, and (formcast rows) the records whose
value equals the local runner's. Not collected by pytest.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common import machine_line, markdown_table, ratio  # noqa: E402  (bench/ is on sys.path when run as a script)

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "city": {"type": "string", "maxLength": 16},
        "year": {"type": "integer", "minimum": 1900, "maximum": 2030},
    },
    "required": ["name", "city", "year"],
    "additionalProperties": False,
}
TEMPLATE = "Extract the person's name, the city they moved to and the year, as JSON.\n{text}"
FIRST = ["Maria", "Tom", "Aiko", "Lars", "Nia", "Omar", "Ines", "Raj", "Zoe", "Ivan", "Lea", "Sami", "Ana", "Yuki"]
LAST = ["Lopez", "Berg", "Tanaka", "Okafor", "Haddad", "Silva", "Kumar", "Novak", "Moreau", "Jensen"]
CITIES = ["Lisbon", "Oslo", "Kyoto", "Lima", "Accra", "Cairo", "Quito", "Pune", "Riga", "Tunis", "Hanoi", "Porto"]
JOBS = ["nurse", "baker", "engineer", "teacher", "pilot", "chemist", "painter", "carpenter"]


@dataclass
class Row:
    name: str
    records: int = 0
    wall: float = 0.0
    first: float | None = None  # seconds to the first result
    first_block: int = 0  # results that came with the first one (the first finished batch)
    tokens: int = 0
    valid: int = 0
    agree: int | None = None
    values: dict[str, Any] = field(default_factory=dict)


def make_records(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        who = f"{rng.choice(FIRST)} {rng.choice(LAST)}"
        born, moved = rng.randint(1920, 1990), rng.randint(1950, 2020)
        src, dst = rng.sample(CITIES, 2)
        out.append({"id": f"p{i:04d}", "text": f"{who}, a {rng.choice(JOBS)} born in {born}, moved from {src} to {dst} in {moved}."})
    return out


def valid(text: str) -> bool:
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), SCHEMA)
        return True
    except (ValueError, jsonschema.ValidationError):
        return False


def timed_results(results: Iterable[Any], row: Row, writer: Any = None) -> Row:
    start = time.perf_counter()
    for result in results:
        now = time.perf_counter() - start
        if row.first is None:
            row.first = now
        if now - row.first < 0.05:
            row.first_block += 1
        if writer is not None:
            writer.write(result)
        row.records += 1
        row.tokens += result.completion_tokens
        row.valid += result.ok and valid(result.text)
        row.values[result.id] = result.value
    row.wall = time.perf_counter() - start
    _progress(row)
    return row


def run_local(records: list[dict], spec: Any, args: argparse.Namespace, folder: Path) -> Row:
    from engine import Engine
    from engine.extract.output import ResultWriter
    from engine.extract.records import from_dicts
    from engine.extract.runner import run_records

    with Engine(dtype="float32", num_threads=args.threads) as engine, ResultWriter(folder / "local.jsonl") as writer:
        run_records(engine, from_dicts(records[:8]), spec)  # compile the schema once, untimed
        list(run_records(engine, from_dicts(records[:2]), spec))  # warm the model up
        return timed_results(run_records(engine, from_dicts(records), spec), Row("formcast local runner"), writer)


def run_ray(records_file: Path, spec: Any, workers: int, args: argparse.Namespace) -> Row:
    from engine import Engine
    from engine.extract.job import RayOptions
    from engine.extract.ray_runner import ray_results

    options = RayOptions(num_workers=workers, batch_size=args.ray_batch_size, cpus_per_worker=args.threads)
    results = ray_results(records_file, spec, {"dtype": "float32"}, options, skip=set(), engine_factory=Engine)
    return timed_results(results, Row(f"formcast Ray runner, {workers} worker{'s' * (workers > 1)}"))


def run_transformers(records: list[dict], args: argparse.Namespace) -> Row:
    import torch
    import xgrammar as xgr
    from xgrammar.contrib.hf import LogitsProcessor

    from engine.hf.model_files import load_model_and_tokenizer

    torch.set_num_threads(args.threads)
    model, tok = load_model_and_tokenizer()
    tok.padding_side = "left"
    eos = tok.eos_token_id
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=model.config.vocab_size, stop_token_ids=[eos])
    compiled = xgr.GrammarCompiler(info).compile_json_schema(json.dumps(SCHEMA))
    prompts = [_prompt(tok, r["text"], args.chat) for r in records]
    row = Row("transformers generate + xgrammar, batch 8")
    start = time.perf_counter()
    for i in range(0, len(records), 8):
        enc = tok(prompts[i : i + 8], return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.inference_mode():
            out = model.generate(**enc, max_new_tokens=args.max_new_tokens, do_sample=False, pad_token_id=eos,
                                 eos_token_id=eos, logits_processor=[LogitsProcessor(compiled)])  # fmt: skip
        for record, ids in zip(records[i : i + 8], out[:, enc["input_ids"].shape[1] :].tolist()):
            ended = eos in ids
            ids = ids[: ids.index(eos) + 1] if ended else ids
            text = tok.decode(ids[:-1] if ended else ids)
            row.tokens += len(ids)
            row.valid += ended and valid(text)
            row.records += 1
        if row.first is None:
            row.first, row.first_block = time.perf_counter() - start, row.records
    row.wall = time.perf_counter() - start
    _progress(row)
    return row


def _prompt(tok: Any, text: str, chat: bool) -> str:
    content = TEMPLATE.format(text=text)
    if not chat:
        return content
    return tok.apply_chat_template([{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True)


def steady_rate(r: Row) -> float:
    """Records/s after the first result (Ray: once the actors have loaded their Engines); NaN
    (printed "-") when the rest came within the last 5% of the run, as when every Ray block
    finishes at about the same time and there is no steady state to measure."""
    if r.first is None or r.wall - r.first < 0.05 * r.wall:
        return float("nan")
    return (r.records - r.first_block) / (r.wall - r.first)


def table(rows: list[Row], anchor: Row | None) -> str:
    header = ["runner", "records", "wall s", "first result s", "records/s", "records/s after first", "out tok/s", "valid",
              "same value as local", "records/s vs anchor"]  # fmt: skip
    body = []
    for r in rows:
        agree = "-" if r.agree is None else f"{r.agree}/{r.records}"
        body.append([r.name, r.records, f"{r.wall:.1f}", f"{r.first:.1f}", f"{r.records / r.wall:.2f}", _number(steady_rate(r)),
                     f"{r.tokens / r.wall:.1f}", f"{r.valid}/{r.records}", agree,
                     ratio(r.records / r.wall, anchor.records / anchor.wall) if anchor else "-"])  # fmt: skip
    return markdown_table(header, body, align_right_from=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=200)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (per Ray worker too)")
    parser.add_argument("--ray-workers", default="1,2")
    parser.add_argument("--ray-batch-size", type=int, default=32)
    parser.add_argument("--no-chat", dest="chat", action="store_false", help="raw prompts, without the chat template")
    parser.add_argument("--runners", default="local,transformers,ray", help="which to run, in this order (the anchor is 'transformers')")
    args = parser.parse_args()
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from engine.extract.spec import ExtractSpec

    records = make_records(args.records)
    spec = ExtractSpec({"json_schema": SCHEMA}, TEMPLATE, chat=args.chat,
                       sampling={"max_new_tokens": args.max_new_tokens, "temperature": 0.0})  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        records_file = folder / "records.jsonl"
        records_file.write_text("".join(json.dumps(r) + "\n" for r in records))
        rows = []
        for runner in args.runners.split(","):
            if runner == "local":
                rows.append(run_local(records, spec, args, folder))
            elif runner == "transformers":
                rows.append(run_transformers(records, args))
            elif runner == "ray":
                rows += run_ray_rows(records_file, spec, args)
            else:
                raise SystemExit(f"unknown runner {runner!r}")
    local = next((r for r in rows if "local" in r.name), None)
    for row in rows:
        if local is not None and row.name.startswith("formcast"):
            row.agree = sum(row.values.get(k) == v for k, v in local.values.items())
    anchor = next((r for r in rows if r.name.startswith("transformers")), None)
    print(f"\n{args.records} records, JSON schema (name, city, year), max_new_tokens {args.max_new_tokens}, greedy, float32, "
          f"{'chat template' if args.chat else 'raw prompts'}, {args.threads} torch thread(s) per engine, {os.cpu_count()} CPUs\n")  # fmt: skip
    import importlib.metadata as md

    print(f"{machine_line()}, torch {md.version('torch')}, transformers {md.version('transformers')}, ray {md.version('ray')}\n")
    print(table(rows, anchor))
    ray_rows = [r for r in rows if "Ray" in r.name]
    if len(ray_rows) >= 2:
        a, b = ray_rows[0], ray_rows[-1]
        print(f"\nRay scaling, {b.name} vs {a.name}: records/s {ratio(b.records / b.wall, a.records / a.wall)}, "
              f"after the first result {ratio(steady_rate(b), steady_rate(a))}")  # fmt: skip


def _number(x: float) -> str:
    return f"{x:.2f}" if x == x else "-"


def run_ray_rows(records_file: Path, spec: Any, args: argparse.Namespace) -> list[Row]:
    import ray

    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})
    try:
        return [run_ray(records_file, spec, int(w), args) for w in args.ray_workers.split(",")]
    finally:
        ray.shutdown()


def _progress(row: Row) -> None:
    print(f"done: {row.name}: {row.records} records in {row.wall:.1f} s", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
