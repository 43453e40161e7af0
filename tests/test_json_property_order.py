"""``property_order="any"``: named properties in every order, still exactly the valid instances.

Oracle: jsonschema. Object schemas drawn here (properties, required, extra keys, counts, patterns,
nesting) have no const / enum objects, so *every* key order of a valid instance must be accepted,
and no order of an invalid one; the algebra's general schemas must stay exact as well. The
declared default is unchanged (a reordered instance stays rejected), and objects over
``MAX_ANY_ORDER_KEYS`` named keys keep the declared order.
"""

from __future__ import annotations

import itertools
import json

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.constrained.grammar_backend import GrammarBackend
from engine.entrypoints.openai_mapping import to_sampling_params
from engine.sampling_params import InvalidSamplingParams, SamplingParams
from grammar import GrammarBudgetError, SchemaError, UnsupportedFeatureError, compile_json_schema
from grammar.json_schema import json_schema_to_grammar
from grammar.json_schema.objects import MAX_ANY_ORDER_KEYS
from grammar.matcher import GrammarMatcher
from property_budget import examples
from test_json_schema_algebra import BYTES, SETTINGS, _accepts, _orders, instances, schemas

KEYS = ["a", "b", "c", "d"]
VALUES = [None, 0, 1, "s", True, [], {}]

leaf_schemas = st.sampled_from([{}, {"type": "integer"}, {"type": "string"}, {"type": ["null", "boolean"]}, {"minimum": 1}])


@st.composite
def object_schemas(draw, depth: int = 0) -> dict:
    names = draw(st.lists(st.sampled_from(KEYS), max_size=4, unique=True))
    sub = leaf_schemas if depth else (leaf_schemas | object_schemas(depth=1))
    schema: dict = {"type": "object", "properties": {n: draw(sub) for n in names}}
    required = draw(st.lists(st.sampled_from(KEYS), max_size=3, unique=True))
    if required:
        schema["required"] = required
    extra = draw(st.sampled_from(["absent", False, {"type": "integer"}, "pattern"]))
    if extra == "pattern":
        schema["patternProperties"] = {"^[xy]": {"type": "string"}}
        schema["additionalProperties"] = False
    elif extra != "absent":
        schema["additionalProperties"] = extra
    if draw(st.booleans()):
        schema["minProperties"] = draw(st.integers(0, 3))
    if draw(st.booleans()):
        schema["maxProperties"] = draw(st.integers(1, 4))
    return schema


@st.composite
def object_instances(draw, depth: int = 0) -> dict:
    keys = draw(st.lists(st.sampled_from(KEYS + ["x", "z"]), max_size=5, unique=True))
    inner = st.sampled_from(VALUES) if depth else (st.sampled_from(VALUES) | object_instances(depth=1))
    return {k: draw(inner) for k in keys}


def _all_orders(value):
    """Every key order of every object in ``value`` (bounded, as _orders but exhaustive at the top)."""
    if not isinstance(value, dict):
        return [value]
    keys = list(value)
    out = []
    for perm in itertools.permutations(keys):
        for vals in itertools.product(*(_all_orders(value[k])[:6] for k in perm)):
            out.append(dict(zip(perm, vals)))
    return out[:120]


def _compile(schema, order: str):
    try:
        return compile_json_schema(schema, BYTES, json_property_order=order)
    except (UnsupportedFeatureError, GrammarBudgetError):
        return None


@settings(SETTINGS, max_examples=examples(60))
@given(object_schemas(), st.lists(object_instances(), min_size=3, max_size=6))
def test_any_order_accepts_every_order_of_valid_objects_and_no_invalid_one(schema, values):
    validator = jsonschema.Draft202012Validator(schema)
    try:
        compiled = _compile(schema, "any")
    except SchemaError as exc:
        assert "unsatisfiable" in str(exc)
        assert not any(validator.is_valid(v) for v in values)
        return
    if compiled is None:
        return
    for value in values:
        valid = validator.is_valid(value)
        for ordered in _all_orders(value):
            assert _accepts(compiled, json.dumps(ordered)) == valid, (schema, ordered, valid)


@settings(SETTINGS, max_examples=examples(40))
@given(schemas, st.lists(instances, min_size=4, max_size=8))
def test_any_order_stays_exact_on_the_algebras_schemas(schema, values):
    """const / enum objects keep one order, so here a valid instance needs one accepted order."""
    validator = jsonschema.Draft202012Validator(schema)
    try:
        compiled = _compile(schema, "any")
    except SchemaError:
        return
    if compiled is None:
        return
    for value in values:
        accepted = [_accepts(compiled, json.dumps(o)) for o in _orders(value)]
        if validator.is_valid(value):
            assert any(accepted), (schema, value, "valid instance rejected")
        else:
            assert not any(accepted), (schema, value, "invalid instance accepted")


def test_declared_order_is_the_default_and_any_reorders():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}, "required": ["a", "b"]}
    declared, any_order = compile_json_schema(schema, BYTES), _compile(schema, "any")
    assert _accepts(declared, '{"a": 1, "b": "x"}') and not _accepts(declared, '{"b": "x", "a": 1}')
    assert _accepts(any_order, '{"a": 1, "b": "x"}') and _accepts(any_order, '{"b": "x", "a": 1}')
    # No key twice, whatever the order: {"a": 1, "a": 2} is no object jsonschema sees as written.
    assert not _accepts(any_order, '{"a": 1, "a": 2, "b": "x"}')
    assert not _accepts(any_order, '{"b": "x"}')


def test_objects_over_the_limit_keep_the_declared_order():
    names = [f"k{i}" for i in range(MAX_ANY_ORDER_KEYS + 1)]
    schema = {"type": "object", "properties": {n: {"type": "integer"} for n in names}, "additionalProperties": False}
    compiled = _compile(schema, "any")
    forward = json.dumps({n: 1 for n in names})
    backward = json.dumps({n: 1 for n in reversed(names)})
    assert _accepts(compiled, forward) and not _accepts(compiled, backward)
    small = {"type": "object", "properties": {n: {"type": "integer"} for n in names[:-1]}, "additionalProperties": False}
    assert _accepts(_compile(small, "any"), json.dumps({n: 1 for n in reversed(names[:-1])}))


def test_the_option_travels_from_sampling_params_and_http_and_is_checked():
    with pytest.raises(SchemaError, match="property_order"):
        json_schema_to_grammar({}, property_order="sorted")
    with pytest.raises(InvalidSamplingParams, match="json_property_order"):
        SamplingParams(json_schema={}, json_property_order="sorted").verify()
    request = {"model": "m", "messages": [], "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}},
               "json_property_order": "any"}
    assert to_sampling_params(request).json_property_order == "any"
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}
    backend = GrammarBackend(BYTES)
    try:
        for order, ok in (("declared", False), ("any", True)):
            m = GrammarMatcher(backend.compile(SamplingParams(json_schema=schema, json_property_order=order)))
            assert (m.accept_bytes(b'{"b": 1, "a": 2}') and m.can_terminate()) == ok, order
    finally:
        backend.shutdown()
