"""formcast.grammar: constraints (regex, JSON Schema, EBNF) -> token-level automata and bitmasks.

Needs no torch. Public names:
- ``TokenVocabulary``: token id -> bytes, EOS/special ids.
- ``compile_regex``, ``compile_json_schema``, ``compile_ebnf``, ``compile_lark``,
  ``compile_structural_tag``, ``compile_choice``, ``compile_grammar`` -> ``CompiledGrammar``;
  each builds a ``Constraint`` (kind, source, options: the one cache key) for ``compile_constraint``.
- ``GrammarMatcher``: per-request state over a ``CompiledGrammar``.
- ``allocate_token_bitmask`` and the bitmask helpers.
"""

from __future__ import annotations

from .bitmask import (
    allocate_token_bitmask,
    allowed_token_ids,
    bitmask_width,
    pack_bool_mask,
    reset_token_bitmask,
    tokens_allowed,
    unpack_bitmask,
)
from .errors import (
    GrammarBudgetError,
    GrammarError,
    GrammarSyntaxError,
    GrammarTimeoutError,
    RegexSyntaxError,
    SchemaError,
    UnsupportedFeatureError,
)
from .vocab import TokenVocabulary

_LAZY = {
    "CompiledGrammar": "compiler",
    "CompileBudget": "compiler",
    "clear_cache": "api",
    "compile_grammar": "api",
    "compile_regex": "api",
    "compile_json_schema": "api",
    "compile_ebnf": "api",
    "compile_lark": "api",
    "compile_structural_tag": "api",
    "compile_choice": "api",
    "compile_constraint": "api",
    "Constraint": "constraint",
    "StructuralTagItem": "structural_tag",
    "GrammarMatcher": "matcher",
}


def __getattr__(name: str):
    # Lazy so that `import grammar` stays cheap and front ends load only when used.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(name)


__all__ = [
    "GrammarBudgetError",
    "GrammarError",
    "GrammarSyntaxError",
    "GrammarTimeoutError",
    "RegexSyntaxError",
    "SchemaError",
    "UnsupportedFeatureError",
    "TokenVocabulary",
    "allocate_token_bitmask",
    "allowed_token_ids",
    "bitmask_width",
    "pack_bool_mask",
    "reset_token_bitmask",
    "tokens_allowed",
    "unpack_bitmask",
    *_LAZY,
]
