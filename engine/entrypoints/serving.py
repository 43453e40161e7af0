"""What both OpenAI endpoints share: admission checks, the run of a request on the Engine, and
its bookkeeping.

A request's life in the server::

    check_model, check_capacity          404 / 503 before any work
    to_sampling_params + tokenize        400 for a bad field or prompt (PromptError, InvalidSamplingParams)
    check_context                        400 when prompt + max_tokens exceed the context
    check_constraint                     the grammar backend compiles the constraint on its worker
                                         (the event loop awaits a future): 400 with the compiler's
                                         message; the scheduler later finds the compile in the cache
    expand                               one ``Choice`` per prompt and per n (own rid, seed + k)
    submit -> EngineRun                  one ``Engine.async_generate(stream=True)`` call for all
                                         choices; ``chunks()`` yields (choice, chunk) in order and
                                         records metrics per token; ``close()`` ends it

Every request streams from the engine, even when the response does not: time to first token and
inter-token latency are then measured the same way for all. ``EngineRun.close`` aborts the choices
that have not finished (which frees their KV slots) and drops them from ``inflight``; the
endpoints call it on every path out (the last chunk, an error, the client going away, the task
being cancelled at shutdown). It is a plain method rather than a generator's ``finally`` because a
response may end before its generator ever started, and then no ``finally`` runs.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from ..constrained.grammar_backend import InvalidGrammar
from ..constrained.output_budget import check_output_budget
from ..sampling_params import SamplingParams
from .api_errors import APIError, bad_request, internal_error, overloaded, shutting_down
from .engine import Engine
from .metrics import ServerMetrics
from .openai_protocol import PromptTokensDetails, Usage

log = logging.getLogger("formcast.server")

# A logprob of -inf (a token the grammar masked) is reported as this, as OpenAI does: JSON has no -inf.
MIN_LOGPROB = -9999.0


@dataclass
class ServingConfig:
    model_name: str
    max_waiting_requests: int | None = None  # None: never 503 for load


@dataclass
class ServerState:
    """What the whole server shares: requests in flight (rid -> endpoint) and the drain flag."""

    engine: Engine
    inflight: dict[str, str] = field(default_factory=dict)
    draining: bool = False

    def abort_all(self) -> int:
        """Abort every request in flight (at the end of the shutdown grace period)."""
        rids = list(self.inflight)
        for rid in rids:
            self.engine.abort(rid)
        return len(rids)


@dataclass
class Choice:
    """One engine request: a prompt's k-th sample. ``index`` is its place in ``choices``."""

    index: int
    prompt_index: int
    sample: int  # k of n
    rid: str
    prompt_ids: list[int]
    params: SamplingParams
    # Filled by OpenAIServing.run as chunks arrive.
    text: list[str] = field(default_factory=list)
    token_count: int = 0
    first_token_time: float | None = None
    last_token_time: float | None = None
    meta: dict[str, Any] = field(default_factory=dict)  # the last chunk's meta_info
    hidden_states: list[list[float]] = field(default_factory=list)  # with return_hidden_states
    routed_experts: list[list[list[int]]] = field(default_factory=list)  # with return_routed_experts
    routed_expert_weights: list[list[list[float]]] = field(default_factory=list)

    @property
    def finish(self) -> dict[str, Any] | None:
        return self.meta.get("finish_reason")


def routed_fields(params: SamplingParams, experts: list | None, weights: list | None) -> dict[str, Any]:
    """The routed-experts fields of a choice (or of a streamed chunk's choice, for its tokens):
    empty unless the request asked for them, so other responses keep their shape."""
    out: dict[str, Any] = {}
    if params.return_routed_experts or params.return_routed_expert_weights:
        out["routed_experts"] = experts or []
        if params.return_routed_expert_weights:
            out["routed_expert_weights"] = weights or []
    return out


def openai_finish_reason(finish: dict[str, Any]) -> str:
    """The engine's finish reason -> OpenAI's (``abort`` never reaches a client as a reason).
    ``dead_end`` (the constraint allows nothing more, the output is incomplete) has no OpenAI
    counterpart; it is reported as itself so that no client mistakes the output for whole."""
    kind = finish["type"]
    return kind if kind in ("length", "dead_end") else "stop"


def clamp_logprob(value: float | None) -> float:
    return MIN_LOGPROB if value is None or value < MIN_LOGPROB else float(value)


def usage_of(choices: list[Choice]) -> Usage:
    """Token counts of a response; a prompt sampled n times counts once, as OpenAI does."""
    firsts = [c for c in choices if c.sample == 0]
    prompt = sum(c.meta.get("prompt_tokens", len(c.prompt_ids)) for c in firsts)
    cached = sum(c.meta.get("cached_tokens", 0) for c in firsts)
    completion = sum(c.meta.get("completion_tokens", 0) for c in choices)
    return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion, prompt_tokens_details=PromptTokensDetails(cached_tokens=cached))


def wants_usage(request: Any) -> bool:
    """A streamed request that asked for a final usage chunk."""
    return request.stream_options is not None and request.stream_options.include_usage


class OpenAIServing:
    endpoint = "none"

    def __init__(self, engine: Engine, config: ServingConfig, metrics: ServerMetrics, state: ServerState) -> None:
        self.engine = engine
        self.config = config
        self.metrics = metrics
        self.state = state

    # ------------------------------------------------------------------ admission
    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.config.model_name:
            raise APIError(404, f"The model {model!r} does not exist; this server serves {self.config.model_name!r}", param="model", code="model_not_found")

    def check_capacity(self) -> None:
        if self.state.draining:
            raise shutting_down()
        bound = self.config.max_waiting_requests
        if bound is not None:
            waiting = self.engine.get_load()["waiting"]
            if waiting >= bound:
                raise overloaded(f"the server is overloaded: {waiting} requests are waiting (bound {bound}); retry later")

    def check_common(self, request: Any) -> None:
        """Checks of fields both endpoints share that ``to_sampling_params`` does not see."""
        if request.stream_options is not None and not request.stream:
            raise bad_request("stream_options: only allowed when stream is true", param="stream_options")
        # store: clients (the Agents SDK, proxies) send true by default; nothing is stored here,
        # so it is logged with user and metadata, the caller's own labels, and not refused.
        if request.user is not None or request.metadata or request.store:
            log.info("request from user=%r metadata=%r store=%r (nothing is stored)", request.user, request.metadata, request.store)

    def check_context(self, prompt_len: int, params: SamplingParams, param: str) -> None:
        context = self.engine.context_len
        if prompt_len >= context:
            raise bad_request(f"{param}: the prompt has {prompt_len} tokens; the model's context holds {context} (prompt plus output)", param=param, code="context_length_exceeded")
        if params.min_new_tokens > context - prompt_len:
            raise bad_request(
                f"min_tokens: {params.min_new_tokens} tokens cannot fit: the prompt has {prompt_len} tokens "
                f"and the model's context holds {context}",
                param="min_tokens",
                code="context_length_exceeded",
            )
        wanted = params.max_new_tokens
        pool = self.engine.runner.max_total_tokens
        if wanted is not None and params.n * (prompt_len + wanted) > pool:
            # One request may not reserve more KV than the whole pool: it could never run at once.
            raise bad_request(
                f"n: {params.n} choices of {prompt_len} prompt + {wanted} output tokens reserve "
                f"{params.n * (prompt_len + wanted)} tokens; this server's KV cache holds {pool}",
                param="n",
            )
        if wanted is not None and prompt_len + wanted > context:
            raise bad_request(
                f"max_tokens: the prompt has {prompt_len} tokens and max_tokens asks for {wanted} more; "
                f"together they exceed the model's context of {context} tokens",
                param="max_tokens",
                code="context_length_exceeded",
            )

    async def check_constraint(self, params: SamplingParams) -> None:
        """Compile the constraint (off the event loop); a refused one raises ``InvalidGrammar``."""
        backend = self.engine.grammar_backend
        compiles = backend.stats["compiles"]
        future = backend.submit(params)
        if future is None:
            return
        (self.metrics.grammar_compiles if backend.stats["compiles"] > compiles else self.metrics.grammar_hits).inc()
        try:
            # shield: a request cancelled while waiting must not cancel the compile that the
            # cache shares with every other request carrying the same constraint.
            compiled = await asyncio.shield(asyncio.wrap_future(future))
        except InvalidGrammar as exc:
            if not exc.retryable:  # a compile stopped by the wall-clock backstop refused nothing
                self.metrics.grammar_refused.inc()
            raise
        # A max_tokens no valid output fits is refused now, not answered with a cut document. The
        # count was taken by the compile worker; reading it here touches no shared grammar state.
        check_output_budget(compiled, params)

    # ------------------------------------------------------------------ running
    def expand(self, prompts: list[list[int]], params: SamplingParams) -> list[Choice]:
        """One choice per prompt and sample, in OpenAI's order (prompt-major)."""
        base = uuid.uuid4().hex
        choices = []
        for p, ids in enumerate(prompts):
            for k in range(params.n):
                copy = dataclasses.replace(params, n=1)
                if k and params.sampling_seed is not None:
                    copy.sampling_seed = (params.sampling_seed + k) % (2**63)
                choices.append(Choice(len(choices), p, k, f"{base}-{p}-{k}", ids, copy))
        return choices

    async def submit(self, choices: list[Choice], arrival: float) -> EngineRun:
        """Hand all choices to the engine as one call (a bad prompt raises here, before any
        response is sent)."""
        stream = await self.engine.async_generate(
            input_ids=[c.prompt_ids for c in choices],
            sampling_params=[c.params for c in choices],
            rid=[c.rid for c in choices],
            stream=True,
        )
        return EngineRun(self, choices, stream, arrival)

    async def respond(self, prep: Any, prompts: list[list[int]], stream: bool, arrival: float) -> Any:
        """Run a prepared request (``prep.params``, one choice set per prompt) to its response:
        the whole body, or (``stream``) an SSE stream; the endpoint's ``complete`` / ``stream``
        render it."""
        await self.check_constraint(prep.params)
        run = await self.submit(self.expand(prompts, prep.params), arrival)
        if stream:
            return EventStream(self.stream(prep, run), run)
        try:
            return await self.complete(prep, run)
        finally:
            run.close()

    def observe(self, choice: Choice, chunk: dict, arrival: float) -> None:
        now = time.monotonic()
        meta = chunk["meta_info"]
        choice.meta = meta
        new = len(chunk["output_ids"])
        if new:
            if choice.first_token_time is None:
                choice.first_token_time = now
                self.metrics.ttft.observe(now - arrival)
                new -= 1
            if new and choice.last_token_time is not None:
                gap = (now - choice.last_token_time) / new
                for _ in range(new):
                    self.metrics.itl.observe(gap)
            choice.last_token_time = now
            choice.token_count += len(chunk["output_ids"])
        choice.text.append(chunk["text"])
        choice.hidden_states += meta.get("hidden_states") or []
        choice.routed_experts += meta.get("routed_experts") or []
        choice.routed_expert_weights += meta.get("routed_expert_weights") or []
        finish = meta["finish_reason"]
        if finish is not None:
            m = self.metrics
            m.e2e.observe(now - arrival)
            if choice.sample == 0:  # a prompt sampled n times is one prompt, as in usage
                m.prompt_tokens.inc(meta["prompt_tokens"])
                m.cached_tokens.inc(meta["cached_tokens"])
            m.generation_tokens.inc(meta["completion_tokens"])
            m.requests.labels(self.endpoint, finish["type"]).inc()

    def abort_error(self, finish: dict[str, Any]) -> APIError:
        """The error for a choice the engine aborted (a client going away never gets here)."""
        if self.state.draining:
            return shutting_down()
        return internal_error(f"the request was aborted: {finish.get('message', '')}")


@dataclass
class EventStream:
    """A streamed response: its SSE ``data`` payloads, and the run to close however it ends."""

    events: AsyncIterator[str]
    run: EngineRun


class EngineRun:
    """The engine's stream for one HTTP request's choices."""

    def __init__(self, serving: OpenAIServing, choices: list[Choice], stream: AsyncIterator[dict], arrival: float) -> None:
        self.serving = serving
        self.choices = choices
        self.stream = stream
        self.arrival = arrival
        self.closed = False
        for c in choices:
            serving.state.inflight[c.rid] = serving.endpoint

    async def chunks(self) -> AsyncIterator[tuple[Choice, dict]]:
        by_rid = {c.rid: c for c in self.choices}
        async for chunk in self.stream:
            choice = by_rid[chunk["meta_info"]["id"]]
            self.serving.observe(choice, chunk, self.arrival)
            yield choice, chunk

    def close(self) -> None:
        """Abort what has not finished and forget the run (idempotent; never blocks)."""
        if self.closed:
            return
        self.closed = True
        engine, inflight = self.serving.engine, self.serving.state.inflight
        for c in self.choices:
            if c.finish is None:  # nobody will read its last chunk: count it here
                engine.abort(c.rid)
                self.serving.metrics.requests.labels(self.serving.endpoint, "abort").inc()
            inflight.pop(c.rid, None)
