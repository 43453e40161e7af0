"""JSON Schema lowering: refused keywords, invalid and unsatisfiable schemas, budgets."""

from __future__ import annotations

import pytest

from grammar import SchemaError, UnsupportedFeatureError
from grammar.json_schema import json_schema_to_grammar


@pytest.mark.parametrize(
    "schema, keyword",
    [
        ({"not": {"type": "array", "uniqueItems": True}}, "uniqueItems"),
        ({"type": "integer", "multipleOf": 123456789}, "multipleOf"),
        ({"not": {"type": "string", "format": "email"}}, "format"),
        ({"oneOf": [{"format": "date"}, {"maxLength": 3}]}, "format"),
        ({"not": {"pattern": "^a{,3}"}}, "pattern"),  # ECMA reads {,3} as text, Python as a repeat
        ({"type": "string", "pattern": "(?<=a)b"}, "pattern"),
        ({"type": "object", "patternProperties": {"(?<=a)b": {}}}, "patternProperties"),
        ({"$recursiveRef": "#"}, "$recursiveRef"),
        ({"type": "string", "pattern": "a+", "maxLength": 100000}, "maxLength"),
    ],
)
def test_refused_keywords_name_keyword_and_pointer(schema, keyword):
    with pytest.raises(UnsupportedFeatureError) as exc:
        json_schema_to_grammar({"properties": {"p": schema}, "type": "object"})
    assert keyword in str(exc.value)
    assert "/properties/p" in str(exc.value) or keyword in ("format", "pattern")


def test_relax_keywords_ignores_the_keyword():
    schema = {"type": "string", "pattern": "(?<=a)b"}
    g = json_schema_to_grammar(schema, relax_keywords=["pattern"])
    assert g.rules
    with pytest.raises(UnsupportedFeatureError):
        json_schema_to_grammar(schema, relax_keywords=["maxContains"])


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


def test_union_bomb_is_cut_to_a_subset_and_never_complemented():
    # Each level doubles the distinct object shapes. Past MAX_BRANCHES the union keeps its
    # simplest members: a subset (never an invalid instance), so its complement is refused.
    from grammar.compiler import compile_grammar
    from grammar.matcher import GrammarMatcher
    from grammar import TokenVocabulary

    defs = {"d0": {"type": "object"}}
    for i in range(1, 10):
        defs[f"d{i}"] = {"anyOf": [{"allOf": [{"$ref": f"#/$defs/d{i-1}"}, {"required": [f"a{i}"]}]},
                                   {"allOf": [{"$ref": f"#/$defs/d{i-1}"}, {"required": [f"b{i}"]}]}]}
    compiled = compile_grammar(json_schema_to_grammar({"$defs": defs, "$ref": "#/$defs/d9"}), TokenVocabulary.byte_level())
    assert not GrammarMatcher(compiled).accept_bytes(b"{}")
    with pytest.raises(UnsupportedFeatureError, match="'not'"):
        json_schema_to_grammar({"$defs": defs, "not": {"$ref": "#/$defs/d9"}})


def test_repeated_numeric_ranges_stay_small():
    # Formerly a reference bomb: every level denotes the same few integer ranges (memoized, merged).
    defs = {"d0": {"type": "integer"}}
    for i in range(1, 40):
        defs[f"d{i}"] = {"anyOf": [{"allOf": [{"$ref": f"#/$defs/d{i-1}"}, {"minimum": 0}]}, {"allOf": [{"$ref": f"#/$defs/d{i-1}"}, {"maximum": 10}]}]}
    g = json_schema_to_grammar({"$defs": defs, "allOf": [{"$ref": "#/$defs/d39"}]})
    assert g.rules


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
