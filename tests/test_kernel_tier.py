"""The grammar kernels' Python twins (``grammar.kernel_tier``, issue 25): what a fresh install's
engine runs while numba compiles. Against the compiled kernels, on the real SmolLM2 vocabulary:
the same masks, completion-budget masks, verdicts and compile steps; refusals alike; no compiled
kernel called (checked on an empty numba cache, where a call would compile); grammars built
before the switch kept by no cache; and an Engine that is ready before the compile, answers as
Python, switches, and gives the same greedy output on the compiled kernels."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from grammar import CompileBudget, Constraint, GrammarBudgetError, api, kernel_tier
from mask_reference import probe_fingerprint

ROOT = Path(__file__).resolve().parents[1]

DEMO = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 40},
                                         "born": {"type": "integer", "minimum": 1000, "maximum": 2025},
                                         "fields": {"type": "array", "items": {"type": "string", "maxLength": 30}, "maxItems": 3}},
        "required": ["name", "born", "fields"], "additionalProperties": False}
CONSTRAINTS = [
    Constraint.json_schema(DEMO),
    # string formats and key patterns: the front end's char-DFA products and minimization
    Constraint.json_schema({"type": "object", "properties": {"when": {"type": "string", "format": "date-time"},
                                                             "id": {"type": "string", "format": "uuid"}},
                            "patternProperties": {"^x-[a-z]+$": {"type": "integer"}}, "required": ["when"]}),
    # recursion: deep configurations (truncation, splits, siblings) and string regions
    Constraint.json_schema({"type": "array", "items": {"anyOf": [{"$ref": "#"}, {"type": "string"}]}, "maxItems": 3}),
    Constraint.regex(r"[A-Z][a-z]{1,8}( [A-Z][a-z]{1,8}){0,2}, born [12][0-9]{3}\."),
    Constraint.ebnf('root ::= "(" item ("," item)* ")"\nitem ::= [a-z]+ | root'),
]
PROBES = [b"", b"{", b'{"name": "Marie', b'{"name": "Marie Curie", "born": 18', b'{"when": "2024-01-02T',
          b'{"when": "2024-01-02T03:04:05Z", "x-ab', b"[", b'[["a", [[', b'[[[["', b"Marie Cu", b"Ada, born 18",
          b"(", b"(a,(b,(c", b"(ab,cd)"]


def _fingerprint(compiled) -> str:
    """Masks (plain and with a budget of 6 tokens) and verdicts along every probe the grammar
    accepts, and the compile's counted steps."""
    return probe_fingerprint(compiled, PROBES, with_steps=True)


@pytest.fixture
def python_tier(monkeypatch):
    """New grammar work runs the twins; restored afterwards whatever the test did."""
    monkeypatch.setattr(kernel_tier, "_compiled", False)
    api.clear_cache()
    yield
    api.clear_cache()


def _compile(constraint, vocab, budget=None):
    return api.compile_constraint(constraint, vocab, budget, disk=None)


@pytest.fixture(scope="module")
def compiled_fingerprints(smollm2_vocab):
    api.clear_cache()
    out = {}
    for c in CONSTRAINTS:
        g = _compile(c, smollm2_vocab)
        assert not g.runs_python
        out[c] = _fingerprint(g)
    return out


@pytest.mark.parametrize("index", range(len(CONSTRAINTS)))
def test_the_twins_give_the_compiled_masks_verdicts_and_steps(index, smollm2_vocab, compiled_fingerprints, python_tier):
    constraint = CONSTRAINTS[index]
    g = _compile(constraint, smollm2_vocab)
    assert g.runs_python and kernel_tier.is_python(g.automaton.core)
    assert _fingerprint(g) == compiled_fingerprints[constraint]


def test_a_budget_refuses_alike_in_both(smollm2_vocab, monkeypatch):
    budget = CompileBudget(max_automaton_states=40)
    regex = Constraint.regex("[a-z]{100}")
    messages = []
    for compiled in (True, False):
        monkeypatch.setattr(kernel_tier, "_compiled", compiled)
        api.clear_cache()
        g = _compile(regex, smollm2_vocab, budget)
        g.token_mask(g.step_bytes(g.initial_state, b"a" * 20))
        with pytest.raises(GrammarBudgetError) as info:
            g.step_bytes(g.initial_state, b"a" * 60)
        messages.append(str(info.value))
    api.clear_cache()
    assert messages[0] == messages[1] and "40 states" in messages[0]


def test_a_grammar_built_before_the_switch_is_kept_by_no_cache(smollm2_vocab, python_tier):
    constraint = CONSTRAINTS[0]
    early = _compile(constraint, smollm2_vocab)
    assert early.runs_python and _compile(constraint, smollm2_vocab) is not early  # not cached
    switched = threading.Event()
    thread = kernel_tier.switch_when(lambda: True, before_switch=lambda: None, after_switch=[switched.set])
    thread.join(30)
    assert switched.is_set() and kernel_tier.compiled()
    late = _compile(constraint, smollm2_vocab)
    assert not late.runs_python and _compile(constraint, smollm2_vocab) is late  # cached again
    # The early grammar keeps running its twins on its own core, to the same masks.
    state_early = early.step_bytes(early.initial_state, b'{"name": "Ada", "born": 1')
    state_late = late.step_bytes(late.initial_state, b'{"name": "Ada", "born": 1')
    assert (early.token_mask(state_early) == late.token_mask(state_late)).all()


def test_the_backend_compiles_again_what_it_compiled_before_the_switch(smollm2_vocab, python_tier):
    from engine.constrained.grammar_backend import GrammarBackend
    from engine.sampling_params import SamplingParams

    backend = GrammarBackend(smollm2_vocab, disk=None)
    try:
        params = SamplingParams(json_schema=DEMO)
        first = backend.submit(params)
        assert first.result(60).runs_python and backend.submit(params) is first  # a hit before the switch
        kernel_tier.switch_when(lambda: True).join(30)
        second = backend.submit(params)
        assert second is not first and not second.result(60).runs_python
        assert backend.submit(params) is second
    finally:
        backend.shutdown()


_EMPTY_CACHE_SCRIPT = """
import json, sys
sys.path.insert(0, sys.argv[1]); sys.path.insert(0, sys.argv[1] + "/tests")
from numba.core.event import install_recorder
from grammar import jit_warmup, kernel_tier
from grammar.vocab import TokenVocabulary
from engine.hf.tokenizers import load_default_tokenizer
import test_kernel_tier as t
from numba.core.registry import CPUDispatcher
assert not jit_warmup.is_warm()
jit_warmup._tried = True  # no warm-up children: every compiled call would compile here
called = []

class Tripwire:  # a compiled kernel that records each call (its twin is found through py_func)
    def __init__(self, kernel):
        self.kernel, self.py_func = kernel, kernel.py_func
    def __call__(self, *args):
        called.append(self.py_func.__qualname__)
        return self.kernel(*args)

for name, module in list(sys.modules.items()):
    if name.startswith("grammar") and module is not None:
        for attr, value in list(vars(module).items()):
            if isinstance(value, CPUDispatcher) and value._can_compile:  # not the ones compiled at import
                setattr(module, attr, Tripwire(value))
kernel_tier.use_python()
vocab = TokenVocabulary.from_tokenizer(load_default_tokenizer())
with install_recorder("numba:compile") as rec:
    out = {c.digest: t._fingerprint(t._compile(c, vocab)) for c in t.CONSTRAINTS}
compiled = sorted({str(e.data["dispatcher"].py_func.__qualname__) for _, e in rec.buffer if e.is_start})
print(json.dumps({"fingerprints": out, "compiled": compiled, "called": sorted(set(called))}))
"""


def test_the_twins_compile_nothing_on_an_empty_numba_cache(tmp_path, compiled_fingerprints):
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba"))
    proc = subprocess.run([sys.executable, "-c", _EMPTY_CACHE_SCRIPT, str(ROOT)], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["called"] == [] and out["compiled"] == [], "the Python tier reached compiled kernels"
    assert out["fingerprints"] == {c.digest: compiled_fingerprints[c] for c in CONSTRAINTS}


class _HeldWarmup:
    """A cold cache's warm-up, as the engine sees it, that finishes when the test says so."""

    procs = [object()]
    elsewhere = False

    def __init__(self) -> None:
        self.release = threading.Event()

    def wait(self, progress=None) -> bool:
        return self.release.wait(120)


@pytest.mark.slow
def test_an_engine_on_a_cold_cache_answers_as_python_then_switches(monkeypatch):
    from engine import Engine, SamplingParams
    from grammar import jit_warmup

    warmup = _HeldWarmup()
    monkeypatch.setattr(jit_warmup, "start", lambda background=False: warmup)
    monkeypatch.setattr(kernel_tier, "_compiled", True)  # restored after the test (the engine switches it)
    api.clear_cache()
    params = SamplingParams(json_schema=DEMO, max_new_tokens=64, temperature=0)
    with Engine(dtype="float32", max_total_tokens=2000, num_threads=1) as eng:
        assert not kernel_tier.compiled(), "ready before the kernels, in the Python tier"
        early = eng.generate("Give me a JSON record about Marie Curie.", params)
        assert eng.grammar_backend.compile(params).runs_python
        warmup.release.set()
        for _ in range(600):
            if kernel_tier.compiled():
                break
            threading.Event().wait(0.05)
        assert kernel_tier.compiled()
        late = eng.generate("Give me a JSON record about Marie Curie.", params)
        assert not eng.grammar_backend.compile(params).runs_python
    assert early["output_ids"] == late["output_ids"] and json.loads(early["text"])["name"]
