"""The OpenAI API's request and response bodies, as pydantic models.

Requests refuse unknown fields (``extra="forbid"``): a misspelt parameter is a 400 naming it, not
a silently ignored knob. Types are checked here; ranges are checked once, by
``SamplingParams.verify`` (through ``to_sampling_params``), except the few bounds that belong to
the API itself (``logprobs`` <= 5 on completions, ``top_logprobs`` <= 20, ``n`` <= 128).

Besides OpenAI's fields, both endpoints take SGLang's and vLLM's sampling extensions (``top_k``,
``min_p``, ``repetition_penalty``, ``min_tokens``, ``stop_token_ids``, ``ignore_eos``, ...) and
constraints (``regex``, ``ebnf``, ``json_schema``, ``structural_tag``); the ``openai`` client sends
them through ``extra_body``, which merges them into the top level of the body.

Responses send ``null`` where OpenAI does (``finish_reason`` mid-stream, ``logprobs`` not asked
for, ``content`` of a message that only calls tools); the "sparse" models (stream deltas, usage,
an assistant message's ``tool_calls``) leave out what is None, as OpenAI's stream does.
"""

from __future__ import annotations

import time
from typing import Any, ClassVar, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, model_serializer, model_validator


def lone_surrogate(value: Any, path: str) -> str | None:
    """The path of the first string holding a lone surrogate (JSON's ``"\\ud800"`` decodes to
    one; it cannot be encoded as UTF-8, so no tokenizer or response could carry it), or None."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path
        return None
    if isinstance(value, dict):
        for key in value:
            if isinstance(key, str) and lone_surrogate(key, path) is not None:
                return f"{path}.<key>" if path else "<key>"
        items = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        where = lone_surrogate(item, f"{path}.{key}" if path else str(key))
        if where is not None:
            return where
    return None


def reject_lone_surrogates(data: Any) -> Any:
    """A request body's ``model_validator``: a lone surrogate anywhere is a 400 naming where."""
    where = lone_surrogate(data, "")
    if where is not None:
        raise ValueError(f"{where or 'body'}: contains a lone UTF-16 surrogate (\\ud800-\\udfff), which is not text")
    return data


class StrictRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class _Response(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True)


class _Sparse(_Response):
    """Serialized without its None fields, except those named in ``keep_null``."""

    keep_null: ClassVar[frozenset[str]] = frozenset()

    @model_serializer(mode="wrap")
    def _drop_none(self, handler: Any) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if v is not None or k in self.keep_null}


# ---------------------------------------------------------------------------------- requests


class StreamOptions(StrictRequest):
    include_usage: bool = False
    # vLLM's: every chunk carries the usage so far (not only the last one).
    continuous_usage_stats: bool = False


class FunctionDefinition(StrictRequest):
    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(StrictRequest):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class FunctionName(StrictRequest):
    name: str


class NamedToolChoice(StrictRequest):
    type: Literal["function"] = "function"
    function: FunctionName


class JsonSchemaFormat(StrictRequest):
    name: str = "response"
    description: str | None = None
    schema_: dict[str, Any] | bool | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(StrictRequest):
    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: JsonSchemaFormat | None = None
    # SGLang's structural tag (``type: "structural_tag"``): free text with schema-checked tags.
    structures: list[dict[str, Any]] | None = None
    triggers: list[str] | None = None


class FunctionCall(StrictRequest):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(StrictRequest):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ContentPart(BaseModel):
    """One part of a message's content; only ``text`` parts, with their ``text``, are supported
    (checked when the prompt is built, so the error names the part's type or the missing text)."""

    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class ChatMessage(StrictRequest):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # assistant turns that called tools
    tool_call_id: str | None = None  # tool turns: which call this answers
    refusal: str | None = None
    # An assistant turn's reasoning (vLLM / DeepSeek clients send it back); templates that
    # render reasoning (Qwen3) get it, others ignore it.
    reasoning_content: str | None = None


class _SamplingExtensions(StrictRequest):
    """SGLang / vLLM extensions shared by both endpoints (sent through ``extra_body``)."""

    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool | None = None
    skip_special_tokens: bool | None = None
    no_stop_trim: bool | None = None  # keep the matched stop string in the output
    return_hidden_states: bool | None = None  # the last layer's state per output token
    regex: str | None = None
    ebnf: str | None = None
    choice: list[str] | None = None  # the output is exactly one of these strings
    stop_regex: str | list[str] | None = None  # stop when the output's tail matches one
    json_schema: dict[str, Any] | str | bool | None = None
    # The draft of a schema without $schema (default: 2020-12 read with the older spellings) and
    # whether ``format`` is asserted ("assert", the default) or an annotation ("annotate").
    json_schema_draft: str | None = None
    json_schema_formats: str | None = None
    json_property_order: str | None = None  # "declared" (default) or "any"
    json_whitespace: str | None = None  # "any" (default), "compact" or "pretty" (indent 2)
    structural_tag: dict[str, Any] | str | None = None
    return_routed_experts: bool | None = None  # MoE models: the experts chosen per output token
    return_routed_expert_weights: bool | None = None
    grammar_compile_timeout: float | None = None  # seconds, at most the server's own budget


class _CommonRequest(_SamplingExtensions):
    model: str | None = None  # None: the served model
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, float] | None = None  # token id -> bias, applied before the grammar mask
    max_tokens: int | None = None
    n: int = Field(default=1, ge=1, le=128)
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = None
    top_p: float | None = None
    user: str | None = None  # an end-user id, written to the server's log with the request id
    # OpenAI's stored-completions fields: nothing is stored here; both go to the server's log
    # (metadata: at most 16 string pairs, as OpenAI).
    store: bool | None = None
    metadata: dict[str, str] | None = Field(default=None, max_length=16)
    response_format: ResponseFormat | None = None

    @model_validator(mode="before")
    @classmethod
    def _no_lone_surrogates(cls, data: Any) -> Any:
        return reject_lone_surrogates(data)


class ChatCompletionRequest(_CommonRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    # Keyword arguments for the chat template (e.g. {"enable_thinking": false} for Qwen3).
    chat_template_kwargs: dict[str, Any] | None = None
    # OpenAI's reasoning budget; passed to the chat template as ``reasoning_effort`` (templates
    # of reasoning models read it) and, on a server with a reasoning parser, mapped to a
    # max_reasoning_tokens when that is not given (REASONING_EFFORT_TOKENS).
    reasoning_effort: Literal["minimal", "low", "medium", "high"] | None = None
    # Thinking tokens before the engine closes the reasoning itself (SamplingParams').
    max_reasoning_tokens: int | None = Field(default=None, ge=0)
    # The last message is an assistant prefix to continue (no new turn is opened).
    continue_final_message: bool = False


class CompletionRequest(_CommonRequest):
    # Text, texts, token ids, or lists of token ids (one completion per prompt, times n).
    prompt: Union[str, list[str], list[int], list[list[int]]]
    max_tokens: int | None = 16  # OpenAI's default for completions
    echo: bool = False
    logprobs: int | None = Field(default=None, ge=0, le=5)
    best_of: int | None = None  # accepted only when it equals n (no server-side ranking)
    suffix: str | None = None  # refused when set (no fill-in-the-middle)


# ---------------------------------------------------------------------------------- responses


class PromptTokensDetails(_Sparse):
    cached_tokens: int = 0


class Usage(_Sparse):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails | None = None


class TopLogprob(_Sparse):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(_Sparse):
    token: str
    logprob: float
    bytes: list[int] | None = None
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChoiceLogprobs(_Response):
    content: list[TokenLogprob] | None = None


class FunctionCallOut(_Response):
    name: str
    arguments: str


class ToolCallOut(_Response):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallOut


class AssistantMessage(_Sparse):
    keep_null = frozenset({"content"})
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    reasoning_content: str | None = None  # with a reasoning end tag configured (constrained/reasoning.py)
    tool_calls: list[ToolCallOut] | None = None


class ChatChoice(_Sparse):
    keep_null = frozenset({"logprobs", "finish_reason"})
    index: int
    message: AssistantMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str | None = None
    # With return_hidden_states (SGLang's extension): the last layer's state per output token.
    hidden_states: list[list[float]] | None = None
    # With return_routed_experts (MoE models): per output token, per MoE layer, the top-k expert
    # ids, best first; return_routed_expert_weights adds their routing weights in the same shape.
    routed_experts: list[list[list[int]]] | None = None
    routed_expert_weights: list[list[list[float]]] | None = None


class ChatCompletionResponse(_Response):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: Usage


class FunctionCallDelta(_Sparse):
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(_Sparse):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionCallDelta


class DeltaMessage(_Sparse):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChatChunkChoice(_Sparse):
    keep_null = frozenset({"logprobs", "finish_reason"})
    index: int
    delta: DeltaMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str | None = None
    routed_experts: list[list[list[int]]] | None = None  # as ChatChoice's, for this chunk's tokens
    routed_expert_weights: list[list[list[float]]] | None = None


class ChatCompletionChunk(_Sparse):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class CompletionLogprobs(_Response):
    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class CompletionChoice(_Sparse):
    keep_null = frozenset({"logprobs", "finish_reason"})
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    hidden_states: list[list[float]] | None = None  # as ChatChoice's
    routed_experts: list[list[list[int]]] | None = None  # as ChatChoice's (a chunk: its tokens')
    routed_expert_weights: list[list[list[float]]] | None = None


class CompletionResponse(_Sparse):
    """Both the whole response and each streamed chunk (OpenAI uses one shape for both)."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ModelCard(_Response):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "formcast"
    max_model_len: int | None = None


class ModelList(_Response):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorInfo(_Response):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(_Response):
    error: ErrorInfo
