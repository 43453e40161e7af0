"""The OpenAI-compatible HTTP server: FastAPI on uvicorn over one ``Engine``, SSE streams through
sse-starlette.

    formcast serve --port 30000                       # the embedded SmolLM2-135M-Instruct
    curl localhost:30000/v1/chat/completions -d '{"messages": [{"role": "user", "content": "Hi"}]}'

Routes: ``GET /health``, ``GET /v1/models`` (and ``/v1/models/{id}``), ``GET /metrics``
(Prometheus), ``POST /v1/completions``, ``POST /v1/chat/completions``, and the native ones
(``serving_native``): ``POST /generate``, ``POST /v1/tokenize``, ``POST /v1/detokenize``. With an API key, every
``/v1`` route wants ``Authorization: Bearer <key>`` (401 otherwise); ``/health`` and ``/metrics``
stay open for probes and scrapers.

Errors are OpenAI's shape (``api_errors``); FastAPI's own validation errors (422 by default) and
routing errors are answered in it too, as 400 / 404 / 405.

Disconnects: a streaming response notices the client leaving (sse-starlette listens for
``http.disconnect``) and is cancelled; a non-streaming one is raced against the same message
(``_until_disconnect``). Either way the engine request is aborted and its KV slots freed.

Shutdown (SIGINT / SIGTERM, or ``FormcastServer.handle_exit``): the server keeps accepting
connections but answers 503 to new work and to ``/health``; requests in flight get
``shutdown_timeout`` seconds to finish, then the server aborts them (their streams end with an
error event, non-streaming ones get 503); once none is left, uvicorn closes the connections and
the engine shuts down (when the server owns it).
sse-starlette's own drain, which cancels every stream the moment uvicorn is asked to exit, is
turned off: it is process-global and, once triggered, never resets, which would cut the streams
of any later server in the same process (as in the tests).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import uvicorn
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from sse_starlette import EventSourceResponse
from sse_starlette.sse import AppStatus
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from ..constrained.grammar_backend import InvalidGrammar
from ..sampling_params import InvalidSamplingParams
from .api_errors import APIError, internal_error, to_api_error, validation_error
from .engine import Engine, PromptError
from .metrics import CONTENT_TYPE, ServerMetrics
from .openai_protocol import ChatCompletionRequest, CompletionRequest, ModelCard, ModelList
from .serving import EventStream, ServerState, ServingConfig
from .serving_chat import OpenAIServingChat
from .serving_completions import OpenAIServingCompletion
from .serving_native import DetokenizeRequest, GenerateRequest, NativeServing, TokenizeRequest

log = logging.getLogger("formcast.server")
T = TypeVar("T")

AppStatus.disable_automatic_graceful_drain()  # see the module docstring

# Waiting requests the server admits per running slot when the engine sets no bound.
DEFAULT_WAITING_PER_RUNNING = 16


@dataclass
class ServerSettings:
    host: str = "127.0.0.1"
    port: int = 30000
    api_key: str | None = None
    served_model_name: str | None = None  # default: the model folder's name (see served_model_name)
    shutdown_timeout: float = 20.0  # seconds in-flight requests get to finish on SIGINT / SIGTERM
    # Larger request bodies are answered 413 before they are parsed (a 20 MB prompt would
    # otherwise hold the event loop for seconds while it is decoded and validated).
    max_request_body_bytes: int = 8 * 1024 * 1024
    log_level: str = "info"
    access_log: bool = True


# A GGUF file's name ends in its encoding (``.Q4_1``, ``-Q4_K_M``, ``-IQ4_XS``, ``.f16``).
_GGUF_ENCODING_TAG = re.compile(r"[.\-_](?:I?Q\d\w*|F16|F32|BF16)$", re.IGNORECASE)


def served_model_name(engine: Engine, settings: ServerSettings) -> str:
    """``--served-model-name``, else the model folder's name, or a GGUF file's name without its
    extension and encoding tag: the embedded model is ``SmolLM2-135M-Instruct`` from its Q4_1
    file as from the folder converted from it, so clients keep one name."""
    return settings.served_model_name or model_name(engine.runner.model_path)


def model_name(model_path: object) -> str:
    """A folder's name; a GGUF file's name without ``.gguf`` and its encoding tag."""
    path = Path(str(model_path))
    if path.suffix.lower() != ".gguf":
        return path.name
    return _GGUF_ENCODING_TAG.sub("", path.stem) or path.stem


def build_app(engine: Engine, settings: ServerSettings, *, shutdown_engine: bool = False) -> FastAPI:
    """The ASGI app over ``engine``; with ``shutdown_engine`` it stops the engine on exit."""
    state = ServerState(engine)
    metrics = ServerMetrics(engine)
    # The waiting queue is bounded even when the engine's is not: beyond it, 503 with Retry-After.
    waiting = engine.args.max_waiting_requests or DEFAULT_WAITING_PER_RUNNING * engine.args.max_running_requests
    config = ServingConfig(model_name=served_model_name(engine, settings), max_waiting_requests=waiting)
    chat = OpenAIServingChat(engine, config, metrics, state)
    completions = OpenAIServingCompletion(engine, config, metrics, state)
    native = NativeServing(engine, state)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        state.draining = True
        if shutdown_engine:
            await asyncio.to_thread(engine.shutdown)
            log.info("formcast: engine stopped")

    app = FastAPI(title="formcast", lifespan=lifespan, max_body_size=settings.max_request_body_bytes)
    app.state.server = state
    app.state.metrics = metrics
    app.state.serving_config = config
    _install_error_handlers(app, metrics)

    @app.get("/health")
    async def health() -> Response:
        if state.draining:
            return Response(status_code=503)
        return Response(status_code=200)

    @app.get("/metrics")
    async def prometheus() -> Response:  # async: runs on the loop thread (see metrics.py)
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    v1 = APIRouter(prefix="/v1", dependencies=[Depends(_api_key_check(settings.api_key))])

    @v1.get("/models")
    async def list_models() -> Response:
        return _json(ModelList(data=[ModelCard(id=config.model_name, max_model_len=engine.context_len)]).to_json())

    @v1.get("/models/{model_id:path}")
    async def get_model(model_id: str) -> Response:
        chat.check_model(model_id)
        return _json(ModelCard(id=config.model_name, max_model_len=engine.context_len).to_json())

    @v1.post("/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        return await _respond(request, chat.create(body, time.monotonic()))

    @v1.post("/completions")
    async def text_completions(body: CompletionRequest, request: Request) -> Response:
        return await _respond(request, completions.create(body, time.monotonic()))

    @v1.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> Response:
        chat.check_model(body.model)
        return _json(json.dumps(await native.tokenize(body)))

    @v1.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> Response:
        chat.check_model(body.model)
        return _json(json.dumps(native.detokenize(body), ensure_ascii=False))

    app.include_router(v1)

    @app.post("/generate", dependencies=[Depends(_api_key_check(settings.api_key))])
    async def generate(body: GenerateRequest, request: Request) -> Response:
        chat.check_capacity()
        result = await _until_disconnect(request, native.generate(body))
        if result is None:
            return Response(status_code=499)
        if isinstance(result, (dict, list)):
            return _json(json.dumps(result, ensure_ascii=False))
        return EventSourceResponse(result, sep="\n")

    return app


async def _respond(request: Request, work: Awaitable[Any]) -> Response:
    """Run the endpoint until it answers or the client leaves; streams become SSE responses."""
    result = await _until_disconnect(request, work)
    if result is None:  # the client is gone: nobody reads this
        return Response(status_code=499)
    if isinstance(result, EventStream):
        # The events' own ``finally`` closes the run once they have started; a response that ends
        # before its first event (the client left at once) never starts them: close it after.
        return EventSourceResponse(result.events, sep="\n", background=BackgroundTask(_close_run, result))
    return _json(result.to_json())


async def _close_run(stream: EventStream) -> None:
    stream.run.close()


async def _until_disconnect(request: Request, work: Awaitable[T]) -> T | None:
    """``work``'s result, or None (``work`` cancelled) if the client disconnects first."""
    task = asyncio.ensure_future(work)

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if task.done():
        return task.result()
    task.cancel()
    return None


def _json(text: str, status: int = 200) -> Response:
    return Response(text, status_code=status, media_type="application/json")


def _api_key_check(api_key: str | None) -> Callable[[Request], Awaitable[None]]:
    async def check(request: Request) -> None:
        if api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), api_key.encode()):
            raise APIError(401, "Incorrect or missing API key: send 'Authorization: Bearer <key>'", code="invalid_api_key")

    return check


def settings_limit(app: FastAPI) -> int | None:
    return getattr(app, "max_body_size", None)


def _install_error_handlers(app: FastAPI, metrics: ServerMetrics) -> None:
    def answer(error: APIError) -> JSONResponse:
        metrics.errors.labels(str(error.status)).inc()
        return error.response()

    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError) -> JSONResponse:
        return answer(exc)

    @app.exception_handler(RequestValidationError)
    async def invalid_body(request: Request, exc: RequestValidationError) -> JSONResponse:
        return answer(validation_error(exc))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if isinstance(exc.__cause__, ClientDisconnect):  # left mid-upload: nobody to answer, no error of theirs
            return Response(status_code=499)
        code = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}.get(exc.status_code)
        detail = exc.detail
        if exc.status_code == 413:
            detail = f"the request body is larger than this server's limit of {settings_limit(app)} bytes"
        return answer(APIError(exc.status_code, f"{request.method} {request.url.path}: {detail}", code=code))

    async def caller_error(request: Request, exc: Exception) -> JSONResponse:
        error = to_api_error(exc)
        assert error is not None
        return answer(error)

    for caller_fault in (InvalidSamplingParams, PromptError, InvalidGrammar):
        app.add_exception_handler(caller_fault, caller_error)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("request failed: %s %s", request.method, request.url.path)
        return answer(internal_error(f"internal error: {exc!r}"))


# ---------------------------------------------------------------------------------- running


class FormcastServer(uvicorn.Server):
    """uvicorn's server, plus the drain. On the first exit request the server keeps listening
    and answers 503 to new work (``/health`` included, on new and kept-alive connections alike)
    while the requests in flight finish; those still running after ``grace`` seconds are
    aborted; once none is left, uvicorn's own shutdown runs. A second exit request (a second
    Ctrl-C) goes straight to uvicorn's shutdown."""

    # Seconds between checks of whether the requests in flight are done.
    DRAIN_POLL_S = 0.05

    def __init__(self, config: uvicorn.Config, state: ServerState, grace: float) -> None:
        super().__init__(config)
        self.state = state
        self.grace = grace
        self.loop: asyncio.AbstractEventLoop | None = None
        self._drain_deadline: float | None = None

    def handle_exit(self, sig: int, frame: Any) -> None:
        if self.loop is None or self._drain_deadline is not None:  # not serving yet, or a second request
            super().handle_exit(sig, frame)
            return
        self._captured_signals.append(sig)  # re-raised after the shutdown, as uvicorn does
        self._drain_deadline = float("inf")  # set for real on the loop thread
        self.loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        assert self.loop is not None
        self.state.draining = True
        self._drain_deadline = self.loop.time() + self.grace
        self._drain_step()

    def _drain_step(self) -> None:
        assert self.loop is not None and self._drain_deadline is not None
        if not self.state.inflight:
            self.should_exit = True  # uvicorn's main loop notices within its tick
            return
        if self.loop.time() >= self._drain_deadline:
            self._abort_in_flight()
            self._drain_deadline = float("inf")  # aborted: now wait for their error events to go out
        self.loop.call_later(self.DRAIN_POLL_S, self._drain_step)

    def _abort_in_flight(self) -> None:
        count = self.state.abort_all()
        if count:
            log.warning("formcast: shutdown grace period over, aborted %d request(s)", count)

    async def serve(self, sockets: Any = None) -> None:
        self.loop = asyncio.get_running_loop()
        await super().serve(sockets)


def make_server(engine: Engine, settings: ServerSettings, *, shutdown_engine: bool = False) -> FormcastServer:
    app = build_app(engine, settings, shutdown_engine=shutdown_engine)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        access_log=settings.access_log,
        timeout_graceful_shutdown=int(settings.shutdown_timeout) + 5,  # after our own abort at grace
        timeout_keep_alive=5,
    )
    return FormcastServer(config, app.state.server, settings.shutdown_timeout)


def run_server(settings: ServerSettings, engine_options: dict[str, Any]) -> None:
    """``formcast serve``: load the model, then serve until SIGINT / SIGTERM."""
    engine = Engine(**engine_options)
    server = make_server(engine, settings, shutdown_engine=True)
    log.info("formcast: serving %s on http://%s:%d", served_model_name(engine, settings), settings.host, settings.port)
    server.run()
