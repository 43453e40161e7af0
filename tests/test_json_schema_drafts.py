"""Drafts: ``$schema`` or the ``json_schema_draft`` option picks each draft's own rules, judged by
jsonschema's validator for that draft; ``json_schema_formats`` makes ``format`` an annotation; the
options travel SamplingParams -> grammar backend -> compiler."""

from __future__ import annotations

import json

import jsonschema
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from engine.constrained.grammar_backend import GrammarBackend
from engine.entrypoints.openai_mapping import to_sampling_params
from engine.sampling_params import InvalidSamplingParams, SamplingParams
from grammar import GrammarBudgetError, SchemaError, TokenVocabulary, UnsupportedFeatureError
from grammar.compiler import compile_grammar
from grammar.json_schema import json_schema_to_grammar
from grammar.matcher import GrammarMatcher
from property_budget import examples
from test_json_schema_algebra import SETTINGS, _accepts, _orders, instances, schemas

BYTES = TokenVocabulary.byte_level()
VALIDATORS = {"draft4": jsonschema.Draft4Validator, "draft6": jsonschema.Draft6Validator, "draft7": jsonschema.Draft7Validator,
              "2019-09": jsonschema.Draft201909Validator, "2020-12": jsonschema.Draft202012Validator}


def accepts(schema, value, **options) -> bool:
    m = GrammarMatcher(compile_grammar(json_schema_to_grammar(schema, **options), BYTES))
    return m.accept_bytes(json.dumps(value)) and m.can_terminate()


REF_WITH_SIBLINGS = {"definitions": {"s": {"type": "string"}}, "$defs": {"s": {"type": "string"}},
                     "properties": {"a": {"$ref": "#/definitions/s", "maxLength": 1}}}
CASES = [
    # (schema, instances): each judged under every draft whose metaschema accepts the schema.
    (REF_WITH_SIBLINGS, [{"a": "xyz"}, {"a": "x"}, {"a": 1}]),
    ({"prefixItems": [{"type": "integer"}], "items": {"type": "string"}}, [[1, "a"], ["a", "a"], [1, 2]]),
    ({"items": [{"type": "integer"}], "additionalItems": {"type": "string"}}, [[1, "a"], [1, 2], ["a"]]),
    ({"dependencies": {"a": ["b"]}, "dependentRequired": {"b": ["c"]}}, [{"a": 1}, {"a": 1, "b": 2}, {"b": 1, "c": 2}]),
    ({"if": {"type": "integer"}, "then": {"minimum": 3}, "else": {"type": "string"}}, [1, 5, "a", None]),
    ({"const": 1, "contains": {"type": "string"}, "propertyNames": {"maxLength": 1}}, [1, ["a"], [1], {"ab": 1}]),
    ({"minContains": 2, "contains": {"type": "integer"}}, [[1], [1, 2], ["a"]]),
    ({"maximum": 3, "exclusiveMaximum": True, "minimum": 1, "exclusiveMinimum": True}, [1, 2, 3]),
    ({"exclusiveMaximum": 3, "exclusiveMinimum": 1}, [1, 2, 3]),
    ({"unevaluatedProperties": False, "properties": {"a": {}}}, [{"a": 1}, {"b": 1}]),
]


@pytest.mark.parametrize("draft", list(VALIDATORS))
@pytest.mark.parametrize("schema,instances", CASES)
def test_each_draft_follows_its_own_rules(draft, schema, instances):
    cls = VALIDATORS[draft]
    if not cls(cls.META_SCHEMA).is_valid(schema):
        pytest.skip("not a schema of this draft")
    for value in instances:
        expected = cls(schema).is_valid(value)
        assert accepts(schema, value, draft=draft) == expected, (draft, value, expected)
        # "$schema" at the root says the same as the option, and wins over another option.
        named = {"$schema": cls.META_SCHEMA.get("$schema") or cls.META_SCHEMA["id"], **schema}
        other = "draft7" if draft != "draft7" else "2020-12"
        assert accepts(named, value, draft=other) == expected, (draft, value, "$schema")


def test_ref_overrides_a_sibling_id_up_to_draft_07():
    schema = {"$id": "http://example.com/root.json", "definitions": {"A": {"type": "integer"}},
              "properties": {"a": {"$id": "http://example.com/other.json", "$ref": "#/definitions/A"}}}
    for draft in ("draft6", "draft7"):
        assert accepts(schema, {"a": 1}, draft=draft) and not accepts(schema, {"a": "x"}, draft=draft)


def test_draft_04_id_and_2019_09_recursive_references():
    d4 = {"id": "http://example.com/root.json", "definitions": {"A": {"id": "#foo", "type": "integer"}},
          "properties": {"a": {"$ref": "#foo"}}}
    assert accepts(d4, {"a": 1}, draft="draft4") and not accepts(d4, {"a": "x"}, draft="draft4")
    tree = {"$id": "http://example.com/tree", "$recursiveAnchor": True, "type": "object",
            "properties": {"kids": {"type": "array", "items": {"$recursiveRef": "#"}}}}
    strict = {"$id": "http://example.com/strict", "$recursiveAnchor": True, "$ref": "tree", "unevaluatedProperties": False}
    both = {"$schema": "https://json-schema.org/draft/2019-09/schema", "$defs": {"tree": tree}, **strict,
            "$id": "http://example.com/strict", "$ref": "http://example.com/tree"}
    validator = jsonschema.Draft201909Validator(both)
    for value in [{"kids": [{"kids": []}]}, {"kids": [{"kids": [], "x": 1}]}, {"x": 1}, {"kids": [1]}]:
        assert accepts(both, value) == validator.is_valid(value), value


def test_formats_assert_by_default_or_annotate():
    assert not accepts({"format": "date"}, "x") and accepts({"format": "date"}, "2024-01-31")
    assert accepts({"format": "date"}, "x", formats="annotate")
    with pytest.raises(SchemaError, match="json_schema_formats"):
        json_schema_to_grammar({}, formats="loose")
    with pytest.raises(SchemaError, match="json_schema_draft"):
        json_schema_to_grammar({}, draft="draft-99")


def test_options_travel_from_sampling_params_to_the_compiler():
    with pytest.raises(InvalidSamplingParams, match="json_schema_draft"):
        SamplingParams(json_schema={}, json_schema_draft="draft-99").verify()
    with pytest.raises(InvalidSamplingParams, match="json_schema_formats"):
        SamplingParams(json_schema={}, json_schema_formats="loose").verify()
    request = {"model": "m", "messages": [], "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}},
               "json_schema_draft": "draft-07", "json_schema_formats": "annotate"}
    params = to_sampling_params(request)  # the server's extensions
    assert (params.json_schema_draft, params.json_schema_formats) == ("draft-07", "annotate")
    backend = GrammarBackend(BYTES)
    try:
        for draft, ok in ((None, False), ("draft-07", True)):
            params = SamplingParams(json_schema=REF_WITH_SIBLINGS, json_schema_draft=draft)
            m = GrammarMatcher(backend.compile(params))
            assert (m.accept_bytes(b'{"a": "xyz"}') and m.can_terminate()) == ok, draft
        m = GrammarMatcher(backend.compile(SamplingParams(json_schema={"format": "date"}, json_schema_formats="annotate")))
        assert m.accept_bytes(b'"x"') and m.can_terminate()
    finally:
        backend.shutdown()


@settings(SETTINGS, max_examples=examples(30))
@given(st.sampled_from(list(VALIDATORS)), schemas, st.lists(instances, min_size=4, max_size=8))
def test_generated_schemas_under_each_draft(draft, schema, values):
    """The algebra's generated schemas (2020-12 keywords, which older drafts ignore) under each
    draft, judged by that draft's validator."""
    cls = VALIDATORS[draft]
    assume(cls(cls.META_SCHEMA).is_valid(schema))
    validator = cls(schema)
    try:
        compiled = compile_grammar(json_schema_to_grammar(schema, draft=draft), BYTES)
    except (UnsupportedFeatureError, GrammarBudgetError):
        assume(False)
        return
    except SchemaError as exc:
        assert "unsatisfiable" in str(exc) and not any(validator.is_valid(v) for v in values), (draft, schema, exc)
        return
    for v in values:
        ok = any(_accepts(compiled, json.dumps(o)) for o in _orders(v))
        assert ok == validator.is_valid(v), (draft, schema, v, validator.is_valid(v))


INTEGER_SCHEMAS = [
    {"type": "integer"},
    {"type": "integer", "minimum": 0, "maximum": 10},
    {"type": "integer", "enum": [1, 2.0, 3.5]},
    {"type": "integer", "multipleOf": 2},
    {"type": "integer", "not": {"enum": [4]}, "maximum": 6},
    {"type": "object", "oneOf": [{"properties": {"t": {"enum": ["a"]}, "n": {"type": "integer"}}},
                                 {"properties": {"t": {"enum": ["b"]}, "n": {"type": "integer"}}}]},
]  # fmt: skip
NUMBER_TEXTS = ["1", "1.0", "2", "2.0", "2.00", "4", "-0", "0.0", "1e2", "1E+1", "3.5", "6", "12345.0"]


@pytest.mark.parametrize("schema", INTEGER_SCHEMAS)
def test_integer_spelling_follows_the_draft(schema):
    """Draft-04's integer is a number without fraction or exponent (1.0 is not one, as jsonschema's
    Draft4Validator reads the parsed value); from draft-06 on 1.0 is an integer. MaskBench found
    ``"userId": 12345.0`` accepted under draft-04 (Github_trivial---o14485)."""
    texts = NUMBER_TEXTS if schema.get("type") != "object" else [f'{{"t": "a", "n": {t}}}' for t in NUMBER_TEXTS]
    for draft, validator in (("draft-04", jsonschema.Draft4Validator), ("draft-07", jsonschema.Draft7Validator)):
        compiled = compile_grammar(json_schema_to_grammar(schema, draft=draft), BYTES)
        for text in texts:
            valid = validator(schema).is_valid(json.loads(text))
            if "e" in text.lower():  # bounded numbers are written without exponents: never invalid
                assert valid or not _accepts(compiled, text), (draft, schema, text, valid)
            else:
                assert _accepts(compiled, text) == valid, (draft, schema, text, valid)
