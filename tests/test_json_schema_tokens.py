"""JSON Schema grammars at token level: real tokenizations, masks, and generated documents.

- Valid instances of example schemas, tokenized by SmolLM2 and Qwen2 as a model would emit them,
  are accepted token by token, and each next token is allowed by the mask before it.
- Random walks over masks (byte-level vocabulary) closed with ``shortest_completion`` always
  produce documents that parse and validate with jsonschema: the soundness direction.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import jsonschema
import pytest

from grammar import TokenVocabulary, allocate_token_bitmask, allowed_token_ids
from grammar.json_schema import json_schema_to_grammar

SCHEMAS = Path(__file__).resolve().parents[1] / "schemas"

CASES = [
    ("tool_get_weather", {"location": "Paris, France", "unit": "celsius", "days": 3}),
    ("extract_invoice", {"invoice_number": "INV-001", "date": "2024-03-01", "currency": "EUR", "total": 1234.5,
                         "lines": [{"description": "Widget «deluxe»", "quantity": 2, "unit_price": 617.25}]}),
    ("tree_recursive", {"name": "root", "children": [{"name": "a", "children": []}, {"name": "b"}]}),
    ("numeric_ranges", {"percent": 99.5, "probability": 0.25, "temperature_c": -12.75, "count": 3, "year": 2024, "rating": 5}),
    ("formats_mix", {"id": "123e4567-e89b-12d3-a456-426614174000", "ip": "10.0.0.1", "created": "2024-01-02T03:04:05Z"}),
]


def _schema(name: str) -> dict:
    return json.loads((SCHEMAS / f"{name}.json").read_text())


def _walk_tokens(vocab: TokenVocabulary, tokenizer, schema: dict, text: str) -> bool:
    from grammar.compiler import compile_grammar
    from grammar.matcher import GrammarMatcher

    m = GrammarMatcher(compile_grammar(json_schema_to_grammar(schema), vocab))
    mask = allocate_token_bitmask(1, vocab.vocab_size)
    for tid in tokenizer.encode(text, add_special_tokens=False):
        m.fill_next_token_bitmask(mask)
        allowed = (mask[0, tid // 32] >> (tid % 32)) & 1
        if not allowed:
            assert not m.copy().accept_token(tid), "mask disallows a token the matcher accepts"
            return False
        assert m.accept_token(tid)
    return m.can_terminate()


@pytest.mark.parametrize("name, instance", CASES)
def test_valid_instances_token_by_token_smollm2(smollm2_vocab, smollm2_tokenizer, name, instance):
    schema = _schema(name)
    jsonschema.validate(instance, schema)
    assert _walk_tokens(smollm2_vocab, smollm2_tokenizer, schema, json.dumps(instance, ensure_ascii=False))
    assert _walk_tokens(smollm2_vocab, smollm2_tokenizer, schema, json.dumps(instance))


@pytest.mark.parametrize("name, instance", CASES[:3])
def test_valid_instances_token_by_token_qwen2(qwen2_vocab, qwen2_tokenizer, name, instance):
    schema = _schema(name)
    assert _walk_tokens(qwen2_vocab, qwen2_tokenizer, schema, json.dumps(instance, ensure_ascii=False))


def test_invalid_instance_rejected_token_by_token(smollm2_vocab, smollm2_tokenizer):
    schema = _schema("tool_get_weather")
    bad = {"location": "Paris", "unit": "kelvin"}
    assert not jsonschema.Draft202012Validator(schema).is_valid(bad)
    assert not _walk_tokens(smollm2_vocab, smollm2_tokenizer, schema, json.dumps(bad))


def _random_document(compiled, vocab: TokenVocabulary, rng: random.Random, steps: int) -> bytes:
    from grammar.matcher import GrammarMatcher

    m = GrammarMatcher(compiled)
    mask = allocate_token_bitmask(1, vocab.vocab_size)
    out = b""
    eos = min(vocab.eos_token_ids)
    for _ in range(steps):
        m.fill_next_token_bitmask(mask)
        ids = [int(t) for t in allowed_token_ids(mask[0], vocab.vocab_size) if t != eos]
        if not ids or (m.can_terminate() and rng.random() < 0.3):
            break
        tid = rng.choice(ids)
        assert m.accept_token(tid)
        out += vocab.token_bytes[tid]
    tail = m.shortest_completion()
    assert m.accept_bytes(tail) and m.can_terminate()
    return out + tail


@pytest.mark.parametrize("path", sorted(SCHEMAS.glob("*.json")), ids=lambda p: p.stem)
def test_generated_documents_validate(path):
    from grammar.compiler import compile_grammar

    schema = json.loads(path.read_text())
    vocab = TokenVocabulary.byte_level()
    compiled = compile_grammar(json_schema_to_grammar(schema), vocab)
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
    rng = random.Random(path.stem)
    for _ in range(4):
        doc = _random_document(compiled, vocab, rng, steps=60)
        value = json.loads(doc.decode("utf-8"))
        errors = [e.message for e in validator.iter_errors(value)]
        assert not errors, (doc, errors)
