"""Accept/reject tables for the keywords the algebra enforces (checked against jsonschema, the IR
interpreter and the compiled matcher, as in test_json_schema.py)."""

from __future__ import annotations

import pytest

from grammar import UnsupportedFeatureError
from grammar.json_schema import json_schema_to_grammar
from test_json_schema import check


def test_one_of_overlapping_branches():
    check({"oneOf": [{"type": "integer"}, {"minimum": 2}]}, valid=[1, 2.5, -3, "x"], invalid=[2, 3])
    check({"type": "string", "oneOf": [{"minLength": 2}, {"pattern": "^a"}]}, valid=["a", "bc", "zz"], invalid=["ab", ""])
    check({"oneOf": [{"required": ["a"]}, {"required": ["b"]}], "type": "object"}, valid=[{"a": 1}, {"b": 1}], invalid=[{"a": 1, "b": 2}, {}])
    # A tagged union whose tag is optional: objects without it match every branch (invalid).
    check({"oneOf": [{"properties": {"kind": {"const": "x"}, "n": {"type": "integer"}}},
                     {"properties": {"kind": {"const": "y"}, "n": {"type": "string"}}}], "type": "object"},
          valid=[{"kind": "x", "n": 1}, {"kind": "y", "n": "s"}, {"n": 2}], invalid=[{"kind": "x", "n": "s"}, {}, {"kind": "z"}])


def test_not_of_every_type():
    check({"not": {"minimum": 3}}, valid=[2, 2.99], invalid=[3, 4.5, "x", None])
    check({"not": {"type": "object", "properties": {"a": {"type": "string"}}}}, valid=[{"a": 1}, 1, []], invalid=[{}, {"a": "s"}])
    check({"not": {"items": {"type": "integer"}}}, valid=[["x"], [1, "x"]], invalid=[[], [1, 2], 5])
    check({"not": {"contains": {"const": 1}}}, valid=[[], [2]], invalid=[[1], [2, 1], "s"])
    check({"not": {"pattern": "^a"}, "type": "string"}, valid=["", "ba"], invalid=["a", "ab"])
    check({"not": {"not": {"pattern": "^a$"}}, "type": "string"}, valid=["a"], invalid=["b", "ab"])
    check({"not": {"multipleOf": 2}, "type": "integer"}, valid=[1, -3, 7], invalid=[0, 2, -4])
    check({"not": {"propertyNames": {"maxLength": 1}}, "type": "object"}, valid=[{"ab": 1}], invalid=[{}, {"a": 1}])
    check({"not": {"anyOf": [{"type": "string"}, {"type": "null"}]}}, valid=[1, [], {}], invalid=["s", None])


def test_if_then_else():
    check({"if": {"exclusiveMaximum": 0}, "then": {"minimum": -10}, "else": {"multipleOf": 2}},
          valid=[-1, 0, 4, "x"], invalid=[-11, 3])
    check({"type": "object", "if": {"required": ["a"]}, "then": {"required": ["b"]}, "else": {"required": ["c"]}},
          valid=[{"a": 1, "b": 2}, {"c": 1}], invalid=[{"a": 1}, {}])
    check({"if": {"type": "string"}, "then": {"maxLength": 2}}, valid=["ab", 12345], invalid=["abc"])


def test_dependent_schemas_and_required():
    check({"type": "object", "dependentSchemas": {"a": {"properties": {"b": {"type": "integer"}}, "required": ["b"]}}},
          valid=[{}, {"b": "s"}, {"b": 2, "a": 1}], invalid=[{"a": 1}, {"b": "s", "a": 1}])  # "b" is a property, so it comes first


def test_pattern_properties_with_named_and_additional():
    schema = {"type": "object", "properties": {"ab": {"type": "integer"}}, "patternProperties": {"^a": {"minimum": 0}, "b$": {"maximum": 10}},
              "additionalProperties": {"type": "string"}}
    check(schema, valid=[{"ab": 5}, {"ax": 1, "xb": 5}, {"zz": "s"}, {"ab": 5, "zz": "s"}],
          invalid=[{"ab": -1}, {"ab": 11}, {"ab": "s"}, {"zz": 1}, {"axb": 11}, {"axb": -1}])
    check({"type": "object", "propertyNames": {"pattern": "^[a-c]+$"}, "patternProperties": {"^a": {"type": "integer"}}},
          valid=[{"a": 1, "bc": "s"}], invalid=[{"d": 1}, {"a": "s"}])


def test_contains_counts():
    check({"type": "array", "contains": {"type": "integer"}, "minContains": 2, "maxContains": 3},
          valid=[[1, 2], ["a", 1, "b", 2, 3]], invalid=[[1], [1, 2, 3, 4], []])
    check({"type": "array", "contains": {"const": 0}, "maxContains": 1, "minContains": 0}, valid=[[], [1], [0, 1]], invalid=[[0, 0]])
    check({"type": "array", "prefixItems": [{"type": "string"}], "contains": {"type": "string"}, "minContains": 2, "maxItems": 3},
          valid=[["a", "b"], ["a", 1, "b"]], invalid=[["a"], ["a", 1], ["a", "b", "c", "d"]])


def test_unevaluated_properties_and_items():
    check({"type": "object", "properties": {"a": {}}, "anyOf": [{"properties": {"b": {}}}, {"properties": {"c": {}}}], "unevaluatedProperties": False},
          valid=[{"a": 1}, {"a": 1, "b": 2}, {"b": 1, "c": 2}], invalid=[{"d": 1}, {"a": 1, "d": 2}])
    check({"type": "object", "allOf": [{"properties": {"a": {"type": "integer"}}}], "unevaluatedProperties": {"type": "string"}},
          valid=[{"a": 1, "z": "s"}], invalid=[{"a": 1, "z": 2}, {"a": "s"}])
    check({"type": "object", "if": {"properties": {"t": {"const": "x"}}, "required": ["t"]}, "then": {"properties": {"x": {}}},
           "unevaluatedProperties": False}, valid=[{"t": "x", "x": 1}], invalid=[{"t": "y"}, {"t": "x", "y": 1}])
    check({"type": "array", "prefixItems": [{"type": "string"}], "unevaluatedItems": False}, valid=[["a"], []], invalid=[["a", 1]])
    check({"type": "array", "contains": {"type": "string"}, "unevaluatedItems": {"type": "integer"}},
          valid=[["a", 1], ["a", "b"]], invalid=[["a", None]])
    check({"type": "array", "not": {"not": {"prefixItems": [True, {"const": "b"}]}}, "prefixItems": [{"const": "a"}], "unevaluatedItems": False},
          valid=[["a"]], invalid=[["a", "b"]])


def test_unique_items_small_domains_are_automata():
    g = check({"type": "array", "items": {"enum": ["x", "y", "z"]}, "uniqueItems": True}, valid=[[], ["x", "z"], ["z", "y", "x"]],
              invalid=[["x", "x"], ["x", "y", "x"]])
    assert g.check is None  # enforced by the grammar alone
    check({"type": "array", "items": {"type": "boolean"}, "uniqueItems": True, "minItems": 2}, valid=[[True, False]], invalid=[[True, True], [False]])


def test_unique_items_open_domains_are_checked_by_the_matcher():
    # The IR alone accepts duplicates here: the matcher's text check refuses them.
    import jsonschema

    from test_json_schema import matcher_accepts, spellings

    schema = {"type": "array", "items": {"type": ["string", "number", "object"]}, "uniqueItems": True}
    g = json_schema_to_grammar(schema)
    assert g.check is not None
    v = jsonschema.Draft202012Validator(schema)
    for inst in [["a", 1, {"a": 1}], [1, 1.5], [{"a": 1}, {"a": 2}], [], ["a", "b", "c"]]:
        assert v.is_valid(inst) and all(matcher_accepts(g, t) for t in spellings(inst)), inst
    for inst in [["a", "a"], [1, 1.0], [{"a": 1, "b": 2}, {"b": 2, "a": 1}], [2, "x", 2], [0.5, 5e-1]]:
        assert not v.is_valid(inst) and not any(matcher_accepts(g, t) for t in spellings(inst)), inst


def test_dynamic_ref():
    schema = {"$id": "https://ex.com/root", "$ref": "list", "$defs": {
        "inner": {"$dynamicAnchor": "item", "type": "integer"},
        "list": {"$id": "list", "type": "array", "items": {"$dynamicRef": "#item"}, "$defs": {"d": {"$dynamicAnchor": "item", "type": "string"}}}}}
    # The root resource (through $defs/inner, which has no $id of its own) binds "item" first.
    check(schema, valid=[[1], []], invalid=[["a"]])
    outer = {"$id": "https://ex.com/outer", "$dynamicAnchor": "item", "type": ["integer", "array"],
             "items": {"$ref": "list"}, "$defs": {"list": schema["$defs"]["list"]}}
    check({"$ref": "#/$defs/o", "$defs": {"o": outer}}, valid=[[[1, 2]], 3], invalid=[[["a"]]])


def test_strings_with_several_constraints():
    check({"type": "string", "allOf": [{"pattern": "^a"}, {"pattern": "b$"}], "maxLength": 4}, valid=["ab", "axxb"], invalid=["axxxb", "ba", "a"])
    check({"type": "string", "format": "date", "pattern": "^2024"}, valid=["2024-02-29"], invalid=["2023-01-01", "2024-13-01"])
    check({"type": "string", "pattern": "^(?!foo)[a-z]+$"}, valid=["bar", "fo"], invalid=["foo", "foobar", ""])
    check({"type": "string", "pattern": "(^a|b$)"}, valid=["ax", "xb", "ab"], invalid=["xa", "bx"])


def test_new_formats():
    # jsonschema here checks idn-hostname and regex only: the other invalid spellings are raw.
    check({"type": "string", "format": "json-pointer"}, valid=["", "/a/0", "/a~1b"], raw_invalid=['"a"', '"/a~2"'])
    check({"type": "string", "format": "relative-json-pointer"}, valid=["0", "1/a", "2#"], raw_invalid=['"/a"', '"-1"', '"01"'])
    check({"type": "string", "format": "idn-hostname"}, valid=["example.com"], invalid=["-a.com", "ab--c.com"])
    check({"type": "string", "format": "regex"}, valid=["^a+$", "(x|y)*"], invalid=["(", "a**", "[z-a]"])
    for fmt in ("iri", "iri-reference", "uri-template", "idn-email"):
        assert json_schema_to_grammar({"type": "string", "format": fmt}).rules


def test_the_format_memo_holds_one_entry_per_format():
    # Keyed by where the format appears, it grew with every schema a process compiled.
    from grammar.json_schema.formats import _format_ir

    _format_ir.cache_clear()
    for i in range(30):
        json_schema_to_grammar({"type": "object", "properties": {f"when_{i}": {"type": "string", "format": "date"},
                                                                  f"id_{i}": {"type": "string", "format": "uuid"}}})
    assert _format_ir.cache_info().currsize == 2


def test_negated_inexact_constraints_are_refused():
    with pytest.raises(UnsupportedFeatureError, match="'format'"):
        json_schema_to_grammar({"not": {"format": "email"}})
    with pytest.raises(UnsupportedFeatureError, match="'pattern'"):
        json_schema_to_grammar({"not": {"pattern": "a{,2}"}})


def test_ecma_only_regex_syntax_is_accepted_by_the_metaschema_check():
    # Python's re cannot read \p{Letter} (jsonschema's metaschema check used to refuse the schema).
    from test_json_schema import matcher_accepts

    g = json_schema_to_grammar({"type": "object", "patternProperties": {"^\\p{Letter}+$": {"type": "integer"}}, "additionalProperties": False})
    assert matcher_accepts(g, '{"ñandú": 1}') and not matcher_accepts(g, '{"ñandú": "x"}') and not matcher_accepts(g, '{"a1": 1}')


def test_dialect_sensitive_pattern_routes_ambiguous_keys_to_both_schemas():
    # Python's \w matches "é", ECMA's does not: a named key "é" gets the pattern's schema too, and
    # extra keys are drawn only from ASCII, where both readings agree.
    from test_json_schema import matcher_accepts

    schema = {"type": "object", "properties": {"é": {}}, "patternProperties": {"^\\w+$": {"type": "integer"}}, "additionalProperties": {"type": "string"}}
    g = json_schema_to_grammar(schema)
    assert matcher_accepts(g, '{"é": 1}') and not matcher_accepts(g, '{"é": "x"}')
    assert matcher_accepts(g, '{"ab": 1, "a-b": "x"}') and not matcher_accepts(g, '{"ü-x": "x"}')
