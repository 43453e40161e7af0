"""Memo caches emptied when a compile ends (``budget.on_compile_end``).

The key-set caches of the JSON Schema front end hold one schema's own IR; kept across compiles
they filled the garbage collector's generations (issue 25: full collections of 21 ms inside
masks). They must work within a compile and be empty after it, and nothing else may change.
"""

from __future__ import annotations

import gc

import pytest

import grammar
from grammar import TokenVocabulary
from grammar.budget import compile_scope, on_compile_end
from grammar.json_schema.strings import not_in, quoted_not_in


def _object_schema(prefix: str, count: int) -> dict:
    # Extra keys allowed (no additionalProperties): the key beside the named ones is quoted_not_in.
    return {"type": "object", "properties": {f"{prefix}{i}": {"type": "integer"} for i in range(count)}}


def test_key_set_caches_are_empty_after_a_compile():
    quoted_not_in.cache_clear()
    grammar.compile_json_schema(_object_schema("field_", 40), TokenVocabulary.byte_level())
    assert quoted_not_in.cache_info().currsize == 0
    assert not_in.cache_info().currsize == 0


def test_the_caches_serve_hits_inside_one_compile():
    words = frozenset({"alpha", "beta"})
    with compile_scope():
        quoted_not_in.cache_clear()
        first = quoted_not_in(words)
        with compile_scope():  # a nested scope (a subschema's) ends: the compile goes on
            assert quoted_not_in(words) is first
        assert quoted_not_in.cache_info().currsize == 1
        assert quoted_not_in(words) is first
    assert quoted_not_in.cache_info().currsize == 0


def test_a_hook_runs_when_the_compile_raises():
    calls: list[int] = []
    hook = lambda: calls.append(1)  # noqa: E731
    on_compile_end(hook)
    on_compile_end(hook)  # registered once
    try:
        with pytest.raises(ValueError):
            with compile_scope():
                raise ValueError("refused")
        assert calls == [1]
    finally:
        from grammar import budget

        budget._COMPILE_END_HOOKS.remove(hook)


def test_compiles_leave_no_key_set_ir_for_the_collector():
    """Distinct schemas with large key sets leave the tracked-object count flat (each key set's
    IR is hundreds of objects: 30 of them kept would add thousands)."""
    vocab = TokenVocabulary.byte_level()
    grammar.compile_json_schema(_object_schema("warm_", 5), vocab)
    gc.collect()
    before = len(gc.get_objects())
    for k in range(30):
        grammar.compile_json_schema(_object_schema(f"set{k}_", 60), vocab)
    grammar.clear_cache(keep_setup=True)  # (the compiled grammars themselves are the LRU's)
    gc.collect()
    assert len(gc.get_objects()) - before < 3000
