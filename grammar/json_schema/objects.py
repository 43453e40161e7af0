"""Objects: named properties in ``properties`` order (optional ones skippable), extra keys.

The property list is a chain of states ``(index, started, count)``: ``started`` decides whether a
comma comes first, ``count`` exists only under ``minProperties``/``maxProperties``. States
after the first emitted property are shared as grammar rules, so a long list of optional
properties stays linear in size instead of quadratic. Extra keys (``additionalProperties``,
``patternProperties``) may appear in any gap between named properties; their keys exclude the
named ones exactly (a trie complement over the decoded key).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from .. import ir
from ..errors import GrammarBudgetError
from .refs import pointer_escape
from .strings import not_in, quoted, string_literal

if TYPE_CHECKING:
    from .lower import Lowerer

_SHARE_ABOVE = 3
_UNIVERSAL = frozenset(["", ".*", "^.*", "(.*)", "^(.*)", ".*?", "[\\s\\S]*", "^[\\s\\S]*"])  # match every key
MAX_COUNT_STATES = 4096  # chains longer than this get their shared states as rules


def _small(expr: ir.Expr, budget: int = 24) -> bool:
    """Whether ``expr`` has at most ``budget`` nodes (cheap to duplicate)."""
    stack, seen = [expr], 0
    while stack:
        e = stack.pop()
        seen += 1
        if seen > budget:
            return False
        if isinstance(e, (ir.Seq, ir.Choice)):
            stack.extend(e.items)
        elif isinstance(e, ir.Repeat):
            stack.append(e.item)
    return True


def _pattern_matches(pattern: str, name: str) -> bool | None:
    try:
        return re.search(pattern, name) is not None
    except re.error:
        return None


def object_expr(lw: "Lowerer", s: dict, ptr: str, depth: int) -> ir.Expr:
    props: dict[str, Any] = s.get("properties", {})
    required = list(dict.fromkeys(s.get("required", [])))
    patterns: dict[str, Any] = s.get("patternProperties", {})
    names_schema = s.get("propertyNames")
    extra = s.get("additionalProperties", False if lw.strict_properties else True)
    if s.get("unevaluatedProperties", True) is not True:
        lw.refuse("unevaluatedProperties", ptr)

    entries: list[tuple[str, ir.Expr, bool]] = []
    for name in [*props, *(r for r in required if r not in props)]:
        sub_ptr = f"{ptr}/properties/{pointer_escape(name)}"
        matching = [p for p in patterns if _pattern_matches(p, name) is not False]
        schemas = ([props[name]] if name in props else []) + [patterns[p] for p in matching]
        schemas = schemas or [extra]
        sub: Any = schemas[0] if len(schemas) == 1 else {"allOf": schemas}
        if names_schema is not None and not lw.valid(name, names_schema):
            sub = False
        value = lw.value(sub, sub_ptr, depth + 1)
        is_req = name in required
        if isinstance(value, ir.Nothing):
            if is_req:
                return ir.NOTHING
            continue
        entries.append((name, value, is_req))

    extra_kv = _extras(lw, s, ptr, depth, set(props) | set(required), patterns, names_schema, extra)
    min_p = s.get("minProperties", 0)
    max_p = s.get("maxProperties")
    if max_p is not None and min_p > max_p:
        return ir.NOTHING
    cap = max_p if max_p is not None else min_p
    if extra_kv is not None and (len(entries) + 1) * (cap + 1) > MAX_COUNT_STATES:
        raise GrammarBudgetError(f"minProperties/maxProperties {cap} with extra keys at {ptr or '/'} needs too many states")
    return _Chain(lw, entries, extra_kv, min_p, max_p, depth).build()


def _extras(lw: "Lowerer", s: dict, ptr: str, depth: int, named: set[str], patterns: dict, names_schema: Any, extra: Any) -> ir.Expr | None:
    """``key: value`` for keys outside ``properties`` (None when there can be none)."""
    layout = lw.layout
    trivial = all(v is True or v == {} for v in patterns.values())
    if patterns and any(p in _UNIVERSAL for p in patterns):
        # Every key matches: the pattern schema applies to all extra keys, additionalProperties never.
        if len(patterns) > 1:
            lw.refuse("patternProperties", ptr, "a match-everything pattern next to other patterns")
        pat, sub = next(iter(patterns.items()))
        patterns, extra = {}, sub
    elif patterns and trivial and extra is not False:
        patterns = {}  # matching keys take any value, and so do the others
    if patterns:
        if extra is not False:
            lw.refuse("patternProperties", ptr, "patternProperties together with allowed additionalProperties")
            return None
        if names_schema is not None:
            lw.refuse("propertyNames", ptr, "propertyNames together with patternProperties")
        if len({repr(v) for v in patterns.values()}) > 1 and len(patterns) > 1:
            lw.refuse("patternProperties", ptr, "several patterns with different schemas may overlap")
        from ..regex import regex_to_ir

        alts = []
        for pat, sub in patterns.items():
            if any(_pattern_matches(pat, name) is not False for name in named):
                lw.refuse("patternProperties", ptr, f"pattern {pat!r} also matches a named property")
            key = quoted(regex_to_ir(pat, flavor="ecma", mode="search"))
            value = lw.value(sub, f"{ptr}/patternProperties/{pointer_escape(pat)}", depth + 1)
            alts.append(ir.seq(key, layout.colon(), value))
        kv = ir.choice(*alts)
        return None if isinstance(kv, ir.Nothing) else kv
    if extra is False:
        return None
    value = lw.value(extra, f"{ptr}/additionalProperties", depth + 1)
    if isinstance(value, ir.Nothing):
        return None
    if names_schema is None:
        key = quoted(not_in(frozenset(named)))
    else:
        key = _names_key(lw, names_schema, ptr, named)
    return None if isinstance(key, ir.Nothing) else ir.seq(key, layout.colon(), value)


def _names_key(lw: "Lowerer", names_schema: Any, ptr: str, named: set[str]) -> ir.Expr:
    resolved = lw.deref(names_schema, f"{ptr}/propertyNames")
    if resolved is False:
        return ir.NOTHING
    if resolved is True:
        return quoted(not_in(frozenset(named)))
    values = [resolved["const"]] if "const" in resolved else resolved.get("enum")
    if values is not None:
        keys = [v for v in values if isinstance(v, str) and v not in named and lw.valid(v, resolved)]
        return ir.choice(*(string_literal(k) for k in keys))
    if named:
        lw.refuse("propertyNames", ptr, "a key language that must also exclude the named properties")
        return quoted(not_in(frozenset(named)))
    return lw.value({**resolved, "type": "string"}, f"{ptr}/propertyNames", 0)


class _Chain:
    """Builds the object body over the states described in the module docstring."""

    def __init__(self, lw: "Lowerer", entries, extra_kv, min_p: int, max_p: int | None, depth: int) -> None:
        self.lw, self.entries, self.extra_kv = lw, entries, extra_kv
        self.counting = min_p > 0 or max_p is not None
        self.min_p, self.max_p, self.depth = min_p, max_p, depth
        layout = lw.layout
        self.sep, self.colon = layout.sep(depth), layout.colon()
        self.req_after = [sum(r for _, _, r in entries[i:]) for i in range(len(entries) + 1)]
        self.memo: dict[tuple[int, bool, int], ir.Expr] = {}
        # Shared states become rules unless the whole object is tiny: inlining them duplicates
        # every later property value once per earlier optional one (and nests exponentially).
        self.share = len(entries) > _SHARE_ABOVE or any(not _small(v) for _, v, _ in entries)
        if extra_kv is not None and not _small(extra_kv):
            self.extra_kv = lw.add_rule("extra", extra_kv)

    def build(self) -> ir.Expr:
        layout = self.lw.layout
        body = self.state(0, False, 0)
        alts = [ir.seq(layout.open("{", self.depth), body, layout.close("}", self.depth))]
        if self.req_after[0] == 0 and self.min_p == 0:
            alts.append(layout.empty("{}"))
        return ir.choice(*alts)

    def state(self, i: int, started: bool, count: int) -> ir.Expr:
        n = len(self.entries)
        if self.counting:
            if self.max_p is not None and count + self.req_after[i] > self.max_p:
                return ir.NOTHING
            if self.extra_kv is None and count + (n - i) < self.min_p:
                return ir.NOTHING
            if self.max_p is None:
                count = min(count, self.min_p)  # beyond minProperties the count no longer matters
        else:
            count = 0
        key = (i, started, count)
        if key not in self.memo:
            expr = self._build(i, started, count)
            if started and self.share and not isinstance(expr, (ir.Nothing, ir.Empty)):
                expr = self.lw.add_rule("obj", expr)
            self.memo[key] = expr
        return self.memo[key]

    def _extra_star(self) -> ir.Expr:
        return ir.star(ir.seq(self.sep, self.extra_kv)) if self.extra_kv is not None else ir.EMPTY

    def _free(self, count: int) -> bool:
        """Whether extra keys no longer change anything the count decides."""
        return not self.counting or (self.max_p is None and count >= self.min_p)

    def _build(self, i: int, started: bool, count: int) -> ir.Expr:
        x = self.extra_kv
        n = len(self.entries)
        done_ok = not self.counting or count >= self.min_p
        if not started:
            alts = [] if i == n else [ir.seq(ir.seq(string_literal(self.entries[i][0]), self.colon, self.entries[i][1]), self.state(i + 1, True, count + 1))]
            if i < n and not self.entries[i][2]:
                alts.append(self.state(i + 1, False, count))
            if x is not None:
                alts.append(ir.seq(x, self.state(i, True, count + 1)))
            return ir.choice(*alts)
        if x is not None and self._free(count):
            rest = ir.EMPTY if i == n else self._named(i, count)
            return ir.seq(self._extra_star(), rest)
        alts = [ir.EMPTY if done_ok else ir.NOTHING] if i == n else [self._named(i, count)]
        if x is not None:
            alts.append(ir.seq(self.sep, x, self.state(i, True, count + 1)))
        return ir.choice(*alts)

    def _named(self, i: int, count: int) -> ir.Expr:
        name, value, req = self.entries[i]
        take = ir.seq(self.sep, string_literal(name), self.colon, value, self.state(i + 1, True, count + 1))
        return take if req else ir.choice(take, self.state(i + 1, True, count))
