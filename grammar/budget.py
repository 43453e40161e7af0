"""Compile budgets: the limits a hostile or huge constraint hits instead of the machine's memory,
the interpreter's recursion limit or a caller's patience.

``CompileBudget`` holds the limits of one compile. Every refusal is decided by counted work, so a
constraint gets the same verdict on any machine and under any load: automaton states (NFA,
string DFAs, determinized states), nesting depth, source bytes, and *compile steps*, which every
long loop of every stage charges through ``charge`` (parsed characters, trie words, rule checks,
JSON schema denotation and lowering steps, weighted by their cost). ``compile_scope`` opens one
compile's count on the current thread (nested scopes share it); the error names the stage.

The wall clock is only a backstop (``max_compile_seconds``, generous by default, None for none):
its expiry is a ``GrammarTimeoutError``, which says the machine was slow, not that the
constraint is too big; callers never cache it as a refusal, and a retry may succeed.
Nesting limits are checked where nesting is read (``check_depth``), so deep input is refused with
the limit and the place, before Python's own recursion limit could be hit.
"""

from __future__ import annotations

import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Iterator

from .errors import GrammarBudgetError, GrammarTimeoutError

# The backstop: far above what any compile the step budget lets through takes on a quiet machine
# (BENCHMARKS.md, issue 25), so only a stalled or starved process reaches it.
DEFAULT_COMPILE_SECONDS = 120.0
# Compile steps (see ``charge``). A step is roughly a microsecond of compile work on a quiet
# machine: the heaviest MaskBench schema known to compile (Github_medium o35868, 9.6 s) counts
# 6.9 M steps, a 100,000-string enum 3.3 M, Kubernetes kb_1161 3.1 M (BENCHMARKS.md, issue 25).
DEFAULT_COMPILE_STEPS = 25_000_000
# Step weights (``charge``): one step per NFA state or parsed source character; the other units
# weighted by their cost measured against those.
STATE_STEPS = 1  # an NFA state built
TRIE_WORD_STEPS = 30  # a word of a large alternation put into its trie
RULE_CHECK_STEPS = 10  # a rule examined by a grammar-wide fixpoint check
SCHEMA_NODE_STEPS = 300  # a schema object denoted
MEET_STEPS = 100  # a pair of alternatives intersected (or an alternative kept) while denoting
LOWER_STEPS = 300  # a subschema lowered to the IR
# Nesting read by the recursive front ends (schema documents, $ref chains, regex groups, grammar
# parentheses and rule chains). Real constraints stay far below it (MaskBench: 30 levels at most).
MAX_NESTING_DEPTH = 200


@dataclass(frozen=True)
class CompileBudget:
    """Limits of one compile (a part of the compiled-grammar cache key)."""

    max_nfa_states: int = 2_000_000
    # Counted work of a whole compile (front end, lowering, automaton construction): the limit
    # that decides a refusal (GrammarBudgetError, the same on every machine).
    max_compile_steps: int = DEFAULT_COMPILE_STEPS
    # Wall-clock backstop (None: off). Its expiry is a GrammarTimeoutError, never a verdict.
    max_compile_seconds: float | None = DEFAULT_COMPILE_SECONDS
    # Time spent at compile time computing masks of the states nearest the start (0: all lazy).
    # Off by default: with the compiled walk a cold mask costs less than the precompute adds to
    # time to first mask (BENCHMARKS.md, issue 10: regexes and MaskBench, TTFM + walk time).
    eager_mask_seconds: float = 0.0
    max_automaton_states: int = 250_000
    max_stack_depth: int = 50_000
    max_mask_cache_bytes: int = 64 << 20
    max_nesting_depth: int = MAX_NESTING_DEPTH

    def verdict_key(self) -> "CompileBudget":
        """The limits that decide a verdict: this budget without its wall-clock backstop (so a
        request's own timeout does not split the compiled-grammar cache)."""
        return self if self.max_compile_seconds is None else replace(self, max_compile_seconds=None)


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


class _Scope(threading.local):
    active: bool = False
    deadline: float | None = None
    seconds: float = 0.0
    max_depth: int = MAX_NESTING_DEPTH
    steps: int = 0
    max_steps: int = DEFAULT_COMPILE_STEPS


_SCOPE = _Scope()
# Run when a thread's outermost compile scope ends: memo caches whose entries are one compile's
# own (its key sets) are emptied there, so they never pile up across compiles (see on_compile_end).
_COMPILE_END_HOOKS: list[Callable[[], None]] = []


def on_compile_end(hook: Callable[[], None]) -> None:
    """Call ``hook`` whenever a compile ends (its outermost ``compile_scope`` exits, raised or
    not). For memo caches of pure functions: emptying one while another thread compiles costs
    that compile some recomputation, never a different result."""
    if hook not in _COMPILE_END_HOOKS:
        _COMPILE_END_HOOKS.append(hook)


@contextmanager
def compile_scope(budget: CompileBudget | None = None) -> Iterator[None]:
    """Run the body as (part of) one compile under ``budget``'s limits. Nested in another scope,
    it shares the outer count of steps, and the tighter of each limit wins (an outer deadline is
    never extended)."""
    budget = budget or CompileBudget()
    s = _SCOPE
    outer = (s.active, s.deadline, s.seconds, s.max_depth, s.steps, s.max_steps)
    mine = None if budget.max_compile_seconds is None else time.monotonic() + budget.max_compile_seconds
    if mine is not None and (s.deadline is None or mine < s.deadline):
        s.deadline, s.seconds = mine, budget.max_compile_seconds
    if s.active:
        s.max_depth = min(s.max_depth, budget.max_nesting_depth)
        s.max_steps = min(s.max_steps, budget.max_compile_steps)
    else:
        s.max_depth, s.max_steps, s.steps = budget.max_nesting_depth, budget.max_compile_steps, 0
    s.active = True
    try:
        yield
    finally:
        steps = s.steps
        s.active, s.deadline, s.seconds, s.max_depth, _, s.max_steps = outer
        if outer[0]:
            s.steps = steps  # the outer compile keeps counting what the inner part did
        else:
            for hook in _COMPILE_END_HOOKS:
                hook()


@contextmanager
def compile_deadline(seconds: float | None, max_depth: int = MAX_NESTING_DEPTH) -> Iterator[None]:
    """A compile scope with only a wall-clock backstop of ``seconds`` and a depth limit."""
    with compile_scope(CompileBudget(max_compile_seconds=seconds, max_nesting_depth=max_depth)):
        yield


def in_compile_scope() -> bool:
    return _SCOPE.active


def active_deadline() -> float | None:
    """The current thread's wall-clock backstop (None outside a scope or when off)."""
    return _SCOPE.deadline


def steps_used() -> int:
    """Compile steps charged so far in the current scope (what a compile cost, machine-free)."""
    return _SCOPE.steps


def charge(stage: str, steps: int = 1) -> None:
    """Count ``steps`` of work done while ``stage``: a GrammarBudgetError past the step budget
    (a verdict), a GrammarTimeoutError past the wall-clock backstop (not one)."""
    s = _SCOPE
    if not s.active:
        return
    s.steps += steps
    if s.steps > s.max_steps:
        raise GrammarBudgetError(
            f"compilation needs more than {s.max_steps:,} steps of work (stopped while {stage}; "
            "CompileBudget.max_compile_steps)"
        )
    check_deadline(stage)


def check_deadline(stage: str) -> None:
    """Raise GrammarTimeoutError naming ``stage`` once the current compile is past its backstop."""
    deadline = _SCOPE.deadline
    if deadline is not None and time.monotonic() > deadline:
        raise GrammarTimeoutError(
            f"compilation ran past its {_SCOPE.seconds:g} s budget while {stage} (CompileBudget.max_compile_seconds, "
            "a wall-clock backstop: the machine was slow, not the constraint too big; retry may succeed)"
        )


def check_depth(depth: int, what: str, where: str, limit: int | None = None) -> None:
    """Refuse nesting deeper than ``limit`` (default: the current compile's budget); ``what``
    nests, ``where`` says where it was hit."""
    limit = _SCOPE.max_depth if limit is None else limit
    if depth > limit:
        if len(where) > 100:  # a pointer as deep as the nesting: its two ends say enough
            where = f"{where[:40]}...{where[-50:]}"
        raise GrammarBudgetError(f"{what} nests deeper than {limit} levels at {where} (CompileBudget.max_nesting_depth)")


def check_document_depth(value: Any, what: str, limit: int | None = None) -> None:
    """Refuse a JSON document nested deeper than ``limit`` before anything recurses over it."""
    # A subschema nests two document levels below its parent ("properties" -> name -> schema).
    limit = 2 * (_SCOPE.max_depth if limit is None else limit)
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
