"""The official JSON-Schema-Test-Suite, per draft, as a ratchet (files in tests/data/json-schema-test-suite).

Each test group's schema is compiled under its draft (the suite's schemas seldom name it: the
draft goes in as ``draft=``) with ``format`` as an annotation (the suite's default), and each
instance, spelled ``json.dumps(data, ensure_ascii=False)``, is walked through a matcher over the
byte-level vocabulary. Two rules: no invalid instance is ever accepted, and the count of correct
answers may not drop below the recorded one (raise ``CORRECT`` when it improves). A schema
refused as unsatisfiable accepts nothing (its valid instances count as rejected); other
refusals (remote references, budgets) score nothing. ``bench/schema_suite.py --draft all``
prints the same figures beside llguidance and xgrammar.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grammar import GrammarError, GrammarMatcher, TokenVocabulary
from grammar.compiler import compile_grammar
from grammar.json_schema import json_schema_to_grammar

SUITE = Path(__file__).parent / "data" / "json-schema-test-suite" / "tests"
FOLDERS = {"draft4": "draft4", "draft6": "draft6", "draft7": "draft7", "2019-09": "draft2019-09", "2020-12": "draft2020-12"}
# Correct answers per draft (of the tests not lost to refusals); the wrong ones left are valid
# instances whose keys come in another order than the schema's ``properties`` (a documented
# restriction), see BENCHMARKS.md, issue 27.
CORRECT = {"draft4": 591, "draft6": 805, "draft7": 893, "2019-09": 1216, "2020-12": 1242}
MAX_WRONG_SHARE = 0.01  # of the scored tests (correct + valid rejected)

BYTES = TokenVocabulary.byte_level()


def _score(draft: str) -> tuple[int, list[str], list[str]]:
    correct, rejected, accepted = 0, [], []
    for path in sorted((SUITE / FOLDERS[draft]).glob("*.json")):
        for i, group in enumerate(json.loads(path.read_text(encoding="utf-8"))):
            where = f"{draft}/{path.name}#{i}"
            try:
                compiled = compile_grammar(json_schema_to_grammar(group["schema"], draft=draft, formats="annotate"), BYTES)
            except GrammarError as exc:
                if "unsatisfiable" in str(exc):
                    for t in group["tests"]:
                        if t["valid"]:
                            rejected.append(f"{where}: {t['description']}")
                        else:
                            correct += 1
                continue
            for t in group["tests"]:
                m = GrammarMatcher(compiled)
                ok = m.accept_bytes(json.dumps(t["data"], ensure_ascii=False).encode("utf-8")) and m.can_terminate()
                if ok == t["valid"]:
                    correct += 1
                else:
                    (rejected if t["valid"] else accepted).append(f"{where}: {t['description']}")
    return correct, rejected, accepted


@pytest.mark.parametrize("draft", list(FOLDERS))
def test_suite_never_accepts_an_invalid_instance_and_keeps_its_score(draft):
    correct, rejected, accepted = _score(draft)
    assert not accepted, f"invalid instances accepted: {accepted}"
    assert correct >= CORRECT[draft], f"{draft}: {correct} correct, recorded {CORRECT[draft]}; valid rejected: {rejected}"
    assert len(rejected) <= MAX_WRONG_SHARE * (correct + len(rejected)), rejected
