"""Tool-call syntaxes per model family (``tool_formats``): detection from chat templates and
model families, the parser reading each syntax (whole and in every split, which must agree), and
each family's ``auto`` structural tag compiled on SmolLM2's vocabulary."""

from __future__ import annotations

import json

import pytest

from engine.entrypoints.engine_args import EngineArgs
from engine.entrypoints.tool_calls import CollectedMessage, auto_structural_tag, make_parser, prompt_messages
from engine.entrypoints.tool_formats import FORMATS, HERMES, JSON, LLAMA3, MISTRAL, detect_format, get_format

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"], "additionalProperties": False}}}  # fmt: skip
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}}}}
TOOLS = [WEATHER, TIME]
ARGS = '{"city": "Pa}ris \\"{x"}'  # braces and quotes inside a string must not end the arguments


def _read(fmt, chunks, max_calls=None) -> tuple:
    parser = make_parser("auto", TOOLS, None, fmt, max_calls)
    out = CollectedMessage()
    for c in chunks:
        out.add(parser.feed(c))
    out.add(parser.finish())
    return out.text, [(c["name"], c["arguments"]) for c in out.calls]


def _splits(text: str) -> list[list[str]]:
    return [[text], list(text)] + [[text[:i], text[i:]] for i in range(1, len(text))]


@pytest.mark.parametrize("fmt", [HERMES, LLAMA3, MISTRAL, JSON], ids=lambda f: f.name)
def test_each_syntax_reads_back_whole_and_streamed(fmt):
    text = "Checking.\n" + fmt.render("get_weather", ARGS) + "\n" + fmt.render("get_time", "{}") + "\n"
    for chunks in _splits(text):
        assert _read(fmt, chunks) == ("Checking.", [("get_weather", ARGS), ("get_time", "{}")]), chunks


@pytest.mark.parametrize(
    "text,expected",
    [
        # With or without <|python_tag|>; calls separated by ";".
        ('<|python_tag|>{"name": "get_time", "parameters": {}}', (None, [("get_time", "{}")])),
        ('{"name": "get_time", "parameters": {"zone": "UTC"}}; {"name": "get_weather", "parameters": {"city": "X"}}',
         (None, [("get_time", '{"zone": "UTC"}'), ("get_weather", '{"city": "X"}')])),
        ('The answer is {"a": 1}; done', ('The answer is {"a": 1}; done', [])),
        ('{"name": "unknown_tool"} is text', ('{"name": "unknown_tool"} is text', [])),
    ],
)  # fmt: skip
def test_llama3_variants(text, expected):
    for chunks in _splits(text):
        assert _read(LLAMA3, chunks) == expected, chunks


def test_max_calls_drops_later_calls_and_text():
    text = LLAMA3.render("get_time", "{}") + "; " + LLAMA3.render("get_weather", '{"city": "X"}') + " bye"
    for chunks in _splits(text):
        assert _read(LLAMA3, chunks, max_calls=1) == (None, [("get_time", "{}")])


def test_a_cut_call_hands_out_what_arrived():
    for fmt in (MISTRAL, LLAMA3):
        assert _read(fmt, [fmt.begin("get_weather") + '{"city": "Li'])[1] == [("get_weather", '{"city": "Li')]


def test_detection_from_template_family_and_override():
    assert detect_format("{% if tools %}<tool_call>{% endif %}") is HERMES
    assert detect_format("{{ '[AVAILABLE_TOOLS]' }}[TOOL_CALLS]") is MISTRAL
    assert detect_format("<|start_header_id|>ipython<|end_header_id|><|python_tag|>") is LLAMA3
    assert detect_format('<|start_header_id|>... "parameters": dictionary') is LLAMA3
    assert detect_format("{{ messages }}", "Qwen2ForCausalLM") is HERMES
    assert detect_format("{{ messages }}", "MistralForCausalLM") is MISTRAL
    assert detect_format("{{ messages }}", "LlamaForCausalLM") is HERMES  # SmolLM2: formcast's own prompt
    assert detect_format("<tool_call>", None, override="llama3") is LLAMA3
    assert get_format("qwen") is HERMES and set(FORMATS) >= {"hermes", "qwen", "llama3", "mistral", "json"}
    with pytest.raises(ValueError, match="tool_call_parser"):
        EngineArgs.from_options(tool_call_parser="bogus")


def test_prompt_describes_and_renders_the_family_syntax():
    history = [{"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]}]
    rendered, _ = prompt_messages(history, TOOLS, template_renders_tools=False, fmt=MISTRAL)
    assert "[TOOL_CALLS]" in rendered[0]["content"] and rendered[1]["content"] == MISTRAL.render("get_time", "{}")


@pytest.mark.parametrize("fmt", [LLAMA3, MISTRAL, JSON], ids=lambda f: f.name)
def test_auto_tag_of_each_family_compiles_and_validates_arguments(fmt, smollm2_vocab, smollm2_tokenizer):
    from engine.constrained.grammar_backend import GrammarBackend
    from engine.sampling_params import SamplingParams
    from grammar import GrammarMatcher

    backend = GrammarBackend(smollm2_vocab)
    try:
        compiled = backend.compile(SamplingParams(structural_tag=auto_structural_tag(TOOLS, fmt)))
    finally:
        backend.shutdown()

    def accepts(text: str) -> bool:
        matcher = GrammarMatcher(compiled)
        return all(matcher.accept_token(t) for t in smollm2_tokenizer(text, add_special_tokens=False)["input_ids"])

    assert accepts("Sure. " + fmt.render("get_weather", json.dumps({"city": "Rome"})))
    assert not accepts("Sure. " + fmt.render("get_weather", json.dumps({"town": "Rome"})))
    assert not accepts("Sure. " + fmt.begin("no_such_tool"))


@pytest.fixture(scope="module")
def marker_tokenizer(smollm2_tokenizer):
    """SmolLM2's tokenizer with Mistral's and Llama 3's markers added as special tokens, as their
    own tokenizers have them."""
    import copy

    tokenizer = copy.deepcopy(smollm2_tokenizer)
    tokenizer.add_special_tokens({"additional_special_tokens": ["[TOOL_CALLS]", "<|python_tag|>"]})
    return tokenizer


@pytest.mark.parametrize("fmt", [MISTRAL, LLAMA3], ids=lambda f: f.name)
def test_markers_that_are_special_tokens_reach_the_grammar_and_the_parser(fmt, marker_tokenizer, tmp_path):
    from engine.constrained.grammar_backend import GrammarBackend
    from engine.entrypoints.tool_formats import marker_token_texts
    from engine.managers.detokenizer import IncrementalDetokenizer, TokenTexts
    from engine.sampling_params import SamplingParams
    from grammar import GrammarMatcher
    from grammar.vocab import TokenVocabulary

    marker = "[TOOL_CALLS]" if fmt is MISTRAL else "<|python_tag|>"
    marker_id = marker_tokenizer.convert_tokens_to_ids(marker)
    plain = TokenVocabulary.from_tokenizer(marker_tokenizer, cache_dir=tmp_path)
    assert marker_id in plain.special_token_ids and plain.token_bytes[marker_id] == b""
    vocab = plain.with_text_tokens(marker_token_texts(fmt, marker_tokenizer, plain.special_token_ids))
    assert vocab.token_bytes[marker_id] == marker.encode() and marker_id not in vocab.special_token_ids
    assert vocab.eos_token_ids == plain.eos_token_ids and vocab.fingerprint != plain.fingerprint

    # What the model writes: the marker as its one control token, then the call as text.
    call = ("" if fmt.trigger == marker else marker) + fmt.render("get_weather", json.dumps({"city": "Rome"}))
    ids = marker_tokenizer("Sure. " + call, add_special_tokens=False)["input_ids"]
    assert marker_id in ids
    for texts, seen in ((TokenTexts(plain, marker_tokenizer), False), (TokenTexts(vocab, marker_tokenizer), True)):
        detok = IncrementalDetokenizer(texts)  # skip_special_tokens=True, the default
        text = "".join(detok.feed([i]) for i in ids) + detok.feed([], finished_reason=object())
        assert (marker in text) is seen
        if seen:
            assert _read(fmt, [text]) == ("Sure.", [("get_weather", '{"city": "Rome"}')])

    # The structural tag's trigger matches the model's own marker token.
    backend = GrammarBackend(vocab)
    try:
        compiled = backend.compile(SamplingParams(structural_tag=auto_structural_tag(TOOLS, fmt)))
    finally:
        backend.shutdown()
    matcher = GrammarMatcher(compiled)
    assert all(matcher.accept_token(t) for t in ids)
