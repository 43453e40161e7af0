"""Oracle tests of the JSON Schema algebra: generated schemas and instances, judged by jsonschema.

Hypothesis draws small schemas over every keyword the algebra enforces (combinators, negation,
conditionals, dependencies, pattern and additional properties, property names, contains counts,
unevaluated properties and items, uniqueItems, multipleOf, string lengths and patterns) from a
small world of keys, strings and numbers, so that constraints collide, and instances from the
same world. The compiled grammar must accept exactly the valid instances: each valid instance in
some order of its keys (formcast emits named properties in a fixed order), compactly and with the
whitespace formcast allows; no invalid instance in any order or spacing. Refused schemas are
filtered out with ``assume`` (hypothesis fails the test if that happens too often).
"""

from __future__ import annotations

import itertools
import json
from fractions import Fraction

import jsonschema
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from grammar import GrammarBudgetError, SchemaError, TokenVocabulary, UnsupportedFeatureError
from grammar.compiler import compile_grammar
from grammar.json_schema import json_schema_to_grammar
from grammar.matcher import GrammarMatcher
from property_budget import examples

BYTES = TokenVocabulary.byte_level()
SETTINGS = settings(max_examples=examples(70), deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
KEYS = ["a", "b", "c"]
STRINGS = ["", "a", "b", "ab", "ba", "abc"]
NUMBERS = [-1, 0, 1, 1.5, 2, 3, 4.5, 6]
PATTERNS = ["^a", "a", "^[ab]+", "^(?!a)", "b$"]
TYPES = ["null", "boolean", "integer", "number", "string", "array", "object"]

# ---------------------------------------------------------------------------- instances

scalars = st.none() | st.booleans() | st.sampled_from(NUMBERS) | st.sampled_from(STRINGS)
instances = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(KEYS + ["x"]), inner, max_size=3),
    max_leaves=6,
)

# ---------------------------------------------------------------------------- schemas


def _pick(options: dict[str, st.SearchStrategy], most: int, least: int = 0) -> st.SearchStrategy[dict]:
    """A schema object with ``least`` to ``most`` of the keywords in ``options`` (few, so that
    the drawn schemas are seldom contradictions)."""
    keys = st.lists(st.sampled_from(sorted(options)), min_size=least, max_size=most, unique=True)
    return keys.flatmap(lambda ks: st.fixed_dictionaries({k: options[k] for k in ks}))


LOCAL = {
    "type": st.sampled_from(TYPES) | st.lists(st.sampled_from(TYPES), min_size=1, max_size=3, unique=True),
    "enum": st.lists(scalars, min_size=1, max_size=3), "const": scalars,
    "minimum": st.sampled_from([-1, 0, 1, 2]), "maximum": st.sampled_from([0, 1, 2, 3]),
    "exclusiveMinimum": st.sampled_from([0, 1.5]), "exclusiveMaximum": st.sampled_from([2, 4.5]),
    "multipleOf": st.sampled_from([1, 2, 3, 0.5, 1.5]),
    "minLength": st.integers(0, 2), "maxLength": st.integers(0, 3), "pattern": st.sampled_from(PATTERNS),
    "minItems": st.integers(0, 2), "maxItems": st.integers(0, 3), "uniqueItems": st.booleans(),
    "minProperties": st.integers(0, 2), "maxProperties": st.integers(0, 3),
    "required": st.lists(st.sampled_from(KEYS), max_size=2, unique=True),
    "dependentRequired": st.dictionaries(st.sampled_from(KEYS), st.lists(st.sampled_from(KEYS), max_size=1, unique=True), max_size=1),
}


def _children(sub: st.SearchStrategy) -> dict[str, st.SearchStrategy]:
    """Keywords that take subschemas, drawn from ``sub``."""
    return {
        "properties": st.dictionaries(st.sampled_from(KEYS), sub, max_size=2).map(lambda d: dict(sorted(d.items()))),
        "additionalProperties": sub, "patternProperties": st.dictionaries(st.sampled_from(["^a", "b"]), sub, max_size=2),
        "propertyNames": st.sampled_from([{"maxLength": 1}, {"pattern": "^[ab]"}, {"enum": ["a", "c"]}]),
        "dependentSchemas": st.dictionaries(st.sampled_from(KEYS), sub, max_size=1),
        "items": sub, "prefixItems": st.lists(sub, min_size=1, max_size=2), "contains": sub,
        "minContains": st.integers(0, 2), "maxContains": st.integers(0, 2),
        "allOf": st.lists(sub, min_size=1, max_size=2), "anyOf": st.lists(sub, min_size=1, max_size=3),
        "oneOf": st.lists(sub, min_size=1, max_size=3), "not": sub, "if": sub, "then": sub, "else": sub,
        "unevaluatedProperties": sub, "unevaluatedItems": sub,
    }


def _merge(a: dict, b: dict) -> dict:
    return {**a, **b}


leaf = _pick(LOCAL, 2) | st.booleans()
schemas = st.recursive(leaf, lambda sub: st.builds(_merge, _pick(LOCAL, 1), _pick(_children(sub), 2, 1)), max_leaves=6)

# ---------------------------------------------------------------------------- oracle


def _orders(v):
    """The instance with its object keys in every order (bounded)."""
    if isinstance(v, dict):
        keys = list(v)
        out = []
        for perm in itertools.permutations(keys):
            for vals in itertools.product(*(_orders(v[k])[:4] for k in perm)):
                out.append(dict(zip(perm, vals)))
                if len(out) >= 24:
                    return out
        return out or [{}]
    if isinstance(v, list):
        return [list(vals) for vals in itertools.islice(itertools.product(*(_orders(x)[:3] for x in v)), 24)] or [[]]
    return [v]


def _texts(v) -> set[str]:
    out = {json.dumps(v), json.dumps(v, separators=(",", ":")), json.dumps(v, ensure_ascii=False)}
    pretty = json.dumps(v, indent=1)
    if max((len(line) - len(line.lstrip(" ")) for line in pretty.splitlines()), default=0) < 20:
        out.add(pretty)  # flexible whitespace: at most 20 characters between tokens
    return out


def _accepts(compiled, text: str) -> bool:
    m = GrammarMatcher(compiled)
    return m.accept_bytes(text.encode("utf-8")) and m.can_terminate()


def agree(schema, values) -> None:
    """The grammar of ``schema`` accepts exactly the instances jsonschema calls valid."""
    validator = jsonschema.Draft202012Validator(schema)
    try:
        compiled = compile_grammar(json_schema_to_grammar(schema), BYTES)
    except (UnsupportedFeatureError, GrammarBudgetError):
        assume(False)
        return
    except SchemaError as exc:
        assert "unsatisfiable" in str(exc), exc
        assert not any(validator.is_valid(v) for v in values), (schema, "declared unsatisfiable")
        return
    for v in values:
        valid = validator.is_valid(v)
        spelled = [t for order in _orders(v) for t in _texts(order)]
        if valid:
            assert any(_accepts(compiled, t) for t in spelled), (schema, v, "valid instance rejected")
            # Every spacing of the accepted key order is accepted too.
            order = next(o for o in _orders(v) if _accepts(compiled, json.dumps(o)))
            for t in _texts(order):
                assert _accepts(compiled, t), (schema, t, "valid spelling rejected")
        else:
            for t in spelled:
                assert not _accepts(compiled, t), (schema, t, "invalid instance accepted")


@SETTINGS
@given(schemas, st.lists(instances, min_size=4, max_size=8))
def test_generated_schemas_accept_exactly_the_valid_instances(schema, values):
    agree(schema, values)


@SETTINGS
@given(schemas, schemas, st.lists(instances, min_size=4, max_size=8))
def test_allof_of_generated_pairs_is_exact(a, b, values):
    """The allOf-merge property: intersecting two schemas keeps every keyword's meaning."""
    agree({"allOf": [a, b]}, values)


@SETTINGS
@given(schemas, st.lists(instances, min_size=4, max_size=8))
def test_negation_and_exactly_one(schema, values):
    agree({"not": schema}, values)
    agree({"oneOf": [schema, {"type": "integer"}, {"maxLength": 1}]}, values)


@pytest.mark.parametrize("mult", [1, 2, 3, 0.5, 1.5, 0.3])
def test_multiple_of_and_its_negation_on_numbers(mult):
    values = [x / 10 for x in range(-40, 41)] + list(range(-12, 13)) + [0.25, 10.5, 100]
    for schema in ({"multipleOf": mult}, {"not": {"multipleOf": mult}}, {"type": "number", "multipleOf": mult, "maximum": 3},
                   {"type": "integer", "not": {"multipleOf": mult}, "minimum": -5}):
        # jsonschema divides floats (-2.7 / 0.3 is not an integer there): keep the values where
        # its verdict is the exact one, which is what the grammar enforces.
        step = Fraction(str(mult))
        oracle = jsonschema.Draft202012Validator({"multipleOf": mult})
        exact = [v for v in values if (Fraction(str(v)) % step == 0) == oracle.is_valid(v)]
        assert len(exact) > len(values) // 2
        agree(schema, exact)
