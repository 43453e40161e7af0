"""MaskBench regression ratchet for the JSON Schema front end (skipped without ../shared).

A fixed sample of the dev split (every 33rd schema whose text is under 4,000 characters, about
200), plus about 60 schemas using the keywords the algebra enforces since issue 14 (``not``,
``oneOf``, ``if``, ``uniqueItems``, ``patternProperties``, ``unevaluated*``, ``contains``...), is
compiled and every test instance walked byte by byte (``json.dumps(data, ensure_ascii=False)``). Hard rule: no invalid instance is ever accepted. Ratchet: a schema
recorded as ``pass`` in tests/data/maskbench_json_schema.json must still pass; run with
``FORMCAST_UPDATE_RATCHET=1`` to record improvements.
"""

from __future__ import annotations

import gzip
import json
import os
import signal
from pathlib import Path

import pytest

from grammar import GrammarError, TokenVocabulary

# The shared folder sits beside the checkout; FORMCAST_MASKBENCH_DEV (or MASKBENCH_DEV) points
# elsewhere (a worktree).
DEV = Path(os.environ.get("FORMCAST_MASKBENCH_DEV") or os.environ.get("MASKBENCH_DEV")
           or Path(__file__).resolve().parents[2] / "shared/bench/maskbench/dev.jsonl.gz")
RECORD = Path(__file__).resolve().parent / "data/maskbench_json_schema.json"
STRIDE, MAX_SCHEMA_CHARS, PER_SCHEMA_S = 33, 4000, 30


KEYWORDS = ('"not"', '"oneOf"', '"if"', '"uniqueItems"', '"patternProperties"', '"unevaluatedProperties"',
            '"unevaluatedItems"', '"propertyNames"', '"dependentSchemas"', '"contains"', '"$dynamicRef"', '"multipleOf"')
KEYWORD_STRIDE = 14


def _sample() -> list[dict]:
    with gzip.open(DEV, "rt") as f:
        rows = [json.loads(line) for line in f]
    small = [r for r in rows if len(json.dumps(r["schema"])) < MAX_SCHEMA_CHARS]
    base = [r for r in rows[::STRIDE] if len(json.dumps(r["schema"])) < MAX_SCHEMA_CHARS]
    taken = {r["id"] for r in base}
    keyworded = [r for r in small if r["id"] not in taken and any(k in json.dumps(r["schema"]) for k in KEYWORDS)]
    return base + keyworded[::KEYWORD_STRIDE]


class _Timeout(Exception):
    pass


def _outcome(row: dict, vocab: TokenVocabulary) -> str:
    from grammar.compiler import CompileBudget, compile_grammar
    from grammar.json_schema import json_schema_to_grammar
    from grammar.matcher import GrammarMatcher

    try:
        compiled = compile_grammar(json_schema_to_grammar(row["schema"]), vocab, budget=CompileBudget(max_compile_seconds=PER_SCHEMA_S))
    except GrammarError as exc:
        return f"compile: {type(exc).__name__}"
    outcome = "pass"
    for test in row["tests"]:
        m = GrammarMatcher(compiled)
        ok = m.accept_bytes(json.dumps(test["data"], ensure_ascii=False).encode("utf-8")) and m.can_terminate()
        if ok and not test["valid"]:
            return "invalidation"
        if not ok and test["valid"]:
            outcome = "validation"
    return outcome


@pytest.mark.skipif(not DEV.exists(), reason="MaskBench dev split not present (../shared)")
def test_maskbench_sample_ratchet():
    # Refusals are decided by counted work (issue 25), the same on a loaded CI box as on a quiet
    # one; the per-schema alarm only catches a hang.
    vocab = TokenVocabulary.byte_level()
    rows = _sample()
    assert len(rows) >= 150

    def alarm(*_):
        raise _Timeout()

    old = signal.signal(signal.SIGALRM, alarm)
    results: dict[str, str] = {}
    try:
        for row in rows:
            signal.alarm(PER_SCHEMA_S)
            try:
                results[row["id"]] = _outcome(row, vocab)
            except _Timeout:
                results[row["id"]] = "timeout"
            finally:
                signal.alarm(0)
    finally:
        signal.signal(signal.SIGALRM, old)
    invalid = sorted(k for k, v in results.items() if v == "invalidation")
    assert not invalid, f"invalid instances accepted for {invalid}"
    recorded = json.loads(RECORD.read_text()) if RECORD.exists() else {}
    regressions = sorted(k for k, v in recorded.items() if v == "pass" and results.get(k, "pass") != "pass")
    if os.environ.get("FORMCAST_UPDATE_RATCHET") == "1" or not RECORD.exists():
        RECORD.parent.mkdir(parents=True, exist_ok=True)
        RECORD.write_text(json.dumps(dict(sorted(results.items())), indent=1) + "\n")
    assert not regressions, f"schemas that used to pass no longer do: {[(k, results[k]) for k in regressions]}"
    passed = sum(v == "pass" for v in results.values())
    print(f"maskbench sample: {passed}/{len(results)} pass")
