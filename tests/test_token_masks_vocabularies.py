"""Masks of real vocabularies (SmolLM2, Qwen2) equal the plain reference walk at random states.

Regex, JSON-schema and EBNF automata are walked with seeded random tokens; at every state the
row the matcher gets (whatever route computed it: string-region split, truncated top frames, the
trie walk) is compared bit for bit with ``mask_reference.ReferenceWalk``. The cross-grammar test
builds a region split with one grammar and checks the masks another grammar gets from it.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from mask_reference import ReferenceWalk, random_walk_check

import grammar
from grammar import GrammarMatcher
from grammar.compiler import CompileBudget
from grammar.token_masks import GrammarMasks

LAZY = CompileBudget(eager_mask_seconds=0)  # every row through the route, none precomputed

CASES = {
    "regex": ("regex", r"(ERROR|WARN|INFO) \[[a-z_.]{1,20}\] [^\n]{0,60}\n(id=[0-9a-f]{8}; )?done"),
    "json_schema": ("json_schema", {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "code": {"type": "string", "maxLength": 6},
            "size": {"type": "number"},
            "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}},
        },
        "required": ["name"],
        "additionalProperties": {"type": "integer"},
    }),
    "ebnf": ("ebnf", 'root ::= list\nlist ::= "[" (value ("," value)*)? "]"\n'
                     'value ::= list | [0-9] [0-9]? | "\\"" ([^"\\\\] | "\\\\" ["\\\\n])* "\\""'),
}

_refs: dict[str, ReferenceWalk] = {}


def _reference(vocab) -> ReferenceWalk:
    if vocab.fingerprint not in _refs:
        _refs[vocab.fingerprint] = ReferenceWalk(vocab)
    return _refs[vocab.fingerprint]


def _compile(kind, source, vocab):
    grammar.clear_cache(keep_setup=True)
    if kind == "regex":
        return grammar.compile_regex(source, vocab, budget=LAZY)
    if kind == "json_schema":
        return grammar.compile_json_schema(source, vocab, budget=LAZY)
    return grammar.compile_ebnf(source, vocab, budget=LAZY)


# Bytes the walks lean towards, so they leave strings and go deep into the structure.
LEAN = {"regex": b" ]\n;=abc", "json_schema": b'",:{}[]abc1 ', "ebnf": b'[[[,1'}


_lean_only: dict[tuple[str, bytes], np.ndarray] = {}


def _made_of(vocab, lean: bytes) -> np.ndarray:
    """bool [vocab]: tokens made of ``lean`` bytes only (once per vocabulary and byte set)."""
    key = (vocab.fingerprint, lean)
    if key not in _lean_only:
        _lean_only[key] = np.array([all(b in lean for b in t) for t in vocab.token_bytes], dtype=bool)
    return _lean_only[key]


def _pick(vocab, choices: list[int], rng: random.Random, lean: bytes) -> int:
    """Random allowed tokens, most of the time one made of ``lean`` bytes only."""
    made_of_lean = _made_of(vocab, lean)
    structural = [t for t in choices if made_of_lean[t]]
    return rng.choice(structural if structural and rng.random() < 0.8 else choices)


def _check_walks(compiled, vocab, seed: int, walks: int, steps: int, lean: bytes = b"") -> int:
    return random_walk_check(compiled, vocab, random.Random(seed), walks=walks, steps=steps,
                             pick=lambda v, choices, step, rng: _pick(v, choices, rng, lean), ref=_reference(vocab))


@pytest.mark.parametrize("case", sorted(CASES))
def test_smollm2_masks_equal_reference(smollm2_vocab, case):
    kind, source = CASES[case]
    compiled = _compile(kind, source, smollm2_vocab)
    assert _check_walks(compiled, smollm2_vocab, seed=7, walks=4, steps=25, lean=LEAN[case]) > 30
    _assert_routes(case, compiled.masks.routes)


def _assert_routes(case: str, routes) -> None:
    """The routes each case is there to exercise did run: the plain walk, regions, and (in the
    grammar with rules, whose states mostly sit inside called rules) truncated top frames."""
    assert routes["walk"] >= (1 if case == "ebnf" else 5), routes
    if case != "regex":  # the regex's free text is counted ({0,60}), never a looping region
        assert routes["region"] >= 1, routes
    if case == "ebnf":
        assert routes["truncated"] >= 5, routes


@pytest.mark.parametrize("case", sorted(CASES))
def test_qwen2_masks_equal_reference(qwen2_vocab, case):
    kind, source = CASES[case]
    compiled = _compile(kind, source, qwen2_vocab)
    assert _check_walks(compiled, qwen2_vocab, seed=11, walks=3, steps=25, lean=LEAN[case]) > 20
    _assert_routes(case, compiled.masks.routes)


def test_masks_through_another_grammars_region_split(qwen2_vocab):
    """A JSON string's split, built while masking one schema, serves a different schema (and a
    regex with the same string shape); the masks it yields there equal the reference."""
    vocab = qwen2_vocab
    first = _compile("json_schema", {"type": "object", "properties": {"a": {"type": "string"}}}, vocab)
    m = GrammarMatcher(first)
    assert m.accept_bytes('{"a": "')
    first.token_mask(m.state)
    splits = first.vocabulary_masks.splits
    hits, size = splits.hits, len(splits)
    second = _compile("json_schema", {"type": "array", "items": {"type": "string"}, "minItems": 1}, vocab)
    m2 = GrammarMatcher(second)
    assert m2.accept_bytes('["x", "')
    row = second.token_mask(m2.state)
    assert second.masks.routes["region"] == 1, second.masks.routes
    assert splits.hits > hits and len(splits) == size, "the split must come from the first grammar's walk"
    assert np.array_equal(row, _reference(vocab).row(second.automaton, m2.state))
    # Deeper into the string (after a multi-byte character and an escape) too.
    for text in ("é", "\\n", "日本", "abc"):
        assert m2.accept_bytes(text)
        assert np.array_equal(second.token_mask(m2.state), _reference(vocab).row(second.automaton, m2.state)), text


def test_end_states_of_budget_masks_equal_stepping_each_token(smollm2_vocab):
    """The walk that records each allowed token's end state (budget-aware masks) agrees with
    stepping the token's bytes through the automaton."""
    vocab = smollm2_vocab
    kind, source = CASES["json_schema"]
    compiled = _compile(kind, source, vocab)
    m = GrammarMatcher(compiled)
    assert m.accept_bytes('{"name": "ab')
    for state in (compiled.initial_state, m.state):
        ids, ends = compiled.masks.allowed_with_end_states(state)
        assert np.array_equal(np.sort(ids), np.flatnonzero(_reference(vocab).allowed(compiled.automaton, state)))
        for token, end in list(zip(ids.tolist(), ends.tolist()))[::17]:
            assert compiled.automaton.step_bytes(state, vocab.token_bytes[token]) == end


def _key_walk(compiled, names, ref) -> None:
    _key_walk_from(compiled, names, 0, ref)


def _key_walk_from(compiled, names, first: int, ref) -> None:
    """Walk ``{"name": true, ...}`` through the names, masking (and checking against ``ref``) at
    each key position from ``first`` on and a few bytes into each of those keys."""
    m = GrammarMatcher(compiled)
    assert m.accept_bytes("{")
    for i, name in enumerate(names):
        assert m.accept_bytes(", " if i else "")
        for chunk in ('"', name[:3], name[3:9]):
            assert m.accept_bytes(chunk)
            if i >= first:
                assert np.array_equal(compiled.token_mask(m.state), ref.row(compiled.automaton, m.state)), (name, chunk)
        assert m.accept_bytes(name[9:] + '": true')


def test_key_positions_of_a_long_object_share_their_parts(qwen2_vocab, monkeypatch):
    """Inside an object with many optional properties and extra keys allowed, every key position
    holds the same extra-key node under a different stack: masks come from the truncated route,
    split per node, and later positions reuse the parts earlier ones computed (most parts are
    cache hits, not walks). Masks equal the reference at each position and inside each key."""
    vocab = qwen2_vocab
    names = [f"option_{i:02d}_{w}" for i, w in enumerate("alpha beta gamma delta kappa lambda sigma omega".split() * 3)]
    schema = {"type": "object", "properties": {n: {"type": "boolean"} for n in names}}
    compiled = _compile("json_schema", schema, vocab)
    calls = {"parts": 0, "walks": 0}
    split, walk_top = type(compiled.automaton).split, GrammarMasks._walk_top

    def counting_split(self, state):
        parts = split(self, state)
        calls["parts"] += len(parts)
        return parts

    def counting_walk(self, top):
        calls["walks"] += 1
        return walk_top(self, top)

    monkeypatch.setattr(type(compiled.automaton), "split", counting_split)
    monkeypatch.setattr(GrammarMasks, "_walk_top", counting_walk)
    _key_walk(compiled, names[:4], _reference(vocab))
    calls.update(parts=0, walks=0)
    _key_walk_from(compiled, names, 4, _reference(vocab))
    routes = compiled.masks.routes
    assert routes["truncated"] >= 3 * len(names), routes
    # Key prefixes over the hole come from the free key's part ("sibling part"), and the free
    # key's part itself from the shared string-region split ("region part").
    assert routes["sibling part"] >= 4 and routes["region part"] >= 1, routes
    assert calls["parts"] > 100 and calls["walks"] * 3 < calls["parts"], calls


@pytest.mark.parametrize("vocab_name", ["smollm2_vocab", "qwen2_vocab"])
def test_sibling_route_equals_reference(vocab_name, request):
    """A regular grammar whose states are a free line with a few bytes spelling a literal
    beside it: their masks come from the free line's mask, corrected on those first bytes."""
    vocab = request.getfixturevalue(vocab_name)
    compiled = _compile("regex", r"x(?:[^\n]*|abc[0-9]+y|b[a-c]{2}é)\n", vocab)
    ref = _reference(vocab)
    for prefix in ("x", "xa", "xab", "xabc", "xb", "xbc", "xzz", "xa\u00e9"[:2], "xé"):
        m = GrammarMatcher(compiled)
        assert m.accept_bytes(prefix), prefix
        assert np.array_equal(compiled.token_mask(m.state), ref.row(compiled.automaton, m.state)), prefix
    assert compiled.masks.routes["sibling"] >= 3, compiled.masks.routes
    assert _check_walks(compiled, vocab, seed=5, walks=3, steps=12, lean=b"abcx1y") > 10


def _masks_equal_reference_at_every_byte(compiled, ref, doc: str) -> None:
    """Walk ``doc`` byte by byte, comparing the mask with ``ref`` before each byte."""
    m = GrammarMatcher(compiled)
    for i in range(len(doc)):
        assert np.array_equal(compiled.token_mask(m.state), ref.row(compiled.automaton, m.state)), doc[:i]
        assert m.accept_bytes(doc[i])
    assert m.can_terminate()


def test_free_key_text_ends_with_its_quote_so_its_parts_take_the_region_route(qwen2_vocab):
    """Keys beside named keys (``additionalProperties``) are the complement of the named keys,
    with free text at every node of their trie. That text carries its closing quote
    (``strings.quoted``), so a state inside it cannot return to its caller mid-string: over a
    hole its part takes the shared string-region split instead of a walk of the vocabulary.
    With the quote left to the caller, 9 parts took the region route on this document."""
    vocab = qwen2_vocab
    inner = {"type": "object", "properties": {"leftPanel": {"type": "boolean"}, "title": {"type": "string"}},
             "additionalProperties": {"type": "string"}}
    schema = {"type": "object", "properties": {"options": {"type": "object", "properties": {"panel": inner},
                                                             "additionalProperties": inner}},
              "additionalProperties": inner}
    compiled = _compile("json_schema", schema, vocab)
    doc = '{"options": {"panel": {"leftPanelX": "a", "lef": "b", "title": "t"}, "other": {"titles": "c", "leftPanel": true}}}'
    _masks_equal_reference_at_every_byte(compiled, _reference(vocab), doc)
    assert compiled.masks.routes["region part"] >= 20, compiled.masks.routes


def test_key_start_under_a_union_of_object_shapes_walks_its_top_whole(qwen2_vocab):
    """At a key's start inside an array of ``anyOf`` object shapes, the top frame unites every
    shape's named keys and its own extra-key trie: a dozen wide parts, none cached yet. One walk
    of the whole top replaces a walk per part; masks equal the reference at every byte, the
    document's keys and the extra keys beside them alike."""
    vocab = qwen2_vocab
    words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot"]
    shapes = [{"type": "object", "properties": {f"{w}_{j}": {"type": "string"} for j in range(3)},
               "required": [f"{w}_0"], "additionalProperties": {"type": "integer"}} for w in words]
    schema = {"type": "object", "properties": {"items": {"type": "array", "items": {"anyOf": shapes}}}}
    compiled = _compile("json_schema", schema, vocab)
    doc = '{"items": [{"bravo_0": "x", "bravo_2": "y", "brave": 1}, {"echo_0": "z", "zulu": 2, "echo_1": "w"}]}'
    _masks_equal_reference_at_every_byte(compiled, _reference(vocab), doc)
    assert compiled.masks.routes["whole top"] >= 1, compiled.masks.routes
