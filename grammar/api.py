"""The public ``compile_*`` entry points: front end -> IR -> :class:`CompiledGrammar`, cached.

Each entry point builds a :class:`Constraint` and calls :func:`compile_constraint`. The cache
key is (``Constraint``, the budget's verdict limits, vocabulary fingerprint), so requests that
share a constraint share one compiled grammar and its growing mask cache; the on-disk store
(``disk_cache``, when configured) keeps the compiled NFAs across restarts, and a caller may run
the front end in another process (``front_end``: the engine's compile pool), receiving the NFA
as arrays.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable, Iterable

from .caches import CACHES
from . import disk_cache, kernel_tier
from .budget import CompileBudget, charge, compile_scope, steps_used
from .compiler import CompiledGrammar, compile_grammar  # noqa: F401 (re-exported)
from .constraint import Constraint
from .errors import GrammarBudgetError
from .fsm import ByteNFA, build_nfa
from .token_masks import vocabulary_masks
from .vocab import TokenVocabulary

_CACHE: OrderedDict[tuple, CompiledGrammar] = CACHES.table("compiled_grammars", factory=OrderedDict)
_CACHE_LOCK = threading.Lock()
CACHE_SIZE = 32


def clear_cache(*, keep_setup: bool = False) -> None:
    """Empty every process-wide cache (``grammar/caches.py``): the compiled grammars and, unless
    ``keep_setup``, what every constraint shares (token tries and region splits per vocabulary,
    schema-check validators, the ``transformers`` processor's backends, kernel workspaces)."""
    with _CACHE_LOCK:
        CACHES.clear(keep_setup=keep_setup)


# A front end run elsewhere (another process): (constraint, budget) -> (NFA payload or None when
# the grammar must be compiled here, steps counted); raises what the in-process front end raises.
FrontEnd = Callable[[Constraint, CompileBudget], "tuple[dict | None, int]"]


def front_end_payload(constraint: Constraint, budget: CompileBudget) -> tuple[dict | None, int]:
    """Front end and NFA construction of ``constraint`` as arrays (run in a compile process: what
    crosses back is ``ByteNFA.to_payload``, not Python objects). None for a grammar with a
    vocabulary-aware check, which is compiled in the caller's process."""
    with compile_scope(budget):
        grammar = constraint.to_ir()
        if grammar.check is not None:
            return None, steps_used()
        nfa = build_nfa(grammar, budget.max_nfa_states)
        charge("building the automaton")
        return nfa.to_payload(), steps_used()


_CONFIGURED = object()


def compile_constraint(
    constraint: Constraint,
    vocab: TokenVocabulary,
    budget: CompileBudget | None = None,
    *,
    front_end: FrontEnd | None = None,
    disk: "disk_cache.DiskCache | None | object" = _CONFIGURED,
) -> CompiledGrammar:
    """The compiled grammar of ``constraint``: from the in-memory cache, else from the on-disk
    store ``disk`` (default: the process's, ``disk_cache.configure``; None: none), else compiled
    (by ``front_end`` in another process when given) and stored. Raises a GrammarError subclass (GrammarTimeoutError: the
    wall-clock backstop ran out, which is not a verdict)."""
    budget = budget or CompileBudget()
    key = (constraint, budget.verdict_key(), vocab.fingerprint)
    with _CACHE_LOCK:
        hit = _CACHE.get(key)
        if hit is not None:
            _CACHE.move_to_end(key)
            return hit
    # Per-vocabulary setup (the token trie, numba loading or compiling its kernels: a minute on a
    # fresh machine) is shared by every constraint, so it is no constraint's budget.
    vocabulary_masks(vocab)
    kind, source = constraint.kind, constraint.source
    if disk is _CONFIGURED:
        disk = disk_cache.active()
    assert disk is None or isinstance(disk, disk_cache.DiskCache)
    disk_key = disk.key(constraint, vocab.fingerprint, budget) if disk is not None else ""
    nfa = disk.load(disk_key) if disk is not None else None
    stage = f"reading the {kind.replace('_', ' ')}"
    try:
        if nfa is not None:
            compiled = CompiledGrammar(None, vocab, budget, kind=kind, source=source, nfa=nfa)
        else:
            payload = None
            if front_end is not None and kernel_tier.compiled():  # a compile process would JIT-compile first
                payload, steps = front_end(constraint, budget)
            if payload is not None:
                compiled = CompiledGrammar(None, vocab, budget, kind=kind, source=source, nfa=ByteNFA.from_payload(payload))
                compiled.compile_steps = steps
            else:
                with compile_scope(budget):
                    grammar = constraint.to_ir()
                    stage = "building the automaton"
                    compiled = CompiledGrammar(grammar, vocab, budget, kind=kind, source=source)
                    compiled.compile_steps = steps_used()
            if disk is not None and compiled.check is None:
                disk.store(disk_key, compiled.nfa)
    except RecursionError:
        # The explicit depth budgets catch what real constraints nest; this is the backstop for
        # a shape they do not measure, so no RecursionError reaches a caller.
        raise GrammarBudgetError(f"constraint nests too deeply to compile (Python's recursion limit hit while {stage})") from None
    except MemoryError:
        raise GrammarBudgetError(f"constraint too large to compile (out of memory while {stage})") from None
    except OverflowError as exc:
        raise GrammarBudgetError(f"constraint has a number too large to compile ({exc}, while {stage})") from None
    compiled.constraint = constraint
    if compiled.runs_python:  # a fresh install's first seconds (kernel_tier): compile again after the switch
        return compiled
    with _CACHE_LOCK:
        _CACHE[key] = compiled
        while len(_CACHE) > CACHE_SIZE:
            _CACHE.popitem(last=False)
    return compiled


def compile_regex(
    pattern: str, vocab: TokenVocabulary, *, flavor: str = "python", budget: CompileBudget | None = None
) -> CompiledGrammar:
    """A grammar accepting exactly the strings ``re.fullmatch(pattern, s, re.ASCII)`` accepts."""
    return compile_constraint(Constraint.regex(pattern, flavor=flavor), vocab, budget)


def compile_json_schema(
    schema: dict | str | bool,
    vocab: TokenVocabulary,
    *,
    whitespace: str | int = "flexible",
    strict_properties: bool = False,
    max_whitespace: int | None = None,
    relax_keywords: Iterable[str] = (),
    json_schema_draft: str | None = None,
    json_schema_formats: str = "assert",
    json_property_order: str = "declared",
    budget: CompileBudget | None = None,
) -> CompiledGrammar:
    """A grammar accepting JSON documents valid against ``schema`` (see ``json_schema``)."""
    constraint = Constraint.json_schema(
        schema, whitespace=whitespace, strict_properties=strict_properties, max_whitespace=max_whitespace,
        relax_keywords=relax_keywords, max_nesting_depth=(budget or CompileBudget()).max_nesting_depth,
        draft=json_schema_draft, formats=json_schema_formats, property_order=json_property_order,
    )
    return compile_constraint(constraint, vocab, budget)


def compile_ebnf(text: str, vocab: TokenVocabulary, *, root: str = "root", budget: CompileBudget | None = None) -> CompiledGrammar:
    """A grammar from XGrammar/GBNF-style EBNF (``root ::= ...``)."""
    return compile_constraint(Constraint.ebnf(text, root=root), vocab, budget)


def compile_lark(text: str, vocab: TokenVocabulary, *, start: str = "start", budget: CompileBudget | None = None) -> CompiledGrammar:
    """A grammar from Lark syntax."""
    return compile_constraint(Constraint.lark(text, start=start), vocab, budget)


def compile_structural_tag(
    tags: list, triggers: list[str], vocab: TokenVocabulary, *, budget: CompileBudget | None = None
) -> CompiledGrammar:
    """Free text with tool calls: see ``structural_tag``."""
    return compile_constraint(Constraint.structural_tag(tags, triggers), vocab, budget)


def compile_choice(options: list[str], vocab: TokenVocabulary, *, budget: CompileBudget | None = None) -> CompiledGrammar:
    """Exactly one of ``options``."""
    return compile_constraint(Constraint.choice(options), vocab, budget)
