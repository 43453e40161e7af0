"""``GrammarBackend``: ``SamplingParams`` constraint fields -> ``CompiledGrammar``, for every
entry point (the Engine's scheduler, the server, the CLI and the ``transformers`` processor).

* ``json_schema`` (object, JSON text or boolean; ``json_schema_strict`` selects the strict
  properties style, ``json_schema_draft`` the draft of a schema without ``$schema``,
  ``json_schema_formats`` whether ``format`` is asserted, ``json_property_order`` whether named
  properties keep the schema's order,
  ``json_whitespace`` the layout: any / compact / pretty), ``regex`` (full match), ``ebnf`` (XGrammar/GBNF dialect), ``structural_tag``
  (SGLang's ``{"structures": [{"begin", "schema", "end"}], "triggers": [...]}``).
* The request's constraint becomes one ``grammar.Constraint`` (``constraint_of``), the key of
  every cache. ``submit`` compiles on a small worker pool and returns a future; concurrent
  requests for the same constraint share one compile, and the outcome (grammar or refusal) is
  kept in an LRU, so a refused constraint is refused again at once. A compile stopped by the
  wall-clock backstop (``CompileTimeout``, "retry may succeed") is not kept. ``compile`` blocks.
* ``disk``: compiled grammars kept across restarts (``grammar.disk_cache``); ``precompile`` fills it.
* With ``compile_processes`` > 0 the front end runs in child processes (``grammar.compile_worker``)
  and the NFA crosses back as arrays, so a big compile never stalls decoding on the GIL.
* Errors are ``InvalidGrammar`` (a ``GrammarError``) with the compiler's message, which names the
  keyword, rule or position at fault.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Iterable

import grammar
from grammar import CompileBudget, Constraint, GrammarError, GrammarTimeoutError, TokenVocabulary
from grammar import kernel_tier
from grammar.compile_worker import CompilePool
from grammar.disk_cache import DiskCache

from .output_budget import record_min_output_tokens
from ..errors import CompileTimeout, InvalidGrammar  # defined with the other field errors; imported from here too
from ..sampling_params import JSON_WHITESPACE, SamplingParams

log = logging.getLogger("formcast.grammar")

# Outcomes kept (compiled grammars also sit in grammar's own cache, which bounds their memory).
OUTCOME_CACHE_SIZE = 512


class GrammarBackend:
    def __init__(
        self,
        vocab: TokenVocabulary,
        *,
        num_workers: int = 1,
        budget: CompileBudget | None = None,
        compile_processes: int = 0,
        disk: DiskCache | None = None,
        tokenizer: Any = None,
    ) -> None:
        self.vocab = vocab
        # With the model's tokenizer, each compile also records the fewest output tokens the
        # grammar allows (constrained.output_budget), before the grammar is shared.
        self.tokenizer = tokenizer
        self.disk = disk
        self.budget = budget
        self._pool = ThreadPoolExecutor(max(1, num_workers), thread_name_prefix="formcast-grammar")
        # Front ends in child processes (the compiled NFA comes back as arrays): no GIL held here.
        self._processes = CompilePool(compile_processes) if compile_processes > 0 else None
        self._outcomes: OrderedDict[tuple, Future] = OrderedDict()
        self._lock = threading.Lock()
        self._closed = False
        self.stats = {"compiles": 0, "hits": 0, "errors": 0}
        # Each is called with (kind, seconds) after every compile, refused or not (server metrics).
        self.compile_observers: list[Callable[[str, float], None]] = []

    @staticmethod
    def key_of(params: SamplingParams) -> Constraint | None:
        """The request's constraint as one typed value (None when there is none): the key of
        every compiled-grammar cache. Raises ``InvalidGrammar`` for a source that does not parse."""
        return constraint_of(params)

    def submit(self, params: SamplingParams) -> Future | None:
        """A future of the compiled grammar (its exception is an ``InvalidGrammar``; a
        ``CompileTimeout`` when the wall-clock backstop ran out, which is never kept)."""
        try:
            constraint = constraint_of(params)
        except InvalidGrammar as exc:
            self.stats["errors"] += 1
            future: Future = Future()
            future.set_exception(exc)
            return future
        if constraint is None:
            return None
        with self._lock:
            future = self._outcomes.get(constraint)
            if future is not None and _built_before_switch(future):
                future = None  # compiled as Python before the kernels were: compile it again
            if future is not None:
                self._outcomes.move_to_end(constraint)
                self.stats["hits"] += 1
                return future
            future = self._pool.submit(self._compile_key, constraint, params.grammar_compile_timeout)
            self._outcomes[constraint] = future
            while len(self._outcomes) > OUTCOME_CACHE_SIZE:
                self._outcomes.popitem(last=False)
            self.stats["compiles"] += 1
        return future

    def precompile(self, items: Iterable[SamplingParams | dict[str, Any]]) -> list[str | None]:
        """Compile every constraint ahead of traffic (into memory and the on-disk store). An item
        is ``SamplingParams`` or its dict form (``{"json_schema": ...}``, ``{"regex": ...}``...);
        returns, per item, None or the refusal's message."""
        futures = []
        for item in items:
            try:
                params = item if isinstance(item, SamplingParams) else SamplingParams(**dict(item))
                params.verify()
                futures.append(self.submit(params))
            except (GrammarError, ValueError, TypeError) as exc:
                futures.append(exc)
        out: list[str | None] = []
        for f in futures:
            if isinstance(f, BaseException):
                out.append(str(f))
            elif f is None:
                out.append("no constraint")
            else:
                try:
                    f.result()
                    out.append(None)
                except GrammarError as exc:
                    out.append(str(exc))
        return out

    def compile(self, params: SamplingParams) -> grammar.CompiledGrammar | None:
        """The compiled grammar of ``params`` (None without a constraint); raises ``InvalidGrammar``."""
        future = self.submit(params)
        return None if future is None else future.result()

    def start_compile_processes(self) -> None:
        """Start the compile processes now (in the background) and have them load their kernels,
        so the first constrained request does not wait for a process to start. Nothing once the
        backend is shut down: the kernel switch that calls this can come after an engine closed."""
        if self._processes is not None and not self._closed:
            probe = Constraint.json_schema({"type": "string", "pattern": "^[a-z]+$", "maxLength": 3})
            for _ in range(self._processes.size):
                try:
                    self._pool.submit(self._processes, probe, CompileBudget())
                except RuntimeError:  # the pool was shut down meanwhile
                    if not self._closed:
                        raise
                    return

    def compile_beside(self, running: Callable[[], bool]) -> None:
        """``running()`` says whether requests are decoding: a compile process then waits for idle
        CPU first (``grammar.compile_worker.IDLE_SECONDS``), so their decode steps keep the cores."""
        if self._processes is not None:
            self._processes.busy = running

    def shutdown(self) -> None:
        self._closed = True
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self._processes is not None:
            self._processes.close()

    # ------------------------------------------------------------------ compiling
    def budget_for(self, timeout: float | None) -> CompileBudget:
        """The engine's budget, its wall-clock backstop cut to a request's ``grammar_compile_timeout``."""
        budget = self.budget or CompileBudget()
        if timeout is not None and (budget.max_compile_seconds is None or timeout < budget.max_compile_seconds):
            budget = dataclasses.replace(budget, max_compile_seconds=timeout)
        return budget

    def _compile_key(self, constraint: Constraint, timeout: float | None) -> grammar.CompiledGrammar:
        kind = constraint.kind
        start = time.perf_counter()
        try:
            compiled = grammar.compile_constraint(constraint, self.vocab, self.budget_for(timeout), front_end=self._processes, disk=self.disk)
            if self.tokenizer is not None:
                try:
                    record_min_output_tokens(compiled, self.tokenizer)
                except Exception:  # noqa: BLE001 - no count only means no admission check
                    log.warning("could not count the shortest output of a %s constraint", kind, exc_info=True)
            return compiled
        except GrammarTimeoutError as exc:
            # The machine was slow, not the constraint too big: forget the outcome so that the
            # next request with this constraint compiles again.
            with self._lock:
                if self._outcomes.get(constraint) is not None and self._outcomes[constraint].running():
                    del self._outcomes[constraint]
            raise CompileTimeout(kind, str(exc)) from None
        except GrammarError as exc:
            self.stats["errors"] += 1
            if isinstance(exc, InvalidGrammar):
                raise
            raise InvalidGrammar(kind, str(exc)) from None
        except (RecursionError, MemoryError, OverflowError) as exc:
            self.stats["errors"] += 1
            raise InvalidGrammar(kind, f"too large or too deep to compile ({type(exc).__name__})") from None
        finally:
            for observe in self.compile_observers:
                observe(kind, time.perf_counter() - start)


def _built_before_switch(future: Future) -> bool:
    """A finished compile whose grammar runs the kernels' Python twins while the process now runs
    the compiled kernels (``grammar.kernel_tier``)."""
    if not future.done() or future.cancelled() or future.exception() is not None:
        return False
    compiled = future.result()
    return compiled.runs_python and kernel_tier.compiled()


def constraint_of(params: SamplingParams) -> Constraint | None:
    """``SamplingParams`` -> ``Constraint``, built once per request (None without a constraint)."""
    spec = params.grammar
    if spec is None:
        return None
    kind, source = spec
    try:
        if kind == "regex":
            return Constraint.regex(source)
        if kind == "ebnf":
            return Constraint.ebnf(source)
        if kind == "json_schema":
            return Constraint.json_schema(
                source,
                strict_properties=params.json_schema_strict,
                draft=params.json_schema_draft,
                formats=params.json_schema_formats,
                property_order=params.json_property_order,
                whitespace=JSON_WHITESPACE[params.json_whitespace],
            )
        if kind == "choice":
            return Constraint.choice(list(source))
        if kind == "structural_tag":
            tags, triggers = _structural_tag(_parse_json(kind, source) if isinstance(source, str) else source)
            return Constraint.structural_tag(tags, triggers)
    except InvalidGrammar:
        raise
    except GrammarError as exc:
        raise InvalidGrammar(kind, str(exc)) from None
    raise InvalidGrammar(kind, "unknown constraint kind")


def _parse_json(field_name: str, source: str) -> Any:
    try:
        return json.loads(source)
    except json.JSONDecodeError as exc:
        raise InvalidGrammar(field_name, f"not valid JSON: {exc}") from None


def _structural_tag(spec: Any) -> tuple[list, list[str]]:
    """SGLang's structural tag object -> (tags, triggers)."""
    from grammar import StructuralTagItem

    if not isinstance(spec, dict):
        raise InvalidGrammar("structural_tag", "must be an object with 'structures' and 'triggers'")
    structures, triggers = spec.get("structures"), spec.get("triggers")
    if not isinstance(structures, list) or not structures:
        raise InvalidGrammar("structural_tag", "'structures' must be a non-empty list")
    if not isinstance(triggers, list) or not all(isinstance(t, str) for t in triggers):
        raise InvalidGrammar("structural_tag", "'triggers' must be a list of strings")
    tags = []
    for i, s in enumerate(structures):
        if not isinstance(s, dict) or not {"begin", "end"} <= set(s):
            raise InvalidGrammar("structural_tag", f"structures[{i}] needs 'begin', 'schema' and 'end'")
        schema = s.get("schema", s.get("parameters", True))
        tags.append(StructuralTagItem(begin=str(s["begin"]), schema=schema, end=str(s["end"])))
    return tags, list(triggers)
