"""The public ``compile_*`` entry points: front end -> IR -> :class:`CompiledGrammar`, cached.

The cache key is (kind, source text, options, budget, vocabulary fingerprint), so requests that
share a constraint share one compiled grammar and its growing mask cache.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Any, Callable, Iterable

from . import ir
from .budget import CompileBudget, check_document_depth, compile_deadline
from .caches import CACHES
from .compiler import CompiledGrammar, compile_grammar  # noqa: F401 (re-exported)
from .errors import GrammarBudgetError, GrammarError, SchemaError
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


def _compile(
    kind: str, source: str, options: tuple, make_ir: Callable[[], ir.Grammar], vocab: TokenVocabulary, budget: CompileBudget | None
) -> CompiledGrammar:
    budget = budget or CompileBudget()
    key = (kind, source, options, budget, vocab.fingerprint)
    with _CACHE_LOCK:
        hit = _CACHE.get(key)
        if hit is not None:
            _CACHE.move_to_end(key)
            return hit
    # Per-vocabulary setup (the token trie, numba loading or compiling its kernels: a minute on a
    # fresh machine) is shared by every constraint, so it is no constraint's budget.
    vocabulary_masks(vocab)
    stage = f"reading the {kind.replace('_', ' ')}"
    try:
        with compile_deadline(budget.max_compile_seconds, budget.max_nesting_depth):
            grammar = make_ir()
            stage = "building the automaton"
            compiled = CompiledGrammar(grammar, vocab, budget, kind=kind, source=source)
    except RecursionError:
        # The explicit depth budgets catch what real constraints nest; this is the backstop for
        # a shape they do not measure, so no RecursionError reaches a caller.
        raise GrammarBudgetError(f"constraint nests too deeply to compile (Python's recursion limit hit while {stage})") from None
    except MemoryError:
        raise GrammarBudgetError(f"constraint too large to compile (out of memory while {stage})") from None
    except OverflowError as exc:
        raise GrammarBudgetError(f"constraint has a number too large to compile ({exc}, while {stage})") from None
    with _CACHE_LOCK:
        _CACHE[key] = compiled
        while len(_CACHE) > CACHE_SIZE:
            _CACHE.popitem(last=False)
    return compiled


def compile_regex(
    pattern: str, vocab: TokenVocabulary, *, flavor: str = "python", budget: CompileBudget | None = None
) -> CompiledGrammar:
    """A grammar accepting exactly the strings ``re.fullmatch(pattern, s, re.ASCII)`` accepts."""
    from .regex import regex_to_ir

    def make_ir() -> ir.Grammar:
        return ir.Grammar({"root": regex_to_ir(pattern, flavor=flavor, mode="fullmatch")}, "root", "regex")

    return _compile("regex", pattern, (flavor,), make_ir, vocab, budget)


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
    budget: CompileBudget | None = None,
) -> CompiledGrammar:
    """A grammar accepting JSON documents valid against ``schema`` (see ``json_schema``).
    ``json_schema_draft``: the draft of a schema without ``$schema`` (None: formcast's default,
    2020-12 with the older spellings); ``json_schema_formats``: "assert" or "annotate"."""
    from .json_schema import json_schema_to_grammar

    limit = (budget or CompileBudget()).max_nesting_depth
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except RecursionError:
            raise GrammarBudgetError(
                f"the schema document nests deeper than Python's JSON parser reads, over the {2 * limit} levels "
                f"allowed (two a subschema; CompileBudget.max_nesting_depth={limit})"
            ) from None
        except json.JSONDecodeError as exc:
            raise SchemaError(f"schema is not valid JSON: {exc}") from None
    check_document_depth(schema, "the schema document", limit)
    # Key order matters (properties are emitted in their listed order): never sort keys here.
    source = json.dumps(schema)
    options: dict[str, Any] = dict(whitespace=whitespace, strict_properties=strict_properties, relax_keywords=tuple(sorted(relax_keywords)))
    if json_schema_draft is not None:
        options["draft"] = json_schema_draft
    if json_schema_formats != "assert":
        options["formats"] = json_schema_formats
    if max_whitespace is not None:
        options["max_whitespace"] = max_whitespace
    return _compile(
        "json_schema", source, tuple(sorted(options.items())), lambda: json_schema_to_grammar(schema, **options), vocab, budget
    )


def compile_ebnf(text: str, vocab: TokenVocabulary, *, root: str = "root", budget: CompileBudget | None = None) -> CompiledGrammar:
    """A grammar from XGrammar/GBNF-style EBNF (``root ::= ...``)."""
    from .ebnf import ebnf_to_grammar

    return _compile("ebnf", text, (root,), lambda: ebnf_to_grammar(text, root=root), vocab, budget)


def compile_lark(text: str, vocab: TokenVocabulary, *, start: str = "start", budget: CompileBudget | None = None) -> CompiledGrammar:
    """A grammar from Lark syntax."""
    from .lark_grammar import lark_to_grammar

    return _compile("lark", text, (start,), lambda: lark_to_grammar(text, start=start), vocab, budget)


def compile_structural_tag(
    tags: list, triggers: list[str], vocab: TokenVocabulary, *, budget: CompileBudget | None = None
) -> CompiledGrammar:
    """Free text with tool calls: see ``structural_tag``."""
    from .structural_tag import structural_tag_to_grammar

    source = json.dumps([[getattr(t, "__dict__", t) for t in tags], list(triggers)], default=str)  # order matters
    return _compile("structural_tag", source, (), lambda: structural_tag_to_grammar(tags, triggers), vocab, budget)


def compile_choice(options: list[str], vocab: TokenVocabulary, *, budget: CompileBudget | None = None) -> CompiledGrammar:
    """Exactly one of ``options``."""
    from .structural_tag import choice_to_grammar

    if not options:
        raise GrammarError("choice needs at least one option")
    return _compile("choice", json.dumps(list(options)), (), lambda: choice_to_grammar(list(options)), vocab, budget)
