"""Scalar types: ``string`` and ``number``/``integer`` keywords to IR (no layout involved)."""

from __future__ import annotations

from fractions import Fraction
from typing import Callable

from .. import ir
from ..errors import SchemaError, UnsupportedFeatureError
from . import numbers
from .formats import format_expr
from .strings import any_string, not_in, quoted, restrict_length

Refuse = Callable[[str, str, str], None]


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


def number_expr(schema: dict, pointer: str, integer: bool, refuse: Refuse) -> ir.Expr:
    """JSON text of the numbers (or integers) satisfying the numeric keywords of ``schema``."""
    lo, lo_x, hi, hi_x = bounds(schema, pointer)
    step = _frac(schema["multipleOf"], "multipleOf", pointer) if "multipleOf" in schema else None
    if step is not None and step <= 0:
        raise SchemaError(f"'multipleOf' at {pointer or '/'} must be positive")
    if integer or (step is not None and step.denominator == 1):
        ilo, ihi = numbers.integer_bounds(lo, lo_x, hi, hi_x)
        if ilo is not None and ihi is not None and ilo > ihi:
            return ir.NOTHING
        # An integer n is a multiple of p/q (reduced) iff p divides n.
        k = 1 if step is None else step.numerator
        expr = numbers.int_range(ilo, ihi) if k == 1 else numbers.integer_multiples(k, ilo, ihi, pointer)
        # JSON Schema integers are values, not spellings: 10.0 is an integer (json.dumps of a float),
        # and so is 1e+16 when unbounded (a positive exponent on an integral mantissa). Integral
        # values spelled with fraction digits and an exponent (1.5e1) are rejected: a restriction.
        # The exponent has at most two digits: 9e99726 is an integer in JSON Schema's eyes but
        # infinity to every float-based parser (json.loads included), so it is never generated.
        expr = ir.seq(expr, ir.optional(ir.seq(ir.literal("."), ir.plus(ir.literal("0")))))
        if ilo is None and ihi is None and k == 1:
            exponent = ir.seq(ir.char_class([(0x45, 0x45), (0x65, 0x65)]), ir.optional(ir.literal("+")), ir.repeat(numbers.DIGIT, 1, 2))
            expr = ir.seq(expr, ir.optional(exponent))
        return expr
    places = None
    if step is not None:
        places = numbers.decimal_places(step)
        if places is None:
            refuse("multipleOf", pointer, f"multipleOf {schema['multipleOf']} on non-integers")
    if lo is None and hi is None and places is None:
        return numbers.JSON_NUMBER
    if lo is not None and hi is not None and (lo > hi or (lo == hi and (lo_x or hi_x))):
        return ir.NOTHING
    return numbers.number_range(lo, lo_x, hi, hi_x, max_fraction_digits=places)


def string_expr(schema: dict, pointer: str, excluded: list[str], refuse: Refuse, relaxed: frozenset[str]) -> ir.Expr:
    """JSON text of the strings satisfying the string keywords of ``schema``, minus ``excluded``."""
    lo = schema.get("minLength", 0)
    hi = schema.get("maxLength")
    if hi is not None and lo > hi:
        return ir.NOTHING
    value: ir.Expr | None = None
    if "pattern" in schema:
        from ..regex import regex_to_ir

        value = regex_to_ir(schema["pattern"], flavor="ecma", mode="search")
    if "format" in schema:
        fmt = schema["format"]
        try:
            fexpr = format_expr(fmt, pointer) if isinstance(fmt, str) else None
        except UnsupportedFeatureError:
            if "format" not in relaxed:
                raise
            fexpr = None
        if fexpr is not None:
            if value is not None:
                refuse("format", pointer, "format together with pattern")
            else:
                value = fexpr
    if excluded:
        if value is not None or lo or hi is not None:
            refuse("not", pointer, "excluding strings from a constrained string")
        else:
            return quoted(not_in(frozenset(excluded)))
    if value is None:
        return any_string(lo, hi)
    if lo or hi is not None:
        try:
            value = restrict_length(value, lo, hi, "maxLength" if hi is not None else "minLength")
        except UnsupportedFeatureError:
            keyword = "maxLength" if hi is not None else "minLength"
            refuse(keyword, pointer, "length bound together with pattern/format")
    return quoted(value)
