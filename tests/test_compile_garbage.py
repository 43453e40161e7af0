"""Compiles leave no reference cycles behind.

A compile builds hundreds of thousands of IR nodes; if anything holding them sits in a reference
cycle, they outlive the compile until a full (generation 2) collection, which then walks every
live object with the GIL held: pauses of hundreds of milliseconds in a serving process, stalling
the decode loop beside it. Everything here must be freed by reference counting alone."""

from __future__ import annotations

import gc
import types
from collections import Counter

import numpy as np
import pytest

import grammar
from grammar import TokenVocabulary
from grammar.api import clear_cache

SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://example.com/tree.json",
    "$defs": {"node": {"type": "object", "properties": {"value": {"const": 1.5}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}},
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 8},
        "tags": {"type": "array", "items": {"enum": ["a", "b", 2]}, "uniqueItems": True},
        "tree": {"$ref": "#/$defs/node"},
        "when": {"type": "string", "format": "date"},
    },
    "required": ["name"],
}


def _compile_all(vocab: TokenVocabulary) -> None:
    mask = grammar.allocate_token_bitmask(1, vocab.vocab_size)
    for compiled in (
        grammar.compile_json_schema(SCHEMA, vocab),
        grammar.compile_json_schema({"type": "object", "properties": {"x": {"format": "email", "type": "string"}}}, vocab, relax_keywords=["format"]),
        grammar.compile_regex(r"(\d{3}-)?[a-f]+", vocab),
        grammar.compile_ebnf('root ::= "[" item ("," item)* "]"\nitem ::= [0-9]+ | root', vocab),
    ):
        matcher = grammar.GrammarMatcher(compiled)
        matcher.fill_next_token_bitmask(mask, 0)
    clear_cache(keep_setup=True)


def test_compiles_free_everything_by_reference_counting():
    vocab = TokenVocabulary.byte_level()
    _compile_all(vocab)  # first use fills process-wide caches, which are not garbage
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        _compile_all(vocab)
        gc.collect()
        leaked = Counter(f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if was_enabled:
            gc.enable()
    assert not leaked, f"objects freed only by the cyclic collector: {leaked.most_common(8)}"


def _reachable(root: object, shared: object) -> Counter:
    """Tracked objects reachable from ``root``, by type: not through ``shared`` (the vocabulary's
    setup) nor code (types, modules, functions: their globals reach every module's caches)."""
    seen, todo, found = {id(root), id(shared)}, [root], Counter()
    while todo:
        for x in gc.get_referents(todo.pop()):
            if id(x) in seen or isinstance(x, (type, types.ModuleType, types.FunctionType)):
                continue
            seen.add(id(x))
            todo.append(x)
            if gc.is_tracked(x):
                found[f"{type(x).__module__}.{type(x).__qualname__}"] += 1
    return found


def test_a_compiled_grammar_keeps_no_ir():
    # The cache keeps compiled grammars for the life of the process, and every full collection
    # walks what they hold: the IR (a schema's tens of thousands of nodes) must not be part of it.
    schema = dict(SCHEMA, properties={**SCHEMA["properties"], **{f"field_{i}": {"type": ["integer", "string"]} for i in range(60)}})
    compiled = grammar.compile_json_schema(schema, TokenVocabulary.byte_level())
    grammar.GrammarMatcher(compiled).fill_next_token_bitmask(grammar.allocate_token_bitmask(1, compiled.vocab.vocab_size), 0)
    held = _reachable(compiled, compiled.vocabulary_masks)
    ir_nodes = {name: n for name, n in held.items() if name.startswith("grammar.ir.")}
    assert not ir_nodes, f"IR held by the compiled grammar: {ir_nodes}"
    assert sum(held.values()) < 2000, held.most_common(8)
