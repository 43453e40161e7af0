"""Compile budgets: the limits a hostile or huge constraint hits instead of the machine's memory,
the interpreter's recursion limit or a caller's patience.

``CompileBudget`` holds the limits of one compile. The wall-clock part is a per-thread deadline
(``compile_deadline``) that every long loop of every stage checks through ``check_deadline``, so
no constraint holds a compile worker past its budget and the error names the stage that ran out.
Nesting limits are checked where nesting is read (``check_depth``), so deep input is refused with
the limit and the place, before Python's own recursion limit could be hit.
"""

from __future__ import annotations

import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

from .errors import GrammarBudgetError

DEFAULT_COMPILE_SECONDS = 10.0
# Nesting read by the recursive front ends (schema documents, $ref chains, regex groups, grammar
# parentheses and rule chains). Real constraints stay far below it (MaskBench: 30 levels at most).
MAX_NESTING_DEPTH = 200


@dataclass(frozen=True)
class CompileBudget:
    """Limits of one compile (a part of the compiled-grammar cache key)."""

    max_nfa_states: int = 2_000_000
    # Wall clock for a whole compile: front end, lowering and automaton construction.
    max_compile_seconds: float = DEFAULT_COMPILE_SECONDS
    # Time spent at compile time computing masks of the states nearest the start (0: all lazy).
    # Off by default: with the compiled walk a cold mask costs less than the precompute adds to
    # time to first mask (BENCHMARKS.md, issue 10: regexes and MaskBench, TTFM + walk time).
    eager_mask_seconds: float = 0.0
    max_automaton_states: int = 250_000
    max_stack_depth: int = 50_000
    max_mask_cache_bytes: int = 64 << 20
    max_nesting_depth: int = MAX_NESTING_DEPTH


_RECURSION_LOCK = threading.Lock()
_recursion_users = 0
_saved_recursion_limit = 0


@contextmanager
def recursion_room(frames: int) -> Iterator[None]:
    """Raise Python's (process-wide) recursion limit to at least ``frames`` for the body. Counted,
    so a thread leaving never lowers it under another thread still inside; the depth budgets
    keep real recursion far below it."""
    global _recursion_users, _saved_recursion_limit
    with _RECURSION_LOCK:
        if _recursion_users == 0:
            _saved_recursion_limit = sys.getrecursionlimit()
        _recursion_users += 1
        if sys.getrecursionlimit() < frames:
            sys.setrecursionlimit(frames)
    try:
        yield
    finally:
        with _RECURSION_LOCK:
            _recursion_users -= 1
            if _recursion_users == 0:
                sys.setrecursionlimit(_saved_recursion_limit)


class _Clock(threading.local):
    deadline: float | None = None
    seconds: float = 0.0
    max_depth: int = MAX_NESTING_DEPTH


_CLOCK = _Clock()


@contextmanager
def compile_deadline(seconds: float, max_depth: int = MAX_NESTING_DEPTH) -> Iterator[None]:
    """Run the body under a deadline ``seconds`` from now (an enclosing, earlier one wins)."""
    outer = (_CLOCK.deadline, _CLOCK.seconds, _CLOCK.max_depth)
    mine = time.monotonic() + seconds
    if outer[0] is None or mine < outer[0]:
        _CLOCK.deadline, _CLOCK.seconds = mine, seconds
    _CLOCK.max_depth = min(max_depth, outer[2]) if outer[0] is not None else max_depth
    try:
        yield
    finally:
        _CLOCK.deadline, _CLOCK.seconds, _CLOCK.max_depth = outer


def active_deadline() -> float | None:
    """The current thread's compile deadline (None outside ``compile_deadline``)."""
    return _CLOCK.deadline


def check_deadline(stage: str) -> None:
    """Raise GrammarBudgetError naming ``stage`` once the current compile is past its deadline."""
    deadline = _CLOCK.deadline
    if deadline is not None and time.monotonic() > deadline:
        raise GrammarBudgetError(
            f"compilation ran past its {_CLOCK.seconds:g} s budget while {stage} (CompileBudget.max_compile_seconds)"
        )


def check_depth(depth: int, what: str, where: str, limit: int | None = None) -> None:
    """Refuse nesting deeper than ``limit`` (default: the current compile's budget); ``what``
    nests, ``where`` says where it was hit."""
    limit = _CLOCK.max_depth if limit is None else limit
    if depth > limit:
        if len(where) > 100:  # a pointer as deep as the nesting: its two ends say enough
            where = f"{where[:40]}...{where[-50:]}"
        raise GrammarBudgetError(f"{what} nests deeper than {limit} levels at {where} (CompileBudget.max_nesting_depth)")


def check_document_depth(value: Any, what: str, limit: int | None = None) -> None:
    """Refuse a JSON document nested deeper than ``limit`` before anything recurses over it."""
    # A subschema nests two document levels below its parent ("properties" -> name -> schema).
    limit = 2 * (_CLOCK.max_depth if limit is None else limit)
    stack: list[tuple[Any, int, str]] = [(value, 1, "")]
    while stack:
        node, depth, where = stack.pop()
        if isinstance(node, dict):
            items: Iterable[tuple[Any, Any]] = node.items()
        elif isinstance(node, list):
            items = enumerate(node)
        else:
            continue
        check_depth(depth, f"{what} (two levels a subschema)", where or "/", limit)
        stack.extend((v, depth + 1, f"{where}/{k}") for k, v in items if isinstance(v, (dict, list)))
