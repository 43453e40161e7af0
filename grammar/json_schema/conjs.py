"""Array and object conjunctions: the shapes an array or object schema denotes, and their algebra.

An ``ArrConj`` says: item i satisfies ``prefix[i]`` (then ``rest``), the length lies in
``lo..hi``, each ``contains`` entry (schema, min, max, first index counted) is met, and maybe
the items are unique. An ``ObjConj`` says: a present named key satisfies its ``props`` schema,
``required`` keys are present, every key in a rule's key language satisfies the rule's schema
(``patternProperties``, ``additionalProperties``), keys are in ``names``, the count lies in
``lo..hi``, and each ``exists`` entry (key language, schema) has a witness.

Intersection is exact field by field (positions are intersected position by position, rules
and ``contains`` entries accumulate instead of being merged into one keyword): this is where
``allOf`` used to lose meaning when merged into a parent schema object. Complements are unions
of one-atom negations (``negations``), e.g. not "items satisfy S from index k" is "some item
from index k satisfies not S" (a ``contains`` entry). ``ev_*`` fields carry what the schema
evaluated, for ``unevaluatedItems`` / ``unevaluatedProperties``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Callable

from .. import ir
from .exprs import FALSE, TRUE, Expr, and_, not_
from .strsets import StrSet


@dataclass(frozen=True)
class Pattern:
    """A ``patternProperties`` pattern: its ECMA-262 language (search mode), its text (which
    jsonschema runs through Python's ``re``), and the characters on which both readings agree
    (None: all of them)."""

    expr: ir.Expr
    source: str
    safe: tuple | None = None

    def ecma(self, key: str) -> bool:
        return StrSet.of(self.expr).accepts(key)

    def python(self, key: str) -> bool:
        try:
            return re.search(self.source, key) is not None
        except re.error:  # Python cannot read it (\p{...}): only the ECMA reading exists
            return self.ecma(key)

    def agreed(self, key: str) -> bool:
        return self.safe is None or all(any(lo <= ord(ch) <= hi for lo, hi in self.safe) for ch in key)


@dataclass(frozen=True)
class KeyLang:
    """Keys that are none of ``without``, match none of ``unless`` and lie in ``within`` (which,
    for a pattern rule, is ``pattern``'s language)."""

    without: frozenset[str] = frozenset()
    unless: tuple[Pattern, ...] = ()
    within: StrSet = field(default_factory=StrSet.all)
    pattern: Pattern | None = None

    def accepts(self, key: str) -> bool:
        """The ECMA-262 reading (the one the grammar's key languages follow)."""
        if key in self.without or not self.within.accepts(key):
            return False
        return not any(p.ecma(key) for p in self.unless)

    def _python(self, key: str) -> bool:
        if key in self.without or (self.pattern is not None and not self.pattern.python(key)):
            return False
        return not any(p.python(key) for p in self.unless)

    def _agreed(self, key: str) -> bool:
        return all(p.agreed(key) for p in self.patterns())

    def may_accept(self, key: str) -> bool:
        """In the language under either reading: a rule applies to such a key (stricter)."""
        return self.accepts(key) or (not self._agreed(key) and self._python(key))

    def must_accept(self, key: str) -> bool:
        """In the language under both readings: such a key witnesses an ``exists`` entry."""
        return self.accepts(key) and (self._agreed(key) or self._python(key))

    def patterns(self) -> tuple[Pattern, ...]:
        return self.unless + ((self.pattern,) if self.pattern is not None else ())

    def strset(self) -> StrSet:
        """The language as an exact string set (ECMA reading)."""
        out = self.within
        banned = [StrSet.of(p.expr) for p in self.unless]
        if self.without:
            banned.append(StrSet.words(self.without))
        for b in banned:
            out = out & b.complement(_never)
        return out


def _never(keyword: str, why: str) -> None:
    raise AssertionError("pattern and word sets are exact")


def pattern_lang(p: Pattern) -> KeyLang:
    return KeyLang(within=StrSet.of(p.expr), pattern=p)


# ---------------------------------------------------------------------------- arrays


@dataclass(frozen=True)
class ArrConj:
    prefix: tuple[Expr, ...] = ()
    rest: Expr = TRUE
    lo: int = 0
    hi: int | None = None
    contains: tuple[tuple[Expr, int, int | None, int], ...] = ()  # (schema, min, max, start)
    unique: bool = False
    ev_prefix: int = 0
    ev_all: bool = False
    ev_contains: tuple[Expr, ...] = ()

    def item(self, i: int) -> Expr:
        return self.prefix[i] if i < len(self.prefix) else self.rest


def arr_normalize(c: ArrConj) -> ArrConj | None:
    """Fold impossible positions into ``hi``; None when provably empty."""
    hi = c.hi
    prefix = c.prefix
    for i, p in enumerate(prefix):
        if p == FALSE:
            hi = i if hi is None else min(hi, i)
            prefix = prefix[:i]
            break
    if c.rest == FALSE:
        hi = len(prefix) if hi is None else min(hi, len(prefix))
    if hi is not None and c.lo > hi:
        return None
    contains = []
    for s, mn, mx, start in c.contains:
        if mx is not None and mn > mx:
            return None
        if mn == 0 and mx is None:
            continue
        room = None if hi is None else max(hi - start, 0)
        if room is not None and mn > room or (s == FALSE and mn > 0):
            return None
        contains.append((s, mn, mx, start))
    contains = tuple(dict.fromkeys(contains))
    if (prefix, hi, contains) == (c.prefix, c.hi, c.contains):
        return c
    return replace(c, prefix=prefix, hi=hi, contains=contains)


def arr_and(a: ArrConj, b: ArrConj) -> ArrConj | None:
    n = max(len(a.prefix), len(b.prefix))
    prefix = tuple(and_(a.item(i), b.item(i)) for i in range(n))
    hi = a.hi if b.hi is None else b.hi if a.hi is None else min(a.hi, b.hi)
    return arr_normalize(ArrConj(
        prefix, and_(a.rest, b.rest), max(a.lo, b.lo), hi, a.contains + b.contains, a.unique or b.unique,
        max(a.ev_prefix, b.ev_prefix), a.ev_all or b.ev_all, tuple(dict.fromkeys(a.ev_contains + b.ev_contains)),
    ))


def arr_negations(c: ArrConj, refuse: Callable[[str, str], None]) -> list[ArrConj]:
    """Arrays outside ``c``, as a union of conjunctions."""
    out: list[ArrConj] = []
    for i, p in enumerate(c.prefix):
        if p != TRUE:
            out.append(ArrConj(prefix=(TRUE,) * i + (not_(p),), lo=i + 1))
    if c.rest != TRUE:
        out.append(ArrConj(contains=((not_(c.rest), 1, None, len(c.prefix)),)))
    if c.lo > 0:
        out.append(ArrConj(hi=c.lo - 1))
    if c.hi is not None:
        out.append(ArrConj(lo=c.hi + 1))
    for s, mn, mx, start in c.contains:
        if mn > 0:
            out.append(ArrConj(contains=((s, 0, mn - 1, start),)))
        if mx is not None:
            out.append(ArrConj(contains=((s, mx + 1, None, start),)))
    if c.unique:
        refuse("uniqueItems", "arrays with a duplicate (a negated uniqueItems) are not enforced")
    return [x for x in (arr_normalize(o) for o in out) if x is not None]


# ---------------------------------------------------------------------------- objects


@dataclass(frozen=True)
class ObjConj:
    props: tuple[tuple[str, Expr], ...] = ()  # emission order; one entry per name
    required: tuple[str, ...] = ()  # ordered: names not in props are emitted in this order
    rules: tuple[tuple[KeyLang, Expr], ...] = ()
    names: StrSet | None = None
    lo: int = 0
    hi: int | None = None
    exists: tuple[tuple[KeyLang, Expr], ...] = ()
    explicit_extra: bool = False  # some part spoke about extra keys (strict mode leaves it alone)
    ev_names: frozenset[str] = frozenset()
    ev_pats: tuple[Pattern, ...] = ()  # patternProperties patterns
    ev_all: bool = False

    def prop(self, name: str) -> Expr:
        index = self.__dict__.get("_prop_index")
        if index is None:  # built once: a scan per lookup is quadratic on thousands of properties
            index = {}
            for k, v in self.props:
                index.setdefault(k, v)
            object.__setattr__(self, "_prop_index", index)
        return index.get(name, TRUE)


def obj_normalize(c: ObjConj) -> ObjConj | None:
    if c.hi is not None and (c.lo > c.hi or len(c.required) > c.hi):
        return None
    for k in c.required:
        if c.prop(k) == FALSE:
            return None
        if c.names is not None and not c.names.accepts(k):
            return None
        if any(s == FALSE and lang.may_accept(k) for lang, s in c.rules):
            return None
    if any(s == FALSE for _, s in c.exists):
        return None
    return c


def obj_and(a: ObjConj, b: ObjConj) -> ObjConj | None:
    props = dict(a.props)
    for k, v in b.props:
        props[k] = and_(props[k], v) if k in props else v
    names = a.names if b.names is None else b.names if a.names is None else a.names & b.names
    hi = a.hi if b.hi is None else b.hi if a.hi is None else min(a.hi, b.hi)
    return obj_normalize(ObjConj(
        tuple(props.items()), tuple(dict.fromkeys(a.required + b.required)), tuple(dict.fromkeys(a.rules + b.rules)), names,
        max(a.lo, b.lo), hi, tuple(dict.fromkeys(a.exists + b.exists)), a.explicit_extra or b.explicit_extra,
        a.ev_names | b.ev_names, tuple(dict.fromkeys(a.ev_pats + b.ev_pats)), a.ev_all or b.ev_all,
    ))


def obj_negations(c: ObjConj, refuse: Callable[[str, str], None]) -> list[ObjConj]:
    """Objects outside ``c``, as a union of conjunctions."""
    out: list[ObjConj] = []
    for k, v in c.props:
        if v != TRUE:
            out.append(ObjConj(props=((k, not_(v)),), required=(k,)))
    for k in c.required:
        out.append(ObjConj(props=((k, FALSE),)))
    for lang, s in c.rules:
        if s != TRUE:
            out.append(ObjConj(exists=((lang, not_(s)),)))
    if c.names is not None and not c.names.is_all:
        out.append(ObjConj(exists=((KeyLang(within=c.names.complement(refuse)), TRUE),)))
    if c.lo > 0:
        out.append(ObjConj(hi=c.lo - 1))
    if c.hi is not None:
        out.append(ObjConj(lo=c.hi + 1))
    for lang, s in c.exists:
        out.append(ObjConj(rules=((lang, not_(s)),)))
    return [x for x in (obj_normalize(o) for o in out) if x is not None]


# ---------------------------------------------------------------------------- subsumption


def _within(x: tuple, y: tuple) -> bool:
    return set(x) <= set(y)


def arr_implies(x: ArrConj, y: ArrConj) -> bool:
    """A syntactic test that every array in ``x`` is in ``y`` and that ``x`` evaluates no more
    than ``y`` (so dropping ``x`` from a union with ``y`` changes nothing, even under
    ``unevaluatedItems``)."""
    if len(x.prefix) < len(y.prefix) or any(x.prefix[i] != p and p != TRUE for i, p in enumerate(y.prefix)):
        return False
    if y.rest != TRUE and x.rest != y.rest:
        return False
    if x.lo < y.lo or (y.hi is not None and (x.hi is None or x.hi > y.hi)):
        return False
    if not _within(y.contains, x.contains) or (y.unique and not x.unique):
        return False
    return x.ev_prefix <= y.ev_prefix and (y.ev_all or not x.ev_all) and _within(x.ev_contains, y.ev_contains)


def obj_implies(x: ObjConj, y: ObjConj) -> bool:
    """The same test for objects."""
    if len(y.props) > len(x.props) or len(y.required) > len(x.required) or len(y.rules) > len(x.rules):
        return False
    if x.lo < y.lo or (y.hi is not None and (x.hi is None or x.hi > y.hi)) or x.explicit_extra != y.explicit_extra:
        return False
    if not _within(y.props, x.props) or not _within(y.required, x.required) or not _within(y.rules, x.rules):
        return False
    if not _within(y.exists, x.exists) or (y.names is not None and y.names != x.names):
        return False
    return x.ev_names <= y.ev_names and _within(x.ev_pats, y.ev_pats) and (y.ev_all or not x.ev_all)


PRUNE_MAX = 64  # pruning is quadratic: bigger unions are only deduplicated


def prune(conjs: list, implies) -> list:
    """Drop the members of a union that another member contains (the first of equals stays)."""
    if len(conjs) > PRUNE_MAX:
        return conjs
    out: list = []
    for i, x in enumerate(conjs):
        if not any(j != i and implies(x, y) and not (j > i and implies(y, x)) for j, y in enumerate(conjs)):
            out.append(x)
    return out
