"""Arrays as IR: prefix items, the rest, length bounds and ``contains``.

Elements are built from the front: prefix positions nest (each may end the array once
``minItems`` is met), the rest is one counted repetition. ``contains`` with ``minContains`` k
is exact as "any items, a match, ..." k times, since a match is also an item.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import ir

if TYPE_CHECKING:
    from .lower import Lowerer


def array_expr(lw: "Lowerer", s: dict, ptr: str, depth: int) -> ir.Expr:
    """Arrays: ``prefixItems``/``items`` (or draft-07 ``items`` lists and ``additionalItems``),
    ``minItems``/``maxItems``, ``contains`` with ``minContains``."""
    layout = lw.layout
    prefix = s.get("prefixItems", [])
    rest = s.get("items", True)
    if isinstance(rest, list):
        prefix, rest = rest, s.get("additionalItems", True)
    lo, hi = s.get("minItems", 0), s.get("maxItems")
    if s.get("uniqueItems") is True and (hi is None or hi > 1):
        lw.refuse("uniqueItems", ptr)
    pv = [lw.value(p, f"{ptr}/prefixItems/{i}", depth + 1) for i, p in enumerate(prefix)]
    for i, e in enumerate(pv):
        if isinstance(e, ir.Nothing):
            hi = i if hi is None else min(hi, i)
            break
    rv = lw.value(rest, f"{ptr}/items", depth + 1)
    if isinstance(rv, ir.Nothing):
        hi = len(pv) if hi is None else min(hi, len(pv))
    if hi is not None and lo > hi:
        return ir.NOTHING
    sep = layout.sep(depth)
    contains = lw.deref(s["contains"], f"{ptr}/contains") if "contains" in s else True
    k = s.get("minContains", 1) if "contains" in s else 0
    if "maxContains" in s and "contains" in s:
        lw.refuse("maxContains", ptr)
    if k > 0 and contains is False:
        return ir.NOTHING
    if k > 0 and contains is True:
        lo, k = max(lo, k), 0
    if hi is not None and lo > hi:
        return ir.NOTHING
    if k > 0:
        body = _contains(lw, s, ptr, depth, pv, rv, lo, hi, sep)
    else:
        body = _elements(0, max(lo, 1), hi, pv, rv, sep)
    alts = [ir.seq(layout.open("[", depth), body, layout.close("]", depth))]
    if lo == 0 and k == 0:
        alts.append(layout.empty("[]"))
    return ir.choice(*alts)

def _elements(i: int, lo: int, hi: int | None, pv: list[ir.Expr], rv: ir.Expr, sep: ir.Expr) -> ir.Expr:
    if hi is not None and i >= hi:
        return ir.EMPTY if i >= lo else ir.NOTHING
    lead = sep if i > 0 else ir.EMPTY
    if i < len(pv):
        item = ir.seq(lead, pv[i], _elements(i + 1, lo, hi, pv, rv, sep))
        return ir.choice(ir.EMPTY, item) if i >= lo else item
    need, room = max(lo - i, 0), None if hi is None else hi - i
    if i > 0:
        return ir.repeat(ir.seq(sep, rv), need, room)
    tail = ir.seq(rv, ir.repeat(ir.seq(sep, rv), max(need - 1, 0), None if room is None else room - 1))
    return ir.choice(ir.EMPTY, tail) if need == 0 else tail

def _contains(lw: "Lowerer", s: dict, ptr: str, depth: int, pv, rv, lo, hi, sep) -> ir.Expr:
    k = s.get("minContains", 1)
    if pv or hi is not None or lo > k:
        lw.refuse("contains", ptr, "contains with prefixItems, maxItems or minItems above minContains")
    rest = s.get("items", True) if not isinstance(s.get("items"), list) else s.get("additionalItems", True)
    hit = lw.value({"allOf": [rest, s["contains"]]}, f"{ptr}/contains", depth + 1)
    gap = ir.star(ir.seq(rv, sep))
    return ir.seq(gap, hit, ir.repeat(ir.seq(sep, gap, hit), k - 1, k - 1), ir.star(ir.seq(sep, rv)))
