"""The local keywords of one schema object: ``type``, ``enum``/``const`` and each type's own.

Each keyword constrains only its own type (``minimum`` says nothing about strings): numbers
become a ``NumConj``, strings a ``StrSet`` (patterns in ECMA-262 syntax, formats, lengths),
arrays an ``ArrConj`` (``prefixItems``/``items``, or draft-07 ``items`` arrays with
``additionalItems``; counts; ``contains`` with its bounds; ``uniqueItems``), objects a union of
``ObjConj`` (``dependentRequired`` distributes: absent, or present with its companions).
Subschemas stay lazy expressions (``den.sub``). In-place applicators are ``schema_denoter``'s.
"""

from __future__ import annotations

from fractions import Fraction
from math import gcd
from typing import TYPE_CHECKING

from .. import ir
from ..errors import GrammarBudgetError, SchemaError, UnsupportedFeatureError
from ..regex import regex_to_ir
from .conjs import ArrConj, KeyLang, ObjConj, Pattern, arr_normalize, obj_and, obj_normalize, pattern_lang
from .denotation_algebra import BOOLS, Denot, conj, value_denot, values_denot
from .exprs import FALSE, TRUE, Expr
from .formats import format_expr
from .numsets import NumConj, NumSet
from .refs import pointer_escape
from .strsets import StrSet

if TYPE_CHECKING:
    from .schema_denoter import Denoter

TYPES = ("null", "boolean", "object", "array", "string", "number", "integer")


def type_set(schema: dict) -> set[str] | None:
    t = schema.get("type")
    if t is None:
        return None
    return {t} if isinstance(t, str) else set(t)


def local(den: "Denoter", s: dict, ptr: str, scope: tuple) -> Denot:
    """Type, enum/const and the type-specific keywords of one schema object."""
    types = type_set(s)
    if types is None:
        types = set(TYPES)
    for t in types:
        if t not in TYPES:
            raise SchemaError(f"unknown type {t!r} at {ptr or '/'}")
    num = NumSet.none()
    if "number" in types or "integer" in types:
        num = NumSet.of(number(s, ptr, "number" not in types))
    d = Denot(
        "null" in types,
        BOOLS if "boolean" in types else frozenset(),
        num,
        string(den, s, ptr) if "string" in types else StrSet.none(),
        array(den, s, ptr, scope) if "array" in types else (),
        objects(den, s, ptr, scope) if "object" in types else (),
    )
    if "const" in s:
        d = conj(d, value_denot(s["const"]))
    if "enum" in s:
        d = conj(d, values_denot(list(s["enum"])))
    return d

def number(s: dict, ptr: str, integer: bool) -> NumConj:
    lo, lo_x, hi, hi_x = bounds(s, ptr)
    mult = Fraction(1) if integer else None
    if "multipleOf" in s:
        m = s["multipleOf"]
        if isinstance(m, bool) or not isinstance(m, (int, float)) or m <= 0:
            raise SchemaError(f"'multipleOf' at {ptr or '/'} must be a positive number")
        f = Fraction(str(m)) if isinstance(m, float) else Fraction(m)
        mult = f if mult is None else _lcm(mult, f)
    return NumConj(lo, lo_x, hi, hi_x, mult)

def string(den: "Denoter", s: dict, ptr: str) -> StrSet:
    out = StrSet(_count(s, "minLength", ptr, 0), _count(s, "maxLength", ptr, None))
    if "pattern" in s:
        try:
            expr = regex_to_ir(s["pattern"], flavor="ecma", mode="search")
        except UnsupportedFeatureError as exc:
            den.refuse("pattern", ptr, str(exc))
        else:
            safe = _dialect_safe(s["pattern"])
            approx = None if safe == ALL_CHARS else ("pattern", f"pattern {s['pattern']!r} at {ptr or '/'}", safe)
            out = out & StrSet.of(expr, approx)
    fmt = s.get("format")
    if isinstance(fmt, str):
        try:
            expr = format_expr(fmt, ptr)
        except UnsupportedFeatureError as exc:
            den.refuse("format", ptr, str(exc))
            expr = None
        if expr is not None:
            out = out & StrSet.of(expr, ("format", f"format '{fmt}' at {ptr or '/'}", None))
    return out

def array(den: "Denoter", s: dict, ptr: str, scope: tuple) -> tuple[ArrConj, ...]:
    items = s.get("items")
    if den.legacy_items or isinstance(items, list):
        if isinstance(items, list):
            prefix = tuple(den.sub(f"{ptr}/items/{i}", scope) for i in range(len(items)))
            rest = den.sub(f"{ptr}/additionalItems", scope) if "additionalItems" in s else TRUE
            ev_all = "additionalItems" in s
        else:
            prefix, rest, ev_all = (), den.sub(f"{ptr}/items", scope) if "items" in s else TRUE, "items" in s
    else:
        prefix = tuple(den.sub(f"{ptr}/prefixItems/{i}", scope) for i in range(len(s.get("prefixItems", ()))))
        rest = den.sub(f"{ptr}/items", scope) if "items" in s else TRUE
        ev_all = "items" in s
    contains: tuple = ()
    ev_contains: tuple = ()
    if "contains" in s:
        c = den.sub(f"{ptr}/contains", scope)
        mn = _count(s, "minContains", ptr, 1)
        mx = _count(s, "maxContains", ptr, None)
        contains = ((c, mn, mx, 0),)
        ev_contains = (c,)
    conj_ = ArrConj(prefix, rest, _count(s, "minItems", ptr, 0), _count(s, "maxItems", ptr, None), contains,
                    s.get("uniqueItems") is True, len(prefix), ev_all, ev_contains)
    out = arr_normalize(conj_)
    return () if out is None else (out,)

def objects(den: "Denoter", s: dict, ptr: str, scope: tuple) -> tuple[ObjConj, ...]:
    props = tuple((name, den.sub(f"{ptr}/properties/{pointer_escape(name)}", scope)) for name in s.get("properties", {}))
    rules: list[tuple[KeyLang, Expr]] = []
    pats: list[Pattern] = []
    for p in s.get("patternProperties", {}):
        if "{," in p:
            den.refuse("patternProperties", ptr, f"pattern {p!r}: ECMA-262 reads '{{,' as text, Python's re as a repeat")
            continue
        try:
            pir = regex_to_ir(p, flavor="ecma", mode="search")
        except UnsupportedFeatureError as exc:
            den.refuse("patternProperties", ptr, str(exc))
            continue
        safe = _dialect_safe(p)
        pattern = Pattern(pir, p, None if safe in (None, ALL_CHARS) else safe)
        pats.append(pattern)
        rules.append((pattern_lang(pattern), den.sub(f"{ptr}/patternProperties/{pointer_escape(p)}", scope)))
    if "additionalProperties" in s:
        names = frozenset(s.get("properties", {}))
        rules.append((KeyLang(without=names, unless=tuple(pats)), den.sub(f"{ptr}/additionalProperties", scope)))
    names_set = None
    if "propertyNames" in s:
        names_set = den.expr(den.sub(f"{ptr}/propertyNames", scope)).str
    base = ObjConj(
        props, tuple(dict.fromkeys(s.get("required", ()))), tuple(rules), names_set,
        _count(s, "minProperties", ptr, 0), _count(s, "maxProperties", ptr, None), (),
        "additionalProperties" in s or "patternProperties" in s,
        frozenset(s.get("properties", {})), tuple(pats), "additionalProperties" in s,
    )
    out = [c for c in (obj_normalize(base),) if c is not None]
    deps = dict(s.get("dependentRequired", {}))
    deps.update({k: v for k, v in s.get("dependencies", {}).items() if isinstance(v, list)})
    for name, needed in deps.items():
        absent = ObjConj(props=((name, FALSE),))
        present = ObjConj(required=tuple(dict.fromkeys([name, *needed])))
        out = [z for c in out for z in (obj_and(c, absent), obj_and(c, present)) if z is not None]
        if len(out) > 512:
            raise GrammarBudgetError(f"dependentRequired at {ptr or '/'} expands to more than 512 alternatives")
    return tuple(dict.fromkeys(out))


def _frac(value, keyword: str, pointer: str) -> Fraction:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SchemaError(f"'{keyword}' at {pointer or '/'} must be a number")
    return Fraction(str(value)) if isinstance(value, float) else Fraction(value)


def bounds(schema: dict, pointer: str) -> tuple[Fraction | None, bool, Fraction | None, bool]:
    """The tightest (lower, lower_exclusive, upper, upper_exclusive) from the four keywords,
    accepting draft-04 boolean ``exclusiveMinimum``/``exclusiveMaximum``."""
    lo = hi = None
    lo_x = hi_x = False
    if "minimum" in schema:
        lo, lo_x = _frac(schema["minimum"], "minimum", pointer), schema.get("exclusiveMinimum") is True
    if "maximum" in schema:
        hi, hi_x = _frac(schema["maximum"], "maximum", pointer), schema.get("exclusiveMaximum") is True
    xmin, xmax = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    if xmin is not None and not isinstance(xmin, bool):
        v = _frac(xmin, "exclusiveMinimum", pointer)
        if lo is None or v >= lo:
            lo, lo_x = v, True
    if xmax is not None and not isinstance(xmax, bool):
        v = _frac(xmax, "exclusiveMaximum", pointer)
        if hi is None or v <= hi:
            hi, hi_x = v, True
    return lo, lo_x, hi, hi_x


def _count(s: dict, key: str, ptr: str, default):
    """A non-negative integer keyword (``2.0`` is 2, as the specification allows)."""
    if key not in s:
        return default
    v = s[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or v != int(v):
        raise SchemaError(f"'{key}' at {ptr or '/'} must be a non-negative integer")
    return int(v)


def _lcm(a: Fraction, b: Fraction) -> Fraction:
    return Fraction(a.numerator * b.numerator // gcd(a.numerator, b.numerator), gcd(a.denominator, b.denominator))


# Where ECMA-262 (the specification's dialect) and Python's re (what jsonschema runs) read a
# pattern differently. Enforcing the ECMA meaning is a subset of both; its complement is exact in
# both only on strings of the characters where the two agree (``_dialect_safe``).
ALL_CHARS = ((0, 0x10FFFF),)
_UNICODE_CLASSES = ("\\d", "\\D", "\\w", "\\W", "\\s", "\\S", "\\b", "\\B")
_LINE_SENSITIVE = (".", "$")
_UNREADABLE = ("{,", "\\p", "\\P", "\\c", "\\u{", "(?<", "\\k")  # a different language, or none in Python


def _dialect_safe(pattern: str) -> tuple | None:
    """The characters on which ECMA and Python agree about ``pattern`` (None: no safe subset)."""
    if any(t in pattern for t in _UNREADABLE):
        return None
    ranges = list(ALL_CHARS)
    if any(t in pattern for t in _UNICODE_CLASSES):
        # \d \w are ASCII in ECMA, Unicode in Python; \s differs on \x1c-\x1f, \x85, \ufeff.
        ranges = [(0, 0x1B), (0x20, 0x7F)]
    if any(t in pattern for t in _LINE_SENSITIVE):
        # ECMA's . stops at \n \r \u2028 \u2029, Python's only at \n; Python's $ also matches
        # before a final \n.
        ranges = list(ir.subtract_ranges(ranges, [(0x0A, 0x0A), (0x0D, 0x0D), (0x2028, 0x2029)]))
    return tuple(ranges)
