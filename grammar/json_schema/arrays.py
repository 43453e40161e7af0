"""Arrays: one ``ArrConj`` -> IR.

Without ``contains`` entries, elements are built from the front: prefix positions nest (each may
end the array once ``minItems`` is met), the rest is one counted repetition.

With ``contains`` entries (``contains`` with ``minContains``/``maxContains``, and the negations
of ``items`` / ``prefixItems``, which say "some item from index k fails S"), the body is an
``ir.Graph`` over states (index, counts): each item either counts for an entry (it satisfies
the entry's schema) or does not (it satisfies the negation, needed only when the entry has a
maximum: without one, not counting a matching item is harmless). The index is tracked up to the
last position that matters (prefix, ``minItems``, first counted index, ``maxItems``).

``uniqueItems``: when every item can take only a few values (booleans, small enums), the state
also holds the set of values used, and each edge writes one value; otherwise the array is
built without it and registered with ``unique`` for the matcher to enforce.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import ir
from ..errors import GrammarBudgetError
from .conjs import ArrConj
from .exprs import Expr, and_, not_
from .unique import finite_values

if TYPE_CHECKING:
    from .lower import Lowerer

MAX_GRAPH_STATES = 20_000
MAX_UNIQUE_VALUES = 10


def array_expr(lw: "Lowerer", c: ArrConj, ptr: str, depth: int) -> ir.Expr:
    layout = lw.layout
    values = _unique_domain(lw, c) if c.unique and (c.hi is None or c.hi > 1) else None
    if c.unique and values is None and (c.hi is None or c.hi > 1):
        lw.unique_site(c, ptr)
    if values is not None or c.contains:
        body, empty_ok = _graph(lw, c, ptr, depth, values)
    else:
        pv = [lw.value(p, depth + 1) for p in c.prefix]
        hi = c.hi
        for i, e in enumerate(pv):
            if isinstance(e, ir.Nothing):
                hi = i if hi is None else min(hi, i)
                break
        rv = lw.value(c.rest, depth + 1)
        if isinstance(rv, ir.Nothing):
            hi = len(pv) if hi is None else min(hi, len(pv))
        if hi is not None and c.lo > hi:
            return ir.NOTHING
        if not c.unique:
            pv, rv = [lw.item(e) for e in pv], lw.item(rv)
        body = _elements(0, max(c.lo, 1), hi, pv, rv, layout.sep(depth))
        empty_ok = c.lo == 0
    alts = [ir.seq(layout.open("[", depth), body, layout.close("]", depth))]
    if empty_ok:
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


def _unique_domain(lw: "Lowerer", c: ArrConj) -> list | None:
    """The few values items can take (canonical JSON -> value), or None."""
    exprs = list(c.prefix) + [c.rest]
    domain: dict[str, object] = {}
    for e in exprs:
        vals = finite_values(lw.den, e, MAX_UNIQUE_VALUES)
        if vals is None:
            return None
        domain.update(vals)
        if len(domain) > MAX_UNIQUE_VALUES:
            return None
    return list(domain.items())


def _graph(lw: "Lowerer", c: ArrConj, ptr: str, depth: int, values: list | None) -> tuple[ir.Expr, bool]:
    """The non-empty bodies as an ``ir.Graph``; and whether ``[]`` is allowed."""
    sep = lw.layout.sep(depth)
    entries = list(c.contains)
    caps = [mx + 1 if mx is not None else mn for _, mn, mx, _ in entries]
    top = max([1, len(c.prefix), c.lo, *(st + 1 for _, _, _, st in entries)])
    if c.hi is not None:
        top = c.hi
    ids: dict[tuple, int] = {}
    order: list[tuple] = []
    edges: list[tuple[int, ir.Expr, int]] = []

    def node(key: tuple) -> int:
        if key not in ids:
            if len(order) >= MAX_GRAPH_STATES:
                raise GrammarBudgetError(f"array at {ptr or '/'} needs more than {MAX_GRAPH_STATES} states (contains counts, maxItems, uniqueItems)")
            ids[key] = len(order)
            order.append(key)
        return ids[key]

    def done(key: tuple) -> bool:
        idx, counts, _ = key
        return idx >= c.lo and all(k >= mn for k, (_, mn, _, _) in zip(counts, entries))

    node((0, tuple(0 for _ in entries), frozenset()))
    i = 0
    while i < len(order):
        idx, counts, used = order[i]
        if c.hi is None or idx < c.hi:
            base = c.item(idx)
            nxt_idx = idx + 1 if (c.hi is not None or idx + 1 <= top) else idx
            lead = sep if idx > 0 else ir.EMPTY
            for expr, new_counts, new_used in _steps(lw, c, entries, caps, idx, counts, used, base, values):
                v = lw.value(expr, depth + 1)
                if isinstance(v, ir.Nothing):
                    continue
                j = node((nxt_idx, new_counts, new_used))
                edges.append((i, ir.seq(lead, v if c.unique else lw.item(v)), j))
        i += 1
    finals = frozenset(k for k, key in enumerate(order) if key[0] > 0 and done(key))
    empty_ok = done(order[0])
    if not finals:
        return ir.NOTHING, empty_ok
    return ir.Graph(0, finals, tuple(edges)), empty_ok


def _steps(lw, c: ArrConj, entries, caps, idx, counts, used, base: Expr, values):
    """(item expression, counts after, values used after) for each way to write item ``idx``."""
    active = [j for j, (_, _, _, st) in enumerate(entries) if st <= idx]
    if values is not None:
        for key, v in values:
            if key in used or not lw.den.holds(base, v):
                continue
            new = list(counts)
            ok = True
            for j in active:
                if lw.den.holds(entries[j][0], v):
                    new[j] += 1
                    if entries[j][2] is not None and new[j] > entries[j][2]:
                        ok = False
                    new[j] = min(new[j], caps[j])
            if ok:
                from .exprs import Const

                yield Const(key), tuple(new), used | {key}
        return
    # Entries that still matter: a maximum to respect, or a minimum not yet met.
    live = [j for j in active if entries[j][2] is not None or counts[j] < entries[j][1]]
    for mask in range(1 << len(live)):
        chosen = [live[k] for k in range(len(live)) if mask >> k & 1]
        parts = [base] + [entries[j][0] for j in chosen]
        parts += [not_(entries[j][0]) for j in live if j not in chosen and entries[j][2] is not None]
        new = list(counts)
        ok = True
        for j in chosen:
            new[j] += 1
            if entries[j][2] is not None and new[j] > entries[j][2]:
                ok = False
            new[j] = min(new[j], caps[j])
        if ok:
            yield and_(*parts), tuple(new), used
