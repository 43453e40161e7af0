"""Property tests: the JSON Schema grammar accepts exactly what jsonschema validates.

Instances come from hypothesis (arbitrary JSON, numbers, unicode text) and are dumped the ways
real producers do (``ensure_ascii`` on and off, compact separators). Object instances keep the
``properties`` order, the documented emission order.
"""

from __future__ import annotations

import json
from decimal import Decimal
from functools import lru_cache

import jsonschema
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from grammar import SchemaError, TokenVocabulary
from grammar.json_schema import json_schema_to_grammar
from property_budget import examples

BYTES = TokenVocabulary.byte_level()
SETTINGS = settings(max_examples=examples(60), deadline=None)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(min_value=-1e15, max_value=1e15) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
)


@lru_cache(maxsize=64)
def _compiled(schema_text: str):
    from grammar.compiler import compile_grammar

    return compile_grammar(json_schema_to_grammar(json.loads(schema_text)), BYTES)


def accepts(schema, text: str) -> bool:
    from grammar.matcher import GrammarMatcher

    m = GrammarMatcher(_compiled(json.dumps(schema)))  # keep key order: properties are emitted in order
    return m.accept_bytes(text.encode("utf-8")) and m.can_terminate()


def agree(schema, instance) -> None:
    expected = jsonschema.Draft202012Validator(schema).is_valid(instance)
    for text in {json.dumps(instance), json.dumps(instance, ensure_ascii=False), json.dumps(instance, separators=(",", ":"))}:
        assert accepts(schema, text) == expected, (schema, text, expected)


@SETTINGS
@given(st.integers(-10**5, 10**5) | st.none(), st.integers(-10**5, 10**5) | st.none(), st.integers(-2 * 10**5, 2 * 10**5))
def test_integer_ranges_exact(lo, hi, value):
    schema: dict = {"type": "integer"}
    if lo is not None:
        schema["minimum"] = lo
    if hi is not None:
        schema["maximum"] = hi
    if lo is not None and hi is not None and lo > hi:
        return
    agree(schema, value)


decimals = st.decimals(min_value=-1000, max_value=1000, places=3, allow_nan=False, allow_infinity=False)


@SETTINGS
@given(decimals | st.none(), decimals | st.none(), st.booleans(), st.booleans(), decimals)
def test_number_ranges_exact(lo, hi, lo_x, hi_x, value):
    schema: dict = {"type": "number"}
    if lo is not None:
        schema["exclusiveMinimum" if lo_x else "minimum"] = float(lo)
    if hi is not None:
        schema["exclusiveMaximum" if hi_x else "maximum"] = float(hi)
    try:
        g = _compiled(json.dumps(schema))
    except SchemaError as exc:  # an empty interval is refused as unsatisfiable, and only that
        assert type(exc) is SchemaError and "unsatisfiable" in str(exc), exc
        empty = lo is not None and hi is not None and (lo > hi or (lo == hi and (lo_x or hi_x)))
        assert empty, (schema, exc)
        return
    assert g is not None
    text = format(value.normalize(), "f") if value == value.to_integral() else str(value)
    expected = jsonschema.Draft202012Validator(schema).is_valid(float(Decimal(text)))
    assert accepts(schema, text) == expected, (schema, text)


@SETTINGS
@given(st.text(max_size=12), st.integers(0, 6), st.integers(0, 6) | st.none())
def test_string_lengths_and_escapes(text, lo, hi):
    if hi is not None and hi < lo:
        return
    schema: dict = {"type": "string", "minLength": lo}
    if hi is not None:
        schema["maxLength"] = hi
    agree(schema, text)


@SETTINGS
@given(json_values)
def test_type_unions(value):
    agree(True, value)
    agree({"type": ["string", "null", "array"]}, value)
    agree({"type": "object", "additionalProperties": {"type": ["integer", "boolean"]}}, value)


PROPS = {"id": {"type": "integer", "minimum": 1}, "name": {"type": "string", "maxLength": 5}, "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}, "meta": {}}


@SETTINGS
@given(st.fixed_dictionaries({}, optional={k: json_values | st.integers(-3, 3) | st.sampled_from(["a", "b", "abcdef"]) | st.lists(st.sampled_from(["a", "b", "c"]), max_size=3) for k in PROPS}), st.booleans())
def test_objects_in_properties_order(obj, strict):
    ordered = {k: obj[k] for k in PROPS if k in obj}
    schema = {"type": "object", "properties": PROPS, "required": ["id"]}
    if strict:
        schema["additionalProperties"] = False
    agree(schema, ordered)


def _spellings(cp: int) -> dict[str, bool]:
    """Every JSON spelling of the character ``cp``, each with whether formcast accepts it: raw
    unless JSON must escape it, a short escape where one exists, and ``\\uXXXX`` (either hex
    case, surrogate pairs for astral characters) except for printable ASCII (by design)."""
    ch = chr(cp)
    out = {ch: cp >= 0x20 and ch not in '"\\'}
    short = {0x22: '\\"', 0x5C: "\\\\", 0x2F: "\\/", 0x08: "\\b", 0x0C: "\\f", 0x0A: "\\n", 0x0D: "\\r", 0x09: "\\t"}
    if cp in short:
        out[short[cp]] = True
    units = [cp] if cp <= 0xFFFF else [0xD800 + ((cp - 0x10000) >> 10), 0xDC00 + ((cp - 0x10000) & 0x3FF)]
    for upper in (False, True):
        text = "".join(f"\\u{u:04X}" if upper else f"\\u{u:04x}" for u in units)
        out[text] = not 0x20 <= cp <= 0x7E
    return out


code_points = st.integers(0, 0x10FFFF).filter(lambda c: not 0xD800 <= c <= 0xDFFF)


@SETTINGS
@given(st.lists(st.tuples(code_points, st.integers(0, 3000)), min_size=1, max_size=4), st.lists(code_points, min_size=1, max_size=8))
def test_encoded_classes_accept_exactly_the_spellings_of_their_characters(spans, probes):
    """``encode_char_class``: one character of the class in any JSON spelling formcast allows,
    and nothing else (probes inside and outside the class, near its edges)."""
    from grammar import ir
    from grammar.compiler import compile_grammar
    from grammar.json_schema.strings import encode_char_class
    from grammar.matcher import GrammarMatcher

    ranges = ir.normalize_ranges((lo, min(lo + n, 0x10FFFF)) for lo, n in spans)
    ranges = ir.subtract_ranges(ranges, [(0xD800, 0xDFFF)])
    if not ranges:
        return
    compiled = compile_grammar(ir.Grammar({"root": ir.seq(ir.literal('"'), encode_char_class(ranges), ir.literal('"'))}), BYTES)
    edges = [x for lo, hi in ranges for x in (lo - 1, lo, hi, hi + 1)]
    for cp in probes + edges:
        if not 0 <= cp <= 0x10FFFF or 0xD800 <= cp <= 0xDFFF:
            continue
        inside = any(lo <= cp <= hi for lo, hi in ranges)
        for text, allowed in _spellings(cp).items():
            m = GrammarMatcher(compiled)
            got = m.accept_bytes(('"' + text + '"').encode("utf-8")) and m.can_terminate()
            assert got == (inside and allowed), (ranges, hex(cp), text)


key_words = st.frozensets(st.text(alphabet='ab"\\/é\n日x😀', max_size=4), max_size=6)


@SETTINGS
@given(key_words)
def test_key_complement_built_in_one_pass_equals_the_three_pass_build(words):
    """``quoted_not_in`` (the key beside named keys) is the same IR as quoting the complement."""
    from grammar import ir
    from grammar.fsm import build_nfa
    from grammar.json_schema.strings import not_in, quoted, quoted_not_in

    one_pass, three_pass = quoted_not_in(words), quoted(not_in(words))
    assert one_pass == three_pass
    # The same automaton too: the builder shares subexpressions by how often they occur, so the
    # one-pass build must not reuse a node object where the three passes made several.
    nfas = [build_nfa(ir.Grammar({"root": ir.choice(ir.seq(ir.literal("{"), q, ir.literal("}")), ir.seq(ir.literal("["), q, q))}))
            for q in (one_pass, three_pass)]
    a, b = (vars(n.arrays()) for n in nfas)
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_key_complement_of_long_names_equals_the_three_pass_build():
    """Past the quote-moving depth limit (names of about a hundred characters) too."""
    from grammar.json_schema.strings import not_in, quoted, quoted_not_in

    for words in (frozenset(["x" * 99, "x" * 100 + "é", "y"]), frozenset(["a" * 110, "ab", ""])):
        assert quoted_not_in(words) == quoted(not_in(words))
