"""The local runner: records -> one Engine, a bounded window in flight -> results as they finish.

    records ──> (a record that failed to read, or a refused constraint: its failure at once)
            ──> window of worker threads, each: render the prompt, chat template, tokenize,
                Engine.generate(input_ids=..., rid=...) (blocking), build the ExtractResult
            ──> yielded in the order records finish

The window (twice the engine's ``max_running_requests`` by default) keeps the scheduler's queue
full without tokenizing a million prompts up front; the scheduler batches whatever is running.
Threads suit this: each one mostly waits on its request's queue while the engine's own threads do
the work, and the public, blocking ``generate`` is all they need.

The constraint is compiled once, up front, by the engine's grammar backend: a refused one fails
every record with the compiler's message, without sending anything to the model. A prompt the
engine refuses (too long for the context) fails only its own record. Closing the iterator early
aborts the requests still in flight; their results are never yielded.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import TYPE_CHECKING, Any, Callable

from ..constrained.grammar_backend import InvalidGrammar
from ..errors import PromptError
from ..sampling_params import SamplingParams
from .records import SourceRecord, from_dicts, id_key
from .results import ExtractError, ExtractResult, FailureType, failure, from_generation
from .spec import ExtractSpec, RecordError

if TYPE_CHECKING:  # pragma: no cover
    from ..entrypoints.engine import Engine


def extract(
    engine: Engine,
    records: Iterable[Any],
    schema: dict[str, Any] | str | None = None,
    *,
    regex: str | None = None,
    ebnf: str | None = None,
    prompt_template: str = "{text}",
    field: str = "text",
    id_field: str = "id",
    chat: bool = True,
    max_new_tokens: int = 128,
    temperature: float = 0.0,
    window: int | None = None,
    **sampling: Any,
) -> Iterator[ExtractResult]:
    """``Engine.extract``: results of ``records`` (dicts, or strings taken as ``field``) as they
    finish. Bad arguments raise here; a bad record yields a failed result and the rest go on."""
    given = {"json_schema": schema, "regex": regex, "ebnf": ebnf}
    constraint = {k: v for k, v in given.items() if v is not None}
    spec = ExtractSpec(constraint, prompt_template, field, id_field, chat,
                       {"max_new_tokens": max_new_tokens, "temperature": temperature, **sampling})  # fmt: skip
    spec.sampling_params()  # bad sampling fields raise now, not at the first next()
    return run_records(engine, from_dicts(records, id_field, field), spec, window=window)


def run_records(engine: Engine, records: Iterable[SourceRecord], spec: ExtractSpec, *, window: int | None = None) -> Iterator[ExtractResult]:
    """The result of every record, in the order they finish."""
    params = spec.sampling_params()
    if spec.chat and not getattr(engine.tokenizer, "chat_template", None):
        raise ValueError("the model has no chat template; run without chat (--no-chat)")
    refusal = check_constraint(engine, params)
    window = window or 2 * engine.args.max_running_requests
    return _run(engine, records, spec, params, refusal, window)


def check_constraint(engine: Engine, params: SamplingParams) -> ExtractError | None:
    """Compile the job's constraint once (it stays in the backend's cache for every record)."""
    try:
        engine.grammar_backend.compile(params)
    except InvalidGrammar as exc:
        return ExtractError(FailureType.REFUSED_CONSTRAINT, f"the constraint was refused: {exc}")
    return None


def _run(engine: Engine, records: Iterable[SourceRecord], spec: ExtractSpec, params: SamplingParams,
         refusal: ExtractError | None, window: int) -> Iterator[ExtractResult]:  # fmt: skip
    running: dict[Future, str] = {}
    try:
        for record in records:
            error = record.error or refusal
            if error is not None:
                yield failure(record.id, record.line, error)
                continue
            while len(running) >= window:
                yield from _take_finished(running)
            rid = f"extract-{uuid.uuid4().hex}"
            running[_in_thread(_run_one, engine, spec, params, record, rid)] = rid
        while running:
            yield from _take_finished(running)
    finally:
        for rid in running.values():  # the consumer stopped early: free the engine
            engine.abort(rid)


def _in_thread(fn: Callable[..., ExtractResult], *args: Any) -> Future:
    """Run ``fn`` on a daemon thread of its own: a request caught by an engine shutting down
    can never keep the interpreter from exiting (a ThreadPoolExecutor joins its threads at exit).
    A thread costs tens of microseconds; a record, seconds of model time."""
    future: Future = Future()

    def work() -> None:
        try:
            future.set_result(fn(*args))
        except BaseException as exc:  # handed to the consumer by future.result()
            future.set_exception(exc)

    threading.Thread(target=work, name="formcast-extract", daemon=True).start()
    return future


def _take_finished(running: dict[Future, str]) -> Iterator[ExtractResult]:
    done, _ = wait(running, return_when=FIRST_COMPLETED)
    for future in done:
        del running[future]
        yield future.result()


def _run_one(engine: Engine, spec: ExtractSpec, params: SamplingParams, record: SourceRecord, rid: str) -> ExtractResult:
    assert record.fields is not None
    try:
        text = spec.render(record.fields, record.line)
    except RecordError as exc:
        return failure(record.id, record.line, exc.error)
    if spec.chat:
        ids = engine.apply_chat_template([{"role": "user", "content": text}])
    else:
        ids = list(engine.tokenizer(text)["input_ids"])
    try:
        out = engine.generate(input_ids=ids, sampling_params=spec.params_for(params, id_key(record.id)), rid=rid)
    except PromptError as exc:
        too_long = len(ids) >= engine.context_len or len(ids) + 1 > engine.runner.max_total_tokens
        kind = FailureType.PROMPT_TOO_LONG if too_long else FailureType.INVALID_PROMPT
        return failure(record.id, record.line, ExtractError(kind, f"line {record.line}: {exc}"))
    assert isinstance(out, dict)
    return from_generation(record.id, record.line, out, spec.kind, params.max_new_tokens)
