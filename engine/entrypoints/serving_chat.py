"""``POST /v1/chat/completions``: messages through the model's chat template, constraints from
``response_format`` / ``tools`` + ``tool_choice`` / the extensions (all through
``to_sampling_params`` and ``tool_calls.constraint``), whole or streamed responses.

A streamed response is, per choice: a first chunk with ``role``, then content or tool-call deltas
(a call's first delta carries its id and name, later ones pieces of its arguments), then a chunk
with ``finish_reason``; after all choices, a usage chunk when ``stream_options.include_usage``
asks, and ``[DONE]``. A request the engine aborts mid-stream ends with an ``error`` event (the
``openai`` client raises it), then ``[DONE]``.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from jinja2 import TemplateError

from ..sampling_params import SamplingParams
from .openai_mapping import to_sampling_params
from .api_errors import APIError, bad_request, internal_error
from .openai_protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatMessage,
    ChoiceLogprobs,
    DeltaMessage,
    FunctionCallDelta,
    FunctionCallOut,
    TokenLogprob,
    ToolCallDelta,
    ToolCallOut,
    TopLogprob,
)
from ..constrained.reasoning import ReasoningSplitter, prompt_closes_reasoning
from .serving import Choice, EngineRun, EventStream, OpenAIServing, clamp_logprob, openai_finish_reason, routed_fields, usage_of, wants_usage
from .tool_formats import HERMES, ToolCallFormat
from .tool_calls import (
    CollectedMessage,
    ParsedArguments,
    ParsedCallStart,
    ParsedContent,
    ParsedEvent,
    ToolCallParser,
    ToolMode,
    auto_structural_tag,
    make_parser,
    prompt_messages,
    tool_mode,
)

log = logging.getLogger("formcast.server")

# reasoning_effort -> max_reasoning_tokens, when a request gives no budget of its own.
REASONING_EFFORT_TOKENS = {"minimal": 32, "low": 256, "medium": 1024, "high": 4096}


@dataclass
class PreparedChat:
    """A checked request: its sampling parameters, prompt ids and tool-calling mode."""

    request: ChatCompletionRequest
    params: SamplingParams
    prompt_ids: list[int]
    mode: ToolMode
    tools: list[dict] | None
    tool_choice: Any
    stop_after_first_call: bool  # auto + parallel_tool_calls=false: the request stops at the format's close
    reasoning_end: str | None = None  # the engine's reasoning end tag (reasoning_content is split off)
    reasoning_closed: bool = False  # the prompt already closed the reasoning block
    fmt: ToolCallFormat = HERMES  # the model's tool-call syntax
    max_calls: int | None = None  # parallel_tool_calls=false: calls after the first are dropped

    def parser(self) -> ToolCallParser:
        return make_parser(self.mode, self.tools, self.tool_choice, self.fmt, self.max_calls)

    def splitter(self) -> ReasoningSplitter | None:
        return ReasoningSplitter(self.reasoning_end, done=self.reasoning_closed) if self.reasoning_end else None


class OpenAIServingChat(OpenAIServing):
    endpoint = "chat"

    async def create(self, request: ChatCompletionRequest, arrival: float) -> ChatCompletionResponse | EventStream:
        """The whole response, or (``stream``) its SSE events."""
        # Templating and tokenizing a large request take long: off the event loop, so they never
        # stall other clients' streams (or /health).
        prep = await asyncio.to_thread(self.prepare, request)
        return await self.respond(prep, [prep.prompt_ids], request.stream, arrival)

    # ------------------------------------------------------------------ request -> prompt + params
    def prepare(self, request: ChatCompletionRequest) -> PreparedChat:
        self.check_model(request.model)
        self.check_capacity()
        self.check_common(request)
        body = request.model_dump(by_alias=True, exclude_unset=True)
        tools = body.get("tools") or None
        mode = tool_mode(tools, body.get("tool_choice"))
        params = to_sampling_params(body)
        stop_after_first_call = False
        fmt = self.engine.tool_call_format
        if mode == "auto":
            if params.grammar is not None:
                raise bad_request(
                    f"tools: tool_choice 'auto' cannot be combined with a {params.grammar[0]} constraint "
                    "(use tool_choice 'required' or a named function, or drop the constraint)",
                    param="tool_choice",
                )
            params.structural_tag = auto_structural_tag(tools, fmt)
            if not request.parallel_tool_calls and fmt.close is not None:
                params.stop = [*(params.stop or []), fmt.close]
                stop_after_first_call = True
        prompt_ids = self._prompt_ids(request, tools if mode != "none" else None, fmt)
        self.check_context(len(prompt_ids), params, "messages")
        end = self.engine.args.reasoning_end
        if end is not None and params.max_reasoning_tokens is None and request.reasoning_effort is not None:
            params.max_reasoning_tokens = REASONING_EFFORT_TOKENS[request.reasoning_effort]
        closed = end is not None and prompt_closes_reasoning(self.engine.texts.text(prompt_ids[-64:], skip_special_tokens=False), end)
        max_calls = None if request.parallel_tool_calls else 1
        return PreparedChat(request, params, prompt_ids, mode, tools, body.get("tool_choice"), stop_after_first_call, end, closed, fmt, max_calls)

    def _prompt_ids(self, request: ChatCompletionRequest, tools: list[dict] | None, fmt: ToolCallFormat) -> list[int]:
        plain = [_message_dict(m, i) for i, m in enumerate(request.messages)]
        template = getattr(self.engine.tokenizer, "chat_template", None) or ""
        rendered, template_tools = prompt_messages(plain, tools, template_renders_tools="tools" in template, fmt=fmt)
        template_kwargs = dict(request.chat_template_kwargs or {})
        if request.reasoning_effort is not None:
            template_kwargs.setdefault("reasoning_effort", request.reasoning_effort)
        try:
            return self.engine.apply_chat_template(
                rendered, tools=template_tools, continue_final_message=request.continue_final_message, **template_kwargs
            )
        except TemplateError as exc:
            raise bad_request(f"messages: the chat template refused them: {exc}", param="messages") from None

    # ------------------------------------------------------------------ whole response
    async def complete(self, prep: PreparedChat, run: EngineRun) -> ChatCompletionResponse:
        parsers = {c.index: prep.parser() for c in run.choices}
        splitters = {c.index: prep.splitter() for c in run.choices}
        reasoning: dict[int, list[str]] = {c.index: [] for c in run.choices}
        thinking = {c.index: False for c in run.choices}
        messages = {c.index: CollectedMessage() for c in run.choices}
        logprobs: dict[int, list[TokenLogprob]] = {c.index: [] for c in run.choices}
        async with aclosing(run.chunks()) as chunks:
            async for choice, chunk in chunks:
                finish = chunk["meta_info"]["finish_reason"]
                if finish is not None and finish["type"] == "abort":
                    raise self.abort_error(finish)
                thought, events = self._parse(prep, parsers[choice.index], splitters[choice.index], chunk)
                reasoning[choice.index].append(thought)
                if finish is not None:
                    thinking[choice.index] = _still_thinking(splitters[choice.index])
                messages[choice.index].add(events)
                logprobs[choice.index] += self._logprobs(prep.params, chunk)
        out = []
        for c in run.choices:
            msg = messages[c.index]
            calls = [ToolCallOut(id=k["id"], function=FunctionCallOut(name=k["name"], arguments=k["arguments"])) for k in msg.calls]
            thought = "".join(reasoning[c.index]) if prep.reasoning_end else None
            message = AssistantMessage(content=msg.text, tool_calls=calls or None, reasoning_content=thought)
            lp = ChoiceLogprobs(content=logprobs[c.index]) if prep.params.logprobs else None
            hidden = c.hidden_states if prep.params.return_hidden_states else None
            routed = routed_fields(prep.params, c.routed_experts, c.routed_expert_weights)
            out.append(ChatChoice(index=c.index, message=message, logprobs=lp, finish_reason=_finish_reason(c, prep.mode, bool(calls), thinking[c.index]), hidden_states=hidden, **routed))
        return ChatCompletionResponse(id=_response_id(), model=self.config.model_name, choices=out, usage=usage_of(run.choices))

    # ------------------------------------------------------------------ streamed response
    async def stream(self, prep: PreparedChat, run: EngineRun) -> AsyncIterator[str]:
        response_id, created = _response_id(), int(time.time())
        parsers = {c.index: prep.parser() for c in run.choices}
        splitters = {c.index: prep.splitter() for c in run.choices}
        calls_made = {c.index: False for c in run.choices}

        continuous = prep.request.stream_options is not None and prep.request.stream_options.continuous_usage_stats

        def chunk(index: int, delta: DeltaMessage, **fields: Any) -> str:
            choice = ChatChunkChoice(index=index, delta=delta, **fields)
            usage = usage_of(run.choices) if continuous else None
            return ChatCompletionChunk(id=response_id, created=created, model=self.config.model_name, choices=[choice], usage=usage).to_json()

        def usage_chunk() -> str:
            return ChatCompletionChunk(id=response_id, created=created, model=self.config.model_name, choices=[], usage=usage_of(run.choices)).to_json()

        try:
            for c in run.choices:
                yield chunk(c.index, DeltaMessage(role="assistant", content=""))
            async with aclosing(run.chunks()) as chunks:
                async for choice, engine_chunk in chunks:
                    finish = engine_chunk["meta_info"]["finish_reason"]
                    if finish is not None and finish["type"] == "abort":
                        raise self.abort_error(finish)
                    thought, events = self._parse(prep, parsers[choice.index], splitters[choice.index], engine_chunk)
                    if thought:
                        yield chunk(choice.index, DeltaMessage(reasoning_content=thought))
                    calls_made[choice.index] |= any(isinstance(e, ParsedCallStart) for e in events)
                    deltas = _deltas(events)
                    token_logprobs = self._logprobs(prep.params, engine_chunk)
                    meta = engine_chunk["meta_info"]
                    routed = routed_fields(prep.params, meta.get("routed_experts"), meta.get("routed_expert_weights"))
                    if (token_logprobs or routed.get("routed_experts")) and not deltas:
                        deltas = [DeltaMessage()]  # logprobs / experts of held-back text still go out now
                    for k, delta in enumerate(deltas):
                        lp = ChoiceLogprobs(content=token_logprobs) if k == 0 and prep.params.logprobs else None
                        yield chunk(choice.index, delta, logprobs=lp, **(routed if k == 0 else {}))
                    if finish is not None:
                        reason = _finish_reason(choice, prep.mode, calls_made[choice.index], _still_thinking(splitters[choice.index]))
                        yield chunk(choice.index, DeltaMessage(), finish_reason=reason)
            if wants_usage(prep.request):
                yield usage_chunk()
        except APIError as exc:
            # Aborted mid-stream (shutdown, ...): the tokens generated so far are still billed.
            if wants_usage(prep.request):
                yield usage_chunk()
            yield exc.body().to_json()
        except Exception as exc:  # noqa: BLE001 - the stream has started: report in-band
            log.exception("chat stream failed")
            yield internal_error(f"internal error: {exc!r}").body().to_json()
        finally:
            run.close()
        yield "[DONE]"

    # ------------------------------------------------------------------ pieces
    @staticmethod
    def _parse(prep: PreparedChat, parser: ToolCallParser, splitter: ReasoningSplitter | None, chunk: dict) -> tuple[str, list[ParsedEvent]]:
        """(reasoning text, answer events) of one engine chunk."""
        thought, text = splitter.feed(chunk["text"]) if splitter is not None else ("", chunk["text"])
        finish = chunk["meta_info"]["finish_reason"]
        if finish is not None and splitter is not None:
            more_thought, more_text = splitter.finish()
            thought, text = thought + more_thought, text + more_text
        events = parser.feed(text)
        if finish is not None:
            close = prep.fmt.close
            if prep.stop_after_first_call and close is not None and finish.get("matched") == close:
                events += parser.feed(close)  # the stop string was cut from the text
            events += parser.finish()
        return thought, events

    def _logprobs(self, params: SamplingParams, chunk: dict) -> list[TokenLogprob]:
        meta = chunk["meta_info"]
        tokens = meta.get("output_token_logprobs")
        if not params.logprobs or not tokens:
            return []
        tops = meta.get("output_top_logprobs") or [[] for _ in tokens]
        table = self.engine.vocab.token_bytes
        out = []
        for (lp, tid, text), top in zip(tokens, tops):
            alternatives = [TopLogprob(token=t, logprob=clamp_logprob(v), bytes=_bytes(table, i, t)) for v, i, t in top[: params.top_logprobs_num]]
            out.append(TokenLogprob(token=text, logprob=clamp_logprob(lp), bytes=_bytes(table, tid, text), top_logprobs=alternatives))
        return out


def _message_dict(message: ChatMessage, position: int) -> dict[str, Any]:
    content = message.content
    if isinstance(content, list):
        texts = []
        for k, part in enumerate(content):
            where = f"messages[{position}].content[{k}]"
            if part.type != "text":
                raise bad_request(f"{where}: part type {part.type!r} is not supported (text only)", param=where)
            if not isinstance(part.text, str):
                raise bad_request(f"{where}.text: required (a string) for a part of type 'text'", param=f"{where}.text")
            texts.append(part.text)
        content = "\n".join(texts)
    if message.role == "tool" and not message.tool_call_id:
        raise bad_request(f"messages[{position}].tool_call_id: required for a tool message", param=f"messages[{position}].tool_call_id")
    calls = [c.model_dump() for c in message.tool_calls] if message.tool_calls else None
    out = {
        "role": "system" if message.role == "developer" else message.role,
        "content": content,
        "name": message.name,
        "tool_calls": calls,
        "tool_call_id": message.tool_call_id,
    }
    if message.reasoning_content is not None:
        out["reasoning_content"] = message.reasoning_content
    return out


def _deltas(events: list[ParsedEvent]) -> list[DeltaMessage]:
    """Parser events -> stream deltas (consecutive content, or arguments of one call, merged)."""
    out: list[DeltaMessage] = []
    for e in events:
        last = out[-1] if out else None
        if isinstance(e, ParsedContent):
            if last is not None and last.content is not None:
                last.content += e.text
            else:
                out.append(DeltaMessage(content=e.text))
        elif isinstance(e, ParsedCallStart):
            start = ToolCallDelta(index=e.index, id=e.id, type="function", function=FunctionCallDelta(name=e.name, arguments=""))
            out.append(DeltaMessage(tool_calls=[start]))
        elif isinstance(e, ParsedArguments):
            if last is not None and last.tool_calls and last.tool_calls[0].index == e.index:
                fn = last.tool_calls[0].function
                fn.arguments = (fn.arguments or "") + e.text
            else:
                out.append(DeltaMessage(tool_calls=[ToolCallDelta(index=e.index, function=FunctionCallDelta(arguments=e.text))]))
    return out


def _finish_reason(choice: Choice, mode: ToolMode, called: bool, thinking: bool = False) -> str:
    """OpenAI's: ``tool_calls`` when ``auto`` or ``required`` produced calls; a named function
    ends with ``stop`` (as OpenAI answers it), a cut output with ``length``. An output that ended
    inside the reasoning (no answer at all) says so: ``reasoning_length`` when max_tokens ran out
    there, ``reasoning_stop`` when the model ended (EOS, a stop) before closing it."""
    assert choice.finish is not None
    reason = openai_finish_reason(choice.finish)
    if thinking and reason in ("stop", "length"):
        return "reasoning_" + reason
    return "tool_calls" if reason == "stop" and called and mode in ("auto", "required") else reason


def _still_thinking(splitter: ReasoningSplitter | None) -> bool:
    """The output ended before the reasoning did (called once the splitter has finished)."""
    return splitter is not None and not splitter.done



def _bytes(table: tuple[bytes, ...], token_id: int, text: str) -> list[int]:
    raw = table[token_id] if 0 <= token_id < len(table) else b""
    return list(raw or text.encode("utf-8"))


def _response_id() -> str:
    return "chatcmpl-" + uuid.uuid4().hex

