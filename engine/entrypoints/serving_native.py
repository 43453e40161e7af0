"""The server's non-OpenAI routes: ``POST /generate`` (SGLang's native shape: ``SamplingParams``
as they are), ``POST /v1/tokenize`` and ``POST /v1/detokenize`` (vLLM's shapes).

    /generate        {"text" | "input_ids", "sampling_params": {...SamplingParams fields},
                      "stream": false}  ->  the Engine's result dict(s) (``text``, ``output_ids``,
                      ``meta_info``), or with ``stream`` SSE events of its chunks, then [DONE]
    /v1/tokenize     {"prompt"} or {"messages"} (through the chat template)  ->
                      {"tokens", "count", "max_model_len"}
    /v1/detokenize   {"tokens"}  ->  {"prompt"}

Bad input is a 400 through the same errors as the OpenAI routes (unknown sampling fields name
themselves). Prompts are tokenized off the event loop.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from pydantic import Field, model_validator

from .api_errors import APIError, bad_request
from .engine import Engine
from .openai_protocol import ChatMessage, StrictRequest, reject_lone_surrogates
from .serving import ServerState


class _NativeRequest(StrictRequest):
    @model_validator(mode="before")
    @classmethod
    def _no_lone_surrogates(cls, data: Any) -> Any:
        return reject_lone_surrogates(data)


class GenerateRequest(_NativeRequest):
    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: dict[str, Any] | None = None
    stream: bool = False
    rid: str | None = None


class TokenizeRequest(_NativeRequest):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True


class DetokenizeRequest(_NativeRequest):
    model: str | None = None
    tokens: list[int] = Field(min_length=0)


class NativeServing:
    def __init__(self, engine: Engine, state: ServerState) -> None:
        self.engine = engine
        self.state = state

    async def generate(self, request: GenerateRequest) -> dict | list | AsyncIterator[str]:
        if (request.text is None) == (request.input_ids is None):
            raise bad_request("text: give exactly one of text and input_ids", param="text")
        input_ids: Any = request.input_ids
        if request.text is not None:  # tokenized here, off the event loop (async_generate would not)
            texts = [request.text] if isinstance(request.text, str) else request.text
            if not texts or not all(texts):
                raise bad_request("text: is empty", param="text")
            ids = await asyncio.to_thread(lambda: [list(self.engine.tokenizer(t)["input_ids"]) for t in texts])
            input_ids = ids[0] if isinstance(request.text, str) else ids
        kwargs = dict(input_ids=input_ids, sampling_params=request.sampling_params or {}, rid=request.rid)
        if not request.stream:
            return await self.engine.async_generate(**kwargs)
        chunks = await self.engine.async_generate(stream=True, **kwargs)
        return self._events(chunks)

    async def _events(self, chunks: AsyncIterator[dict]) -> AsyncIterator[str]:
        try:
            async for chunk in chunks:
                yield json.dumps(chunk, ensure_ascii=False)
        except APIError as exc:
            yield exc.body().to_json()
        yield "[DONE]"

    async def tokenize(self, request: TokenizeRequest) -> dict[str, Any]:
        if (request.prompt is None) == (request.messages is None):
            raise bad_request("prompt: give exactly one of prompt and messages", param="prompt")
        tokens = await asyncio.to_thread(self._tokenize, request)
        return {"tokens": tokens, "count": len(tokens), "max_model_len": self.engine.context_len}

    def _tokenize(self, request: TokenizeRequest) -> list[int]:
        if request.prompt is not None:
            return list(self.engine.tokenizer(request.prompt, add_special_tokens=request.add_special_tokens)["input_ids"])
        messages = [m.model_dump(exclude_none=True) for m in request.messages or []]
        if request.add_generation_prompt:
            return self.engine.apply_chat_template(messages)
        return self.engine.apply_chat_template(messages, continue_final_message=True)

    def detokenize(self, request: DetokenizeRequest) -> dict[str, Any]:
        vocab = self.engine.runner.vocab_size
        bad = next((t for t in request.tokens if not 0 <= t < vocab), None)
        if bad is not None:
            raise bad_request(f"tokens: token id {bad} is outside [0, {vocab})", param="tokens")
        return {"prompt": self.engine.texts.text(request.tokens, skip_special_tokens=False)}
