"""``uniqueItems``: the finite case as plain automata (here), the general case in the matcher.

When every item can take only a few values, ``arrays`` writes the array as an automaton over
the set of values already used. ``finite_values`` finds those values: a denotation that is a
finite set of scalars (``null``, booleans, single numbers, a finite string language).
"""

from __future__ import annotations

from fractions import Fraction
from typing import TYPE_CHECKING, Any

from .. import char_dfa
from .exprs import Expr, canonical
from .strsets import materialize

if TYPE_CHECKING:
    from .denote import Denoter


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
