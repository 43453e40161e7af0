"""``uniqueItems`` inside unions, conditionals, properties and nested arrays, judged by jsonschema.

The duplicate check runs beside the automaton; it must bind only the branch and the array it
was compiled for (a duplicate kills the branches that forbid it, the others go on). Hypothesis
draws array schemas with and without ``uniqueItems`` under ``anyOf`` / ``oneOf`` /
``if``-``then``-``else`` / ``not`` / ``properties`` / ``items`` / ``contains``, and arrays full
of duplicates (numbers equal by value, nested arrays, objects). The ``@example`` cases are the
regressions from issue 27 and the ones random-seed runs found.
"""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st
from property_budget import examples
from test_json_schema_algebra import SETTINGS, agree

ITEM_SCHEMAS = [{}, {"type": "integer"}, {"type": "array"}, {"maxItems": 1}, {"enum": [1, [1], "a"]}, {"type": ["string", "null"]}]

item = st.sampled_from(ITEM_SCHEMAS)


def _array(sub: st.SearchStrategy) -> st.SearchStrategy[dict]:
    """An array schema, unique or not, with a few other keywords beside ``uniqueItems``."""
    options = {
        "items": sub, "prefixItems": st.lists(sub, min_size=1, max_size=2), "contains": sub,
        "minItems": st.integers(0, 3), "maxItems": st.integers(1, 3), "type": st.just("array"),
    }
    keys = st.lists(st.sampled_from(sorted(options)), max_size=2, unique=True)
    rest = keys.flatmap(lambda ks: st.fixed_dictionaries({k: options[k] for k in ks}))
    return st.builds(lambda u, r: {**r, "uniqueItems": u} if u is not None else r, st.sampled_from([True, True, False, None]), rest)


def _around(sub: st.SearchStrategy) -> st.SearchStrategy[dict]:
    """``sub`` under a union, a conditional, a negation of a plain schema, or a container."""
    pair = st.lists(sub, min_size=2, max_size=3)
    return st.one_of(
        pair.map(lambda xs: {"anyOf": xs}),
        pair.map(lambda xs: {"oneOf": xs}),
        st.tuples(sub, sub, sub).map(lambda t: {"if": t[0], "then": t[1], "else": t[2]}),
        st.tuples(sub, st.sampled_from([{"maxItems": 2}, {"contains": {"type": "integer"}}, {"items": {"type": "integer"}}])).map(
            lambda t: {"anyOf": [t[0], {"not": t[1]}]}),
        sub.map(lambda s: {"properties": {"a": s}}),
        sub.map(lambda s: {"items": s}),
        sub.map(lambda s: {"prefixItems": [s], "items": {"uniqueItems": True}}),
        st.tuples(sub, sub).map(lambda t: {"contains": t[0], "items": t[1]}),
    )


schemas = st.recursive(_array(item), lambda sub: _around(sub) | _array(sub), max_leaves=5)

# Arrays with many duplicates: numbers equal by value, equal nested arrays and objects.
atoms = st.sampled_from([None, 1, 1.0, 2, "a", "b", True])
values = st.recursive(atoms, lambda inner: st.lists(inner, max_size=4) | st.fixed_dictionaries({"a": inner}), max_leaves=8)
instances = st.lists(values, max_size=4) | st.fixed_dictionaries({"a": st.lists(values, max_size=4)})


ISSUE_27 = [None, [None, None], [1, 1], [1, 2], [[1, 1]], [[1, 1], [1, 1]], {"a": [1, 1]}, {"a": [1, 1, 1]}]


@settings(SETTINGS, max_examples=examples(25))
@given(schemas, st.lists(instances, min_size=3, max_size=6))
@example({"anyOf": [{}, {"uniqueItems": True, "prefixItems": [{}]}]}, ISSUE_27)
@example({"allOf": [{}, {"anyOf": [{}, {"uniqueItems": True, "prefixItems": [{}]}]}]}, ISSUE_27)
@example({"oneOf": [{"maxItems": 2}, {"uniqueItems": True, "minItems": 3}]}, ISSUE_27 + [[1, 1, 1], [1, 2, 3]])
@example({"if": {"maxItems": 2}, "then": {}, "else": {"uniqueItems": True, "items": {}}}, ISSUE_27 + [[1, 1, 1], [1, 2, 3]])
@example({"properties": {"a": {"anyOf": [{"maxItems": 2}, {"uniqueItems": True, "items": {}}]}}}, ISSUE_27)
@example({"items": {"anyOf": [{"maxItems": 2}, {"uniqueItems": True, "items": {"type": "integer"}}]}},
         ISSUE_27 + [[[1, 1, 1]], [[1, 2, 3], [1, 1]], [[1, 1], [2, 2, 2]]])
# Two inner arrays whose branches are tied through the outer union: a duplicate in the first
# one commits the outer array to the second branch.
@example({"anyOf": [{"items": {"uniqueItems": True, "minItems": 3}}, {"items": {"maxItems": 2}}]},
         [[[1, 1]], [[1, 1], [1, 2, 3]], [[1, 1, 1]], [[1, 2, 3], [4, 5, 6]]])
@example({"uniqueItems": True, "items": {"anyOf": [{"maxItems": 1}, {"uniqueItems": True}]}},
         [[[1, 1], [1, 1]], [[1, 1], [1, 2]], [[], []], [[1], [1, 1]]])
@example({"uniqueItems": True, "contains": {"type": "string"}, "items": {"anyOf": [{}, {"uniqueItems": True, "minItems": 1}]}},
         [["a", "a"], ["a", [1, 1]], ["a", [1, 1], [1, 1]]])
def test_unique_items_binds_only_its_branch_and_array(schema, values):
    agree(schema, values)
