"""Denotations: the set of JSON values a schema allows, split by type, with exact boolean operations.

A ``Denot`` holds one part per JSON type: ``null`` (allowed or not), the allowed booleans, a
``NumSet``, a ``StrSet``, and unions (lists) of ``ArrConj`` / ``ObjConj`` for arrays and
objects. Intersection works part by part (pairwise for the unions), union concatenates, and
complement is exact for every part: the scalar sets complement themselves, and the complement
of a union of conjunctions is the intersection of their one-atom negations (De Morgan).

So ``allOf``, ``anyOf``, ``oneOf`` ("this branch and none of the others"), ``not`` and
``if``/``then``/``else`` are all exact here; what cannot be complemented (a negated
``uniqueItems``, a negated inexact format) is refused through ``refuse``.

Unions of conjunctions can grow multiplicatively (a ``oneOf`` of ten object shapes that share
optional keys and no required discriminator). Past ``MAX_BRANCHES`` members a union keeps the
``KEEP_WHEN_CUT`` simplest ones (fewest constraints: in a tagged union, those that pin the tag)
and the denotation records it in ``approx``: a subset, so enforcing it never accepts an invalid
value, but its complement would, so complementing it is refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any, Callable

from ..budget import MEET_STEPS, charge
from ..errors import GrammarBudgetError, GrammarError, SchemaError
from .conjs import ArrConj, KeyLang, ObjConj, arr_and, arr_implies, arr_negations, obj_and, obj_implies, obj_negations, prune
from .exprs import FALSE, const
from .numsets import NumConj, NumSet
from .strsets import StrSet

MAX_BRANCHES = 256
KEEP_WHEN_CUT = 32
BOOLS = frozenset([True, False])
Refuse = Callable[[str, str], None]  # (keyword, why) with the pointer bound by the caller


@dataclass(frozen=True)
class Denot:
    null: bool = False
    bools: frozenset[bool] = frozenset()
    num: NumSet = field(default_factory=NumSet.none)
    str: StrSet = field(default_factory=StrSet.none)
    arr: tuple[ArrConj, ...] = ()
    obj: tuple[ObjConj, ...] = ()
    approx: str | None = None  # why this is a subset of the schema's values, not all of them

    def is_empty(self) -> bool:
        """Provably empty, cheaply (a string language is not determinized here)."""
        s = self.str
        no_str = s.empty or (s.hi is not None and s.lo > s.hi)
        return not (self.null or self.bools or self.arr or self.obj) and self.num.is_empty() and no_str

    def types(self) -> set[str]:
        out = set()
        if self.null:
            out.add("null")
        if self.bools:
            out.add("boolean")
        if not self.num.is_empty():
            out.add("number")
        if not self.str.empty:
            out.add("string")
        if self.arr:
            out.add("array")
        if self.obj:
            out.add("object")
        return out


TOP = Denot(True, BOOLS, NumSet.all(), StrSet.all(), (ArrConj(),), (ObjConj(),))
BOTTOM = Denot()


def only(**parts: Any) -> Denot:
    """A denotation with the given parts and nothing of the other types."""
    return replace(BOTTOM, **parts)


def but(**parts: Any) -> Denot:
    """Everything, with the given parts replaced (``but(obj=(...))``: any non-object, or those objects)."""
    return replace(TOP, **parts)


def _size(c: ArrConj | ObjConj) -> int:
    if isinstance(c, ObjConj):
        return len(c.props) + len(c.required) + len(c.rules) + len(c.exists)
    return len(c.prefix) + len(c.contains)


def _tick(meets: int = 1) -> None:
    charge("denoting the JSON schema (products of alternatives)", meets * MEET_STEPS)


class _Cut:
    """Records whether a union was cut down to its simplest members; ``viable`` (when given)
    drops members with a required key whose value schema is provably empty."""

    def __init__(self, viable: Callable[[Any], bool] | None = None) -> None:
        self.why: str | None = None
        self.viable = viable

    def fit(self, items: list, implies) -> list:
        _tick()
        items = prune(items, implies) if len(items) > 1 else items
        if len(items) <= MAX_BRANCHES:
            return items
        if self.viable is not None:
            items = [c for c in items if self.viable(c)]
            if len(items) <= MAX_BRANCHES:
                return items
        self.why = f"a union of more than {MAX_BRANCHES} alternatives was cut to its {KEEP_WHEN_CUT} simplest"
        return sorted(items, key=_size)[:KEEP_WHEN_CUT]

    def fit_num(self, s: NumSet) -> NumSet:
        if len(s.conjs) <= MAX_BRANCHES:
            return s
        self.why = f"a union of more than {MAX_BRANCHES} number ranges was cut"
        return NumSet(s.conjs[:KEEP_WHEN_CUT])

    def approx(self, *parts: Denot) -> str | None:
        return self.why or next((p.approx for p in parts if p.approx), None)


def conj(a: Denot, b: Denot) -> Denot:
    cut = _Cut()
    arr = _cross(a.arr, b.arr, arr_and, arr_implies, cut)
    obj = _cross(a.obj, b.obj, obj_and, obj_implies, cut)
    num = cut.fit_num(a.num & b.num)
    return Denot(a.null and b.null, a.bools & b.bools, num, a.str & b.str, arr, obj, cut.approx(a, b))


def _cross(xs: tuple, ys: tuple, meet, implies, cut: _Cut) -> tuple:
    out: dict = {}
    for x in xs:
        for y in ys:
            z = x if x == y else meet(x, y)
            if z is not None:
                out[z] = None
        _tick(len(ys))
        if len(out) > MAX_BRANCHES:
            out = dict.fromkeys(cut.fit(list(out), implies))
    return tuple(cut.fit(list(out), implies))


def disj(a: Denot, b: Denot) -> Denot:
    cut = _Cut()
    num = cut.fit_num(a.num | b.num)
    arr = tuple(cut.fit(list(dict.fromkeys(a.arr + b.arr)), arr_implies))
    obj = tuple(cut.fit(list(dict.fromkeys(a.obj + b.obj)), obj_implies))
    return Denot(a.null or b.null, a.bools | b.bools, num, a.str | b.str, arr, obj, cut.approx(a, b))


def _exact(a: Denot, refuse: Refuse) -> bool:
    """Whether ``a`` may be complemented (an approximation may not)."""
    if a.approx is None:
        return True
    refuse("@complement", f"its complement is needed but {a.approx}")
    return False


def neg(a: Denot, refuse: Refuse) -> Denot:
    if not _exact(a, refuse):
        return TOP  # relaxed: the complement is not enforced
    cut = _Cut()
    arr: tuple[ArrConj, ...] = (ArrConj(),)
    for c in a.arr:
        arr = _cross(arr, tuple(arr_negations(c, refuse)), arr_and, arr_implies, cut)
    obj: tuple[ObjConj, ...] = (ObjConj(),)
    for c in a.obj:
        obj = _cross(obj, tuple(obj_negations(c, refuse)), obj_and, obj_implies, cut)
    num = cut.fit_num(a.num.complement())
    return Denot(not a.null, BOOLS - a.bools, num, a.str.complement(refuse), arr, obj, cut.approx())


def unannotated(d: Denot) -> Denot:
    """``d`` with no evaluated keys or items (annotations of a negated schema are dropped)."""
    arr = tuple(dict.fromkeys(replace(c, ev_prefix=0, ev_all=False, ev_contains=()) for c in d.arr))
    obj = tuple(dict.fromkeys(replace(c, ev_names=frozenset(), ev_pats=(), ev_all=False) for c in d.obj))
    return replace(d, arr=arr, obj=obj)


def conj_not(a: Denot, b: Denot, refuse: Refuse, sub: "Sub") -> Denot:
    """``a`` and not ``b``, computed relative to ``a``: a conjunction of ``a`` that is provably
    disjoint from a conjunction of ``b`` keeps it whole, and the others distribute over the
    one-atom negations (most of which contradict ``a`` and vanish). Much smaller than
    ``conj(a, neg(b))`` when ``b`` is a union of large conjunctions."""
    if not _exact(b, refuse):
        return a
    cut = _Cut(lambda c: _viable(c, sub))
    arr = _minus(a.arr, b.arr, lambda x, y: arr_and(x, y) is None, lambda c: arr_negations(c, refuse), arr_and, arr_implies, cut)
    obj = _minus(a.obj, b.obj, lambda x, y: _objs_disjoint(x, y, sub, 2), lambda c: obj_negations(c, refuse), obj_and, obj_implies, cut)
    num = cut.fit_num(a.num & b.num.complement()) if not a.num.is_empty() else a.num
    strs = a.str & b.str.complement(refuse) if not a.str.empty and not b.str.empty else a.str
    return Denot(a.null and not b.null, a.bools - b.bools, num, strs, arr, obj, cut.approx(a))


def _minus(xs: tuple, ys: tuple, apart, negations, meet, implies, cut: _Cut) -> tuple:
    out: list = []
    for x in xs:
        parts = [x]
        for c in ys:
            nxt: dict = {}
            atoms = None
            for y in parts:
                if apart(y, c):
                    nxt[y] = None
                    continue
                if atoms is None:
                    atoms = negations(c)
                for atom in atoms:
                    z = meet(y, atom)
                    if z is not None and (cut.viable is None or cut.viable(z)):
                        nxt[z] = None
            parts = cut.fit(list(nxt), implies)
            if not parts:
                break
        out.extend(parts)
    return tuple(cut.fit(list(dict.fromkeys(out)), implies))


def _viable(c: ArrConj | ObjConj, sub: "Sub") -> bool:
    """False when a required key's (or a prefix item's, up to minItems) schema is provably empty
    (a heuristic: a value schema that cannot be denoted counts as satisfiable)."""
    try:
        if isinstance(c, ObjConj):
            return not any(sub(c.prop(k)).is_empty() for k in c.required if c.prop(k) != FALSE)
        return not any(sub(c.item(i)).is_empty() for i in range(min(c.lo, len(c.prefix) + 1)))
    except GrammarError:
        charge("denoting the JSON schema", 0)  # out of steps or time is no heuristic's answer
        return True


def exactly_one(branches: list[Denot], minus: Callable[[Denot, int], Denot], sub: "Sub") -> Denot:
    """``oneOf``: the union over i of branch i minus every other branch (``minus(d, j)`` is
    ``d`` and not branch j); a branch provably disjoint from branch i is skipped."""
    out = BOTTOM
    for i, b in enumerate(branches):
        cur = b
        for j in range(len(branches)):
            if j != i and not cur.is_empty() and not disjoint(cur, branches[j], sub):
                cur = minus(cur, j)
        out = disj(out, cur)
    return out


Sub = Callable[[Any], Denot]  # the denotation of a value expression (for nested checks)


def disjoint(a: Denot, b: Denot, sub: Sub, depth: int = 2) -> bool:
    """A cheap, sound test: True only when no value of ``a`` satisfies the schema ``b`` denotes.
    ``a`` may be a subset of its schema's values; ``b`` must then be all of its own, so a cut
    union or an inexact string set on the ``b`` side is never called disjoint."""
    if b.approx is not None:
        return False
    if (a.null and b.null) or (a.bools & b.bools):
        return False
    if not (a.num & b.num).is_empty():
        return False
    if not a.str.empty and not b.str.empty:
        if a.str.is_all or b.str.is_all or b.str.approx is not None:
            return False
        try:
            if not (a.str & b.str).is_empty():
                return False
        except GrammarBudgetError:
            charge("denoting the JSON schema", 0)
            return False
    for x in a.arr:
        for y in b.arr:
            if arr_and(x, y) is not None:
                return False
    for x in a.obj:
        for y in b.obj:
            if not _objs_disjoint(x, y, sub, depth):
                return False
    return True


def _objs_disjoint(x: ObjConj, y: ObjConj, sub: Sub, depth: int) -> bool:
    if y.names is not None and y.names.approx is not None:
        return False  # y's key names are a lower bound: a contradiction with them proves nothing
    if obj_and(x, y) is None:
        return True
    if depth <= 0:
        return False
    # A key both require, with disjoint values there: the usual tagged union.
    for k in [k for k in x.required if k in y.required]:
        if disjoint(sub(x.prop(k)), sub(y.prop(k)), sub, depth - 1):
            return True
    return False


# ---------------------------------------------------------------------------- constants


def value_denot(v: Any) -> Denot:
    """Exactly the JSON value ``v``."""
    if v is None:
        return only(null=True)
    if isinstance(v, bool):
        return only(bools=frozenset([v]))
    if isinstance(v, (int, float)):
        x = Fraction(str(v)) if isinstance(v, float) else Fraction(v)
        return only(num=NumSet.of(NumConj(lo=x, hi=x)))
    if isinstance(v, str):
        return only(str=StrSet.words([v]))
    if isinstance(v, list):
        return only(arr=(ArrConj(tuple(const(x) for x in v), FALSE, len(v), len(v)),))
    if isinstance(v, dict):
        c = ObjConj(tuple((k, const(x)) for k, x in v.items()), tuple(v), ((KeyLang(without=frozenset(v)), FALSE),), explicit_extra=True)
        return only(obj=(c,))
    raise SchemaError(f"unsupported JSON value {v!r}")


def values_denot(values: list) -> Denot:
    out = BOTTOM
    strings = [v for v in values if isinstance(v, str)]
    for v in values:
        if not isinstance(v, str):
            out = disj(out, value_denot(v))
    if strings:
        out = disj(out, only(str=StrSet.words(strings)))
    return out
