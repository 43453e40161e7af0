"""The JSON Schema walker: one schema object -> one IR expression (with shared rules for $ref).

Order of work for a schema object: ``$ref`` (a rule per target, so recursion becomes a rule
cycle), ``enum``/``const`` (values filtered by validating them with ``jsonschema`` against the
whole schema, which is exact whatever else is there), ``allOf`` (merged), ``dependent*`` and
``if``/``then``/``else`` (rewritten into ``anyOf``), ``anyOf``/``oneOf`` (a choice over the
branches merged with the siblings; ``oneOf`` only when the branches are provably disjoint),
``not`` (simple forms), then one alternative per allowed type.
"""

from __future__ import annotations

import copy
import re
from typing import Any, Iterable

from .. import ir
from ..errors import GrammarBudgetError, SchemaError, UnsupportedFeatureError
from . import numbers, scalars
from .layout import MAX_INDENT_DEPTH, Layout
from .arrays import array_expr
from .merge import ANNOTATIONS, TYPES, canonical, merge, type_set
from .objects import object_expr
from .refs import resolve_pointer
from .strings import any_string, string_literal

MAX_WORK = 50_000  # schema nodes visited: bounds reference bombs and combinatorial allOf/anyOf
MAX_BRANCHES = 512
MAX_NESTING = 150  # nested subschemas being lowered at once (each level is a few Python frames)  # alternatives produced by one anyOf/oneOf/dependency distribution


class Lowerer:
    def __init__(self, doc: Any, validator_cls: type, layout: Layout, strict_properties: bool, relax: Iterable[str]) -> None:
        self.doc = doc
        self.layout = layout
        self.strict_properties = strict_properties
        self.relaxed = frozenset(relax)
        self.rules: dict[str, ir.Expr] = {}
        self._ref_names: dict[tuple[str, int], str] = {}
        self._validator = validator_cls(doc, format_checker=validator_cls.FORMAT_CHECKER)
        self._work = 0
        self._fresh = 0
        self._building: set[str] = set()
        self._nesting = 0

    # ---------------------------------------------------------------- helpers
    def refuse(self, keyword: str, pointer: str, why: str = "") -> None:
        """Raise UnsupportedFeatureError for ``keyword`` unless the caller relaxed it."""
        if keyword in self.relaxed:
            return
        detail = f" ({why})" if why else ""
        raise UnsupportedFeatureError(f"keyword '{keyword}' at {pointer or '/'} is not enforced exactly{detail}; pass relax_keywords=['{keyword}'] to ignore it")

    def valid(self, instance: Any, schema: Any) -> bool:
        return self._validator.evolve(schema=schema).is_valid(instance)

    def add_rule(self, prefix: str, expr: ir.Expr) -> ir.Expr:
        self._fresh += 1
        name = f"{prefix}_{self._fresh}"
        self.rules[name] = expr
        return ir.Ref(name)

    def _tick(self) -> None:
        self._work += 1
        if self._work > MAX_WORK:
            raise GrammarBudgetError(f"JSON schema expands to more than {MAX_WORK} subschemas (reference bomb or combinatorial allOf/anyOf?)")

    def deref(self, schema: Any, pointer: str) -> Any:
        """Follow a top-level ``$ref`` chain; siblings of ``$ref`` are merged into the target."""
        seen: set[str] = set()
        while isinstance(schema, dict) and "$ref" in schema:
            ref = schema["$ref"]
            if ref in seen:
                raise SchemaError(f"$ref cycle through {ref} at {pointer or '/'} never reaches a schema")
            seen.add(ref)
            self._tick()
            target = resolve_pointer(self.doc, ref[1:])
            rest = {k: v for k, v in schema.items() if k != "$ref" and k not in ANNOTATIONS and k not in ("$defs", "definitions")}
            if not rest:
                schema = target
            elif target is False:
                return False
            elif target is True:
                schema = rest
            else:
                schema = {**rest, "allOf": [*rest.get("allOf", []), target]}
        return schema

    # ---------------------------------------------------------------- entry
    def value(self, schema: Any, ptr: str, depth: int) -> ir.Expr:
        self._nesting += 1
        try:
            if self._nesting > MAX_NESTING:
                raise GrammarBudgetError(
                    f"schema nesting deeper than {MAX_NESTING} at {ptr or '/'} (a recursive $ref inlined through allOf/anyOf siblings?)"
                )
            return self._value(schema, ptr, depth)
        finally:
            self._nesting -= 1

    def _value(self, schema: Any, ptr: str, depth: int) -> ir.Expr:
        self._tick()
        if self.layout.depth_sensitive and depth > MAX_INDENT_DEPTH:
            return ir.NOTHING
        if schema is True or schema == {}:
            return self.any_value(depth)
        if schema is False:
            return ir.NOTHING
        if not isinstance(schema, dict):
            raise SchemaError(f"schema at {ptr or '/'} must be an object or a boolean")
        if "$ref" in schema:
            rest = {k for k in schema if k != "$ref" and k not in ANNOTATIONS and k not in ("$defs", "definitions")}
            if not rest:
                return self.ref(schema["$ref"][1:], depth)
        if "enum" in schema or "const" in schema:
            return self.enum(schema, ptr, depth)
        schema = self.flatten(schema, ptr)
        if schema is False:
            return ir.NOTHING
        if "enum" in schema or "const" in schema:
            return self.enum(schema, ptr, depth)
        for rewrite in (self._dependencies, self._conditional):
            branched = rewrite(schema, ptr)
            if branched is not None:
                return self.value(branched, ptr, depth)
        if "anyOf" in schema or "oneOf" in schema:
            return self.branches(schema, ptr, depth)
        excluded: list[Any] = []
        if "not" in schema:
            schema, excluded = self.negate(schema, ptr)
            if schema is False:
                return ir.NOTHING
        return self.typed(schema, ptr, depth, excluded)

    def ref(self, pointer: str, depth: int) -> ir.Expr:
        key = (pointer, depth if self.layout.depth_sensitive else 0)
        name = self._ref_names.get(key)
        if name is None:
            name = "def_" + re.sub(r"[^A-Za-z0-9_]", "_", pointer)[-40:] + f"_{len(self._ref_names)}"
            self._ref_names[key] = name
            self._building.add(name)
            self.rules[name] = ir.NOTHING  # placeholder while the body (maybe recursive) is built
            self.rules[name] = self.value(resolve_pointer(self.doc, pointer), pointer, depth)
            self._building.discard(name)
        if name not in self._building and isinstance(self.rules[name], ir.Nothing):
            return ir.NOTHING  # unsatisfiable target: let required properties see it
        return ir.Ref(name)

    # ---------------------------------------------------------------- combinators
    def flatten(self, schema: dict, ptr: str) -> Any:
        """Merge ``allOf`` (and ``$ref`` with siblings) into one schema object, or False."""
        schema = self.deref(schema, ptr)
        deferred: list[dict] = []  # a second anyOf/oneOf waits until the first is distributed
        while isinstance(schema, dict) and "allOf" in schema:
            schema = dict(schema)
            parts = schema.pop("allOf")
            for i, part in enumerate(parts):
                self._tick()
                part = self.deref(part, f"{ptr}/allOf/{i}")
                if part is False:
                    return False
                if part is True:
                    continue
                for key in ("anyOf", "oneOf"):
                    if key in part and key in schema and part[key] != schema[key]:
                        deferred.append({key: part[key]})
                        part = {k: v for k, v in part.items() if k != key}
                schema = merge(schema, part, f"{ptr}/allOf/{i}")
        if deferred and isinstance(schema, dict):
            schema = {**schema, "allOf": deferred}
        return schema

    def branches(self, schema: dict, ptr: str, depth: int) -> ir.Expr:
        key = "anyOf" if "anyOf" in schema else "oneOf"
        base = {k: v for k, v in schema.items() if k != key}
        if not set(base) - ANNOTATIONS - {"$defs", "definitions"}:
            # Nothing to merge: keep branches as they are, so a $ref branch stays a rule reference
            # (recursive schemas like {"anyOf": [{"$ref": "#"}, {"type": "null"}]}).
            if key == "oneOf" and not self._disjoint([self.deref(b, ptr) for b in schema[key]]):
                exclusive = self._exclusive_branches(schema["oneOf"])
                if exclusive is not None:
                    return self.value({**base, "anyOf": exclusive}, ptr, depth)
                self.refuse("oneOf", ptr, "branches not provably disjoint")
            return ir.choice(*(self.value(b, f"{ptr}/{key}/{i}", depth) for i, b in enumerate(schema[key])))
        merged = []
        for i, branch in enumerate(schema[key]):
            branch = self.deref(branch, f"{ptr}/{key}/{i}")
            if branch is False:
                continue
            merged.append(base if branch is True else merge(copy.copy(base), branch, f"{ptr}/{key}/{i}"))
        if len(merged) > MAX_BRANCHES:
            raise GrammarBudgetError(f"{key} at {ptr or '/'} expands to more than {MAX_BRANCHES} alternatives")
        if key == "oneOf" and not self._disjoint(merged):
            exclusive = self._exclusive_branches(schema["oneOf"])
            if exclusive is not None:
                return self.value({**base, "anyOf": exclusive}, ptr, depth)
            self.refuse("oneOf", ptr, "branches not provably disjoint")
        return ir.choice(*(self.value(m, f"{ptr}/{key}", depth) for m in merged))

    def _exclusive_branches(self, branches: list[Any]) -> list[dict] | None:
        """``oneOf`` as ``anyOf`` of "this branch and none of the others", when every branch's
        negation is expressible (type, required, property discriminator); else None."""
        resolved = [self.deref(b, "") for b in branches]
        negations = [_negate_condition(b) for b in resolved]
        if len(branches) > 8 or any(n is None for n in negations):
            return None
        return [{"allOf": [b, *(n for j, n in enumerate(negations) if j != i)]} for i, b in enumerate(resolved)]

    def _disjoint(self, schemas: list[Any]) -> bool:
        flat = [self.flatten(s, "") if isinstance(s, dict) else s for s in schemas]
        return all(self._pair_disjoint(a, b) for i, a in enumerate(flat) for b in flat[i + 1 :])

    def _pair_disjoint(self, a: Any, b: Any) -> bool:
        if a is False or b is False:
            return True
        if a is True or b is True:
            return False
        ta, tb = _effective_types(a), _effective_types(b)
        common = ta & tb
        if ("number" in ta and "integer" in tb) or ("integer" in ta and "number" in tb):
            common.add("integer")  # integers are numbers
        if not common:
            return True
        for x, y in ((a, b), (b, a)):
            vals = [x["const"]] if "const" in x else x.get("enum")
            if vals is not None and not any(self.valid(v, y) for v in vals):
                return True
        if common == {"object"}:
            return self._objects_disjoint(a, b) or self._objects_disjoint(b, a)
        return False

    def _objects_disjoint(self, a: dict, b: dict) -> bool:
        pb = b.get("properties", {})
        for name in a.get("required", []):
            if name not in pb and b.get("additionalProperties", True) is False and not b.get("patternProperties"):
                return True
            if name in pb and pb[name] is False:
                return True
            if name in b.get("required", []) and name in a.get("properties", {}) and name in pb:
                sa, sb = self.flatten(self.deref(a["properties"][name], ""), ""), self.flatten(self.deref(pb[name], ""), "")
                if isinstance(sa, dict) and isinstance(sb, dict) and self._pair_disjoint(sa, sb):
                    return True
        return False

    def _dependencies(self, schema: dict, ptr: str) -> dict | None:
        """The first property dependency as an ``anyOf``: property absent, or present with its
        dependency (``dependentRequired``, ``dependentSchemas``, draft-07 ``dependencies``)."""
        for key in ("dependentRequired", "dependentSchemas", "dependencies"):
            deps = schema.get(key)
            if not deps:
                continue
            name, dep = next(iter(deps.items()))
            rest = {k: v for k, v in deps.items() if k != name}
            base = {k: v for k, v in schema.items() if k != key}
            if rest:
                base[key] = rest
            absent = {"properties": {name: False}}
            present = {"required": [name, *dep]} if isinstance(dep, list) else {"required": [name], "allOf": [dep]}
            return {**base, "allOf": [*base.get("allOf", []), {"anyOf": [absent, present]}]}
        return None

    def _conditional(self, schema: dict, ptr: str) -> dict | None:
        """``if``/``then``/``else`` as ``anyOf`` when the negation of ``if`` is expressible."""
        if "if" not in schema:
            return None
        base = {k: v for k, v in schema.items() if k not in ("if", "then", "else")}
        cond = self.deref(schema["if"], f"{ptr}/if")
        then, other = schema.get("then", True), schema.get("else", True)
        if cond is True or cond is False:
            return {**base, "allOf": [*base.get("allOf", []), then if cond else other]}
        negated = _negate_condition(cond)
        if negated is None:
            self.refuse("if", ptr, "only property-discriminator and type conditions are supported")
            return base
        return {**base, "allOf": [*base.get("allOf", []), {"anyOf": [{"allOf": [cond, then]}, {"allOf": [negated, other]}]}]}

    def negate(self, schema: dict, ptr: str) -> tuple[Any, list[Any]]:
        """Apply ``not`` of a simple form: types, values, or one required property."""
        schema = dict(schema)
        neg = self.deref(schema.pop("not"), f"{ptr}/not")
        if neg is False:
            return schema, []
        if neg is True:
            return False, []
        keys = set(neg) - ANNOTATIONS
        if not keys:  # not {} rejects everything
            return False, []
        if keys == {"anyOf"}:  # not (A or B) == not A and not B
            excluded: list[Any] = []
            for part in neg["anyOf"]:
                schema, more = self.negate({**schema, "not": part}, ptr)
                excluded += more
                if schema is False:
                    return False, []
            return schema, excluded
        if keys == {"type"}:
            excluded_types = _effective_types(neg)
            if "number" in excluded_types:  # integers are numbers: excluding numbers excludes them
                excluded_types.add("integer")
            types = _effective_types(schema) - excluded_types
            if "integer" in _effective_types(neg) and "number" in types:
                self.refuse("not", ptr, "non-integer numbers")
            return ({**schema, "type": sorted(types)} if types else False), []
        if keys in ({"enum"}, {"const"}):
            values = [neg["const"]] if "const" in neg else list(neg["enum"])
            return schema, [v for v in values if self.valid(v, schema)]
        if keys == {"required"} and len(neg["required"]) == 1:
            return merge(schema, {"properties": {neg["required"][0]: False}}, ptr), []
        self.refuse("not", ptr, "only not of type, enum/const or one required property is supported")
        return schema, []

    # ---------------------------------------------------------------- values
    def enum(self, schema: dict, ptr: str, depth: int) -> ir.Expr:
        values = [schema["const"]] if "const" in schema else schema["enum"]
        rest = {k: v for k, v in schema.items() if k not in ("enum", "const")}
        kept: dict[str, Any] = {}
        for v in values:
            if canonical(v) not in kept and self.valid(v, schema):
                kept[canonical(v)] = v
        return ir.choice(*(self.literal_value(v, depth) for v in kept.values()))

    def literal_value(self, v: Any, depth: int) -> ir.Expr:
        """Every spelling of the JSON value ``v`` (number forms, string escapes, whitespace)."""
        layout = self.layout
        if v is None or isinstance(v, bool):
            return ir.literal({None: "null", True: "true", False: "false"}[v])
        if isinstance(v, str):
            return string_literal(v)
        if isinstance(v, (int, float)):
            return _number_literal(v)
        if isinstance(v, list):
            if not v:
                return layout.empty("[]")
            items = [self.literal_value(x, depth + 1) for x in v]
            body = [items[0], *(ir.seq(layout.sep(depth), x) for x in items[1:])]
            return ir.seq(layout.open("[", depth), *body, layout.close("]", depth))
        if isinstance(v, dict):
            if not v:
                return layout.empty("{}")
            kvs = [ir.seq(string_literal(k), layout.colon(), self.literal_value(x, depth + 1)) for k, x in v.items()]
            body = [kvs[0], *(ir.seq(layout.sep(depth), x) for x in kvs[1:])]
            return ir.seq(layout.open("{", depth), *body, layout.close("}", depth))
        raise SchemaError(f"unsupported JSON value {v!r}")

    def typed(self, schema: dict, ptr: str, depth: int, excluded: list[Any]) -> ir.Expr:
        for key in ("unevaluatedItems", "$dynamicRef", "$recursiveRef"):
            if key in schema and schema[key] is not True:
                self.refuse(key, ptr)
        types = _effective_types(schema)
        if "number" in types:
            types.discard("integer")
        ex_keys = {canonical(v) for v in excluded}
        ex_strings = [v for v in excluded if isinstance(v, str)]
        others = [v for v in excluded if not isinstance(v, (str, bool)) and v is not None]
        if others:
            self.refuse("not", ptr, "excluding numbers, arrays or objects")
        alts: list[ir.Expr] = []
        for t in TYPES:
            if t not in types:
                continue
            if t == "null":
                alts.append(ir.NOTHING if canonical(None) in ex_keys else ir.literal("null"))
            elif t == "boolean":
                alts += [ir.literal(x) for x, b in (("true", True), ("false", False)) if canonical(b) not in ex_keys]
            elif t == "string":
                alts.append(scalars.string_expr(schema, ptr, ex_strings, self.refuse, self.relaxed))
            elif t in ("number", "integer"):
                alts.append(scalars.number_expr(schema, ptr, t == "integer", self.refuse))
            elif t == "object":
                alts.append(object_expr(self, schema, ptr, depth))
            elif t == "array":
                alts.append(array_expr(self, schema, ptr, depth))
        return ir.choice(*alts)

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
        arr = ir.seq(layout.open("[", depth), inner, ir.star(ir.seq(sep, inner)), layout.close("]", depth))
        kv = ir.seq(any_string(), layout.colon(), inner)
        obj = ir.seq(layout.open("{", depth), kv, ir.star(ir.seq(sep, kv)), layout.close("}", depth))
        scalars_ = [ir.literal("null"), ir.literal("true"), ir.literal("false"), numbers.JSON_NUMBER, any_string()]
        self.rules[name] = ir.choice(*scalars_, layout.empty("[]"), arr, layout.empty("{}"), obj)
        return ir.Ref(name)


def _effective_types(schema: dict) -> set[str]:
    types = type_set(schema)
    # OpenAPI's ``nullable`` is not a JSON Schema keyword: validators (and MaskBench's labels)
    # ignore it, so honouring it would accept null where jsonschema rejects it.
    return set(TYPES) if types is None else set(types)


def _number_literal(v: int | float) -> ir.Expr:
    """Spellings of a number constant: canonical text, plus ``.0`` forms for integral values."""
    if isinstance(v, float) and not v.is_integer():
        text = repr(v)
        alts = [ir.literal(text)]
        if "e" in text or "E" in text:
            from decimal import Decimal

            alts.append(ir.literal(format(Decimal(text), "f")))
        plain = [a for a in alts if b"e" not in a.data]  # type: ignore[union-attr]
        return ir.choice(*alts, *(ir.seq(p, ir.plus(ir.literal("0"))) for p in plain))
    n = int(v)
    base = ir.literal(str(n)) if n != 0 else ir.choice(ir.literal("0"), ir.literal("-0"))
    return ir.seq(base, ir.optional(ir.seq(ir.literal("."), ir.plus(ir.literal("0")))))


def _negate_condition(cond: Any) -> Any:
    """A schema for "``cond`` fails", for type conditions and property discriminators."""
    if not isinstance(cond, dict):
        return None
    keys = set(cond) - ANNOTATIONS
    if keys == {"type"}:
        return {"not": {"type": cond["type"]}}
    if keys == {"required"} and cond["required"]:
        absent = [{"properties": {name: False}} for name in cond["required"]]
        return absent[0] if len(absent) == 1 else {"anyOf": absent}
    props = cond.get("properties", {})
    req = cond.get("required", [])
    if keys - {"properties", "required"} or len(props) != 1 or (req and req != list(props)):
        return None
    (name, sub), = props.items()
    if not isinstance(sub, dict) or set(sub) - ANNOTATIONS not in ({"const"}, {"enum"}):
        return None
    values = [sub["const"]] if "const" in sub else sub["enum"]
    wrong = {"required": [name], "properties": {name: {"not": {"enum": values}}}}
    return {"anyOf": [{"properties": {name: False}}, wrong]} if req else wrong
