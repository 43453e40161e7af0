"""``formcast extract`` without the model: readers (line numbers, ids, malformed lines), the
prompt template, result lines, the output file (resume, torn last line, --retry-failed), and
argument errors that exit 2 before anything loads. The model runs in ``test_extract.py``."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engine.entrypoints import cli
from engine.extract.output import OutputError, ResultWriter, drop_failures, read_existing
from engine.extract.records import SourceRecord, count_records, from_dicts, read_records
from engine.extract.results import ExtractError, ExtractResult, FailureType, from_generation
from engine.extract.spec import ExtractSpec, RecordError


def _write(path, text: str | bytes):
    (path.write_bytes if isinstance(text, bytes) else path.write_text)(text)
    return path


# ---------------------------------------------------------------------- readers


def test_jsonl_malformed_lines_are_failures_with_their_line_numbers(tmp_path):
    path = _write(tmp_path / "in.jsonl", b'{"id": "a", "text": "x"}\n{oops\n\n[1, 2]\n{"text": "no id"}\n\xff\xfe\n{"id": "a", "text": "again"}\n{"id": 1.5}\n')
    got = list(read_records(path))
    assert [(r.line, r.id) for r in got] == [(1, "a"), (2, 2), (4, 4), (5, 5), (6, 6), (7, "a"), (8, 8)]
    assert got[0].fields == {"id": "a", "text": "x"} and got[0].error is None
    assert got[3].fields == {"text": "no id"} and got[3].error is None  # no id field: the line number
    kinds = [r.error.type if r.error else None for r in got]
    assert kinds == [None, "malformed_line", "malformed_line", None, "malformed_line", "duplicate_id", "invalid_record"]
    assert got[1].error.message.startswith("line 2: not valid JSON")
    assert got[2].error.message == "line 4: expected a JSON object, got list"
    assert got[4].error.message.startswith("line 6: not valid UTF-8")
    assert got[5].error.message == 'line 7: id "a" was already used on line 1'
    assert "must be a string or an integer, got 1.5" in got[6].error.message
    assert all(r.fields is None for r in got if r.error)
    assert count_records(path) == 7


def test_csv_rows_keep_strings_and_report_bad_rows_by_line(tmp_path):
    path = _write(tmp_path / "in.csv", 'id,text\nr1,"Ada, born 1815"\nr2,"two\nlines"\n007,x,extra\n\nr4,plain\n')
    got = list(read_records(path))
    assert [(r.line, r.id) for r in got] == [(2, "r1"), (3, "r2"), (5, 5), (7, "r4")]
    assert got[0].fields == {"id": "r1", "text": "Ada, born 1815"}
    assert got[1].fields["text"] == "two\nlines"
    assert got[2].error == ExtractError(FailureType.MALFORMED_LINE, "line 5: has 3 fields; the header has 2")


def test_parquet_rows_are_numbered_and_normalized_through_json(tmp_path):
    import datetime

    table = pa.table({"text": ["a", "b", None], "when": [datetime.date(2020, 1, 2)] * 3, "n": [1, 2, 3]})
    path = tmp_path / "in.parquet"
    pq.write_table(table, path)
    got = list(read_records(path))
    assert [(r.line, r.id) for r in got] == [(1, 1), (2, 2), (3, 3)]
    assert got[0].fields == {"text": "a", "when": "2020-01-02", "n": 1}
    assert count_records(path) == 3
    with open(path, "rb") as f:  # a Ray read task hands over a stream that cannot seek
        from engine.extract.records import read_stream

        class Unseekable:
            def __init__(self, f):
                self.f = f

            def seekable(self):
                return False

            def read(self, *a):
                return self.f.read(*a)

        assert list(read_stream(Unseekable(f), "parquet")) == got


def test_unknown_format_and_payload_round_trip(tmp_path):
    with pytest.raises(ValueError, match="unknown input format"):
        list(read_records(tmp_path / "in.json"))
    record = SourceRecord(3, "x", None, ExtractError("malformed_line", "line 3: bad"))
    assert SourceRecord.from_payload(record.to_payload()) == record
    assert [r.id for r in from_dicts([{"id": 7, "text": "a"}, "plain", 3])] == [7, 2, 3]
    assert list(from_dicts(["plain"]))[0].fields == {"text": "plain"}


# ---------------------------------------------------------------------- prompt template


def test_template_renders_fields_and_names_what_is_missing():
    spec = ExtractSpec(prompt_template="From {source}: {text}", field="body")
    assert spec.render({"body": "doc", "source": "web"}, 1) == "From web: doc"
    with pytest.raises(RecordError, match="line 4: no field 'source'"):
        spec.render({"body": "doc"}, 4)
    with pytest.raises(RecordError, match="line 5: field 'body' must be a string; got int"):
        spec.render({"body": 3, "source": "x"}, 5)
    with pytest.raises(ValueError, match="literal braces"):
        ExtractSpec(prompt_template="JSON like {a: 1")
    with pytest.raises(ValueError, match="field names"):
        ExtractSpec(prompt_template="{0}")
    assert ExtractSpec(prompt_template='{{"a": 1}} {text}').render({"text": "t"}, 1) == '{"a": 1} t'


def test_seeded_jobs_give_each_record_its_own_stable_seed():
    spec = ExtractSpec(sampling={"temperature": 1.0, "sampling_seed": 5})
    params = spec.sampling_params()
    a, b = spec.params_for(params, '"a"'), spec.params_for(params, '"b"')
    assert a.sampling_seed != b.sampling_seed and a.sampling_seed == spec.params_for(params, '"a"').sampling_seed
    assert ExtractSpec().params_for(ExtractSpec().sampling_params(), '"a"').sampling_seed is None


# ---------------------------------------------------------------------- results


def _out(text, reason, completion=5):
    return {"text": text, "output_ids": [], "meta_info": {"finish_reason": reason, "prompt_tokens": 9, "completion_tokens": completion}}


def test_results_from_each_finish_reason():
    ok = from_generation("a", 1, _out('{"x": 1}', {"type": "stop", "matched": 2}), "json_schema", 16)
    assert ok.ok and ok.value == {"x": 1} and ok.prompt_tokens == 9
    match = from_generation("a", 1, _out("2024-01-02", {"type": "stop", "matched": 2}), "regex", 16)
    assert match.value == "2024-01-02"
    cut = from_generation("a", 1, _out('{"x": ', {"type": "length", "length": 16}, 16), "json_schema", 16)
    assert cut.error.type == FailureType.INCOMPLETE and cut.value is None and cut.text == '{"x": '
    assert cut.error.message == "incomplete within max_new_tokens=16: the output stopped after 16 tokens"
    aborted = from_generation("a", 1, _out("", {"type": "abort", "message": "out of KV cache memory"}), "regex", 16)
    assert aborted.error == ExtractError(FailureType.ABORTED, "out of KV cache memory")
    # An admission refusal is told by the typed field, not by the message's wording.
    refused = from_generation("a", 1, _out("", {"type": "abort", "message": "no output fits", "field": "max_new_tokens"}, 0), "json_schema", 3)
    assert refused.error == ExtractError(FailureType.INCOMPLETE, "incomplete within max_new_tokens=3: no output fits")
    caller = from_generation("a", 1, _out("", {"type": "abort", "message": "max_new_tokens: aborted by the caller"}, 0), "json_schema", 3)
    assert caller.error.type == FailureType.ABORTED
    bad = from_generation("a", 1, _out("{", {"type": "stop", "matched": 2}), "json_schema", 16)
    assert bad.error.type == FailureType.INVALID_OUTPUT
    for result in (ok, cut, aborted):
        assert ExtractResult.from_json(json.loads(result.to_line())) == result


def test_a_lone_surrogate_still_makes_a_valid_utf8_line():
    line = ExtractResult(id="\ud800", line=1, value="é").to_line()
    assert json.loads(line.decode("utf-8"))["id"] == "\ud800"


# ---------------------------------------------------------------------- output file


def _result(i, ok=True):
    error = None if ok else ExtractError("incomplete", "cut")
    return ExtractResult(id=f"r{i}", line=i, value=None if error else i, error=error)


def test_resume_reads_done_ids_and_drops_a_torn_last_line(tmp_path):
    out = tmp_path / "out.jsonl"
    assert read_existing(out).done == set()
    with ResultWriter(out) as w:
        for i in range(3):
            w.write(_result(i, ok=i != 1))
    whole = out.read_bytes()
    out.write_bytes(whole + _result(3).to_line()[:17])  # killed in the middle of a write
    existing = read_existing(out)
    assert existing.done == {'"r0"', '"r1"', '"r2"'} and existing.lines == 3 and existing.failed == 1
    assert "dropped a torn last line" in existing.repaired
    assert out.read_bytes() == whole
    out.write_bytes(whole + _result(3).to_line()[:-1])  # killed between the line and its newline
    existing = read_existing(out)
    assert '"r3"' in existing.done and "completed" in existing.repaired
    assert out.read_bytes() == whole + _result(3).to_line()
    assert read_existing(out).repaired is None


def test_a_foreign_line_in_the_middle_stops_the_job(tmp_path):
    out = _write(tmp_path / "out.jsonl", _result(0).to_line() + b"not json\n" + _result(1).to_line())
    with pytest.raises(OutputError, match=r"out.jsonl:2: not a result line"):
        read_existing(out)


def test_retry_failed_drops_failed_lines_only(tmp_path):
    out = tmp_path / "out.jsonl"
    with ResultWriter(out) as w:
        for i in range(4):
            w.write(_result(i, ok=i % 2 == 0))
    assert drop_failures(out) == 2
    assert read_existing(out).done == {'"r0"', '"r2"'}
    assert [p.name for p in tmp_path.iterdir()] == ["out.jsonl"]  # no temporary file left


# ---------------------------------------------------------------------- command line


def test_extract_bad_arguments_exit_2_before_loading_the_model(tmp_path, capsys):
    records = _write(tmp_path / "in.jsonl", '{"text": "x"}\n')
    out = str(tmp_path / "out.jsonl")
    base = ["extract", "--input", str(records), "--output", out]
    assert cli.main(base + ["--prompt-template", "{text"]) == 2
    assert cli.main(["extract", "--input", str(tmp_path / "missing.jsonl"), "--output", out]) == 2
    assert cli.main(["extract", "--input", str(tmp_path / "in.txt"), "--output", out]) == 2
    assert cli.main(base + ["--schema", "{not json"]) == 2
    assert cli.main(base + ["--temperature", "-1"]) == 2
    assert cli.main(base + ["--max-total-tokens", "0"]) == 2
    err = capsys.readouterr().err
    for words in ("prompt template", "missing.jsonl", "unknown input format", "--json-schema", "temperature", "max_total_tokens"):
        assert words in err
    assert not (tmp_path / "out.jsonl").exists()
