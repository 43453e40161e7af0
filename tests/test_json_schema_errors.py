"""JSON Schema lowering: refused keywords, invalid and unsatisfiable schemas, budgets."""

from __future__ import annotations

import pytest

from grammar import GrammarBudgetError, SchemaError, UnsupportedFeatureError
from grammar.json_schema import json_schema_to_grammar


@pytest.mark.parametrize(
    "schema, keyword",
    [
        ({"type": "array", "uniqueItems": True}, "uniqueItems"),
        ({"type": "array", "contains": {"type": "integer"}, "maxContains": 2}, "maxContains"),
        ({"type": "object", "unevaluatedProperties": False}, "unevaluatedProperties"),
        ({"type": "number", "multipleOf": 0.3}, "multipleOf"),
        ({"type": "integer", "multipleOf": 7, "minimum": 3}, "multipleOf"),
        ({"type": "string", "format": "json-pointer"}, "format"),
        ({"oneOf": [{"type": "integer"}, {"minimum": 3}]}, "oneOf"),
        ({"oneOf": [{"type": "integer"}, {"type": "number", "maximum": 5}]}, "oneOf"),
        ({"not": {"minimum": 3}}, "not"),
        ({"if": {"minimum": 3}, "then": {"multipleOf": 2}}, "if"),
        ({"type": "string", "pattern": "a", "maxLength": 3}, "maxLength"),
        ({"type": "object", "patternProperties": {"^x": {"type": "integer"}}}, "patternProperties"),
        ({"allOf": [{"type": "string", "pattern": "a"}, {"pattern": "b"}]}, "pattern"),
    ],
)
def test_refused_keywords_name_keyword_and_pointer(schema, keyword):
    with pytest.raises(UnsupportedFeatureError) as exc:
        json_schema_to_grammar({"properties": {"p": schema}, "type": "object"})
    assert keyword in str(exc.value)
    assert "/properties/p" in str(exc.value) or keyword in ("format", "pattern")


def test_relax_keywords_ignores_the_keyword():
    g = json_schema_to_grammar({"type": "array", "uniqueItems": True}, relax_keywords=["uniqueItems"])
    assert g.rules
    with pytest.raises(UnsupportedFeatureError):
        json_schema_to_grammar({"type": "array", "uniqueItems": True}, relax_keywords=["maxContains"])


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "integer", "minimum": 5, "maximum": 3},
        {"type": "string", "minLength": 4, "maxLength": 2},
        {"type": "object", "properties": {"a": False}, "required": ["a"]},
        {"type": "object", "additionalProperties": False, "required": ["zz"]},
        {"allOf": [{"type": "string"}, {"type": "integer"}]},
        {"enum": [1, 2], "type": "string"},
        {"type": "array", "items": False, "minItems": 1},
        {"type": "number", "exclusiveMinimum": 1, "exclusiveMaximum": 1},
        False,
        {"not": {}},
    ],
)
def test_unsatisfiable_schemas(schema):
    with pytest.raises(SchemaError, match="unsatisfiable"):
        json_schema_to_grammar(schema)


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "strin"},
        {"minimum": "3"},
        {"required": "a"},
        {"properties": []},
        '{"type": ',
        [1, 2],
    ],
)
def test_invalid_schemas(schema):
    with pytest.raises(SchemaError):
        json_schema_to_grammar(schema)


def test_unresolvable_and_remote_refs():
    with pytest.raises(SchemaError):
        json_schema_to_grammar({"$ref": "#/$defs/missing"})
    with pytest.raises(UnsupportedFeatureError):
        json_schema_to_grammar({"$ref": "https://example.com/other.json"})
    with pytest.raises(SchemaError):
        json_schema_to_grammar({"$ref": "#nowhere"})


def test_reference_bomb_hits_budget():
    defs = {"d0": {"type": "integer"}}
    for i in range(1, 40):
        defs[f"d{i}"] = {"anyOf": [{"allOf": [{"$ref": f"#/$defs/d{i-1}"}, {"minimum": 0}]}, {"allOf": [{"$ref": f"#/$defs/d{i-1}"}, {"maximum": 10}]}]}
    with pytest.raises(GrammarBudgetError):
        json_schema_to_grammar({"$defs": defs, "allOf": [{"$ref": "#/$defs/d39"}]})


def test_bad_options():
    with pytest.raises(SchemaError):
        json_schema_to_grammar({}, whitespace="pretty")
    with pytest.raises(SchemaError):
        json_schema_to_grammar({}, max_whitespace=-1)


def test_refs_cycle_without_content():
    with pytest.raises(SchemaError):
        json_schema_to_grammar({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "allOf": [{"$ref": "#/$defs/a"}]})


def test_unknown_format_is_an_annotation():
    g = json_schema_to_grammar({"type": "string", "format": "x-custom-thing"})
    assert g.rules
