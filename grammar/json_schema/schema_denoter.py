"""Schema objects -> denotations: every keyword of a schema object, exactly (or refused).

A schema object denotes the intersection of its *local* keywords (``type``, ``enum``/``const``
and the type-specific keywords, each constraining only its own type) and of its *in-place
applicators* (``$ref``, ``allOf``, ``anyOf``, ``oneOf``, ``not``, ``if``/``then``/``else``,
``dependentSchemas``); child schemas (properties, items...) stay lazy ``Ptr`` expressions,
denoted when the lowering reaches them.

``unevaluatedProperties`` / ``unevaluatedItems`` are static: while a schema with one of them is
denoted, its in-place applicators are denoted with ``track=True``, so each conjunction knows
which keys and items it evaluated (``properties`` names, ``patternProperties`` languages,
``additionalProperties`` = all; ``prefixItems`` count, ``items`` = all, ``contains`` matches),
and the keyword becomes one more rule on the keys / items outside that set. Under tracking an
``anyOf`` expands into the union over non-empty subsets of its branches (every branch that
validates contributes its annotations, and fewer evaluated keys only make the constraint
stronger, so the union is exact); ``oneOf``, ``if`` and ``not`` need nothing special (the
annotations of failing or negated schemas are dropped, as the specification says).
"""

from __future__ import annotations

from typing import Any, Callable

from .. import char_dfa
from ..budget import LOWER_STEPS, SCHEMA_NODE_STEPS, charge, check_depth
from ..errors import GrammarBudgetError, SchemaError
from .conjs import ArrConj, KeyLang, ObjConj
from .denotation_algebra import BOTTOM, TOP, Denot, but, conj, conj_not, disj, exactly_one, neg, only, unannotated, value_denot
from .exprs import FALSE, TRUE, And, Bool, Const, Expr, Not, Or, Ptr, holds, or_
from .drafts import Draft, view
from .keywords import local
from .refs import Dynamic, pointer_escape, resolve_pointer

MAX_WORK = 50_000  # schema objects denoted: bounds reference bombs
MAX_TRACKED_BRANCHES = 6  # anyOf branches expanded into subsets under unevaluated*
ANNOTATIONS = frozenset(
    "title description default examples $comment $schema $id $anchor $dynamicAnchor deprecated readOnly writeOnly "
    "contentMediaType contentEncoding contentSchema $vocabulary $defs definitions".split()
)
RefuseAt = Callable[[str, str, str], None]  # (keyword, pointer, why)


class Denoter:
    def __init__(self, doc: Any, validator: Any, refuse: RefuseAt, legacy_items: bool, dynamic: Dynamic | None = None,
                 draft: Draft | None = None, annotate_formats: bool = False) -> None:
        self.doc = doc
        self.draft = draft  # None: formcast's default (2020-12 plus older spellings)
        self.annotate_formats = annotate_formats
        self.dynamic = dynamic or Dynamic()
        # Dynamic anchor names some bookended $dynamicRef resolves: the only ones a scope binds.
        self._dyn_names = frozenset(n for _, n in self.dynamic.refs.values() if n is not None)
        self._validator = validator
        self.refuse = refuse
        self.legacy_items = legacy_items  # draft-07 / 2019-09 ``items`` arrays and ``additionalItems``
        self._memo: dict[tuple[Expr, bool], Denot] = {}
        self._active: set[tuple[Expr, bool]] = set()
        self._work = 0
        self._depth = 0
        char_dfa.load_kernels()  # not on this schema's clock (a fresh machine compiles them)

    # ------------------------------------------------------------------ expressions
    def sub(self, ptr: str, scope: tuple = ()) -> Expr:
        """The expression for the subschema at ``ptr`` reached from dynamic ``scope`` (booleans
        and ``{}`` folded)."""
        node = resolve_pointer(self.doc, ptr)
        if node is True or node == {}:
            return TRUE
        if node is False:
            return FALSE
        return Ptr(ptr, self.enter(scope, ptr))

    def enter(self, scope: tuple, ptr: str) -> tuple:
        """The dynamic scope once evaluation reaches ``ptr``: the anchors of its resource are bound
        unless an outer resource bound them first. Only names a $dynamicRef uses are kept."""
        if not self._dyn_names:
            return ()
        bound = dict(scope)
        for name, target in self.dynamic.anchors.get(self.dynamic.resource_of(ptr), {}).items():
            if name in self._dyn_names and name not in bound:
                bound[name] = target
        return tuple(sorted(bound.items()))

    def expr(self, e: Expr, track: bool = False) -> Denot:
        key = (e, track)
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        if key in self._active:
            raise SchemaError(f"schema at {_where(e)} refers to itself in place ($ref cycle without a nested value)")
        self._active.add(key)
        self._depth += 1
        try:
            # In-place applicators ($ref chains, allOf inside allOf) recurse here, once per level.
            check_depth(self._depth, "the chain of $ref and in-place subschemas", _where(e))
            out = self._expr(e, track)
        finally:
            self._active.discard(key)
            self._depth -= 1
        self._memo[key] = out
        return out

    def _expr(self, e: Expr, track: bool) -> Denot:
        if isinstance(e, Bool):
            return TOP if e.value else BOTTOM
        if isinstance(e, Const):
            return value_denot(e.value)
        if isinstance(e, Ptr):
            return self.node(resolve_pointer(self.doc, e.ptr), e.ptr, e.scope, track)
        if isinstance(e, Not):
            return neg(self.expr(e.item), self._refuser(_where(e)))
        if isinstance(e, And):
            consts = [x for x in e.items if isinstance(x, Const)]
            if consts:
                v = consts[0].value
                ok = all(self.holds(x, v) for x in e.items)
                return value_denot(v) if ok else BOTTOM
            out = TOP
            for x in sorted(e.items, key=repr):
                out = conj(out, self.expr(x, track))
                if out.is_empty():
                    break
            return out
        assert isinstance(e, Or)
        return self.union([self.expr(x, track) for x in sorted(e.items, key=repr)], track, _where(e))

    def count_lowered(self) -> None:
        """Count one subschema lowered (the step budget; see ``budget``)."""
        charge("lowering the JSON schema", LOWER_STEPS)

    def holds(self, e: Expr, value: Any) -> bool:
        """Exact membership through jsonschema at the leaves (False when it cannot decide).
        With dynamic references jsonschema cannot see our scopes: the denotation decides."""
        if self._dyn_names:
            from .membership import member

            return member(value, self.expr(e), self)
        try:
            return holds(e, value, lambda v, p: self._validator.evolve(schema=resolve_pointer(self.doc, p.ptr)).is_valid(v))
        except Exception:  # e.g. a pattern Python's re cannot compile: drop the constant (sound)
            return False

    def union(self, branches: list[Denot], track: bool, ptr: str) -> Denot:
        if track and len(branches) > 1 and any(_evaluates(b) for b in branches):
            if len(branches) > MAX_TRACKED_BRANCHES:
                self.refuse("unevaluatedProperties", ptr, f"anyOf with more than {MAX_TRACKED_BRANCHES} branches under unevaluated*")
            else:
                out = BOTTOM
                for mask in range(1, 1 << len(branches)):
                    part = TOP
                    for i, b in enumerate(branches):
                        if mask >> i & 1:
                            part = conj(part, b)
                    out = disj(out, part)
                return out
        out = BOTTOM
        for b in branches:
            out = disj(out, b)
        return out

    def _refuser(self, ptr: str) -> Callable[[str, str], None]:
        """A refusal callback for complements taken at ``ptr`` (``.../not``, ``.../oneOf/2``,
        ``.../if``); "@complement" names the keyword that asked for the complement."""
        asker = next((seg for seg in reversed(ptr.split("/")) if seg in ("not", "oneOf", "if")), "not")
        return lambda keyword, why: self.refuse(asker if keyword == "@complement" else keyword, ptr, why)

    # ------------------------------------------------------------------ schema objects
    def node(self, s: Any, ptr: str, scope: tuple, track: bool) -> Denot:
        self._work += 1
        if self._work > MAX_WORK:
            raise GrammarBudgetError(f"JSON schema expands to more than {MAX_WORK} subschemas (reference bomb or combinatorial allOf/anyOf?)")
        charge("denoting the JSON schema", SCHEMA_NODE_STEPS)
        if s is True:
            return TOP
        if s is False:
            return BOTTOM
        if not isinstance(s, dict):
            raise SchemaError(f"schema at {ptr or '/'} must be an object or a boolean")
        if self.draft is not None or self.annotate_formats:
            s = view(s, self.draft, self.annotate_formats)
        track = track or "unevaluatedProperties" in s or "unevaluatedItems" in s
        d = local(self, s, ptr, scope)
        for step in (self._refs, self._all_of, self._any_of, self._one_of, self._not, self._conditional, self._dependent_schemas):
            if d.is_empty():
                return d
            d = step(s, ptr, scope, track, d)
        return self._unevaluated(s, ptr, scope, d)

    def _refs(self, s: dict, ptr: str, scope: tuple, track: bool, d: Denot) -> Denot:
        if "$ref" in s:
            d = conj(d, self.expr(self.sub(s["$ref"][1:], scope), track))
        if "$dynamicRef" in s:
            target, name = self.dynamic.refs.get(ptr, (s["$dynamicRef"][1:], None))
            if name is not None:
                target = dict(scope).get(name, target)
            d = conj(d, self.expr(self.sub(target, scope), track))
        if "$recursiveRef" in s:
            self.refuse("$recursiveRef", ptr, "2019-09 recursive references are not resolved")
        return d

    def _all_of(self, s: dict, ptr: str, scope: tuple, track: bool, d: Denot) -> Denot:
        for i in range(len(s.get("allOf", ()))):
            d = conj(d, self.expr(self.sub(f"{ptr}/allOf/{i}", scope), track))
        return d

    def _any_of(self, s: dict, ptr: str, scope: tuple, track: bool, d: Denot) -> Denot:
        if "anyOf" not in s:
            return d
        branches = [self.expr(self.sub(f"{ptr}/anyOf/{i}", scope), track) for i in range(len(s["anyOf"]))]
        return conj(d, self.union(branches, track, ptr))

    def _one_of(self, s: dict, ptr: str, scope: tuple, track: bool, d: Denot) -> Denot:
        if "oneOf" not in s:
            return d
        exprs = [self.sub(f"{ptr}/oneOf/{i}", scope) for i in range(len(s["oneOf"]))]
        branches = [self.expr(e, track) for e in exprs]
        return conj(d, exactly_one(branches, lambda cur, j: self.minus(cur, f"{ptr}/oneOf/{j}", scope), self.expr))

    def _not(self, s: dict, ptr: str, scope: tuple, track: bool, d: Denot) -> Denot:
        if "not" not in s:
            return d
        return self.minus(d, f"{ptr}/not", scope)

    def minus(self, d: Denot, ptr: str, scope: tuple) -> Denot:
        """``d`` and not the schema at ``ptr``; ``{"not": X}`` there gives ``d`` and X, so a
        double negation never complements a set that is only a lower bound."""
        node = resolve_pointer(self.doc, ptr)
        if isinstance(node, dict) and "not" in node and not set(node) - ANNOTATIONS - {"not"}:
            return conj(d, unannotated(self.expr(self.sub(f"{ptr}/not", scope))))  # a negated schema evaluates nothing
        return conj_not(d, self.expr(self.sub(ptr, scope)), self._refuser(ptr), self.expr)

    def _conditional(self, s: dict, ptr: str, scope: tuple, track: bool, d: Denot) -> Denot:
        if "if" not in s:
            return d
        cond = self.sub(f"{ptr}/if", scope)
        then = self.expr(self.sub(f"{ptr}/then", scope), track) if "then" in s else TOP
        other = self.expr(self.sub(f"{ptr}/else", scope), track) if "else" in s else TOP
        yes = conj(self.expr(cond, track), then)
        no = self.minus(other, f"{ptr}/if", scope)
        return conj(d, disj(yes, no))

    def _dependent_schemas(self, s: dict, ptr: str, scope: tuple, track: bool, d: Denot) -> Denot:
        deps = [("dependentSchemas", k) for k in s.get("dependentSchemas", {})]
        deps += [("dependencies", k) for k, v in s.get("dependencies", {}).items() if not isinstance(v, list)]
        for key, name in deps:
            applied = self.expr(self.sub(f"{ptr}/{key}/{pointer_escape(name)}", scope), track)
            absent = but(obj=(ObjConj(props=((name, FALSE),)),))
            present = conj(only(obj=(ObjConj(required=(name,)),)), applied)
            d = conj(d, disj(absent, present))
        return d

    def _unevaluated(self, s: dict, ptr: str, scope: tuple, d: Denot) -> Denot:
        from dataclasses import replace

        if "unevaluatedProperties" in s:
            rest = self.sub(f"{ptr}/unevaluatedProperties", scope)
            objs = []
            for c in d.obj:
                if not c.ev_all:
                    lang = KeyLang(without=c.ev_names, unless=c.ev_pats)
                    c = replace(c, rules=c.rules + ((lang, rest),), explicit_extra=True)
                objs.append(replace(c, ev_all=True))
            d = replace(d, obj=tuple(dict.fromkeys(objs)))
        if "unevaluatedItems" in s:
            rest = self.sub(f"{ptr}/unevaluatedItems", scope)
            arrs = []
            for c in d.arr:
                if not c.ev_all:
                    from .conjs import arr_and

                    tail = ArrConj(prefix=(TRUE,) * c.ev_prefix, rest=or_(rest, *c.ev_contains))
                    c = arr_and(c, tail)
                if c is not None:
                    arrs.append(replace(c, ev_all=True))
            d = replace(d, arr=tuple(dict.fromkeys(arrs)))
        return d

def _evaluates(d: Denot) -> bool:
    return any(c.ev_prefix or c.ev_all or c.ev_contains for c in d.arr) or any(c.ev_names or c.ev_pats or c.ev_all for c in d.obj)


def _where(e: Expr) -> str:
    from .exprs import pointer_of

    return pointer_of(e) or "/"
