"""``allOf`` as one schema: merge two schema objects into their exact intersection, or refuse.

Keywords that combine exactly (type intersection, tighter bounds, union of ``required``,
property-wise ``allOf``...) are merged; anything else that both sides constrain differently is
refused with UnsupportedFeatureError naming the keyword. Branching keywords (``anyOf``,
``oneOf``) of the second side are deferred into a residual ``allOf`` so the lowering can
distribute them over its branches.
"""

from __future__ import annotations

import json
from fractions import Fraction
from math import gcd
from typing import Any

from ..errors import UnsupportedFeatureError

TYPES = ("null", "boolean", "object", "array", "string", "number", "integer")
ANNOTATIONS = frozenset(
    "title description default examples $comment $schema $id $anchor $dynamicAnchor deprecated readOnly writeOnly "
    "contentMediaType contentEncoding contentSchema $vocabulary".split()
)
# Keywords with assertion semantics (any other key is an annotation or unknown).
VOCABULARY = frozenset(
    "type enum const properties required additionalProperties patternProperties propertyNames minProperties "
    "maxProperties items prefixItems additionalItems minItems maxItems contains minContains maxContains uniqueItems "
    "minLength maxLength pattern format minimum maximum exclusiveMinimum exclusiveMaximum multipleOf anyOf oneOf "
    "allOf not if then else $ref dependentRequired dependentSchemas dependencies unevaluatedProperties "
    "unevaluatedItems $dynamicRef $recursiveRef $defs definitions".split()
)
_LOWER = ("minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties", "minContains")
_UPPER = ("maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties", "maxContains")


def canonical(value: Any) -> str:
    """A key equal for JSON-equal values (1 == 1.0, but true != 1)."""
    def norm(v: Any) -> Any:
        if isinstance(v, bool) or v is None or isinstance(v, str):
            return v
        if isinstance(v, (int, float)):
            f = Fraction(str(v)) if isinstance(v, float) else Fraction(v)
            return {"$num": str(f)}
        if isinstance(v, list):
            return [norm(x) for x in v]
        if isinstance(v, dict):
            return {k: norm(x) for k, x in v.items()}
        return v
    return json.dumps(norm(value), sort_keys=True)


def type_set(schema: dict) -> set[str] | None:
    t = schema.get("type")
    if t is None:
        return None
    return {t} if isinstance(t, str) else set(t)


def _merge_types(a: set[str] | None, b: set[str] | None) -> set[str] | None:
    if a is None or b is None:
        return a if b is None else b
    out = a & b
    if "integer" in a and "number" in b or "number" in a and "integer" in b:
        out.add("integer")
    return out


def _values(schema: dict) -> list | None:
    if "const" in schema:
        return [schema["const"]]
    return list(schema["enum"]) if "enum" in schema else None


def merge(a: dict, b: dict, pointer: str) -> dict:
    """The intersection of schema objects ``a`` and ``b`` (neither may carry ``$ref``)."""
    out = dict(a)
    for key, bv in b.items():
        if key in ANNOTATIONS or key not in out:
            if key not in ANNOTATIONS and key not in ("const", "enum", "type"):
                out[key] = bv
            continue
        av = out[key]
        if av == bv and key not in ("allOf",):
            continue
        out[key] = _merge_key(key, av, bv, a, b, pointer)
    types = _merge_types(type_set(a), type_set(b))
    if types is not None:
        out["type"] = sorted(types)
    va, vb = _values(a), _values(b)
    if va is not None or vb is not None:
        out.pop("const", None)
        if va is None or vb is None:
            out["enum"] = va if vb is None else vb
        else:
            keys = {canonical(v) for v in vb}
            out["enum"] = [v for v in va if canonical(v) in keys]
    _merge_additional(out, a, b, pointer)
    return out


def _merge_key(key: str, av: Any, bv: Any, a: dict, b: dict, pointer: str) -> Any:
    if key in _LOWER:
        if isinstance(av, bool) or isinstance(bv, bool):  # draft-04 boolean exclusives
            raise UnsupportedFeatureError(f"allOf: cannot merge draft-04 boolean '{key}' at {pointer or '/'}")
        return max(av, bv)
    if key in _UPPER:
        if isinstance(av, bool) or isinstance(bv, bool):
            raise UnsupportedFeatureError(f"allOf: cannot merge draft-04 boolean '{key}' at {pointer or '/'}")
        return min(av, bv)
    if key == "required":
        return list(dict.fromkeys([*av, *bv]))
    if key == "uniqueItems":
        return bool(av or bv)
    if key in ("properties", "dependentRequired"):
        merged = dict(av)
        for name, sub in bv.items():
            if name not in merged:
                merged[name] = sub
            elif key == "properties":
                merged[name] = {"allOf": [merged[name], sub]}
            else:
                merged[name] = list(dict.fromkeys([*merged[name], *sub]))
        return merged
    if key in ("items", "contains", "propertyNames") and not isinstance(av, list) and not isinstance(bv, list):
        return {"allOf": [av, bv]}
    if key == "multipleOf":
        fa, fb = Fraction(str(av)), Fraction(str(bv))
        if fa.denominator == 1 and fb.denominator == 1:
            return int(fa * fb // gcd(int(fa), int(fb)))
    if key in ("allOf",):
        return [*av, *bv]
    if key in ("anyOf", "oneOf"):
        return av  # bv is deferred below by the caller through allOf
    if key in ("const", "enum", "type", "additionalProperties"):
        return av  # merged after the loop
    if key == "not":
        return {"anyOf": [av, bv]}  # not A and not B == not (A or B); ``negate`` splits it again
    if key not in VOCABULARY:
        return av  # an unknown keyword is an annotation: it constrains nothing
    raise UnsupportedFeatureError(f"allOf: cannot merge differing '{key}' at {pointer or '/'}")


def _merge_additional(out: dict, a: dict, b: dict, pointer: str) -> None:
    """``additionalProperties`` of one side constrains the other side's named properties too."""
    residual = []
    for key in ("anyOf", "oneOf"):
        if key in a and key in b and a[key] != b[key]:
            residual.append({key: b[key]})
    if residual:
        out["allOf"] = [*out.get("allOf", []), *residual]
    if "additionalProperties" not in a and "additionalProperties" not in b:
        return
    if "patternProperties" in a or "patternProperties" in b:
        if a.get("patternProperties") != b.get("patternProperties") or a.get("additionalProperties") != b.get("additionalProperties"):
            raise UnsupportedFeatureError(f"allOf: cannot merge 'additionalProperties' with 'patternProperties' at {pointer or '/'}")
        return
    props = dict(out.get("properties", {}))
    for side, other in ((a, b), (b, a)):
        extra = side.get("additionalProperties", True)
        if extra is True:
            continue
        for name in other.get("properties", {}):
            if name not in side.get("properties", {}):
                props[name] = {"allOf": [props[name], extra]}
        for name in other.get("required", []):
            if name not in side.get("properties", {}) and name not in other.get("properties", {}):
                props[name] = {"allOf": [props.get(name, True), extra]}
    if props:
        out["properties"] = props
    xa, xb = a.get("additionalProperties", True), b.get("additionalProperties", True)
    if xa is True or xb is True:
        out["additionalProperties"] = xb if xa is True else xa
    elif xa is False or xb is False:
        out["additionalProperties"] = False
    else:
        out["additionalProperties"] = {"allOf": [xa, xb]}
