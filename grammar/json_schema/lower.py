"""The lowering: schema expressions -> denotations (``schema_denoter``) -> grammar IR.

``Lowerer.value(expr)`` denotes an expression and writes one IR alternative per part of the
denotation: ``null``, the booleans, the numbers (``numsets``), the strings (``strsets``, then
JSON-encoded and quoted), each array conjunction (``arrays``) and each object conjunction
(``objects``). Child schemas reach ``value`` again from those builders. Results are memoized
per (expression, indent depth); an expression met again while it is being built (recursion
through ``$ref``) becomes a grammar rule, so recursive schemas are rule cycles.
"""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import Any, Iterable

from .. import ir
from ..budget import charge
from ..errors import GrammarBudgetError, UnsupportedFeatureError
from . import numbers
from .arrays import array_expr
from .denotation_algebra import TOP, Denot
from .schema_denoter import Denoter
from .exprs import TRUE, Expr, Ptr, pointer_of
from .layout import MAX_INDENT_DEPTH, Layout
from .numsets import NumSet, num_ir
from .objects import object_expr
from .strings import any_string, encode_value, quoted
from .strsets import StrSet, length_keyword


def refuse_unless_relaxed(relaxed: frozenset[str], keyword: str, pointer: str, why: str = "") -> None:
    """Raise UnsupportedFeatureError for ``keyword`` unless the caller relaxed it."""
    if keyword in relaxed:
        return
    detail = f" ({why})" if why else ""
    raise UnsupportedFeatureError(
        f"keyword '{keyword}' at {pointer or '/'} is not enforced exactly{detail}; pass relax_keywords=['{keyword}'] to ignore it"
    )


MAX_NESTING = 150  # values being lowered at once (each level is a few Python frames)
_BUILDING = object()


class Lowerer:
    def __init__(self, doc: Any, validator_cls: type, layout: Layout, strict_properties: bool, relax: Iterable[str], dynamic=None,
                 draft=None, annotate_formats: bool = False, any_order: bool = False) -> None:
        import jsonschema

        self.doc = doc
        self.layout = layout
        self.strict_properties = strict_properties
        self.any_order = any_order  # named properties in every order (objects.py), not only the schema's
        # Draft-04's "integer" is a number spelled without fraction or exponent (1.0 is not one,
        # as jsonschema's Draft4Validator reads it); later drafts count any integral value.
        self.integer_spelling = draft is not None and draft.name == "draft4"
        self.relaxed = frozenset(relax)
        self.rules: dict[str, ir.Expr] = {}
        validator = validator_cls(doc, format_checker=validator_cls.FORMAT_CHECKER)
        legacy = validator_cls not in (jsonschema.Draft202012Validator,)
        # A partial over the relaxed set, not a bound method: the denoter holding the lowerer
        # would be a reference cycle keeping every compile's IR alive until the cyclic collector runs.
        self.refuse = functools.partial(refuse_unless_relaxed, self.relaxed)
        self.den = Denoter(doc, validator, self.refuse, legacy_items=legacy, dynamic=dynamic, draft=draft, annotate_formats=annotate_formats)
        self._memo: dict[tuple[Expr, int], Any] = {}
        self._cycles: dict[tuple[Expr, int], str] = {}
        self._fresh = 0
        self._nesting = 0
        self.has_unique = False
        # uniqueItems beyond the automaton: the matcher's check writes MARK after an item that
        # repeats an earlier one, and only arrays that allow duplicates accept it (``item``).
        self.marks = _mentions_unique(doc)
        self.approximated = False  # some denotation was cut to a subset (see denotation_algebra.KEEP_WHEN_CUT)
        self._strings: dict[StrSet, ir.Expr] = {}
        self._ref_targets: set[str] | None = None
        self._lowered: dict[tuple[Denot, int], ir.Expr] = {}

    # ---------------------------------------------------------------- helpers
    def unique_site(self, c, ptr: str) -> None:
        """An array whose items must be unique and cannot be enumerated: the matcher enforces it
        (``unique_check``); ``json_schema_to_grammar`` attaches the check."""
        self.has_unique = True

    def item(self, v: ir.Expr) -> ir.Expr:
        """An item of an array that allows duplicates: ``v``, then the check's duplicate mark
        (where the schema has ``uniqueItems``). Unique arrays use ``v`` alone, so a duplicate
        kills exactly the branches that forbid it (``unique_check``)."""
        if not self.marks or isinstance(v, ir.Nothing):
            return v
        return ir.seq(v, ir.optional(ir.Ref(MARK_RULE)))

    def add_rule(self, prefix: str, expr: ir.Expr) -> ir.Expr:
        self._fresh += 1
        name = f"{prefix}_{self._fresh}"
        self.rules[name] = expr
        return ir.Ref(name)

    # ---------------------------------------------------------------- values
    def value(self, e: Expr, depth: int) -> ir.Expr:
        """IR of the JSON texts (at indent ``depth``) satisfying ``e``."""
        if self.layout.depth_sensitive and depth > MAX_INDENT_DEPTH:
            return ir.NOTHING
        if e == TRUE:
            return self.any_value(depth)
        key = (e, depth if self.layout.depth_sensitive else 0)
        hit = self._memo.get(key)
        if hit is _BUILDING:
            name = self._cycles.get(key)
            if name is None:
                self._fresh += 1
                name = self._cycles[key] = f"v_{self._fresh}"
            return ir.Ref(name)
        if hit is not None:
            return hit
        self._memo[key] = _BUILDING
        self.den.count_lowered()
        self._nesting += 1
        try:
            if self._nesting > MAX_NESTING:
                raise GrammarBudgetError(f"schema nesting deeper than {MAX_NESTING} at {pointer_of(e) or '/'}")
            d = self.den.expr(e)
            self.approximated = self.approximated or d.approx is not None
            body = self.lower(d, pointer_of(e), depth)
        finally:
            self._nesting -= 1
            if self._memo.get(key) is _BUILDING:
                del self._memo[key]
        name = self._cycles.get(key)
        if name is not None:
            self.rules[name] = body
            body = ir.Ref(name)
        elif self._shared(e) and not isinstance(body, (ir.Nothing, ir.Ref)) and not ir.is_small(body):
            # A $ref target is met at several places, and indent mode builds values per depth (a
            # value nested 32 levels deep would be copied into its parents exponentially often):
            # as a rule it is built once and called.
            body = self.add_rule("v", body)
        self._memo[key] = body
        return body

    def _shared(self, e: Expr) -> bool:
        if self.layout.depth_sensitive:
            return True
        if self._ref_targets is None:
            self._ref_targets = _ref_targets(self.doc)
        return isinstance(e, Ptr) and e.ptr in self._ref_targets

    def lower(self, d: Denot, ptr: str, depth: int) -> ir.Expr:
        """IR of a denotation, memoized by value: schemas reached through different pointers
        (every ``{"$ref": ...}`` to one definition) share one lowering and its rules."""
        if d == TOP:
            return self.any_value(depth)
        key = (d, depth if self.layout.depth_sensitive else 0)
        hit = self._lowered.get(key)
        if hit is None:
            hit = self._lowered[key] = self._lower(d, ptr, depth)
        return hit

    def _lower(self, d: Denot, ptr: str, depth: int) -> ir.Expr:
        alts: list[ir.Expr] = []
        if d.null:
            alts.append(ir.literal("null"))
        alts += [ir.literal(x) for x, b in (("true", True), ("false", False)) if b in d.bools]
        alts += [object_expr(self, c, ptr, depth) for c in d.obj]
        alts += [array_expr(self, c, ptr, depth) for c in d.arr]
        if not d.str.empty:
            alts.append(self.string(d.str, ptr))
        if not d.num.is_empty():
            alts.append(self.numbers(d.num, ptr))
        return ir.choice(*alts)

    def numbers(self, s: NumSet, ptr: str) -> ir.Expr:
        try:
            return num_ir(s, ptr, self.integer_spelling)
        except UnsupportedFeatureError as exc:
            self.refuse("multipleOf", ptr, str(exc))  # relaxed: the same numbers without steps
            return num_ir(NumSet(tuple(replace(c, mult=None, nonmults=frozenset()) for c in s.conjs)), ptr, self.integer_spelling)

    def string(self, s: StrSet, ptr: str) -> ir.Expr:
        if s.is_all:
            return any_string()
        hit = self._strings.get(s)
        if hit is None:
            hit = self._strings[s] = self._string(s, ptr)
        return hit

    def _string(self, s: StrSet, ptr: str) -> ir.Expr:
        try:
            return quoted(s.to_ir())
        except GrammarBudgetError as exc:
            charge("lowering a string schema", 0)  # out of compile steps: that is the verdict
            keyword = length_keyword(s) if (s.lo or s.hi is not None) else "pattern"
            self.refuse(keyword, ptr, str(exc))
            return quoted(StrSet(exprs=s.exprs, approx=s.approx).to_ir()) if s.exprs else any_string()

    def any_value(self, depth: int) -> ir.Expr:
        d = depth if self.layout.depth_sensitive else 0
        name = f"any_json_{d}"
        if name in self.rules:
            return ir.Ref(name)
        self.rules[name] = ir.NOTHING
        layout = self.layout
        if self.layout.depth_sensitive and d >= MAX_INDENT_DEPTH:
            inner = ir.NOTHING
        else:
            inner = self.any_value(depth + 1)
        sep = layout.sep(depth)
        item = self.item(inner)
        arr = ir.seq(layout.open("[", depth), item, ir.star(ir.seq(sep, item)), layout.close("]", depth))
        kv = ir.seq(any_string(), layout.colon(), inner)
        obj = ir.seq(layout.open("{", depth), kv, ir.star(ir.seq(sep, kv)), layout.close("}", depth))
        scalars_ = [ir.literal("null"), ir.literal("true"), ir.literal("false"), numbers.JSON_NUMBER, any_string()]
        self.rules[name] = ir.choice(*scalars_, layout.empty("[]"), arr, layout.empty("{}"), obj)
        return ir.Ref(name)


MARK_RULE = "unique_mark"


def _mentions_unique(doc: Any) -> bool:
    """Whether some object of the document has ``"uniqueItems": true``."""
    stack = [doc]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if node.get("uniqueItems") is True:
                return True
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return False


def _ref_targets(doc: Any) -> set[str]:
    """Pointers that some $ref / $dynamicRef names (normalized to "#<pointer>")."""
    out: set[str] = set()
    stack = [doc]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for key in ("$ref", "$dynamicRef"):
                if isinstance(node.get(key), str) and node[key].startswith("#"):
                    out.add(node[key][1:])
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return out


__all__ = ["Lowerer", "MARK_RULE", "encode_value"]
