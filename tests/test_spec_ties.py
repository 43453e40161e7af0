"""Greedy speculation is token-identical to plain decoding where logits tie (issue 29).

Half-precision logits tie at the top often (bfloat16 values near 10 are 0.125 apart), and a
verification forward scores k+1 positions where plain decoding scores one: both the tie rule
(``engine/sampling/ties.py``) and the forward's batch invariance (``engine/layers/attention.py``)
must hold for outputs to stay equal. The embedded SmolLM2 runs in bfloat16, float16, and float32
with its logits rounded to a coarse grid on purpose (ties at almost every step); each drafter,
jump-forward on and off, JSON whitespace modes, requests alone and in a mixed batch.

One engine per dtype (module scope); the speculative worker is swapped between runs on the
scheduler thread, so every configuration shares the loaded weights. The guarantee covers
forwards of at most ``cpu_linear.MAX_ROWS_F32`` tokens (the linear layers' row-invariant loop);
the test checks that its decode forwards stay within it.
"""

from __future__ import annotations

import pytest
import torch

from engine import Engine
from engine.layers.cpu_linear import MAX_ROWS_F32
from engine.speculative.worker import SpeculativeConfig, SpeculativeWorker, build_drafter

pytestmark = pytest.mark.slow

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "address": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                    "required": ["city", "zip"], "additionalProperties": False},
        "orders": {"type": "array", "items": {"type": "integer"}, "maxItems": 3},
    },
    "required": ["name", "address", "orders"],
    "additionalProperties": False,
}  # fmt: skip
DOC = "Invoice 2291 for Jan Kowalski, 14 Lipowa Street, 80331 Gdansk. Orders 17, 204 and 9."
GRID = 0.5  # float32 logits rounded to multiples of this: ties at nearly every step


def _prompts(engine: Engine) -> list[list[int]]:
    chat = lambda text: engine.apply_chat_template([{"role": "user", "content": text}])  # noqa: E731
    return [chat(f"{DOC} Extract name, address and orders as JSON."), chat(f"{DOC} Repeat the address."),
            chat(f"{DOC} Extract the customer as JSON.")]  # fmt: skip


def _params(whitespace: str) -> list[dict]:
    return [
        {"temperature": 0.0, "max_new_tokens": 36, "json_schema": SCHEMA, "json_whitespace": whitespace},
        {"temperature": 0.0, "max_new_tokens": 12},
        {"temperature": 0.0, "max_new_tokens": 24, "json_schema": SCHEMA},
    ]


class _Probe:
    """Wraps the target's forward: optional rounding of the logits, and counts of top-1 ties and
    of the largest decode forward."""

    def __init__(self, runner, grid: float | None) -> None:  # type: ignore[no-untyped-def]
        self.forward, self.grid = runner.forward, grid
        self.ties = 0
        self.largest_decode = 0
        runner.forward = self

    def __call__(self, batch):  # type: ignore[no-untyped-def]
        out = self.forward(batch)
        if self.grid is not None:
            out.next_token_logits = torch.round(out.next_token_logits / self.grid) * self.grid
        top2 = out.next_token_logits.topk(2, dim=-1).values
        self.ties += int((top2[:, 0] == top2[:, 1]).sum())
        if min(batch.extend_prefix_lens_cpu) > 0:
            self.largest_decode = max(self.largest_decode, batch.num_tokens)
        return out


def _use(engine: Engine, algorithm: str, jump_forward: bool) -> None:
    """Plain decoding (``none``) or speculation with ``algorithm``, jump-forward as asked."""

    def swap() -> None:
        sched = engine.scheduler
        if sched.spec is not None:
            for req in list(sched.running):
                sched.spec.release(req)
        sched.outputs.enable_jump_forward = jump_forward
        worker = None
        if algorithm != "none":
            config = SpeculativeConfig(algorithm=algorithm, jump_forward=jump_forward, draft_num_layers=30)
            drafter = build_drafter(config, sched.runner, sched.outputs.tokenizer, sched.texts,
                                    sched.vocab.vocab_size, frozenset(sched.vocab.eos_token_ids))  # fmt: skip
            worker = SpeculativeWorker(drafter, sched.runner.sampler, config)
        sched.spec = sched.planner.spec = worker

    engine.scheduler.call(swap)


DTYPES = {"bfloat16": None, "float16": None, "float32-rounded": GRID}


@pytest.fixture(scope="module", params=list(DTYPES))
def engine(request):
    dtype = request.param.split("-")[0]
    from engine.hf.model_files import default_model_dir

    # the float folder: ties come from bfloat16 / float16 logits (a GGUF model computes in float32)
    with Engine(str(default_model_dir()), dtype=dtype, max_total_tokens=4000, max_running_requests=8, num_threads=1, enable_prefix_cache=False) as eng:
        eng.name = request.param  # type: ignore[attr-defined]
        eng.probe = _Probe(eng.runner, DTYPES[request.param])  # type: ignore[attr-defined]
        eng.references = {}  # type: ignore[attr-defined]
        yield eng


def _plain(engine: Engine, whitespace: str, jump_forward: bool) -> list[list[int]]:
    key = (whitespace, jump_forward)
    if key not in engine.references:  # type: ignore[attr-defined]
        _use(engine, "none", jump_forward)
        prompts = _prompts(engine)
        outs = [engine.generate(input_ids=p, sampling_params=q) for p, q in zip(prompts, _params(whitespace))]
        engine.references[key] = [o["output_ids"] for o in outs]  # type: ignore[attr-defined]
    return engine.references[key]  # type: ignore[attr-defined]


# (algorithm, jump-forward, json_whitespace of the first request) per dtype: every drafter, both
# jump-forward settings and every whitespace mode across them (a spread, for the suite's time).
CASES = {
    "bfloat16": [("ngram", True, "any"), ("grammar", False, "compact"), ("ngram+grammar", True, "pretty"), ("draft_model", True, "any")],
    "float16": [("ngram+grammar", True, "compact")],
    "float32-rounded": [("ngram", True, "pretty"), ("grammar", False, "any")],
}  # fmt: skip


@pytest.mark.parametrize("case", range(max(map(len, CASES.values()))))
def test_greedy_speculation_is_token_identical_under_ties(engine, case):
    if case >= len(CASES[engine.name]):  # type: ignore[attr-defined]
        pytest.skip("fewer cases for this dtype")
    algorithm, jump_forward, whitespace = CASES[engine.name][case]  # type: ignore[attr-defined]
    reference = _plain(engine, whitespace, jump_forward)
    _use(engine, algorithm, jump_forward)
    batch = engine.generate(input_ids=_prompts(engine), sampling_params=_params(whitespace))  # a mixed batch
    stats = engine.scheduler.spec.stats
    _use(engine, "none", True)
    # Plain decoding ran each request alone; speculation runs them together.
    assert [o["output_ids"] for o in batch] == reference, (algorithm, jump_forward, whitespace)
    # The grammar alone with jump-forward drafts only few-choice guesses, which may not arise.
    assert stats["drafted"] > 0 or (algorithm, jump_forward) == ("grammar", True), stats
    # The run met tied maxima (bfloat16 and the rounded float32 are built to; float16's finer
    # spacing gave none on these prompts in CI, so there this checks identity alone and
    # tests/test_batch_invariance.py checks float16's logits bit for bit).
    assert engine.probe.ties > 0 or engine.name == "float16"  # type: ignore[attr-defined]
    assert engine.probe.largest_decode <= MAX_ROWS_F32  # within the guarantee  # type: ignore[attr-defined]
