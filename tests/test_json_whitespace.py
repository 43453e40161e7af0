"""Per-request JSON whitespace (``SamplingParams.json_whitespace``) through the one pipeline:
SamplingParams -> GrammarBackend (keyed by the mode) -> CompiledGrammar. ``compact`` accepts
``json.dumps(separators=(",", ":"))`` only, ``pretty`` ``json.dumps(indent=2)`` only, ``any``
both; separators become forced text (jump-forward's ``forced_continuation``)."""

from __future__ import annotations

import json

import pytest

from engine.constrained.grammar_backend import GrammarBackend
from engine.sampling_params import SamplingParams
from grammar import GrammarMatcher

SCHEMA = {
    "type": "object",
    "properties": {"id": {"type": "integer"}, "items": {"type": "array", "items": {"type": "object", "properties": {"sku": {"type": "string"}}, "required": ["sku"]}}},
    "required": ["id", "items"],
    "additionalProperties": False,
}
DOC = {"id": 7, "items": [{"sku": "a-1"}, {"sku": "b"}]}
LAYOUTS = {"compact": json.dumps(DOC, separators=(",", ":")), "pretty": json.dumps(DOC, indent=2), "spaced": json.dumps(DOC)}
ACCEPTS = {"any": {"compact", "pretty", "spaced"}, "compact": {"compact"}, "pretty": {"pretty"}}


@pytest.fixture(scope="module")
def backend(smollm2_vocab):
    b = GrammarBackend(smollm2_vocab)
    yield b
    b.shutdown()


@pytest.mark.parametrize("mode", ["any", "compact", "pretty"])
def test_each_mode_accepts_its_layout_only(backend, smollm2_tokenizer, mode):
    compiled = backend.compile(SamplingParams(json_schema=SCHEMA, json_whitespace=mode))
    for name, text in LAYOUTS.items():
        m = GrammarMatcher(compiled)
        ids = smollm2_tokenizer.encode(text, add_special_tokens=False)
        ok = all(m.accept_token(t) for t in ids) and m.can_terminate()
        assert ok == (name in ACCEPTS[mode]), (mode, name)


def test_modes_are_cached_apart(backend):
    grammars = {mode: backend.compile(SamplingParams(json_schema=SCHEMA, json_whitespace=mode)) for mode in ACCEPTS}
    assert len({id(g) for g in grammars.values()}) == 3
    assert backend.compile(SamplingParams(json_schema=SCHEMA, json_whitespace="compact")) is grammars["compact"]


@pytest.mark.parametrize(("mode", "forced"), [("compact", b'{"id":'), ("pretty", b'{\n  "id": '), ("any", b"")])
def test_separators_are_forced_text(backend, mode, forced):
    m = GrammarMatcher(backend.compile(SamplingParams(json_schema=SCHEMA, json_whitespace=mode)))
    assert m.forced_continuation() == forced


def test_cli_maps_json_whitespace():
    from engine.entrypoints import cli

    parser = cli.build_parser()
    args = parser.parse_args(["generate", "--json-schema", '{"type": "object"}', "--prompt", "p", "--json-whitespace", "pretty"])
    assert cli._sampling(args)["json_whitespace"] == "pretty"
    assert "json_whitespace" not in cli._sampling(parser.parse_args(["generate", "--regex", "a", "--prompt", "p"]))
    with pytest.raises(SystemExit):  # argparse refuses other values
        parser.parse_args(["generate", "--json-schema", "{}", "--prompt", "p", "--json-whitespace", "tabs"])
