"""Speculative decoding in the Engine with the embedded SmolLM2: greedy outputs are token-identical
with and without speculation, for every drafter, constrained and not, alone and in mixed
batches; the target as its own draft model has every draft accepted; matchers stay exactly in
step with the output after every rollback; logprobs are the target's; the KV pools end free."""

from __future__ import annotations

import pytest

from engine import Engine
from engine.managers import output_processor as op_module
from grammar import GrammarMatcher

pytestmark = pytest.mark.slow

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 30}, "city": {"type": "string", "maxLength": 20}, "age": {"type": "integer"}},
    "required": ["name", "city", "age"],
    "additionalProperties": False,
}
DOC = "Record: the customer Maria Lopez lives in Madrid and is 34 years old. She joined in 2019 and likes tea."
KW = dict(dtype="float32", max_total_tokens=6000, max_running_requests=16, num_threads=1)


def _requests(engine: Engine) -> tuple[list[list[int]], list[dict]]:
    chat = lambda text: engine.apply_chat_template([{"role": "user", "content": text}])  # noqa: E731
    prompts = [
        chat(DOC + " Extract name, city and age as JSON."),
        chat(DOC + " Repeat the record word for word."),
        chat("Count from 1 to 12 separated by commas."),
        chat(DOC + " Where does she live? One word."),
    ]
    params = [
        {"temperature": 0.0, "max_new_tokens": 40, "json_schema": SCHEMA},
        {"temperature": 0.0, "max_new_tokens": 30},
        {"temperature": 0.0, "max_new_tokens": 24, "frequency_penalty": 0.5, "repetition_penalty": 1.1},
        {"temperature": 0.0, "max_new_tokens": 12, "regex": r"[A-Z][a-z]+"},
    ]
    return prompts, params


@pytest.fixture(scope="module")
def reference():
    with Engine(**KW) as base:
        prompts, params = _requests(base)
        alone = [base.generate(input_ids=p, sampling_params=q) for p, q in zip(prompts, params)]
        logprobs = base.generate(input_ids=prompts[0], sampling_params=params[0], return_logprob=True)
    return prompts, params, alone, logprobs


@pytest.fixture
def in_step_matchers(monkeypatch):
    """After every output step, each running request's matcher must equal a fresh matcher fed
    the request's output: rollback left nothing behind and skipped nothing."""
    checked = []
    original = op_module.OutputProcessor.process

    def process(self, batch, *args, **kwargs):
        original(self, batch, *args, **kwargs)
        for req in batch.reqs:
            if req.grammar is None or req.to_abort:
                continue
            fresh = GrammarMatcher(req.grammar.compiled)
            assert all(fresh.accept_token(t) for t in req.output_ids), req.rid
            assert fresh.state == req.grammar.state and fresh.is_terminated() == req.grammar.is_terminated()
            checked.append(req.rid)

    monkeypatch.setattr(op_module.OutputProcessor, "process", process)
    return checked


@pytest.mark.parametrize("algorithm", ["ngram", "grammar", "ngram+grammar", "draft_model"])
def test_greedy_outputs_are_identical_with_speculation(algorithm, reference, in_step_matchers):
    prompts, params, alone, _ = reference
    extra = {"speculative_draft_num_layers": 30} if algorithm == "draft_model" else {}
    if algorithm == "grammar":
        # With jump-forward on, forced text never reaches the drafter; without it, the grammar
        # drafts that text itself and verification must accept it.
        extra["enable_jump_forward"] = False
        with Engine(**KW, enable_jump_forward=False) as base:
            alone = [base.generate(input_ids=p, sampling_params=q) for p, q in zip(prompts, params)]
    with Engine(**KW, speculative_algorithm=algorithm, **extra) as spec:
        start = spec.runner.token_to_kv_pool.available_size()
        batch = spec.generate(input_ids=prompts, sampling_params=params)  # mixed: drafting and not
        single = spec.generate(input_ids=prompts[0], sampling_params=params[0])
        stats = spec.scheduler.spec.stats
        for ref, got in zip(alone, batch):
            assert got["output_ids"] == ref["output_ids"], (algorithm, ref["text"], got["text"])
        assert single["output_ids"] == alone[0]["output_ids"]
        assert stats["drafted"] > 0 and stats["accepted"] > 0, stats
        if algorithm == "draft_model":  # the target is its own draft: every draft is accepted
            assert stats["accepted"] == stats["drafted"], stats
            drafter = spec.scheduler.spec.drafter.first if hasattr(spec.scheduler.spec.drafter, "first") else spec.scheduler.spec.drafter
            pool = drafter.runner.token_to_kv_pool
            assert spec.scheduler.call(pool.available_size) == pool.size  # read between steps
        spec.flush_cache()
        assert spec.scheduler.call(spec.runner.token_to_kv_pool.available_size) == start
    assert in_step_matchers  # the invariant was checked on constrained requests


def test_logprobs_with_speculation_are_the_targets(reference):
    prompts, params, _, plain = reference
    with Engine(**KW, speculative_algorithm="ngram+grammar") as spec:
        got = spec.generate(input_ids=prompts[0], sampling_params=params[0], return_logprob=True)
        assert spec.scheduler.spec.stats["accepted"] > 0
    assert got["output_ids"] == plain["output_ids"]
    for (a, ta, _), (b, tb, _) in zip(got["meta_info"]["output_token_logprobs"], plain["meta_info"]["output_token_logprobs"]):
        assert ta == tb and abs(a - b) < 1e-3


def test_sampled_constrained_outputs_validate_with_speculation():
    import json

    import jsonschema

    with Engine(**KW, speculative_algorithm="ngram+grammar") as spec:
        prompt = spec.apply_chat_template([{"role": "user", "content": DOC + " Extract name, city and age as JSON."}])
        outs = spec.generate(input_ids=[prompt] * 4, sampling_params={"temperature": 0.8, "sampling_seed": 3, "max_new_tokens": 60, "json_schema": SCHEMA, "n": 1})
        again = spec.generate(input_ids=prompt, sampling_params={"temperature": 0.8, "sampling_seed": 3, "max_new_tokens": 60, "json_schema": SCHEMA})
    for out in outs:
        if out["meta_info"]["finish_reason"]["type"] == "stop":
            jsonschema.validate(json.loads(out["text"]), SCHEMA)
    assert again["output_ids"] == outs[0]["output_ids"]  # a seeded request is reproducible
