"""``uniqueItems``: the finite case as plain automata, and where the matcher must check the rest.

When every item can take only a few values, ``arrays`` writes the array as an automaton over
the set of values already used. ``finite_values`` finds those values: a denotation that is a
finite set of scalars (``null``, booleans, single numbers, a finite string language).

Otherwise ``unique_check`` enforces uniqueness while the text is produced, and needs to know
which arrays are unique: ``build_check`` makes a structure graph from the denotations, one node
per value schema that can lead to a unique array, with its children by key (named keys, key
languages) and by index (prefix positions, the rest, ``contains``). While scanning, each open
container holds the set of nodes that apply to it; an array is tracked when one of them says
so. Taking every branch of a union (and every ``contains`` schema) over-approximates where
uniqueness may apply, and costs nothing in exactness: the check only marks duplicates, and the
automaton's branches that allow duplicates read the marks (``unique_check``).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from .. import char_dfa
from ..errors import GrammarBudgetError
from .exprs import FALSE, TRUE, Expr, canonical
from .strsets import materialize
from .unique_check import UniqueItemsCheck

if TYPE_CHECKING:
    from .conjs import KeyLang
    from .schema_denoter import Denoter

MAX_NODES = 20_000


def finite_values(den: "Denoter", e: Expr, limit: int) -> dict[str, Any] | None:
    """canonical text -> value for every value of ``e`` when there are at most ``limit``."""
    d = den.expr(e)
    if d.arr or d.obj:
        return None
    out: dict[str, Any] = {}
    if d.null:
        out[canonical(None)] = None
    for b in sorted(d.bools):
        out[canonical(b)] = b
    for c in d.num.conjs:
        p = c.point()
        if p is None:
            return None
        v: Any = int(p) if p.denominator == 1 else float(p)
        if Fraction(str(v)) != p if isinstance(v, float) else False:
            return None  # not representable as a float: leave it to the general path
        out[canonical(v)] = v
    if not d.str.empty:
        if d.str.is_all:
            return None
        words = char_dfa.finite_words(materialize(d.str), limit)
        if words is None:
            return None
        for w in words:
            out[canonical(w)] = w
    return out if len(out) <= limit else None



@dataclass
class Node:
    unique: bool
    names: dict[str, list[int]]
    langs: list[tuple["KeyLang", int]]
    indexes: list[tuple[int, int | None, int]]  # (first, last or None, child)


def build_check(den: "Denoter", root: Expr) -> UniqueItemsCheck | None:
    """The check for the schema ``root``, or None when no array in it must be unique."""
    ids: dict[Expr, int] = {}
    nodes: list[Node] = []
    todo = [root]
    ids[root] = 0
    nodes.append(Node(False, {}, [], []))
    while todo:
        e = todo.pop()
        node = nodes[ids[e]]
        d = den.expr(e)
        node.unique = any(c.unique for c in d.arr)

        def child(x: Expr) -> int | None:
            if x in (TRUE, FALSE):
                return None
            if x not in ids:
                if len(nodes) >= MAX_NODES:
                    raise GrammarBudgetError(f"uniqueItems: the schema has more than {MAX_NODES} value schemas to track")
                ids[x] = len(nodes)
                nodes.append(Node(False, {}, [], []))
                todo.append(x)
            return ids[x]

        for c in d.obj:
            for k, v in c.props:
                j = child(v)
                if j is not None:
                    node.names.setdefault(k, []).append(j)
            for lang, s in c.rules + c.exists:
                j = child(s)
                if j is not None:
                    node.langs.append((lang, j))
        for c in d.arr:
            for i, p in enumerate(c.prefix):
                j = child(p)
                if j is not None:
                    node.indexes.append((i, i, j))
            for s, start in [(c.rest, len(c.prefix))] + [(x, st) for x, _, _, st in c.contains]:
                j = child(s)
                if j is not None:
                    node.indexes.append((start, None, j))
    relevant = _leading_to_unique(nodes)
    if not relevant[0]:
        return None
    return UniqueItemsCheck(nodes, relevant)


def _leading_to_unique(nodes: list[Node]) -> list[bool]:
    """Nodes from which a unique array is reachable (the others need no tracking)."""
    parents: list[list[int]] = [[] for _ in nodes]
    for i, n in enumerate(nodes):
        kids = [j for js in n.names.values() for j in js] + [j for _, j in n.langs] + [j for _, _, j in n.indexes]
        for j in kids:
            parents[j].append(i)
    out = [n.unique for n in nodes]
    todo = [i for i, u in enumerate(out) if u]
    while todo:
        j = todo.pop()
        for i in parents[j]:
            if not out[i]:
                out[i] = True
                todo.append(i)
    return out
