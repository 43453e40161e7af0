"""``GrammarBackend``: ``SamplingParams`` constraint fields -> ``CompiledGrammar``, for every
entry point (the Engine's scheduler, the server, the CLI and the ``transformers`` processor).

* ``json_schema`` (object, JSON text or boolean; ``json_schema_strict`` selects the strict
  properties style, ``json_whitespace`` the layout: any / compact / pretty), ``regex`` (full match), ``ebnf`` (XGrammar/GBNF dialect), ``structural_tag``
  (SGLang's ``{"structures": [{"begin", "schema", "end"}], "triggers": [...]}``).
* ``submit`` compiles on a small worker pool and returns a future; concurrent requests for the
  same constraint share one compile, and the outcome (grammar or error) is kept in an LRU, so a
  refused constraint is refused again at once (CONVENTIONS.md 10). ``compile`` blocks.
* Errors are ``InvalidGrammar`` (a ``GrammarError``) with the compiler's message, which names the
  keyword, rule or position at fault.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

import grammar
from grammar import CompileBudget, GrammarError, TokenVocabulary

from ..sampling_params import JSON_WHITESPACE, SamplingParams

# Outcomes kept (compiled grammars also sit in grammar's own cache, which bounds their memory).
OUTCOME_CACHE_SIZE = 512


class InvalidGrammar(GrammarError):
    """A constraint that cannot be compiled; ``field`` names the SamplingParams field."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name


class GrammarBackend:
    def __init__(
        self, vocab: TokenVocabulary, *, num_workers: int = 1, budget: CompileBudget | None = None
    ) -> None:
        self.vocab = vocab
        self.budget = budget
        self._pool = ThreadPoolExecutor(max(1, num_workers), thread_name_prefix="formcast-grammar")
        self._outcomes: OrderedDict[tuple, Future] = OrderedDict()
        self._lock = threading.Lock()
        self.stats = {"compiles": 0, "hits": 0, "errors": 0}
        # Each is called with (kind, seconds) after every compile, refused or not (server metrics).
        self.compile_observers: list[Callable[[str, float], None]] = []

    @staticmethod
    def key_of(params: SamplingParams) -> tuple | None:
        """A hashable description of the constraint (None when there is none)."""
        spec = params.grammar
        if spec is None:
            return None
        kind, source = spec
        if not isinstance(source, str):
            source = json.dumps(source)  # key order matters for JSON schemas: never sort
        strict = params.json_schema_strict if kind == "json_schema" else False
        whitespace = params.json_whitespace if kind == "json_schema" else "any"
        return kind, source, strict, params.grammar_compile_timeout, whitespace

    def submit(self, params: SamplingParams) -> Future | None:
        """A future of the compiled grammar (its exception is an ``InvalidGrammar``)."""
        key = self.key_of(params)
        if key is None:
            return None
        with self._lock:
            future = self._outcomes.get(key)
            if future is not None:
                self._outcomes.move_to_end(key)
                self.stats["hits"] += 1
                return future
            future = self._pool.submit(self._compile_key, key)
            self._outcomes[key] = future
            while len(self._outcomes) > OUTCOME_CACHE_SIZE:
                self._outcomes.popitem(last=False)
            self.stats["compiles"] += 1
        return future

    def compile(self, params: SamplingParams) -> grammar.CompiledGrammar | None:
        """The compiled grammar of ``params`` (None without a constraint); raises ``InvalidGrammar``."""
        future = self.submit(params)
        return None if future is None else future.result()

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------ compiling
    def budget_for(self, timeout: float | None) -> CompileBudget:
        """The engine's budget, its wall clock cut to a request's ``grammar_compile_timeout``."""
        budget = self.budget or CompileBudget()
        if timeout is not None and timeout < budget.max_compile_seconds:
            budget = dataclasses.replace(budget, max_compile_seconds=timeout)
        return budget

    def _compile_key(self, key: tuple) -> grammar.CompiledGrammar:
        kind, source, strict, timeout, whitespace = key
        start = time.perf_counter()
        try:
            return self._compile(kind, source, strict, self.budget_for(timeout), whitespace)
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

    def _compile(self, kind: str, source: str, strict: bool, budget: CompileBudget, whitespace: str = "any") -> grammar.CompiledGrammar:
        vocab = self.vocab
        if kind == "regex":
            return grammar.compile_regex(source, vocab, budget=budget)
        if kind == "ebnf":
            return grammar.compile_ebnf(source, vocab, budget=budget)
        if kind == "json_schema":
            schema = _parse_json(kind, source)
            layout = JSON_WHITESPACE[whitespace]
            return grammar.compile_json_schema(schema, vocab, whitespace=layout, strict_properties=strict, budget=budget)
        if kind == "structural_tag":
            tags, triggers = _structural_tag(_parse_json(kind, source))
            return grammar.compile_structural_tag(tags, triggers, vocab, budget=budget)
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
