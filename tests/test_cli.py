"""The ``formcast generate`` command line: a real run in a subprocess, and argument handling."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from engine.entrypoints import cli

REPO = Path(__file__).resolve().parents[1]


def test_cli_subprocess_prints_only_the_match():
    pattern = r"\d{4}-\d{2}-\d{2}"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, "-m", "engine", "generate", "--regex", pattern, "--prompt", "When did Apollo 11 land?",
         "--max-new-tokens", "12", "--threads", "1", "--temperature", "0.8", "--seed", "1"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.endswith("\n") and proc.stdout.count("\n") == 1
    assert re.fullmatch(pattern, proc.stdout[:-1], re.ASCII), proc.stdout
    assert "loading model" in proc.stderr  # progress goes to stderr


def test_bad_arguments_exit_2_before_loading_the_model(capsys):
    assert cli.main(["generate", "--regex", "a", "--prompt", "x", "--max-new-tokens", "0"]) == 2
    assert cli.main(["generate", "--json-schema", "{not json", "--prompt", "x"]) == 2
    err = capsys.readouterr()
    assert err.out == "" and "--max-new-tokens" in err.err and "--json-schema" in err.err
    with pytest.raises(SystemExit):
        cli.main(["generate", "--regex", "a", "--ebnf", "root ::= \"a\"", "--prompt", "x"])


def test_constraint_from_file_or_inline(tmp_path):
    schema = {"type": "integer"}
    path = tmp_path / "s.json"
    path.write_text(json.dumps(schema))
    parser = cli.build_parser()
    assert cli._constraint(parser.parse_args(["generate", "--json-schema", str(path), "--prompt", "p"])) == {"json_schema": schema}
    assert cli._constraint(parser.parse_args(["generate", "--json-schema", '{"type": "integer"}', "--prompt", "p"])) == {"json_schema": schema}
    grammar = tmp_path / "g.ebnf"
    grammar.write_text('root ::= "yes" | "no"\n')
    assert cli._constraint(parser.parse_args(["generate", "--ebnf", str(grammar), "--prompt", "p"])) == {"ebnf": 'root ::= "yes" | "no"\n'}
    assert cli._constraint(parser.parse_args(["generate", "--ebnf", 'root ::= "a"', "--prompt", "p"])) == {"ebnf": 'root ::= "a"'}


def test_cli_batch_file_runs_on_the_engine(tmp_path):
    lines = [
        {"id": "a", "prompt": "Pick a date."},
        {"id": "b", "prompt": "Yes or no: is the sky blue?", "regex": "(yes|no)"},
        {"id": "c", "prompt": "A number:", "json_schema": {"type": "integer", "minimum": 0, "maximum": 99}},
    ]
    batch = tmp_path / "in.jsonl"
    batch.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, "-m", "engine", "generate", "--regex", r"\d{4}-\d{2}-\d{2}", "--batch", str(batch),
         "--max-new-tokens", "16", "--threads", "1", "--dtype", "float32"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = [json.loads(x) for x in proc.stdout.splitlines()]
    assert [o["id"] for o in out] == ["a", "b", "c"]
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", out[0]["text"], re.ASCII)
    assert out[1]["text"] in ("yes", "no")
    assert 0 <= json.loads(out[2]["text"]) <= 99
    assert all(o["finish_reason"]["type"] == "stop" for o in out)


def test_cli_refused_constraint_exits_2(capsys):
    assert cli.main(["generate", "--regex", "(?<=a)b", "--prompt", "x", "--dtype", "float32"]) == 2
    assert "lookbehind" in capsys.readouterr().err


def test_cli_budget_below_the_shortest_output_exits_2(capsys):
    """A date-time and a uuid cannot fit 8 tokens: refused naming the minimum, never a cut document."""
    schema = json.dumps({"type": "object", "properties": {"t": {"type": "string", "format": "date-time"}, "u": {"type": "string", "format": "uuid"}},
                         "required": ["t", "u"]})  # fmt: skip
    assert cli.main(["generate", "--json-schema", schema, "--max-new-tokens", "8", "--prompt", "x", "--dtype", "float32"]) == 2
    err = capsys.readouterr().err
    assert "max_new_tokens" in err and "allow at least" in err, err
