"""Schema expressions: the lazy, hashable form in which subschemas travel through the algebra.

A value constraint inside an object or array conjunction (a property's schema, the items'
schema, a ``contains`` schema) is an expression over document nodes, not yet lowered:

- ``Ptr(pointer, scope)``: the schema at a JSON pointer of the (ref-normalized) document;
  ``scope`` is the dynamic scope ``$dynamicRef`` resolves against (empty when unused);
- ``Const(text)``: exactly one JSON value (canonical text);
- ``And`` / ``Or`` / ``Not``: boolean combinations; ``TRUE`` and ``FALSE``.

The smart constructors flatten and simplify (``not not x == x``, ``FALSE`` absorbs ``And``), so
equal constraints meet as equal keys in the lowering's rule memo. ``holds`` evaluates an
expression on a value with ``jsonschema`` at the leaves: the exact membership test that filters
``enum`` values and decides constants.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Callable, Iterable, Union


@dataclass(frozen=True)
class Ptr:
    ptr: str
    scope: tuple[str, ...] = ()


@dataclass(frozen=True)
class Const:
    text: str  # canonical JSON (see ``canonical``)

    @property
    def value(self) -> Any:
        return json.loads(self.text, object_hook=_from_num)


@dataclass(frozen=True)
class Bool:
    value: bool


@dataclass(frozen=True)
class And:
    items: frozenset["Expr"]


@dataclass(frozen=True)
class Or:
    items: frozenset["Expr"]


@dataclass(frozen=True)
class Not:
    item: "Expr"


Expr = Union[Ptr, Const, Bool, And, Or, Not]
TRUE = Bool(True)
FALSE = Bool(False)


def and_(*items: Expr) -> Expr:
    out: set[Expr] = set()
    for e in items:
        if e == FALSE:
            return FALSE
        if e == TRUE:
            continue
        out.update(e.items if isinstance(e, And) else (e,))
    for e in out:
        if not_(e) in out:
            return FALSE
    if not out:
        return TRUE
    return next(iter(out)) if len(out) == 1 else And(frozenset(out))


def or_(*items: Expr) -> Expr:
    out: set[Expr] = set()
    for e in items:
        if e == TRUE:
            return TRUE
        if e == FALSE:
            continue
        out.update(e.items if isinstance(e, Or) else (e,))
    if not out:
        return FALSE
    return next(iter(out)) if len(out) == 1 else Or(frozenset(out))


def not_(e: Expr) -> Expr:
    if isinstance(e, Bool):
        return Bool(not e.value)
    if isinstance(e, Not):
        return e.item
    return Not(e)


def const(value: Any) -> Const:
    return Const(canonical(value))


def canonical(value: Any) -> str:
    """JSON text equal for JSON-equal values (1 == 1.0, key order ignored, but true != 1)."""
    return json.dumps(_normalized(value), sort_keys=True, ensure_ascii=False)


def _normalized(v: Any) -> Any:
    # Module level, not a closure over itself: a self-referencing closure is a reference cycle
    # that only the cyclic collector frees.
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return v
    if isinstance(v, (int, float)):
        f = Fraction(str(v)) if isinstance(v, float) else Fraction(v)
        return {"$num": str(f)}
    if isinstance(v, list):
        return [_normalized(x) for x in v]
    if isinstance(v, dict):
        return {k: _normalized(x) for k, x in v.items()}
    return v


def _from_num(d: dict) -> Any:
    if len(d) == 1 and "$num" in d and isinstance(d["$num"], str):
        f = Fraction(d["$num"])
        return int(f) if f.denominator == 1 else float(f)
    return d


def pointer_of(e: Expr) -> str:
    """A JSON pointer to name in messages: the first document node inside ``e``."""
    stack = [e]
    while stack:
        x = stack.pop()
        if isinstance(x, Ptr):
            return x.ptr
        if isinstance(x, (And, Or)):
            stack.extend(x.items)
        elif isinstance(x, Not):
            stack.append(x.item)
    return ""


def holds(e: Expr, value: Any, leaf: Callable[[Any, Ptr], bool]) -> bool:
    """Whether ``value`` satisfies ``e``; ``leaf(value, ptr)`` validates against a document node."""
    if isinstance(e, Bool):
        return e.value
    if isinstance(e, Const):
        return canonical(value) == e.text
    if isinstance(e, Ptr):
        return leaf(value, e)
    if isinstance(e, And):
        return all(holds(x, value, leaf) for x in e.items)
    if isinstance(e, Or):
        return any(holds(x, value, leaf) for x in e.items)
    return not holds(e.item, value, leaf)


def consts_of(items: Iterable[Expr]) -> list[Const]:
    return [x for x in items if isinstance(x, Const)]
