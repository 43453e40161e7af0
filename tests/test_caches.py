"""``grammar.clear_cache()`` empties every process-wide cache, because one object owns them all
(``grammar/caches.py``); ``keep_setup=True`` keeps what every constraint shares."""

from __future__ import annotations

import grammar
from grammar import TokenVocabulary
from grammar.caches import CACHES

SETUP_TABLES = {
    "vocabulary_masks", "unique_closing_index", "unique_byte_index", "unique_closing_more",
    "schema_node_verdicts", "schema_meta_validators",
}  # fmt: skip
UNIQUE_ITEMS = {"type": "array", "items": {"type": "string", "maxLength": 3}, "uniqueItems": True}


def _fill(vocab: TokenVocabulary) -> None:
    for compiled in (grammar.compile_regex("a[bc]+", vocab), grammar.compile_json_schema(UNIQUE_ITEMS, vocab)):
        matcher = grammar.GrammarMatcher(compiled)
        mask = grammar.allocate_token_bitmask(1, vocab.vocab_size)
        for text in ('["a', 'a'):
            matcher.reset()
            if matcher.accept_bytes(text.encode()):
                matcher.fill_next_token_bitmask(mask, 0)


def _sizes() -> dict[str, int]:
    return {name: len(CACHES.table(name)) for name in CACHES.names()}


def test_every_cache_is_a_table_of_the_one_owner() -> None:
    import grammar.api  # noqa: F401 - the modules that make the tables
    import grammar.json_schema.refs  # noqa: F401
    import grammar.json_schema.unique_tokens  # noqa: F401
    import grammar.token_masks  # noqa: F401

    assert {"compiled_grammars", *SETUP_TABLES} <= set(CACHES.names())


def test_clear_cache_empties_every_table_and_keep_setup_only_the_compiled_grammars() -> None:
    vocab = TokenVocabulary.byte_level()
    _fill(vocab)
    filled = _sizes()
    assert filled["compiled_grammars"] and filled["vocabulary_masks"] and filled["schema_meta_validators"]
    assert filled["unique_byte_index"] or filled["unique_closing_index"]
    calls = []
    hook = lambda: calls.append(1)  # noqa: E731
    CACHES.on_clear(hook)
    grammar.clear_cache(keep_setup=True)
    kept = _sizes()
    assert kept["compiled_grammars"] == 0 and not calls
    assert all(kept[name] == filled[name] for name in SETUP_TABLES)
    grammar.clear_cache()
    assert all(size == 0 for size in _sizes().values()) and calls == [1]
    CACHES._hooks.remove(hook)
    _fill(vocab)  # everything rebuilds on demand
    assert _sizes()["vocabulary_masks"] == 1


def test_the_transformers_processor_backend_is_emptied_with_the_rest() -> None:
    from engine.hf import processor
    from engine.sampling_params import SamplingParams

    vocab = TokenVocabulary.byte_level()
    processor.compile_for_params(SamplingParams(regex="ab"), vocab)
    assert vocab.fingerprint in processor._BACKENDS
    grammar.clear_cache()
    assert not processor._BACKENDS
