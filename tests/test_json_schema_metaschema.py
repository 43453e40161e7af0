"""The node-by-node metaschema check (``refs._valid_node_by_node``) against jsonschema's
whole-document check: it may send a valid schema to the slow check, but it must never pass a
schema that the metaschema refuses, in any supported draft."""

from __future__ import annotations

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grammar import SchemaError
from grammar.json_schema import refs

DRAFTS = (jsonschema.Draft4Validator, jsonschema.Draft7Validator, jsonschema.Draft201909Validator,
          jsonschema.Draft202012Validator)

_scalars = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.floats(-2, 2, allow_nan=False),
                     st.sampled_from(["", "a", "string", "object", "^a+$", "(", "#", "x#y", "#/a"]))
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["a", "b", "type"]), inner, max_size=2), max_leaves=6)
_types = st.sampled_from(["string", "integer", "number", "object", "array", "boolean", "null", "str"])
_SINGLE = ["additionalProperties", "additionalItems", "contains", "propertyNames", "not", "if", "then", "else",
           "unevaluatedItems", "unevaluatedProperties", "items", "contentSchema"]
_LISTS = ["allOf", "anyOf", "oneOf", "prefixItems", "items"]
_MAPS = ["properties", "$defs", "definitions", "dependentSchemas", "patternProperties", "dependencies"]
_OTHER = ["type", "enum", "const", "required", "minimum", "exclusiveMinimum", "maxLength", "minItems", "pattern",
          "format", "title", "description", "$comment", "default", "examples", "uniqueItems", "multipleOf",
          "dependentRequired", "$ref", "$id", "$anchor", "x-vendor"]


def _schemas(children: st.SearchStrategy) -> st.SearchStrategy:
    entries = st.one_of(
        st.tuples(st.sampled_from(_SINGLE), children | _values),
        st.tuples(st.sampled_from(_LISTS), st.lists(children, max_size=3) | _values),
        st.tuples(st.sampled_from(_MAPS), st.dictionaries(st.sampled_from(["a", "^b", "(", "c"]), children | _values, max_size=3)),
        st.tuples(st.just("type"), _types | st.lists(_types, max_size=3)),
        st.tuples(st.sampled_from(_OTHER), _values),
    )
    return st.lists(entries, max_size=5).map(dict)


_schema_trees = st.recursive(st.booleans() | st.just({}), _schemas, max_leaves=12)


@settings(max_examples=400)
@given(schema=_schema_trees, draft=st.sampled_from(DRAFTS))
def test_node_by_node_never_passes_what_the_metaschema_refuses(schema, draft):
    if refs._valid_node_by_node(draft, schema):
        assert refs._meta_validator(draft).is_valid(schema)


@pytest.mark.parametrize("draft", DRAFTS)
def test_node_by_node_passes_ordinary_valid_schemas(draft):
    # Otherwise every schema would take the slow path and the test above could not fail.
    schema = {
        "title": "t", "description": "d", "type": "object", "required": ["a"], "additionalProperties": False,
        "properties": {"a": {"type": "string", "pattern": "^a+$", "maxLength": 3}, "b": {"type": "array", "items": {"type": "integer"}}},
        "patternProperties": {"^x-": {"type": "boolean"}}, "definitions": {"d": {"enum": [1, 2]}},
        "anyOf": [{"required": ["a"]}, {"not": {"type": "null"}}],
    }
    assert refs._valid_node_by_node(draft, schema)
    assert refs._meta_validator(draft).is_valid(schema)


@pytest.mark.parametrize(("schema", "where"), [
    ({"properties": {"a": {"properties": {"b": {"type": "strin"}}}}}, "/properties/a/properties/b/type"),
    ({"anyOf": [{}, {"minLength": -1}]}, "/anyOf/1/minLength"),
    ({"patternProperties": {"(": {}}}, "/patternProperties"),
    ({"$schema": "https://json-schema.org/draft/2020-12/schema", "$defs": {"x": {"required": "a"}}}, "/\$defs/x/required"),
])
def test_a_node_that_fails_gets_the_whole_document_error_with_its_pointer(schema, where):
    for _ in range(2):  # the second time its node's verdict comes from the cache
        with pytest.raises(SchemaError, match=f"invalid schema at {where}"):
            refs.load_schema(schema)
