"""Budget-aware closing under an adversarial "model", with the SmolLM2 vocabulary.

``GrammarMatcher.fill_next_token_bitmask(..., remaining_tokens=n)`` promises that whatever the
caller picks from the mask, a complete document still fits in the ``n`` tokens left (EOS
included). Here the caller is hostile: it picks the allowed token that leaves the document
*furthest* from complete, or a random allowed token, and never EOS while anything else is allowed.
Every walk must still end with EOS accepted within the budget, and the text must be valid by an
independent judge (``jsonschema``, ``re.fullmatch``, ``json.loads``).
"""

from __future__ import annotations

import ast
import json
import random
import re
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from grammar import GrammarMatcher, allowed_token_ids, compile_ebnf, compile_json_schema, compile_regex

GRAMMARS = Path(__file__).resolve().parent / "grammars"

SCHEMAS = {
    "nested_objects": {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "address": {
                        "type": "object",
                        "properties": {"city": {"type": "string"}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                        "required": ["city", "zip"],
                        "additionalProperties": False,
                    },
                },
                "required": ["name", "address"],
                "additionalProperties": False,
            },
            "note": {"type": "string"},
        },
        "required": ["user"],
        "additionalProperties": False,
    },
    "array_min_items": {
        "type": "array",
        "minItems": 3,
        "items": {
            "type": "object",
            "properties": {"id": {"type": "integer", "minimum": 100}, "tags": {"type": "array", "items": {"type": "string"}}},
            "required": ["id"],
            "additionalProperties": False,
        },
    },
    "long_strings": {
        "type": "object",
        "properties": {"title": {"type": "string", "minLength": 10}, "body": {"type": "string", "maxLength": 500}},
        "required": ["title", "body"],
        "additionalProperties": False,
    },
    "numbers": {
        "type": "object",
        "properties": {
            "x": {"type": "number"},
            "n": {"type": "integer", "minimum": -1000, "maximum": 1000000},
            "p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        },
        "required": ["x", "n", "p"],
        "additionalProperties": False,
    },
    "open_object": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
    "recursive_tree": {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
                "required": ["v", "kids"],
                "additionalProperties": False,
            }
        },
        "$ref": "#/$defs/node",
    },
    "anyof_formats": {
        "type": "array",
        "minItems": 1,
        "items": {"anyOf": [{"type": "string", "format": "date-time"}, {"type": "string", "format": "uuid"}, {"type": "null"}]},
    },
}

REGEXES = {
    "csv_words": r"[a-z]+(,[a-z]+)*;",
    "digits_at_least": r"[0-9]{3,}-[A-Z]{2,}",
    "email": r"[a-z0-9._%+-]+@[a-z0-9-]+(\.[a-z0-9-]+)*\.[a-z]{2,6}",
    "nested_groups": r"\((\w+( \w+)*)\)( and \((\w+( \w+)*)\))*\.",
}

SLACK = [0, 3, 12]  # extra tokens over the tightest budget: 0 leaves exactly one way out


def _distances(matcher: GrammarMatcher):
    # The compiled grammar's own per-state table: allowed token ids and, for each, the
    # fewest bytes to a complete document after it (what the adversary wants to maximize).
    return matcher.compiled._distances_after_token(matcher.state)


def _pick(matcher: GrammarMatcher, row: np.ndarray, vocab, policy: str, rng: random.Random) -> int:
    allowed = allowed_token_ids(row, vocab.vocab_size)
    eos = set(vocab.eos_token_ids)
    content = [int(t) for t in allowed if int(t) not in eos]
    if not content:
        return min(int(t) for t in allowed)
    if policy == "random":
        return rng.choice(content)
    ids, dists = _distances(matcher)
    score = dict(zip(ids.tolist(), dists.tolist()))
    # Furthest from completion; among equals the longest token (most bytes spent per step).
    return max(content, key=lambda t: (score[t], len(vocab.token_bytes[t]), t))


def _walk(compiled, vocab, budget: int, policy: str, seed: int = 0) -> bytes:
    """Drive a matcher adversarially; return the text, asserting EOS is accepted in budget."""
    matcher = GrammarMatcher(compiled)
    row = np.zeros((1, compiled.mask_width), dtype=np.int32)
    rng = random.Random(seed)
    ids: list[int] = []
    for used in range(budget):
        matcher.fill_next_token_bitmask(row, 0, remaining_tokens=budget - used)
        token = _pick(matcher, row[0], vocab, policy, rng)
        assert matcher.accept_token(token), (policy, vocab.decode_bytes(ids), token)
        ids.append(token)
        if matcher.is_terminated():
            break
    text = vocab.decode_bytes([t for t in ids if t not in vocab.eos_token_ids])
    assert matcher.is_terminated(), f"{policy}: no EOS within {budget} tokens: {text!r}"
    assert len(ids) <= budget
    return text


def _tightest(compiled) -> int:
    """Tokens needed at least under the byte-per-token assumption: shortest completion + EOS."""
    return len(GrammarMatcher(compiled).shortest_completion()) + 1


@pytest.mark.parametrize("policy", ["furthest", "random"])
@pytest.mark.parametrize("slack", SLACK)
@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_json_schema_closes_within_budget(smollm2_vocab, name, slack, policy):
    schema = SCHEMAS[name]
    compiled = compile_json_schema(schema, smollm2_vocab)
    budget = _tightest(compiled) + slack
    for seed in range(2 if policy == "random" else 1):
        text = _walk(compiled, smollm2_vocab, budget, policy, seed)
        jsonschema.validate(json.loads(text), schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)


@pytest.mark.parametrize("policy", ["furthest", "random"])
@pytest.mark.parametrize("slack", SLACK)
@pytest.mark.parametrize("name", sorted(REGEXES))
def test_regex_closes_within_budget(smollm2_vocab, name, slack, policy):
    pattern = REGEXES[name]
    compiled = compile_regex(pattern, smollm2_vocab)
    budget = _tightest(compiled) + slack
    for seed in range(2 if policy == "random" else 1):
        text = _walk(compiled, smollm2_vocab, budget, policy, seed).decode("utf-8")
        assert re.fullmatch(pattern, text), (pattern, text)


@pytest.mark.parametrize("policy", ["furthest", "random"])
@pytest.mark.parametrize("slack", [0, 10, 40])
def test_ebnf_json_grammar_closes_within_budget(smollm2_vocab, slack, policy):
    compiled = compile_ebnf((GRAMMARS / "json.ebnf").read_text(), smollm2_vocab)
    budget = _tightest(compiled) + slack
    for seed in range(2 if policy == "random" else 1):
        text = _walk(compiled, smollm2_vocab, budget, policy, seed)
        json.loads(text)


@pytest.mark.parametrize("policy", ["furthest", "random"])
@pytest.mark.parametrize("slack", [0, 5, 30])
def test_ebnf_arith_grammar_closes_within_budget(smollm2_vocab, slack, policy):
    compiled = compile_ebnf((GRAMMARS / "arith.ebnf").read_text(), smollm2_vocab)
    budget = _tightest(compiled) + slack
    for seed in range(2 if policy == "random" else 1):
        text = _walk(compiled, smollm2_vocab, budget, policy, seed).decode()
        # Independent judge: the language is a subset of Python expressions once integer
        # literals lose their leading zeros (Python refuses "01").
        tree = ast.parse(re.sub(r"(?<![\d.])0+(?=\d)", "", text), mode="eval")
        assert isinstance(tree.body, (ast.BinOp, ast.UnaryOp, ast.Constant)), text


def test_too_small_budget_never_empties_the_mask(smollm2_vocab):
    """A budget below the shortest document cannot be met: the mask falls back to the plain one
    (never an empty row, which would leave the sampler nothing to pick)."""
    compiled = compile_json_schema(SCHEMAS["nested_objects"], smollm2_vocab)
    matcher = GrammarMatcher(compiled)
    row = np.zeros((1, compiled.mask_width), dtype=np.int32)
    plain = row.copy()
    for remaining in (1, 2, 5):
        matcher.fill_next_token_bitmask(row, 0, remaining_tokens=remaining)
        matcher.fill_next_token_bitmask(plain, 0)
        assert np.array_equal(row, plain)


def test_adversary_is_not_vacuous(smollm2_vocab):
    """Without the budget the furthest-first adversary never closes a string: the budget is what
    makes the walks above end (so those tests can fail)."""
    compiled = compile_json_schema(SCHEMAS["long_strings"], smollm2_vocab)
    matcher = GrammarMatcher(compiled)
    row = np.zeros((1, compiled.mask_width), dtype=np.int32)
    rng = random.Random(0)
    for _ in range(60):
        matcher.fill_next_token_bitmask(row, 0)
        assert matcher.accept_token(_pick(matcher, row[0], smollm2_vocab, "furthest", rng))
    assert not matcher.is_terminated() and not matcher.can_terminate()


def test_budget_narrows_only_when_needed(smollm2_vocab):
    """A generous budget leaves the plain mask; a tight one removes tokens but keeps a way out."""
    compiled = compile_json_schema(SCHEMAS["long_strings"], smollm2_vocab)
    matcher = GrammarMatcher(compiled)
    assert matcher.accept_bytes(b'{"title": "abcdefghijkl", "body": "')
    plain = np.zeros((1, compiled.mask_width), dtype=np.int32)
    tight = plain.copy()
    matcher.fill_next_token_bitmask(plain, 0)
    matcher.fill_next_token_bitmask(tight, 0, remaining_tokens=10_000)
    assert np.array_equal(plain, tight)
    matcher.fill_next_token_bitmask(tight, 0, remaining_tokens=4)  # '"', '}', EOS: 3 tokens needed
    ids = set(allowed_token_ids(tight[0], smollm2_vocab.vocab_size).tolist())
    quote = smollm2_vocab.token_bytes.index(b'"')
    assert quote in ids
    assert ids < set(allowed_token_ids(plain[0], smollm2_vocab.vocab_size).tolist())
