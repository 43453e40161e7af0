"""JSON Schema lowering: accept/reject tables checked against jsonschema, per keyword.

Each case is verified three ways: jsonschema agrees with the table (so the table is right), the
IR reference interpreter agrees, and the real compiled matcher agrees byte by byte.
"""

from __future__ import annotations

import json

import jsonschema
import pytest

from grammar import SchemaError, TokenVocabulary, ir
from grammar.json_schema import json_schema_to_grammar
from test_json_schema_oracle import ir_accepts

BYTES = TokenVocabulary.byte_level()


def spellings(instance, *, indent=None) -> list[str]:
    out = {json.dumps(instance, ensure_ascii=False), json.dumps(instance), json.dumps(instance, separators=(",", ":"))}
    return sorted(out)


_COMPILED: dict[int, tuple[ir.Grammar, object]] = {}


def matcher_accepts(grammar: ir.Grammar, text: str) -> bool:
    from grammar.compiler import compile_grammar
    from grammar.matcher import GrammarMatcher

    if id(grammar) not in _COMPILED or _COMPILED[id(grammar)][0] is not grammar:
        _COMPILED.clear()
        _COMPILED[id(grammar)] = (grammar, compile_grammar(grammar, BYTES))
    m = GrammarMatcher(_COMPILED[id(grammar)][1])
    return m.accept_bytes(text.encode("utf-8")) and m.can_terminate()


def check(schema, valid=(), invalid=(), raw_valid=(), raw_invalid=(), **options) -> ir.Grammar:
    g = json_schema_to_grammar(schema, **options)
    v = jsonschema.validators.validator_for(schema if isinstance(schema, dict) else {})(schema, format_checker=jsonschema.FormatChecker())
    for inst in valid:
        assert v.is_valid(inst), f"table error: {inst!r} is invalid"
        for text in spellings(inst):
            assert ir_accepts(g, text), f"IR rejects valid {text!r}"
            assert matcher_accepts(g, text), f"matcher rejects valid {text!r}"
    for inst in invalid:
        assert not v.is_valid(inst), f"table error: {inst!r} is valid"
        for text in spellings(inst):
            assert not ir_accepts(g, text), f"IR accepts invalid {text!r}"
            assert not matcher_accepts(g, text), f"matcher accepts invalid {text!r}"
    for text in raw_valid:
        assert v.is_valid(json.loads(text)) and ir_accepts(g, text) and matcher_accepts(g, text), text
    for text in raw_invalid:
        assert not ir_accepts(g, text) and not matcher_accepts(g, text), text
    return g


def test_types_and_booleans():
    check(True, valid=[None, 1, "x", [1, {"a": []}], {"k": {"j": -1.5e3}}], raw_invalid=["", "nul", "[1,]", "{'a':1}", "01", "+1", "NaN"])
    check({"type": "null"}, valid=[None], invalid=[0, False, "null"])
    check({"type": "boolean"}, valid=[True, False], invalid=[None, 1, "true"])
    check({"type": ["string", "null"]}, valid=["a", None], invalid=[1, [], {}])
    check({"type": "string", "nullable": True}, valid=["a"], invalid=[1, None])  # OpenAPI-only keyword
    # ``false`` admits no value: refused as unsatisfiable (exactly SchemaError, not a subclass).
    with pytest.raises(SchemaError, match="unsatisfiable") as info:
        json_schema_to_grammar(False)
    assert info.type is SchemaError


def test_numbers_json_grammar():
    check({"type": "number"}, valid=[0, -0.5, 1e100, 12.25], raw_valid=["1E+2", "-0", "0.0e-0"], raw_invalid=["01", "+1", ".5", "1.", "1e", "NaN", "Infinity", "-"])
    check({"type": "integer"}, valid=[0, -7, 10**30], invalid=[1.5, "1"], raw_invalid=["01", "-", "1.5"])


def test_integer_ranges():
    check({"type": "integer", "minimum": -3, "maximum": 12}, valid=[-3, 0, 9, 12], invalid=[-4, 13, 100, -30])
    check({"type": "integer", "exclusiveMinimum": 0}, valid=[1, 99999], invalid=[0, -1])
    check({"type": "integer", "exclusiveMaximum": -10}, valid=[-11, -1000], invalid=[-10, 0, 5])
    check({"type": "integer", "minimum": 0.5, "maximum": 2.5}, valid=[1, 2], invalid=[0, 3])
    check({"type": "integer", "multipleOf": 5, "minimum": 0}, valid=[0, 5, 1005], invalid=[1, 12, -5])
    check({"type": "integer", "multipleOf": 3, "minimum": 0, "maximum": 30}, valid=[0, 3, 30], invalid=[1, 31, 33])
    check({"type": "integer", "multipleOf": 4}, valid=[-8, 0, 4, 112], invalid=[2, -6, 114])


def test_number_ranges():
    check({"type": "number", "minimum": 0, "maximum": 1}, valid=[0, 0.5, 1, 1.0, 0.999], invalid=[-0.1, 1.01, 2])
    check({"type": "number", "exclusiveMinimum": 0}, valid=[0.001, 5, 1000.5], invalid=[0, -0.001, -3])
    check({"type": "number", "minimum": -2.5, "exclusiveMaximum": 3.75}, valid=[-2.5, 0, 3.7499], invalid=[-2.51, 3.75, 4])
    check({"type": "number", "multipleOf": 0.01, "minimum": 0}, valid=[0, 1.25, 10.1], invalid=[1.255, -1])
    check({"type": "number", "multipleOf": 2}, valid=[2, -4, 6.0], invalid=[3, 2.5])


def test_strings_and_escapes():
    check({"type": "string"}, valid=["", "plain", 'quote " and \\ slash /', "tab\tnl\n\u0001", "é漢🎉"],
          raw_valid=['"\\u00e9\\uD83C\\uDF89"', '"\\/"', '"\\u00E9"'],
          raw_invalid=['"a\nb"', '"\\x41"', '"\\u12"', '"unterminated', "'single'", '"\\ud800"'])
    check({"type": "string", "minLength": 2, "maxLength": 3}, valid=["ab", "abc", "🎉🎉", "\n\t"], invalid=["a", "abcd", ""])
    check({"type": "string", "pattern": "^[a-z]+-\\d{2}$"}, valid=["ab-12"], invalid=["ab-1", "AB-12", "xab-123"])
    check({"type": "string", "pattern": "cat"}, valid=["cat", "concatenate"], invalid=["dog", "ca t"])
    check({"type": "string", "pattern": "^[a-z]+$", "maxLength": 4}, valid=["a", "abcd"], invalid=["abcde", ""])
    check({"type": "string", "pattern": '^"\\\\$'}, valid=['"\\'], invalid=['"', "\\"])


def test_enum_and_const():
    check({"enum": ["red", "green", 3, None, [1, 2], {"a": True}]}, valid=["red", 3, 3.0, None, [1, 2], {"a": True}],
          invalid=["blue", 4, [2, 1], {"a": False}, False])
    # \uXXXX spellings of printable ASCII are refused by design (json.dumps never writes them and
    # small models waste their budget on them): the short escape is the way to write a quote.
    check({"const": "x\"y"}, valid=['x"y'], invalid=["xy"], raw_valid=['"x\\"y"'], raw_invalid=['"x\\u0022y"'])
    check({"type": "string", "enum": ["a", 1, "bb"], "maxLength": 1}, valid=["a"], invalid=["bb", 1])
    check({"const": 0.5}, valid=[0.5], invalid=[0.25], raw_valid=["0.50"])


def test_formats():
    check({"type": "string", "format": "date"}, valid=["2024-02-29", "2023-12-31", "2000-02-29"], invalid=["2023-02-29", "1900-02-29", "2023-13-01", "2023-1-1"])
    check({"type": "string", "format": "date-time"}, valid=["2024-01-02T03:04:05Z", "2024-01-02T03:04:05.123+05:30"], raw_invalid=['"2024-01-02 03:04"', '"2024-01-02T25:00:00Z"'])
    check({"type": "string", "format": "ipv4"}, valid=["192.168.0.1", "0.0.0.0"], invalid=["256.1.1.1", "01.2.3.4", "1.2.3"])
    check({"type": "string", "format": "uuid"}, valid=["123e4567-e89b-12d3-a456-426614174000"], invalid=["123e4567e89b12d3a456426614174000"])
    check({"type": "string", "format": "email"}, valid=["a.b@example.com"])
    check({"type": "string", "format": "ipv6"}, valid=["::1", "2001:db8::8a2e:370:7334", "1:2:3:4:5:6:7:8"], invalid=["1:2:3:4:5:6:7:8:9", "12345::"])
    for fmt in ("time", "duration", "hostname", "uri", "uri-reference"):
        json_schema_to_grammar({"type": "string", "format": fmt})


def test_objects_properties_required_additional():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}, "c": {"type": "boolean"}}, "required": ["b"]}
    check(schema, valid=[{"b": "x"}, {"a": 1, "b": "x"}, {"a": 1, "b": "x", "c": True}, {"b": "x", "zz": [1]}, {"a": 1, "extra": None, "b": "y"}],
          invalid=[{}, {"a": 1}, {"a": "1", "b": "x"}, {"b": "x", "c": 1}, []])
    strict = {**schema, "additionalProperties": False}
    check(strict, valid=[{"b": "x"}, {"a": 1, "b": "x", "c": False}], invalid=[{"b": "x", "zz": 1}])
    check(schema, valid=[{"b": "x"}], raw_invalid=['{"b": "x", "zz": 1}'], strict_properties=True)
    check({"type": "object", "additionalProperties": {"type": "integer"}, "properties": {"n": {"type": "string"}}},
          valid=[{}, {"n": "s", "k": 1}, {"k": 1, "j": 2}], invalid=[{"n": 1}, {"k": "s"}])
    check({"type": "object", "required": ["x"]}, valid=[{"x": 1}, {"x": None, "y": 2}], invalid=[{"y": 2}])
    check({"type": "object", "properties": {}, "additionalProperties": False}, valid=[{}], invalid=[{"a": 1}])


def test_object_counts_patterns_names():
    props = {"type": "object", "properties": {k: {"type": "integer"} for k in "abcd"}, "additionalProperties": False}
    check({**props, "minProperties": 2, "maxProperties": 3}, valid=[{"a": 1, "b": 2}, {"a": 1, "c": 2, "d": 3}], invalid=[{"a": 1}, {"a": 1, "b": 2, "c": 3, "d": 4}, {}])
    check({"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 1, "maxProperties": 2},
          valid=[{"a": 1}, {"a": 1, "b": 2}], invalid=[{}, {"a": 1, "b": 2, "c": 3}, {"a": "s"}])
    check({"type": "object", "properties": {"n": {"type": "string"}}, "minProperties": 2},
          valid=[{"n": "s", "x": 1}, {"x": 1, "y": 2, "z": 3}, {"n": "s", "x": 1, "y": None}], invalid=[{"n": "s"}, {"x": 1}, {}])
    check({"type": "object", "patternProperties": {"^x-": {"type": "integer"}}, "additionalProperties": False},
          valid=[{}, {"x-a": 1, "x-b": 2}], invalid=[{"y": 1}, {"x-a": "s"}])
    check({"type": "object", "patternProperties": {".*": {"type": "integer"}}}, valid=[{}, {"a": 1}], invalid=[{"a": "s"}])
    check({"type": "object", "properties": {"n": {"type": "integer"}}, "patternProperties": {"": {"minimum": 0}}},
          valid=[{"n": 1, "x": 2}, {"x": "s"}], invalid=[{"n": -1}, {"x": -2}])
    check({"type": "object", "patternProperties": {"^a": True}}, valid=[{"a": 1, "b": [2]}])
    check({"type": "object", "propertyNames": {"enum": ["p", "q"]}}, valid=[{"p": 1}, {"p": 1, "q": []}], invalid=[{"r": 1}])
    check({"type": "object", "propertyNames": {"maxLength": 2}}, valid=[{"ab": 1}], invalid=[{"abc": 1}])
    check({"type": "object", "properties": {"a": {"type": "integer"}, "b": {}}, "dependentRequired": {"a": ["b"]}},
          valid=[{}, {"b": 1}, {"a": 1, "b": 2}], invalid=[{"a": 1}])


def test_many_optional_properties_stay_linear():
    props = {f"p{i}": {"type": "integer"} for i in range(40)}
    g = check({"type": "object", "properties": props, "additionalProperties": False},
              valid=[{}, {"p39": 1}, {"p0": 1, "p17": 2, "p39": 3}], raw_invalid=['{"p0": 1, "p0": 2}', '{"p1": 1, "p0": 2}'])  # documented: properties order
    assert sum(1 for _ in g.rules) < 200


def test_arrays():
    check({"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3}, valid=[[1], [1, 2, 3]], invalid=[[], [1, 2, 3, 4], ["a"]])
    check({"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "items": False},
          valid=[[], ["a"], ["a", 1]], invalid=[[1], ["a", 1, 2]])
    check({"type": "array", "prefixItems": [{"type": "string"}], "items": {"type": "boolean"}, "minItems": 2},
          valid=[["a", True], ["a", False, True]], invalid=[["a"], ["a", 1]])
    check({"$schema": "http://json-schema.org/draft-07/schema#", "type": "array", "items": [{"type": "string"}], "additionalItems": {"type": "integer"}}, valid=[["a", 1, 2]], invalid=[["a", "b"]])
    check({"type": "array", "items": {"type": "integer"}, "contains": {"minimum": 10}, "minContains": 2},
          valid=[[10, 11], [1, 10, 2, 20, 3]], invalid=[[10], [], [1, 2]])
    check({"type": "array", "uniqueItems": True, "maxItems": 1}, valid=[[], [1]], invalid=[[1, 2]])


def test_refs_and_recursion():
    tree = {"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
                                "required": ["v"], "additionalProperties": False}}, "$ref": "#/$defs/node"}
    check(tree, valid=[{"v": 1}, {"v": 1, "kids": [{"v": 2, "kids": [{"v": 3}]}]}], invalid=[{"v": 1, "kids": [{}]}, {"kids": []}])
    check({"definitions": {"c": {"type": "object", "properties": {"v": {"type": "integer"}, "next": {"anyOf": [{"$ref": "#/definitions/c"}, {"type": "null"}]}},
                                 "required": ["v", "next"], "additionalProperties": False}}, "$ref": "#/definitions/c"},
          valid=[{"v": 1, "next": None}, {"v": 1, "next": {"v": 2, "next": None}}], invalid=[{"v": 1, "next": {"v": 2}}])
    check({"definitions": {"s": {"type": "string"}}, "properties": {"a": {"$ref": "#/definitions/s"}}, "type": "object"}, valid=[{"a": "x"}], invalid=[{"a": 1}])
    check({"$id": "https://ex.com/root", "$defs": {"p": {"$id": "pos", "type": "integer", "minimum": 0}}, "$ref": "pos"}, valid=[3], invalid=[-3])
    check({"$defs": {"p": {"$anchor": "here", "type": "boolean"}}, "$ref": "#here"}, valid=[True], invalid=[1])
    check({"type": "object", "properties": {"a": {"type": "array", "items": {"type": "integer"}}, "b": {"$ref": "#/properties/a/items"}}},
          valid=[{"a": [1], "b": 2}], invalid=[{"b": "x"}])


def test_combinators():
    check({"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}, {"properties": {"a": {"minimum": 5}}}]},
          valid=[{"a": 5}], invalid=[{"a": 4}, {}])
    check({"anyOf": [{"type": "string", "maxLength": 2}, {"type": "integer", "minimum": 10}]}, valid=["ab", 10], invalid=["abc", 9, None])
    check({"oneOf": [{"type": "string"}, {"type": "null"}]}, valid=["a", None], invalid=[1])
    check({"oneOf": [{"type": "object", "properties": {"kind": {"const": "a"}, "x": {"type": "integer"}}, "required": ["kind"]},
                     {"type": "object", "properties": {"kind": {"const": "b"}, "y": {"type": "string"}}, "required": ["kind"]}]},
          valid=[{"kind": "a", "x": 1}, {"kind": "b", "y": "s"}], invalid=[{"kind": "c"}, {"kind": "a", "x": "s"}])
    check({"type": "object", "oneOf": [{"required": ["a", "b"]}, {"required": ["c"]}]},
          valid=[{"a": 1, "b": 2}, {"c": 1}, {"a": 1, "c": 1}], invalid=[{"a": 1, "b": 2, "c": 3}, {"a": 1}, {}])
    check({"oneOf": [{"type": "integer"}, {"type": "string"}]}, valid=[7, "s"], invalid=[2.5, None])
    check({"type": ["string", "integer"], "not": {"type": "integer"}}, valid=["s"], invalid=[1])
    # MaskBench Github_trivial---o23153: excluding "number" must exclude integers too.
    check({"properties": {"foo": {"not": {"type": "number"}}}}, valid=[{"foo": "x"}, {"foo": None}, {}], invalid=[{"foo": 0}, {"foo": -0}, {"foo": 1e5}, {"foo": 1.5}])
    check({"not": {"type": ["number", "string"]}}, valid=[None, [], {}, True], invalid=[0, 2.5, "s"])
    check({"type": "string", "not": {"enum": ["a", "b"]}}, valid=["", "c", "ab"], invalid=["a", "b"])
    check({"allOf": [{"type": ["string", "integer", "null"], "not": {"type": "null"}}, {"not": {"enum": ["x"]}, "x-note": 1}, {"x-note": 2}]},
          valid=["y", 3], invalid=["x", None])
    check({"type": "object", "properties": {"t": {"enum": ["x", "y"]}, "n": {"type": "integer"}}, "required": ["t"],
           "if": {"properties": {"t": {"const": "x"}}}, "then": {"required": ["n"]}},
          valid=[{"t": "x", "n": 1}, {"t": "y"}], invalid=[{"t": "x"}])
    check({"$schema": "http://json-schema.org/draft-07/schema#", "type": "object", "allOf": [{"dependencies": {"a": ["b", "c"], "b": ["d"]}}, {"required": ["a"]}]},
          valid=[{"a": 1, "b": 2, "c": 3, "d": 4}], invalid=[{"a": 1, "b": 2, "c": 3}, {"a": 1}])
    check({"allOf": [{"anyOf": [{"type": "integer"}, {"type": "string"}]}, {"anyOf": [{"minimum": 3}, {"maxLength": 2}]}]}, valid=[3, "ab", 1], invalid=[None])
    check({"type": "object", "properties": {"a": {}, "b": {}}, "dependentSchemas": {"a": {"required": ["b"]}}}, valid=[{"b": 1}, {"a": 1, "b": 2}], invalid=[{"a": 1}])


def test_layouts():
    schema = {"type": "object", "properties": {"a": {"type": "array", "items": {"type": "integer"}}, "b": {"type": "object"}}, "required": ["a", "b"]}
    inst = {"a": [1, 2], "b": {}}
    g = json_schema_to_grammar(schema, whitespace="compact")
    assert matcher_accepts(g, json.dumps(inst, separators=(",", ":"))) and not matcher_accepts(g, json.dumps(inst))
    g = json_schema_to_grammar(schema, whitespace=2)
    assert matcher_accepts(g, json.dumps(inst, indent=2)) and not matcher_accepts(g, json.dumps(inst))
    assert matcher_accepts(g, json.dumps({"a": [], "b": {"k": {"z": [None]}}}, indent=2))
    g = json_schema_to_grammar(schema, max_whitespace=3)
    assert matcher_accepts(g, '{ "a" :\n [1 , 2],"b":{ } }')
    assert not matcher_accepts(g, '{"a":[1],' + " " * 4 + '"b":{}}')
    # Leading whitespace is fine; trailing whitespace is refused by design (it only burns budget).
    assert matcher_accepts(g, "\n" + json.dumps(inst, indent=1))
    assert not matcher_accepts(g, json.dumps(inst, indent=1) + " ")


def test_compile_json_schema_wrapper_and_shortest_completion():
    from grammar import GrammarMatcher, compile_json_schema

    schema = {"type": "object", "properties": {"a": {"const": 1}, "b": {"type": "string"}}, "required": ["a"], "additionalProperties": False}
    m = GrammarMatcher(compile_json_schema(schema, BYTES, whitespace="compact"))
    assert m.shortest_completion() == b'{"a":1}'
    m = GrammarMatcher(compile_json_schema(json.dumps(schema), BYTES))
    assert m.accept_bytes(b'{"a": 1, "b": "x')
    tail = m.shortest_completion()
    assert json.loads(b'{"a": 1, "b": "x' + tail) == {"a": 1, "b": "x"}


def test_indent_mode_with_recursion():
    tree = {"$defs": {"n": {"type": "object", "properties": {"k": {"type": "array", "items": {"$ref": "#/$defs/n"}}}, "additionalProperties": False}}, "$ref": "#/$defs/n"}
    g = json_schema_to_grammar(tree, whitespace=2)
    doc = {"k": [{"k": []}, {"k": [{}]}]}
    assert matcher_accepts(g, json.dumps(doc, indent=2))
    assert not matcher_accepts(g, json.dumps(doc, indent=4))
    g0 = json_schema_to_grammar(tree, whitespace=0)
    assert matcher_accepts(g0, json.dumps(doc, indent=0))


def test_compile_cache_keeps_property_order_apart():
    from grammar import GrammarMatcher, compile_json_schema

    a = {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}}}
    b = {"type": "object", "properties": {"y": {"type": "integer"}, "x": {"type": "integer"}}}
    for schema, text in ((a, '{"x": 1, "y": 2}'), (b, '{"y": 2, "x": 1}')):
        m = GrammarMatcher(compile_json_schema(schema, BYTES))
        assert m.accept_bytes(text) and m.can_terminate(), text
