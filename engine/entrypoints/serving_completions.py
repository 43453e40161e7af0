"""``POST /v1/completions``: raw prompts (text or token ids, one or many, each sampled ``n``
times), with the same constraints and sampling fields as chat (``to_sampling_params``).

Choices are numbered prompt-major (prompt i's k-th sample is choice ``i * n + k``), as OpenAI
does. ``echo`` puts the prompt's text before the completion (and, with ``logprobs``, the prompt
tokens' logprobs before the completion's; the first prompt token has none, and prompt tokens have
no top alternatives). ``text_offset`` counts characters from the start of the returned text.
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

from ..sampling_params import SamplingParams
from .openai_mapping import to_sampling_params
from .api_errors import APIError, bad_request, internal_error
from .openai_protocol import CompletionChoice, CompletionLogprobs, CompletionRequest, CompletionResponse
from .serving import EngineRun, EventStream, OpenAIServing, clamp_logprob, openai_finish_reason, routed_fields, usage_of, wants_usage

log = logging.getLogger("formcast.server")


@dataclass
class PreparedCompletion:
    request: CompletionRequest
    params: SamplingParams
    prompt_ids: list[list[int]]
    prompt_texts: list[str]  # for echo


class OpenAIServingCompletion(OpenAIServing):
    endpoint = "completions"

    async def create(self, request: CompletionRequest, arrival: float) -> CompletionResponse | EventStream:
        prep = await asyncio.to_thread(self.prepare, request)  # tokenizing: off the event loop
        return await self.respond(prep, prep.prompt_ids, request.stream, arrival)

    def prepare(self, request: CompletionRequest) -> PreparedCompletion:
        self.check_model(request.model)
        self.check_capacity()
        self.check_common(request)
        if request.suffix is not None:
            raise bad_request("suffix: not supported by this server (no fill-in-the-middle)", param="suffix")
        if request.best_of is not None and request.best_of != request.n:
            raise bad_request(f"best_of: only best_of == n is supported (no server-side ranking), got best_of={request.best_of}, n={request.n}", param="best_of")
        body = request.model_dump(by_alias=True, exclude_unset=True)
        body.setdefault("max_tokens", request.max_tokens)  # OpenAI's default of 16 applies when absent
        params = to_sampling_params(body)
        ids, texts = self._prompts(request.prompt)
        for one in ids:
            self.check_context(len(one), params, "prompt")
        return PreparedCompletion(request, params, ids, texts)

    def _prompts(self, prompt: str | list) -> tuple[list[list[int]], list[str]]:
        if isinstance(prompt, str):
            prompt = [prompt]
        if not prompt:
            raise bad_request("prompt: is empty", param="prompt")
        if isinstance(prompt[0], int):
            prompt = [prompt]
        ids, texts = [], []
        for i, item in enumerate(prompt):
            if isinstance(item, str):
                if not item:
                    raise bad_request(f"prompt[{i}]: is empty", param="prompt")
                ids.append(list(self.engine.tokenizer(item)["input_ids"]))
                texts.append(item)
            else:
                if not item:
                    raise bad_request(f"prompt[{i}]: is empty", param="prompt")
                ids.append(list(item))
                texts.append(self.engine.texts.text(list(item), skip_special_tokens=False))
        return ids, texts

    # ------------------------------------------------------------------ whole response
    async def complete(self, prep: PreparedCompletion, run: EngineRun) -> CompletionResponse:
        logprobs = {c.index: CompletionLogprobs() for c in run.choices}
        offsets = {c.index: 0 for c in run.choices}
        async with aclosing(run.chunks()) as chunks:
            async for choice, chunk in chunks:
                finish = chunk["meta_info"]["finish_reason"]
                if finish is not None and finish["type"] == "abort":
                    raise self.abort_error(finish)
                if prep.params.logprobs:
                    offsets[choice.index] = self._add_logprobs(logprobs[choice.index], prep, chunk, offsets[choice.index])
        out = []
        for c in run.choices:
            text = (prep.prompt_texts[c.prompt_index] if prep.request.echo else "") + "".join(c.text)
            assert c.finish is not None
            lp = logprobs[c.index] if prep.params.logprobs else None
            hidden = c.hidden_states if prep.params.return_hidden_states else None
            routed = routed_fields(prep.params, c.routed_experts, c.routed_expert_weights)
            out.append(CompletionChoice(index=c.index, text=text, logprobs=lp, finish_reason=openai_finish_reason(c.finish), hidden_states=hidden, **routed))
        return CompletionResponse(id=_response_id(), model=self.config.model_name, choices=out, usage=usage_of(run.choices))

    # ------------------------------------------------------------------ streamed response
    async def stream(self, prep: PreparedCompletion, run: EngineRun) -> AsyncIterator[str]:
        response_id, created = _response_id(), int(time.time())
        offsets = {c.index: 0 for c in run.choices}
        started: set[int] = set()

        continuous = prep.request.stream_options is not None and prep.request.stream_options.continuous_usage_stats

        def chunk(index: int, text: str, lp: CompletionLogprobs | None, finish: str | None = None, **routed: Any) -> str:
            choice = CompletionChoice(index=index, text=text, logprobs=lp, finish_reason=finish, **routed)
            usage = usage_of(run.choices) if continuous else None
            return CompletionResponse(id=response_id, created=created, model=self.config.model_name, choices=[choice], usage=usage).to_json()

        def usage_chunk() -> str:
            return CompletionResponse(id=response_id, created=created, model=self.config.model_name, choices=[], usage=usage_of(run.choices)).to_json()

        try:
            async with aclosing(run.chunks()) as chunks:
                async for choice, engine_chunk in chunks:
                    finish = engine_chunk["meta_info"]["finish_reason"]
                    if finish is not None and finish["type"] == "abort":
                        raise self.abort_error(finish)
                    text = engine_chunk["text"]
                    if prep.request.echo and choice.index not in started:
                        text = prep.prompt_texts[choice.prompt_index] + text
                    started.add(choice.index)
                    lp = None
                    if prep.params.logprobs:
                        lp = CompletionLogprobs()
                        offsets[choice.index] = self._add_logprobs(lp, prep, engine_chunk, offsets[choice.index])
                    reason = openai_finish_reason(finish) if finish is not None else None
                    meta = engine_chunk["meta_info"]
                    routed = routed_fields(prep.params, meta.get("routed_experts"), meta.get("routed_expert_weights"))
                    if text or lp is not None and lp.tokens or reason is not None or routed.get("routed_experts"):
                        yield chunk(choice.index, text, lp, reason, **routed)
            if wants_usage(prep.request):
                yield usage_chunk()
        except APIError as exc:
            if wants_usage(prep.request):  # aborted mid-stream: what was generated is still billed
                yield usage_chunk()
            yield exc.body().to_json()
        except Exception as exc:  # noqa: BLE001 - the stream has started: report in-band
            log.exception("completion stream failed")
            yield internal_error(f"internal error: {exc!r}").body().to_json()
        finally:
            run.close()
        yield "[DONE]"

    # ------------------------------------------------------------------ logprobs
    @staticmethod
    def _add_logprobs(out: CompletionLogprobs, prep: PreparedCompletion, chunk: dict, offset: int) -> int:
        """Append this chunk's tokens (the prompt's first, with echo); returns the next offset."""
        meta = chunk["meta_info"]
        entries: list[tuple[float | None, str, dict[str, float] | None]] = []
        if prep.request.echo and meta.get("input_token_logprobs") is not None:
            entries += [(lp, text, None) for lp, _, text in meta["input_token_logprobs"]]
        tokens = meta.get("output_token_logprobs") or []
        tops = meta.get("output_top_logprobs") or [[] for _ in tokens]
        n_top = prep.params.top_logprobs_num
        for (lp, _, text), top in zip(tokens, tops):
            entries.append((lp, text, {t: clamp_logprob(v) for v, _, t in top[:n_top]} if n_top else None))
        for lp, text, top in entries:
            out.tokens.append(text)
            out.token_logprobs.append(None if lp is None else clamp_logprob(lp))
            out.top_logprobs.append(top)
            out.text_offset.append(offset)
            offset += len(text)
        return offset



def _response_id() -> str:
    return "cmpl-" + uuid.uuid4().hex
