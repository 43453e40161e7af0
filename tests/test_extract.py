"""``formcast extract`` with the embedded SmolLM2: a 100-record JSON-schema job killed part way
and rerun equals an uninterrupted run; failures (malformed lines, a prompt over the context, a
refused schema, an incomplete output) come out as result lines with clear messages; the Python
API; the Ray Data path on a local Ray instance gives the local runner's outputs.

Kept short for a loaded 2-core machine: one-sentence records, a two-field schema, 24 new tokens,
raw prompts (``--no-chat``: the chat template's system prompt tripled the prompt tokens and the
job's time). 100 records (200 before issue 23): the engine runs up to 64 at once, so the job is
still two waves, and the kill still lands after 40 results with a wave in flight; what grows
with the record count is model time (the job runs three times), not what is checked.
Everything is greedy, so a record's output does not depend on what runs beside it (the engine's
batching invariance, ``test_engine.py``), which is what lets a resumed job equal an
uninterrupted one.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path

import jsonschema
import pytest

from conftest import require_optional
from engine.extract.results import FailureType

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
NAMES = ["Maria", "Tom", "Aiko", "Lars", "Nia", "Omar", "Ines", "Raj", "Zoe", "Ivan", "Lea", "Sami", "Ana"]
CITIES = ["Lisbon", "Oslo", "Kyoto", "Lima", "Accra", "Cairo", "Quito", "Pune", "Riga", "Tunis", "Hanoi"]
SCHEMA = {
    "type": "object",
    "properties": {"city": {"enum": CITIES}, "year": {"type": "integer", "minimum": 1900, "maximum": 2030}},
    "required": ["city", "year"],
    "additionalProperties": False,
}
TEMPLATE = "Where and when did this happen? Answer as JSON. {text}"
MALFORMED_LINE = 7  # the input's 7th line is not JSON
RECORDS = 100  # plus the malformed line: RECORDS + 1 input lines
ENGINE_FLAGS = ["--dtype", "float32", "--num-threads", "1", "--max-total-tokens", "12000", "--no-progress"]


def _lines_of_input() -> list[str]:
    lines = []
    for i in range(RECORDS):
        text = f"{NAMES[i % 13]} moved to {CITIES[(i * 7) % 11]} in {1900 + (i * 37) % 120}."
        lines.append(json.dumps({"id": f"r{i:03d}", "text": text}))
    lines.insert(MALFORMED_LINE - 1, '{"id": "r-bad", "text": "unterminated')
    return lines


def _command(input_path: Path, output: Path) -> list[str]:
    return [sys.executable, "-m", "engine", "extract", "--input", str(input_path), "--output", str(output),
            "--schema", json.dumps(SCHEMA), "--prompt-template", TEMPLATE, "--no-chat", "--max-new-tokens", "24", *ENGINE_FLAGS]  # fmt: skip


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _by_id(lines: list[dict]) -> dict:
    by_id = {json.dumps(x["id"]): x for x in lines}
    assert len(by_id) == len(lines), "an id appears twice"
    return by_id


def _validate(value_text: str) -> None:
    """jsonschema with exact decimals (as test_e2e_json_schema does)."""
    jsonschema.validate(json.loads(value_text, parse_float=Decimal), SCHEMA)


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """The input file and the output of one uninterrupted run of the command."""
    folder = tmp_path_factory.mktemp("extract")
    records = folder / "records.jsonl"
    records.write_text("\n".join(_lines_of_input()) + "\n", encoding="utf-8")
    reference = folder / "reference.jsonl"
    proc = subprocess.run(_command(records, reference), cwd=REPO, env=_env(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 1, proc.stderr[-3000:]  # 1: the malformed line failed
    assert f"{RECORDS + 1} records" in proc.stderr and "malformed_line 1" in proc.stderr  # the summary
    return records, reference


def test_every_output_validates_or_carries_an_error(job):
    _, reference = job
    lines = _read(reference)
    by_id = _by_id(lines)
    assert set(by_id) == {json.dumps(f"r{i:03d}") for i in range(RECORDS)} | {str(MALFORMED_LINE)}
    bad = by_id[str(MALFORMED_LINE)]
    assert bad["line"] == MALFORMED_LINE and bad["value"] is None
    assert bad["error"]["type"] == FailureType.MALFORMED_LINE and bad["error"]["message"].startswith(f"line {MALFORMED_LINE}: not valid JSON")
    ok = [x for x in lines if x["error"] is None]
    assert len(ok) >= 0.75 * RECORDS, [x["error"] for x in lines if x["error"]][:5]  # a chatty model may run out of its 24 tokens
    for x in lines:
        if x["error"] is None:
            _validate(x["text"])
            assert x["value"] == json.loads(x["text"]) and x["finish_reason"]["type"] == "stop"
            assert x["completion_tokens"] > 0 and x["prompt_tokens"] > 0
        else:
            assert x["value"] is None and x["error"]["type"] in (FailureType.MALFORMED_LINE, FailureType.INCOMPLETE)
            assert x["error"]["message"]
    lines_of = {x["id"]: x["line"] for x in lines}
    assert lines_of["r000"] == 1 and lines_of["r006"] == MALFORMED_LINE + 1 and lines_of[f"r{RECORDS - 1:03d}"] == RECORDS + 1


def test_killed_job_rerun_has_each_id_once_and_equals_an_uninterrupted_run(job, tmp_path):
    records, reference = job
    output = tmp_path / "out.jsonl"
    with open(tmp_path / "stderr.txt", "w") as log:
        proc = subprocess.Popen(_command(records, output), cwd=REPO, env=_env(), stderr=log, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 900
        while proc.poll() is None and time.monotonic() < deadline:
            if output.exists() and output.read_bytes().count(b"\n") >= 40:
                break
            time.sleep(0.2)
        assert proc.poll() is None, "the job ended before the test could kill it"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    partial = output.read_bytes()
    assert 40 <= partial.count(b"\n") < RECORDS + 1
    complete = partial[: partial.rfind(b"\n") + 1]
    _by_id([json.loads(x) for x in complete.decode("utf-8").splitlines()])  # no id twice, even when killed

    rerun = subprocess.run(_command(records, output), cwd=REPO, env=_env(), capture_output=True, text=True, timeout=900)
    assert rerun.returncode in (0, 1), rerun.stderr[-3000:]
    assert "resuming" in rerun.stderr and "were skipped" in rerun.stderr
    assert _by_id(_read(output)) == _by_id(_read(reference))


def test_failures_are_result_lines_with_clear_messages(tmp_path):
    from engine import Engine

    records = [
        {"id": "ok", "text": "Ines moved to Riga in 1999."},
        {"id": "long", "text": "word " * 600},
        {"id": "no-text", "body": "Tom moved to Oslo."},
        "Lars moved to Lima in 1950.",  # a plain string is the record's text
    ]
    with Engine(dtype="float32", max_total_tokens=4000, context_length=512, num_threads=1) as engine:
        results = engine.extract(records, SCHEMA, prompt_template=TEMPLATE, max_new_tokens=24)
        assert iter(results) is results  # an iterator: results come as records finish
        got = {r.id: r for r in results}
        assert got["ok"].ok and got["ok"].value == json.loads(got["ok"].text)
        _validate(got["ok"].text)
        assert got[4].line == 4 and (got[4].ok or got[4].error.type == FailureType.INCOMPLETE)
        too_long = got["long"].error
        assert too_long.type == FailureType.PROMPT_TOO_LONG and "the context holds 512" in too_long.message
        assert got["no-text"].error.message == "line 3: field 'text' must be a string; it is missing"

        refused = {"type": "string", "pattern": "(a)\\1"}  # a backreference: not regular
        out = list(engine.extract(records, refused, max_new_tokens=24))
        assert len(out) == 4 and all(r.error.type == FailureType.REFUSED_CONSTRAINT for r in out)
        assert all("backreference" in r.error.message and r.completion_tokens == 0 for r in out)

        # No output of the schema fits 3 tokens: refused at admission (never a cut document).
        short = list(engine.extract(records[:1], SCHEMA, prompt_template=TEMPLATE, max_new_tokens=3))
        assert short[0].error.type == FailureType.INCOMPLETE and short[0].completion_tokens == 0
        assert short[0].error.message.startswith("incomplete within max_new_tokens=3")
        assert "shortest output" in short[0].error.message and "allow at least" in short[0].error.message

        dates = list(engine.extract(["Apollo 11 landed on the Moon in July 1969."], regex=r"\d{4}", prompt_template="In what year? {text}", max_new_tokens=8))
        assert dates[0].ok and dates[0].value == dates[0].text and len(dates[0].value) == 4


def test_ray_path_gives_the_local_runners_outputs(job, tmp_path, monkeypatch):
    ray = require_optional("ray")  # in the dev extra: CI installs it
    from engine import Engine
    from engine.extract.job import JobConfig, RayOptions, run_job
    from engine.extract.spec import ExtractSpec

    from engine.extract.ray_runner import RecordsDatasource
    from engine.extract.records import SourceRecord, read_records

    records, reference = job
    # the first 24 records and the malformed line, same line numbers: after the 5 resumed ones,
    # two batches of the 16 below, one for each worker
    first = tmp_path / "first.jsonl"
    first.write_text("\n".join(records.read_text(encoding="utf-8").splitlines()[:25]) + "\n", encoding="utf-8")
    expected = {k: v for k, v in _by_id(_read(reference)).items() if v["line"] <= 25}
    output = tmp_path / "ray.jsonl"  # a previous run wrote the first 5 lines' results: resumed
    output.write_text("".join(json.dumps(v) + "\n" for v in expected.values() if v["line"] <= 5), encoding="utf-8")
    spec = ExtractSpec({"json_schema": SCHEMA}, TEMPLATE, chat=False, sampling={"max_new_tokens": 24, "temperature": 0.0})
    engine_options = {"dtype": "float32", "max_total_tokens": 12000}
    # The workers import this checkout, whatever the installed package points at: they inherit
    # the driver's environment (a runtime_env would start Ray's runtime-env machinery for them).
    monkeypatch.setenv("PYTHONPATH", _env()["PYTHONPATH"])
    ray.init(num_cpus=2, include_dashboard=False)
    try:
        for path in _csv_and_parquet_copies(first, tmp_path):  # Ray's read task reads as the local reader does
            rows = ray.data.read_datasource(RecordsDatasource(str(path), "id", set()), num_cpus=0).take_all()
            assert [SourceRecord.from_payload(r["payload"]) for r in rows] == list(read_records(path))
        summary = run_job(JobConfig(first, output, spec, engine_options, ray=RayOptions(num_workers=2, batch_size=16), progress=False), Engine)
    finally:
        ray.shutdown()
    assert summary.skipped == 5 and summary.done == 20 and summary.failed[FailureType.MALFORMED_LINE] == 1
    got = _by_id(_read(output))
    assert len(expected) == 25 and got == expected


def _csv_and_parquet_copies(jsonl: Path, folder: Path) -> list[Path]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from engine.extract.records import read_records

    rows = [r.fields for r in read_records(jsonl) if r.fields is not None]
    csv_path, parquet_path = folder / "first.csv", folder / "first.parquet"
    csv_path.write_text("id,text\n" + "".join(f'{r["id"]},"{r["text"]}"\n' for r in rows) + "r-short,only,three\n", encoding="utf-8")
    pq.write_table(pa.Table.from_pylist(rows), parquet_path)
    return [csv_path, parquet_path]
