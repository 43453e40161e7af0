"""Membership of a JSON value in a denotation: the algebra's own validator.

Used where jsonschema cannot decide for us (``$dynamicRef`` scopes are ours, not its): deciding
whether an ``enum``/``const`` value survives the other constraints. It follows exactly the
semantics the grammar is built from, so a value it accepts is one the grammar accepts.
"""

from __future__ import annotations

from fractions import Fraction
from typing import TYPE_CHECKING, Any

from .conjs import ArrConj, ObjConj
from .denotation_algebra import Denot
from .exprs import Expr, canonical

if TYPE_CHECKING:
    from .schema_denoter import Denoter


def member(v: Any, d: Denot, den: "Denoter") -> bool:
    if v is None:
        return d.null
    if isinstance(v, bool):
        return v in d.bools
    if isinstance(v, (int, float)):
        return d.num.contains(Fraction(str(v)) if isinstance(v, float) else Fraction(v))
    if isinstance(v, str):
        return not d.str.empty and d.str.accepts(v)
    if isinstance(v, list):
        return any(_array(v, c, den) for c in d.arr)
    if isinstance(v, dict):
        return any(_object(v, c, den) for c in d.obj)
    return False


def _holds(v: Any, e: Expr, den: "Denoter") -> bool:
    return member(v, den.expr(e), den)


def _array(v: list, c: ArrConj, den: "Denoter") -> bool:
    if len(v) < c.lo or (c.hi is not None and len(v) > c.hi):
        return False
    if not all(_holds(x, c.item(i), den) for i, x in enumerate(v)):
        return False
    for s, mn, mx, start in c.contains:
        n = sum(1 for x in v[start:] if _holds(x, s, den))
        if n < mn or (mx is not None and n > mx):
            return False
    return not c.unique or len({canonical(x) for x in v}) == len(v)


def _object(v: dict, c: ObjConj, den: "Denoter") -> bool:
    if len(v) < c.lo or (c.hi is not None and len(v) > c.hi) or any(k not in v for k in c.required):
        return False
    props = dict(c.props)
    for k, x in v.items():
        if c.names is not None and not c.names.accepts(k):
            return False
        if k in props and not _holds(x, props[k], den):
            return False
        if any(lang.may_accept(k) and not _holds(x, s, den) for lang, s in c.rules):
            return False
    return all(any(lang.must_accept(k) and _holds(x, s, den) for k, x in v.items()) for lang, s in c.exists)
