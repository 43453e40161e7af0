"""Objects: one ``ObjConj`` -> IR. Named keys in order, extra keys in the gaps.

Named keys (``props`` in order, then ``required`` names outside them) are emitted in that order;
optional ones may be skipped. A named key's value satisfies its own schema and every rule whose
key language contains it (``patternProperties`` apply to named keys too). Extra keys come from
*regions*: the key languages outside the named keys, cut so that each region lies inside or
outside every rule's and every ``exists`` entry's language; a region's value satisfies the
schemas of the rules containing it. The plain case (no patterns, no ``propertyNames``) is the
trie complement of the named keys, without automata.

The body is a chain of states ``(index, started, count, witnessed)``: ``started`` decides
whether a comma comes first, ``count`` exists only under ``minProperties``/``maxProperties``,
``witnessed`` is the set (bit mask) of ``exists`` entries already met. States after the first
emitted property are shared as grammar rules, so a long list of optional properties stays linear.

With ``property_order="any"`` (a validator's reading: JSON objects are unordered) the index
becomes the set (bit mask) of named keys already emitted, so the states grow as 2^n: objects
with more than ``MAX_ANY_ORDER_KEYS`` named keys keep the declared order, which accepts a
subset of the valid texts and never an invalid one.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

from typing import TYPE_CHECKING

from .. import ir
from ..errors import GrammarBudgetError, SchemaError
from .conjs import KeyLang, ObjConj
from .exprs import FALSE, Expr, and_
from .strings import quoted, quoted_not_in, string_literal
from .strsets import StrSet

if TYPE_CHECKING:
    from .lower import Lowerer

_SHARE_ABOVE = 3
MAX_COUNT_STATES = 4096
MAX_EXISTS = 4  # exists entries (negated rules, propertyNames) tracked at once
MAX_ANY_ORDER_KEYS = 6  # 2^6 emitted-key sets per object at most: 8 made MaskBench compiles up to 4.6x slower, 10 ran past 120 s
PROPERTY_ORDERS = ("declared", "any")


def check_property_order(mode: str) -> str:
    if mode not in PROPERTY_ORDERS:
        raise SchemaError(f"property_order must be 'declared' or 'any', got {mode!r}")
    return mode


def _subsets(bits: list[int]):
    """Every subset (as a bit mask) of the given bit positions."""
    out = [0]
    for b in bits:
        out += [m | (1 << b) for m in out]
    return out


def object_expr(lw: "Lowerer", c: ObjConj, ptr: str, depth: int) -> ir.Expr:
    if len(c.exists) > MAX_EXISTS:
        lw.refuse("not", ptr, f"more than {MAX_EXISTS} 'some key satisfies' conditions on one object")
        c = replace(c, exists=c.exists[:MAX_EXISTS])
    rules = list(c.rules)
    prop_names = dict(c.props)
    named = [k for k, _ in c.props] + [k for k in c.required if k not in prop_names]
    if lw.strict_properties and not c.explicit_extra:
        rules.append((KeyLang(without=frozenset(named)), FALSE))
    entries: list[tuple[str, list[tuple[ir.Expr, int]], bool]] = []
    for name in named:
        base = and_(c.prop(name), *(s for lang, s in rules if lang.may_accept(name)))
        if c.names is not None and not c.names.accepts(name):
            base = FALSE
        alts = _alternatives(lw, base, [j for j, (lang, _) in enumerate(c.exists) if lang.must_accept(name)], c, depth)
        required = name in c.required
        if not alts:
            if required:
                return ir.NOTHING
            continue
        entries.append((name, alts, required))
    extras = _extras(lw, c, rules, frozenset(named), ptr, depth)
    min_p, max_p = c.lo, c.hi
    cap = max_p if max_p is not None else min_p
    # Only a count of properties multiplies the chain's states; without minProperties /
    # maxProperties extra keys sit in the gaps of a chain linear in the named keys.
    counting = min_p > 0 or max_p is not None
    any_order = lw.any_order and 1 < len(entries) <= MAX_ANY_ORDER_KEYS
    positions = (1 << len(entries)) if any_order else len(entries) + 1
    if extras and counting and positions * (cap + 1) * (1 << len(c.exists)) > MAX_COUNT_STATES:
        keyword = "maxProperties" if max_p is not None else "minProperties"
        raise GrammarBudgetError(
            f"{keyword} {cap} with extra keys allowed and {len(entries)} named keys at {ptr or '/'} needs more than "
            f"{MAX_COUNT_STATES} counting states"
        )
    return _Chain(lw, entries, extras, min_p, max_p, (1 << len(c.exists)) - 1, depth, any_order).build()


def _alternatives(lw: "Lowerer", base: Expr, applicable: list[int], c: ObjConj, depth: int) -> list[tuple[ir.Expr, int]]:
    """Value IRs for one key: plain, and strengthened to witness each subset of ``exists`` entries."""
    out = []
    for mask in _subsets(applicable):
        e = and_(base, *(c.exists[j][1] for j in applicable if mask >> j & 1))
        v = lw.value(e, depth + 1)
        if not isinstance(v, ir.Nothing):
            out.append((v, mask))
    return out


def _extras(lw: "Lowerer", c: ObjConj, rules: list, named: frozenset[str], ptr: str, depth: int) -> list[tuple[ir.Expr, int]]:
    """``key: value`` IRs for keys outside ``named``, each with the exists entries it witnesses."""
    layout = lw.layout
    out: list[tuple[ir.Expr, int]] = []
    for key_ir, schemas, applicable in _regions(c, rules, named):
        alts = _alternatives(lw, and_(*schemas), applicable, c, depth)
        for v, mask in alts:
            kv = ir.seq(key_ir, layout.colon(), v)
            out.append((kv if ir.is_small(kv) else lw.add_rule("extra", kv), mask))
    return out


def _plain(lang: KeyLang, named: frozenset[str]) -> bool:
    """A rule that applies to every extra key (its only exclusions are named keys)."""
    return not lang.unless and lang.within.is_all and lang.without <= named


def _regions(c: ObjConj, rules: list, named: frozenset[str]):
    """(quoted key IR, schemas that apply, exists entries it can witness) per extra-key region."""
    langs = [lang for lang, _ in rules] + [lang for lang, _ in c.exists]
    names_all = c.names is None or c.names.is_all
    if names_all and all(_plain(lang, named) for lang in langs):
        schemas = [s for _, s in rules]
        if FALSE in schemas:
            return []
        return [(quoted_not_in(named), schemas, list(range(len(c.exists))))]
    space = KeyLang(without=named).strset()
    if not names_all:
        space = space & c.names  # type: ignore[operator]
    for p in {p for lang in langs for p in lang.patterns() if p.safe is not None}:
        # Extra keys only from the characters on which ECMA-262 and Python's re read the
        # patterns alike: every other key could be routed differently by a validator.
        space = space & StrSet.of(ir.star(ir.char_class(p.safe)))
    regions = [(space, frozenset())]
    distinct = list(dict.fromkeys(langs))
    for i, lang in enumerate(distinct):
        inside = lang.strset()
        outside = inside.complement(_exact)
        nxt = []
        for region, members in regions:
            for part, mem in ((region & inside, members | {i}), (region & outside, members)):
                if not part.is_empty():
                    nxt.append((part, mem))
        regions = nxt
        if len(regions) > 64:
            raise GrammarBudgetError("patternProperties/propertyNames split the keys into more than 64 regions")
    out = []
    for region, members in regions:
        schemas = [s for lang, s in rules if distinct.index(lang) in members]
        if FALSE in schemas:
            continue
        witnesses = [j for j, (lang, _) in enumerate(c.exists) if distinct.index(lang) in members]
        out.append((quoted(region.to_ir()), schemas, witnesses))
    return out


def _exact(keyword: str, why: str) -> None:
    raise AssertionError("key languages are exact")


class _Chain:
    """Builds the object body over the states described in the module docstring."""

    def __init__(self, lw: "Lowerer", entries, extras, min_p: int, max_p: int | None, full: int, depth: int,
                 any_order: bool = False) -> None:
        self.lw, self.extras = lw, extras
        self.any_order = any_order
        if any_order:
            # Each key: value is reached from up to 2^(n-1) states: one rule, not a copy per state.
            entries = [(name, [(v if ir.is_small(v) else lw.add_rule("prop", v), m) for v, m in values], req)
                       for name, values, req in entries]
            self.required_mask = sum(1 << j for j, (_, _, req) in enumerate(entries) if req)
        self.entries = entries
        self.counting = min_p > 0 or max_p is not None
        self.min_p, self.max_p, self.full, self.depth = min_p, max_p, full, depth
        layout = lw.layout
        self.sep, self.colon = layout.sep(depth), layout.colon()
        self.req_after = list(itertools.accumulate((r for _, _, r in reversed(entries)), initial=0))[::-1]
        self.memo: dict[tuple[int, bool, int, int], ir.Expr] = {}
        self.share = any_order or len(entries) > _SHARE_ABOVE or any(not ir.is_small(v) for _, alts, _ in entries for v, _ in alts)
        self.plain = [kv for kv, m in extras if m == 0]
        self.witnessing = [(kv, m) for kv, m in extras if m]

    def build(self) -> ir.Expr:
        layout = self.lw.layout
        body = self.state(0, False, 0, 0)
        alts = [ir.seq(layout.open("{", self.depth), body, layout.close("}", self.depth))]
        if self._required_left(0) == 0 and self.min_p == 0 and self.full == 0:
            alts.append(layout.empty("{}"))
        return ir.choice(*alts)

    def _required_left(self, i: int) -> int:
        return (self.required_mask & ~i).bit_count() if self.any_order else self.req_after[i]

    def _named_left(self, i: int) -> int:
        return len(self.entries) - (i.bit_count() if self.any_order else i)

    def state(self, i: int, started: bool, count: int, sat: int) -> ir.Expr:
        """``i``: the next entry's index, or under ``any_order`` the set of entries emitted."""
        if self.counting:
            if self.max_p is not None and count + self._required_left(i) > self.max_p:
                return ir.NOTHING
            if not self.extras and count + self._named_left(i) < self.min_p:
                return ir.NOTHING
            if self.max_p is None:
                count = min(count, self.min_p)
        else:
            count = 0
        key = (i, started, count, sat)
        if key not in self.memo:
            expr = self._build(i, started, count, sat)
            if started and self.share and not isinstance(expr, (ir.Nothing, ir.Empty)):
                expr = self.lw.add_rule("obj", expr)
            self.memo[key] = expr
        return self.memo[key]

    def _free(self, count: int) -> bool:
        return not self.counting or (self.max_p is None and count >= self.min_p)

    def _build(self, i: int, started: bool, count: int, sat: int) -> ir.Expr:
        n = len(self.entries)
        lead = self.sep if started else ir.EMPTY
        alts: list[ir.Expr] = []
        if self.any_order:
            for j, (name, values, _) in enumerate(self.entries):
                if not i >> j & 1:
                    for v, mask in values:
                        kv = ir.seq(string_literal(name), self.colon, v)
                        alts.append(ir.seq(lead, kv, self.state(i | 1 << j, True, count + 1, sat | mask)))
            if started and not self.required_mask & ~i and (not self.counting or count >= self.min_p) and sat == self.full:
                alts.append(ir.EMPTY)
        elif i < n:
            name, values, required = self.entries[i]
            for v, mask in values:
                kv = ir.seq(string_literal(name), self.colon, v)
                alts.append(ir.seq(lead, kv, self.state(i + 1, True, count + 1, sat | mask)))
            if not required:
                alts.append(self.state(i + 1, started, count, sat))
        elif started and (not self.counting or count >= self.min_p) and sat == self.full:
            alts.append(ir.EMPTY)
        for kv, mask in self.witnessing:
            if sat | mask != sat:
                alts.append(ir.seq(lead, kv, self.state(i, True, count + 1, sat | mask)))
        if started and self.plain and self._free(count):
            # Extra keys that change nothing may repeat in any gap.
            return ir.seq(ir.star(ir.seq(self.sep, ir.choice(*self.plain))), ir.choice(*alts))
        for kv in self.plain:
            alts.append(ir.seq(lead, kv, self.state(i, True, count + 1, sat)))
        return ir.choice(*alts)
