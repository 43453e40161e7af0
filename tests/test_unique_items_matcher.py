"""uniqueItems in the matcher: masks ban the tokens that complete a duplicate item, and the check
state follows rollback, copy and reset; matchers of one grammar run on several threads."""

from __future__ import annotations

import json
import random
import threading

import jsonschema
import numpy as np
import pytest

from grammar import TokenVocabulary, allocate_token_bitmask, allowed_token_ids
from grammar.compiler import compile_grammar
from grammar.json_schema import json_schema_to_grammar
from grammar.matcher import GrammarMatcher

# Multi-byte tokens that complete items in their middle (a quote, then a comma or a bracket).
EXTRA = ['"a"', '"a",', '"b"', 'a"', 'a",', 'a"]', '1,', '1]', '1.0]', ', ', '",', '"]', 'b"]', '{"k":', '1}', '1},', '1}]']
VOCAB = TokenVocabulary.byte_level(extra_tokens=EXTRA)
SCHEMA = {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": ["string", "number", "object"]}, "uniqueItems": True}},
          "required": ["tags"], "additionalProperties": False}


@pytest.fixture(scope="module")
def compiled():
    return compile_grammar(json_schema_to_grammar(SCHEMA, whitespace="compact"), VOCAB)


def tid(text: str) -> int:
    data = text.encode()
    return next(i for i, t in enumerate(VOCAB.token_bytes) if t == data)


def allowed(m: GrammarMatcher) -> set[int]:
    mask = allocate_token_bitmask(1, VOCAB.vocab_size)
    m.fill_next_token_bitmask(mask)
    return set(allowed_token_ids(mask[0], VOCAB.vocab_size).tolist())


def test_mask_bans_exactly_the_tokens_that_complete_a_duplicate(compiled):
    m = GrammarMatcher(compiled)
    assert m.accept_bytes(b'{"tags":["a",')
    ok = allowed(m)
    assert tid('"b"') in ok and tid('"a"') not in ok and tid('"a",') not in ok
    assert m.accept_token(tid('"')) and m.accept_token(ord("a"))
    ok = allowed(m)
    assert ord('"') not in ok and tid('",') not in ok and tid('"]') not in ok  # would close "a" again
    assert ord("b") in ok  # "ab" is new
    assert not m.accept_token(ord('"'))
    # Numbers compare by value: 1 then 1.0 is a duplicate, decided when the number ends.
    m2 = GrammarMatcher(compiled)
    assert m2.accept_bytes(b'{"tags":[1,')
    assert tid("1.0]") not in allowed(m2) and tid("1]") not in allowed(m2)
    assert m2.accept_bytes(b"1.5]}") and m2.can_terminate()
    # Objects compare regardless of key order.
    m3 = GrammarMatcher(compiled)
    assert m3.accept_bytes(b'{"tags":[{"k":1,"j":2},{"j":2,"k"')
    assert m3.accept_bytes(b":")
    assert tid("1}") not in allowed(m3) and tid("1},") not in allowed(m3)


def test_rollback_copy_and_reset_keep_the_check_consistent(compiled):
    m = GrammarMatcher(compiled)
    steps = [ord(c) for c in '{"tags":['] + [tid('"a",'), tid('"b"'), ord(",")]
    for t in steps:
        assert m.accept_token(t)
    twin = m.copy()
    assert tid('"a"') not in allowed(m)
    m.rollback(3)  # back before "a": both "a" and "b" are new again
    assert tid('"a"') in allowed(m) and tid('"a",') in allowed(m)
    assert tid('"a"') not in allowed(twin)  # the copy kept its own history
    assert m.accept_token(tid('"b"')) and m.accept_token(ord(","))
    assert tid('"b"') not in allowed(m) and tid('"a"') in allowed(m)
    m.reset()
    assert m.accept_bytes(b'{"tags":["a","b"]}') and m.can_terminate()
    limited = GrammarMatcher(compiled, max_rollback_tokens=2)
    for t in steps:
        assert limited.accept_token(t)
    assert tid('"a"') not in allowed(limited)


def test_forced_continuation_stops_before_a_duplicate():
    schema = {"type": "array", "items": {"type": "string", "pattern": "^abc(d+)?$"}, "uniqueItems": True}
    m = GrammarMatcher(compile_grammar(json_schema_to_grammar(schema, whitespace="compact"), VOCAB))
    assert m.accept_bytes(b'["abc","a')
    forced = m.forced_continuation()
    assert forced == b"bc"  # the closing quote would repeat "abc"
    assert m.accept_bytes(forced) and not m.accept_bytes(b'"')


def _walk(compiled, seed: int) -> list[str]:
    """A random walk over masks; returns the texts produced."""
    rng = random.Random(seed)
    out = []
    for _ in range(6):
        m = GrammarMatcher(compiled)
        text = b""
        for _ in range(60):
            if m.can_terminate():
                break
            ok = sorted(allowed(m))
            t = rng.choice(ok)
            assert m.accept_token(t)
            text += VOCAB.token_bytes[t]
        if m.can_terminate():
            out.append(text.decode())
    return out


def test_random_walks_produce_valid_documents_on_several_threads(compiled):
    validator = jsonschema.Draft202012Validator(SCHEMA)
    results: dict[int, list[str]] = {}

    def run(seed: int) -> None:
        results[seed] = _walk(compiled, seed)

    threads = [threading.Thread(target=run, args=(s,)) for s in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert sorted(results) == [0, 1, 2, 3]  # no thread died
    docs = [d for texts in results.values() for d in texts]
    assert docs
    for d in docs:
        assert validator.is_valid(json.loads(d)), d
    assert results[0] == _walk(compiled, 0)  # threads did not disturb each other


def _assert_bans_match_simulation(compiled, prefixes: list[bytes]) -> None:
    """After each prefix, ``banned`` equals the tokens a matcher copy refuses among those the
    grammar allows."""
    check = compiled.check
    for prefix in prefixes:
        m = GrammarMatcher(compiled)
        assert m.accept_bytes(prefix), prefix
        state = m._checks[-1]
        grammar_ok = np.array([t for t in range(VOCAB.vocab_size) if VOCAB.token_bytes[t] and compiled.next_state(m.state, t) >= 0])
        here = m.state

        def alive(marked: bytes) -> bool:
            return compiled.step_bytes(here, marked) >= 0

        fast = set(check.banned(state, VOCAB.token_bytes, grammar_ok, alive).tolist())
        slow = {t for t in grammar_ok.tolist() if not m.copy().accept_token(t)}
        assert fast == slow, (prefix, sorted(VOCAB.token_bytes[t] for t in fast ^ slow)[:5])


def test_string_shortcut_bans_exactly_what_simulation_bans(compiled):
    _assert_bans_match_simulation(compiled, [b'{"tags":["a","ab",', b'{"tags":["a","ab","', b'{"tags":["a","ab","a',
                                             b'{"tags":["\\u00e9","a","\\u00'])


def test_string_shortcut_inside_nested_unique_arrays_bans_what_simulation_bans():
    """Strings inside a unique array that is itself an item of a unique array: the shortcut bans
    the tokens closing a duplicate string, and the tokens that go on past the quote (closing the
    inner array into a duplicate of an earlier outer item) are simulated."""
    nested = {"type": "array", "uniqueItems": True,
              "items": {"type": "array", "uniqueItems": True, "items": {"type": "string"}}}
    compiled = compile_grammar(json_schema_to_grammar(nested, whitespace="compact"), VOCAB)
    _assert_bans_match_simulation(compiled, [b'[["a","b"],["a","', b'[["a","b"],["a","b', b'[["a"],["b"],["', b'[["a"],[',
                                             b'[["a","b"],["b"],["a","'])
    # The case the simulation exists for: 'b"]' would complete ["a","b"], an earlier outer item.
    m = GrammarMatcher(compiled)
    assert m.accept_bytes(b'[["a","b"],["a","')
    assert tid('b"]') not in allowed(m) and tid('"]') in allowed(m)


def test_duplicates_allowed_by_another_branch_and_the_mark_byte_never_allowed():
    """A duplicate is marked for the automaton (byte 0xFF) and survives in the branch that allows
    it; the model itself can never write that byte, not even where the grammar reads the mark."""
    schema = {"anyOf": [{"maxItems": 2}, {"uniqueItems": True, "items": {"type": "integer"}}]}
    compiled = compile_grammar(json_schema_to_grammar(schema, whitespace="compact"), VOCAB)
    m = GrammarMatcher(compiled)
    assert m.accept_bytes(b"[1,1")
    ok = allowed(m)
    assert 0xFF not in ok and ord("]") in ok and ord(",") not in ok  # a third item needs the unique branch
    assert not m.copy().accept_token(0xFF) and not m.copy().accept_bytes(b"\xff]")
    assert m.accept_token(ord("]")) and m.can_terminate()
    m = GrammarMatcher(compiled)
    assert m.accept_bytes(b"[1,2,") and tid("1]") not in allowed(m) and m.accept_bytes(b"3]") and m.can_terminate()


def test_tokens_inside_object_items_ban_what_simulation_bans(compiled):
    """Inside an object (or deeper) that is an item of a unique array, only tokens closing the
    containers up to that item can complete it: ``banned`` simulates only those, and still bans
    exactly what a matcher refuses."""
    _assert_bans_match_simulation(compiled, [b'{"tags":[{"k":1},{"k":', b'{"tags":[{"k":1},{"k":1', b'{"tags":[{"k":"a"},{"k":"',
                                             b'{"tags":[{"k":"a"},{"k":"a', b'{"tags":[{"k":{"k":1}},{"k":{"k":1',
                                             b'{"tags":[{"k":[1]},{"k":['])
    m = GrammarMatcher(compiled)
    assert m.accept_bytes(b'{"tags":[{"k":1},{"k":')
    ok = allowed(m)
    assert tid("1}") not in ok and tid("1},") not in ok and tid("1}]") not in ok and ord("1") in ok
