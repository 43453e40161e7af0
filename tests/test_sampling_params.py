"""SamplingParams validation/normalization and the OpenAI request mapping."""

from __future__ import annotations

import dataclasses
import math

import pytest

from engine.entrypoints.openai_mapping import to_sampling_params
from engine.sampling_params import InvalidSamplingParams, SamplingParams


def test_defaults_verify_and_are_not_greedy() -> None:
    p = SamplingParams().normalize()
    p.verify(vocab_size=100)
    assert not p.is_greedy and p.grammar is None
    assert p.stop == [] and p.stop_token_ids == [] and p.top_k == -1


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": math.nan}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.01}, "top_p"),
        ({"top_k": 0}, "top_k"),
        ({"top_k": -5}, "top_k"),
        ({"top_k": 2.5}, "top_k"),
        ({"min_p": 1.5}, "min_p"),
        ({"min_p": -0.1}, "min_p"),
        ({"frequency_penalty": 2.5}, "frequency_penalty"),
        ({"presence_penalty": -2.5}, "presence_penalty"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"max_new_tokens": -1}, "max_new_tokens"),
        ({"min_new_tokens": -1}, "min_new_tokens"),
        ({"min_new_tokens": 10, "max_new_tokens": 5}, "min_new_tokens"),
        ({"n": 0}, "n"),
        ({"stop": ["ok", ""]}, "stop"),
        ({"stop_token_ids": [5, 100]}, "stop_token_ids"),
        ({"stop_token_ids": [-1]}, "stop_token_ids"),
        ({"regex": "a+", "json_schema": {"type": "object"}}, "regex"),
        ({"ebnf": "root ::= 'a'", "structural_tag": {}}, "structural_tag"),
        ({"regex": 5}, "regex"),
        ({"json_schema": 3}, "json_schema"),
        ({"top_logprobs_num": -1}, "top_logprobs_num"),
        ({"top_logprobs_num": 101}, "top_logprobs_num"),
        ({"logprobs_mode": "final"}, "logprobs_mode"),
        ({"sampling_seed": -1}, "sampling_seed"),
        ({"sampling_seed": 2**64}, "sampling_seed"),
        ({"json_schema": {"type": "object"}, "json_whitespace": "tabs"}, "json_whitespace"),
        ({"json_schema": {"type": "object"}, "json_whitespace": 2}, "json_whitespace"),
        ({"regex": "a+", "json_whitespace": "compact"}, "json_whitespace"),
        ({"json_whitespace": "pretty"}, "json_whitespace"),
    ],
)
def test_verify_names_the_bad_field(kwargs: dict, field: str) -> None:
    with pytest.raises(InvalidSamplingParams) as exc:
        SamplingParams(**kwargs).normalize().verify(vocab_size=100)
    assert exc.value.field == field
    assert str(exc.value).startswith(field)
    assert isinstance(exc.value, ValueError)


# What normalize() makes of the fields a request leaves unset (None -> [] / -1, no stop strings).
_NORMALIZED_DEFAULTS = {"stop": [], "stop_token_ids": [], "top_k": -1, "stop_str_max_len": 0}


@pytest.mark.parametrize(
    "kwargs,derived",
    [
        ({"temperature": 0.0}, {"is_greedy": True}),
        ({"top_p": 1.0, "top_k": 1, "min_p": 1.0}, {"is_greedy": True}),
        ({"frequency_penalty": -2.0, "presence_penalty": 2.0, "repetition_penalty": 1.3}, {}),
        ({"max_new_tokens": 0}, {}),
        ({"max_new_tokens": None, "min_new_tokens": 50}, {}),
        ({"stop_token_ids": [0, 99]}, {}),
        ({"json_schema": True}, {"grammar": ("json_schema", True)}),
        ({"structural_tag": '{"structures": []}'}, {"grammar": ("structural_tag", '{"structures": []}')}),
        ({"sampling_seed": 0}, {}),
        ({"json_schema": True, "json_whitespace": "compact"}, {"grammar": ("json_schema", True)}),
        ({"json_schema": {}, "json_whitespace": "pretty"}, {"grammar": ("json_schema", {})}),
    ],
)
def test_boundary_values_are_accepted(kwargs: dict, derived: dict) -> None:
    p = SamplingParams(**kwargs).normalize()
    p.verify(vocab_size=100)
    # The boundary values are kept exactly as given (no clamping, no coercion: 0.0 stays a float,
    # True stays a bool, None stays None).
    for name, value in kwargs.items():
        assert getattr(p, name) == value and type(getattr(p, name)) is type(value), name
    # Every other field holds its default, in the canonical form normalize() gives it.
    for f in dataclasses.fields(SamplingParams):
        if f.name not in kwargs:
            expected = _NORMALIZED_DEFAULTS.get(f.name, f.default)
            assert getattr(p, f.name) == expected, f.name
    # And the properties derived from them.
    expected = {"is_greedy": False, "grammar": None, **derived}
    assert {name: getattr(p, name) for name in expected} == expected


class _FakeTokenizer:
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        assert add_special_tokens is False
        return list(range(len(text.split())))


def test_normalize() -> None:
    p = SamplingParams(stop="END", top_k=None, top_logprobs_num=2, stop_token_ids=(3, 4)).normalize()
    assert p.stop == ["END"] and p.top_k == -1 and p.logprobs and p.stop_token_ids == [3, 4]
    p = SamplingParams(stop=["a b c", "d"]).normalize(tokenizer=_FakeTokenizer())
    assert p.stop_str_max_len == 3
    assert SamplingParams(temperature=0.0).is_greedy and SamplingParams(top_k=1).is_greedy
    assert SamplingParams(regex="x").grammar == ("regex", "x")


def test_openai_basic_fields() -> None:
    p = to_sampling_params(
        {
            "model": "m",
            "messages": [],
            "max_tokens": 10,
            "max_completion_tokens": 20,
            "temperature": 0.3,
            "top_p": 0.8,
            "n": 2,
            "stop": "###",
            "seed": 42,
            "frequency_penalty": 0.5,
            "presence_penalty": -0.5,
            "logprobs": True,
            "top_logprobs": 4,
        }
    )
    assert (p.max_new_tokens, p.temperature, p.top_p, p.n, p.stop) == (20, 0.3, 0.8, 2, ["###"])
    assert (p.sampling_seed, p.frequency_penalty, p.presence_penalty) == (42, 0.5, -0.5)
    assert p.logprobs and p.top_logprobs_num == 4 and p.grammar is None
    assert to_sampling_params({"max_tokens": 7}).max_new_tokens == 7
    assert to_sampling_params({}).max_new_tokens is None


def test_openai_completions_logprobs_int() -> None:
    p = to_sampling_params({"prompt": "x", "logprobs": 3})
    assert p.logprobs and p.top_logprobs_num == 3
    p = to_sampling_params({"prompt": "x", "logprobs": 0})
    assert p.logprobs and p.top_logprobs_num == 0


def test_openai_response_format() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    p = to_sampling_params({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}})
    assert p.json_schema == schema and p.json_schema_strict
    assert to_sampling_params({"response_format": {"type": "json_object"}}).json_schema == {"type": "object"}
    assert to_sampling_params({"response_format": {"type": "text"}}).grammar is None
    p = to_sampling_params({"response_format": {"type": "structural_tag", "structures": [], "triggers": ["<f"]}})
    assert p.structural_tag == {"structures": [], "triggers": ["<f"]}


def _tools() -> list[dict]:
    return [
        {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
        {"type": "function", "function": {"name": "noop"}},
    ]


def test_openai_tool_choice() -> None:
    assert to_sampling_params({"tools": _tools(), "tool_choice": "auto"}).grammar is None
    assert to_sampling_params({"tools": _tools(), "tool_choice": "none"}).grammar is None
    named = to_sampling_params({"tools": _tools(), "tool_choice": {"type": "function", "function": {"name": "get_weather"}}})
    assert named.json_schema == _tools()[0]["function"]["parameters"]
    required = to_sampling_params({"tools": _tools(), "tool_choice": "required"}).json_schema
    assert required["type"] == "array" and required["minItems"] == 1
    alternatives = required["items"]["anyOf"]
    assert [a["properties"]["name"] for a in alternatives] == [{"const": "get_weather"}, {"const": "noop"}]
    assert alternatives[1]["properties"]["arguments"] == {"type": "object"}
    assert "maxItems" not in required
    single = to_sampling_params({"tools": _tools(), "tool_choice": "required", "parallel_tool_calls": False}).json_schema
    assert single["minItems"] == 1 and single["maxItems"] == 1


@pytest.mark.parametrize(
    "request_body,field",
    [
        ({"tools": _tools(), "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": _tools(), "tool_choice": "sometimes"}, "tool_choice"),
        ({"tools": [{"type": "function"}], "tool_choice": "required"}, "tools"),
        ({"tools": _tools(), "tool_choice": "required", "regex": "a"}, "tool_choice"),
        ({"response_format": {"type": "json_object"}, "regex": "a"}, "response_format"),
        ({"response_format": {"type": "yaml"}}, "response_format.type"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format.json_schema"),
        ({"logprobs": False, "top_logprobs": 2}, "top_logprobs"),
        ({"temperature": -1}, "temperature"),
        ({"max_completion_tokens": -3}, "max_new_tokens"),
    ],
)
def test_openai_errors(request_body: dict, field: str) -> None:
    with pytest.raises(InvalidSamplingParams) as exc:
        to_sampling_params(request_body)
    assert exc.value.field == field
