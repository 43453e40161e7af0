"""Constrained generation on formcast's own Engine with the embedded SmolLM2.

* 50 requests in one batch: the 36 realistic JSON schemas of ``schemas/e2e``, regexes, every
  EBNF test grammar and structural tags. Each output whose finish reason is ``stop`` must
  validate with an independent judge (``jsonschema`` with exact decimals, ``re.fullmatch``,
  Lark's Earley parser, ``json`` + ``jsonschema`` for tool-call bodies).
* The same constraints with ``max_new_tokens`` a few tokens above each grammar's shortest
  completion: budget-aware closing must still finish every output complete and valid.
* One refused constraint in a batch of nine aborts alone; the other eight complete.
"""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from engine import Engine
from grammar import GrammarMatcher
from test_e2e_json_schema import E2E, _validate
from test_ebnf_e2e import PROMPTS
from test_ebnf_grammars import GRAMMARS, NAMES, oracle

pytestmark = pytest.mark.slow

REGEXES = [
    ("date", r"\d{4}-\d{2}-\d{2}", "When did Apollo 11 land? Answer as YYYY-MM-DD."),
    ("yes_no", r"(yes|no)", "Is the sky blue? Answer yes or no."),
    ("phone", r"\(\d{3}\) \d{3}-\d{4}", "Give a US phone number."),
    ("email", r"[a-z]{2,10}@[a-z]{2,10}\.(com|org)", "Give an email address."),
    ("hex", r"#[0-9a-f]{6}", "Give a hex color."),
    ("sentence", r"[A-Z][a-z ]{5,40}\.", "Write a short sentence."),
]
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"]}
TAG = {"structures": [{"begin": "<tool_call>", "schema": WEATHER, "end": "</tool_call>"}], "triggers": ["<tool_call>"]}
FEW_SHOT = (
    'Q: weather in Rome?\nA: <tool_call>{"city": "Rome"}</tool_call>\n'
    'Q: weather in Oslo?\nA: <tool_call>{"city": "Oslo"}</tool_call>\n'
    "Q: weather in {city}?\nA:"
)


def _cases() -> list[dict]:
    cases = [{"kind": "json", "name": c["name"], "prompt": c["prompt"], "params": {"json_schema": c["schema"]}, "schema": c["schema"]} for c in E2E]
    cases += [{"kind": "regex", "name": n, "prompt": p, "params": {"regex": r}, "regex": r} for n, r, p in REGEXES]
    for n in NAMES:
        cases.append({"kind": "ebnf", "name": n, "prompt": PROMPTS[n], "params": {"ebnf": (GRAMMARS / f"{n}.ebnf").read_text()}})
    for city in ("Paris", "Lima", "Kyoto", "Cairo"):
        cases.append({"kind": "tag", "name": f"tag_{city}", "raw": FEW_SHOT.replace("{city}", city), "params": {"structural_tag": TAG}})
    return cases[:50]


CASES = _cases()


@pytest.fixture(scope="module")
def engine():
    with Engine(dtype="float32", max_total_tokens=40_000, max_running_requests=64, num_threads=1) as eng:
        yield eng


def _prompt_ids(engine: Engine, case: dict) -> list[int]:
    if "raw" in case:  # few-shot text without the chat template: the small model then calls tools
        return list(engine.tokenizer(case["raw"])["input_ids"])
    return engine.apply_chat_template([{"role": "user", "content": case["prompt"]}])


def _check(case: dict, text: str) -> None:
    if case["kind"] == "json":
        _validate(text, case["schema"])
    elif case["kind"] == "regex":
        assert re.fullmatch(case["regex"], text, re.ASCII), (case["name"], text)
    elif case["kind"] == "ebnf":
        assert oracle(case["name"], text.encode()), (case["name"], text)
    else:
        for piece in text.split("<tool_call>")[1:]:
            body, sep, _ = piece.partition("</tool_call>")
            assert sep, text
            jsonschema.validate(json.loads(body), WEATHER)


def test_fifty_constraints_in_one_batch(engine):
    assert len(CASES) == 50 and {c["kind"] for c in CASES} == {"json", "regex", "ebnf", "tag"}
    prompts = [_prompt_ids(engine, c) for c in CASES]
    params = [{**c["params"], "temperature": 0.0, "max_new_tokens": 96} for c in CASES]
    outs = engine.generate(input_ids=prompts, sampling_params=params)
    stopped = 0
    for case, out in zip(CASES, outs):
        reason = out["meta_info"]["finish_reason"]
        print(f"  {case['name']:24s} {reason['type']:6s} {out['text']!r}")
        assert reason["type"] in ("stop", "length"), (case["name"], reason)
        if reason["type"] == "stop":
            _check(case, out["text"])
            stopped += 1
    assert stopped >= 45  # budget-aware closing finishes nearly every row within 96 tokens
    tags = [o["text"] for c, o in zip(CASES, outs) if c["kind"] == "tag"]
    assert any("<tool_call>" in t for t in tags), tags  # the few-shot prompt elicits calls
    jumped = sum(o["meta_info"]["jump_forward_tokens"] for o in outs)
    assert jumped > 0  # schemas force keys and punctuation: some tokens came without sampling


def test_tight_budgets_still_close_every_output(engine):
    prompts, params = [], []
    for case in CASES:
        compiled = engine.grammar_backend.compile(_as_params(case["params"]))
        shortest = len(GrammarMatcher(compiled).shortest_completion())
        prompts.append(_prompt_ids(engine, case))
        params.append({**case["params"], "temperature": 0.0, "max_new_tokens": shortest + 6})
    outs = engine.generate(input_ids=prompts, sampling_params=params)
    for case, out in zip(CASES, outs):
        assert out["meta_info"]["finish_reason"]["type"] == "stop", (case["name"], out["text"], out["meta_info"])
        _check(case, out["text"])


def test_refused_constraint_aborts_alone(engine):
    good = CASES[:8]
    prompts = [_prompt_ids(engine, c) for c in good] + [_prompt_ids(engine, CASES[0])]
    params = [{**c["params"], "temperature": 0.0, "max_new_tokens": 64} for c in good]
    params.append({"regex": r"(a+)\1", "max_new_tokens": 64})  # backreferences are not regular
    outs = engine.generate(input_ids=prompts, sampling_params=params)
    refused = outs[-1]["meta_info"]["finish_reason"]
    assert refused["type"] == "abort" and "backreference" in refused["message"], refused
    for case, out in zip(good, outs[:8]):
        assert out["meta_info"]["finish_reason"]["type"] in ("stop", "length")
        if out["meta_info"]["finish_reason"]["type"] == "stop":
            _check(case, out["text"])


def _as_params(spec: dict):
    from engine import SamplingParams

    return SamplingParams(**spec)


def test_text_forced_at_the_start_is_prefilled_with_the_prompt(engine):
    # "Year: " is forced before any choice: it is appended at admission, so the prefill samples
    # the first digit and every forward of the request samples a token (EOS included).
    prompt = _prompt_ids(engine, {"prompt": "In what year did Apollo 11 land on the Moon?"})
    before = engine.scheduler.stats["forwards"]
    out = engine.generate(input_ids=[prompt], sampling_params=[{"regex": r"Year: \d{4}", "temperature": 0.0, "max_new_tokens": 16}])[0]
    forwards = engine.scheduler.stats["forwards"] - before
    meta = out["meta_info"]
    assert re.fullmatch(r"Year: \d{4}", out["text"]), out["text"]
    assert meta["finish_reason"]["type"] == "stop", meta
    # All of "Year: " came without sampling (before, the prefill sampled its first token).
    assert meta["jump_forward_tokens"] == len(engine.tokenizer.encode("Year: ", add_special_tokens=False)), meta
    assert forwards == meta["completion_tokens"] - meta["jump_forward_tokens"] == 5, (forwards, meta)  # 4 digits, EOS
