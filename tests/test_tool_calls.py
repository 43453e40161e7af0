"""Tool calling without the model: the prompt rendering, the ``auto`` structural tag (compiled by
the real grammar backend on SmolLM2's vocabulary), and the parsers that read calls back, fed
whole or in every possible split, which must agree."""

from __future__ import annotations

import json

import pytest

from engine.entrypoints.tool_calls import (
    CALL_CLOSE,
    CALL_OPEN,
    CollectedMessage,
    ParsedCallStart,
    ParsedContent,
    auto_structural_tag,
    make_parser,
    prompt_messages,
    render_call,
    tool_mode,
)

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"], "additionalProperties": False}}}  # fmt: skip
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}}}}
TOOLS = [WEATHER, TIME]


def _collect(mode: str, chunks: list[str], tool_choice=None, tools=TOOLS) -> CollectedMessage:
    parser = make_parser(mode, tools, tool_choice)  # type: ignore[arg-type]
    out = CollectedMessage()
    for c in chunks:
        out.add(parser.feed(c))
    out.add(parser.finish())
    return out


def _shape(msg: CollectedMessage) -> tuple:
    return msg.text, [(c["name"], c["arguments"]) for c in msg.calls]


def _splits(text: str) -> list[list[str]]:
    """The whole text, one character at a time, and every two-piece split."""
    return [[text], list(text)] + [[text[:i], text[i:]] for i in range(1, len(text))]


def test_tool_mode():
    assert tool_mode(None, None) == "none" and tool_mode(TOOLS, "none") == "none"
    assert tool_mode(TOOLS, None) == "auto" and tool_mode(TOOLS, "auto") == "auto"
    assert tool_mode(TOOLS, "required") == "required"
    assert tool_mode(TOOLS, {"type": "function", "function": {"name": "get_time"}}) == "named"


@pytest.mark.parametrize(
    "text,expected",
    [
        ("Just text, no call.", ("Just text, no call.", [])),
        ("Text ending in a newline\n", ("Text ending in a newline\n", [])),
        ("a < b and <tool is not a call", ("a < b and <tool is not a call", [])),
        (render_call("get_weather", '{"city": "Paris"}'), (None, [("get_weather", '{"city": "Paris"}')])),
        (
            "Let me check.\n" + render_call("get_weather", '{"city": "Oslo"}') + "\n" + render_call("get_time", "{}") + "\n",
            ("Let me check.", [("get_weather", '{"city": "Oslo"}'), ("get_time", "{}")]),
        ),
        # A trigger not followed by a known tool's begin (only possible unconstrained) stays text.
        (CALL_OPEN + "\n{\"name\": \"rm_rf\"}", (CALL_OPEN + "\n{\"name\": \"rm_rf\"}", [])),
        # Cut inside a call (length): the call is reported with what arrived.
        (render_call("get_weather", '{"city": "Li')[: -len("}\n" + CALL_CLOSE)], (None, [("get_weather", '{"city": "Li')])),
    ],
)
def test_auto_parser_whole_and_streamed_agree(text, expected):
    for chunks in _splits(text):
        assert _shape(_collect("auto", chunks)) == expected, chunks


def test_auto_parser_streams_arguments_before_the_call_ends():
    parser = make_parser("auto", TOOLS, None)
    events = parser.feed(render_call("get_weather", '{"city": "Par')[: -len("}\n" + CALL_CLOSE)])
    assert isinstance(events[0], ParsedCallStart) and events[0].name == "get_weather" and events[0].id.startswith("call_")
    assert "".join(e.text for e in events[1:]) == '{"city": "Par'


def test_auto_parser_holds_back_a_possible_trigger():
    parser = make_parser("auto", TOOLS, None)
    assert parser.feed("Hello <tool") == [ParsedContent("Hello")]  # " " waits: it may end the text
    assert parser.feed("kit>") == [ParsedContent(" <toolkit>")]


@pytest.mark.parametrize(
    "text,expected",
    [
        ('[{"name": "get_weather", "arguments": {"city": "Rome"}}]', [("get_weather", '{"city": "Rome"}')]),
        ('[{"name": "get_time", "arguments": {"zone": "a]}\\"{"}}, {"name": "get_weather", "arguments": {"city": "X"}}]',
         [("get_time", '{"zone": "a]}\\"{"}'), ("get_weather", '{"city": "X"}')]),
    ],
)  # fmt: skip
def test_required_parser(text, expected):
    for chunks in _splits(text):
        msg = _collect("required", chunks)
        assert msg.text is None and [(c["name"], json.loads(c["arguments"])) for c in msg.calls] == [(n, json.loads(a)) for n, a in expected]


def test_required_parser_returns_unparsable_text_as_content():
    msg = _collect("required", ['[{"name": "get_weather", "argu'])
    assert msg.calls == [] and msg.text == '[{"name": "get_weather", "argu'


def test_named_parser_streams_the_arguments():
    choice = {"type": "function", "function": {"name": "get_time"}}
    for chunks in _splits('{"zone": "UTC"}'):
        msg = _collect("named", chunks, tool_choice=choice)
        assert _shape(msg) == (None, [("get_time", '{"zone": "UTC"}')])
    assert _shape(_collect("named", [], tool_choice=choice)) == (None, [("get_time", "")])


def test_prompt_messages_without_template_support():
    history = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Rome?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]},
        {"role": "tool", "content": '{"temp": 20}', "tool_call_id": "call_1"},
    ]
    rendered, template_tools = prompt_messages(history, TOOLS, template_renders_tools=False)
    assert template_tools is None
    assert rendered[0]["role"] == "system" and "<tools>" in rendered[0]["content"] and rendered[0]["content"].endswith("Be brief.")
    assert '"name": "get_weather"' in rendered[0]["content"]
    assert rendered[2] == {"role": "assistant", "content": render_call("get_weather", '{"city": "Rome"}')}
    assert rendered[3] == {"role": "tool", "content": '{"temp": 20}'}
    plain, _ = prompt_messages(history[1:2], None, template_renders_tools=False)
    assert plain == [{"role": "user", "content": "Weather in Rome?"}]


def test_prompt_messages_for_a_template_that_renders_tools():
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}
    rendered, template_tools = prompt_messages([{"role": "assistant", "content": None, "tool_calls": [call]}], TOOLS, template_renders_tools=True)
    assert template_tools == TOOLS
    assert rendered[0]["tool_calls"][0]["function"]["arguments"] == {"city": "Rome"} and rendered[0]["content"] == ""


def test_auto_tag_compiles_and_accepts_a_call(smollm2_vocab, smollm2_tokenizer):
    from engine.constrained.grammar_backend import GrammarBackend
    from engine.sampling_params import SamplingParams
    from grammar import GrammarMatcher

    backend = GrammarBackend(smollm2_vocab)
    try:
        compiled = backend.compile(SamplingParams(structural_tag=auto_structural_tag(TOOLS)))
    finally:
        backend.shutdown()
    good = "Sure.\n" + render_call("get_weather", '{"city": "Rome"}')
    bad = "Sure.\n" + render_call("get_weather", '{"town": "Rome"}')  # additionalProperties: false

    def accepts(text: str) -> bool:
        matcher = GrammarMatcher(compiled)
        return all(matcher.accept_token(t) for t in smollm2_tokenizer(text, add_special_tokens=False)["input_ids"])

    assert accepts(good) and not accepts(bad)
