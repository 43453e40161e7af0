"""Sets of strings (decoded values, character level), closed under intersection, union and complement.

A ``StrSet`` stays symbolic while it is a plain conjunction (length bounds and languages that
must all match: patterns, formats, enum words), which lowers straight to IR in the common cases
(one pattern, a length bound the pattern's own repeat can carry). Anything else (two patterns,
a complement, a union of constrained sets, a length bound over a complex pattern) is folded into
one ``char_dfa`` automaton, exact by construction.

Exactness: a ``format`` (validators check formats with different strictness, some not at all
without optional libraries) gives a *lower bound*: enforcing it never accepts an invalid string,
but its complement could. Such a set records the keyword in ``approx``, and complementing it
raises UnsupportedFeatureError naming that keyword. A ``pattern`` whose meaning differs between
ECMA-262 (the specification) and Python's ``re`` (what jsonschema runs) only on some characters
(``\\d`` and ``\\w`` on non-ASCII digits and letters, ``.`` and ``$`` around line breaks) carries
the *safe* characters on which both agree: its complement is taken within strings of safe
characters, a subset of the complement in both dialects (and itself a lower bound).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from .. import char_dfa, ir
from ..trie_choice import trie_choice
from ..errors import GrammarBudgetError, UnsupportedFeatureError
from .strings import length_bounds, restrict_length


@dataclass(frozen=True)
class StrSet:
    lo: int = 0
    hi: int | None = None
    exprs: tuple[ir.Expr, ...] = ()  # character-level languages that must all match
    dfa: char_dfa.CharDFA | None = None  # when set: the whole language (lo/hi/exprs unused)
    approx: tuple[str, str, tuple | None] | None = None  # (keyword, what, safe ranges): see above
    empty: bool = False

    @staticmethod
    def all() -> "StrSet":
        return StrSet()

    @staticmethod
    def none() -> "StrSet":
        return StrSet(empty=True)

    @staticmethod
    def of(expr: ir.Expr, approx: tuple[str, str, tuple | None] | None = None) -> "StrSet":
        return StrSet(exprs=(expr,), approx=approx)

    @staticmethod
    def words(words) -> "StrSet":
        return StrSet(exprs=(trie_choice(*(ir.literal(w) for w in sorted(set(words)))),))

    @property
    def is_all(self) -> bool:
        return not self.empty and self.dfa is None and not self.exprs and self.lo == 0 and self.hi is None

    def is_empty(self) -> bool:
        if self.empty:
            return True
        if self.hi is not None and self.lo > self.hi:
            return True
        if self.dfa is not None:
            return char_dfa.is_empty(self.dfa)
        if not self.exprs:
            return False
        return char_dfa.is_empty(materialize(self))

    def __and__(self, other: "StrSet") -> "StrSet":
        if self.empty or other.empty:
            return StrSet.none()
        approx = _approx(self.approx, other.approx)
        if self.dfa is None and other.dfa is None:
            hi = self.hi if other.hi is None else other.hi if self.hi is None else min(self.hi, other.hi)
            exprs = tuple(dict.fromkeys(self.exprs + other.exprs))
            return StrSet(max(self.lo, other.lo), hi, exprs, None, approx)
        return StrSet(dfa=char_dfa.intersect(materialize(self), materialize(other)), approx=approx)

    def __or__(self, other: "StrSet") -> "StrSet":
        if self.empty:
            return other
        if other.empty:
            return self
        approx = _approx(self.approx, other.approx)
        if self.is_all or other.is_all:
            return StrSet(approx=None if (self.is_all and not self.approx) or (other.is_all and not other.approx) else approx)
        if self == other:
            return self
        return StrSet(dfa=char_dfa.union(materialize(self), materialize(other)), approx=approx)

    def complement(self, refuse) -> "StrSet":
        """All strings outside; ``refuse(keyword, why)`` is called for a lower bound."""
        if self.approx and self.approx[2] is None:
            refuse(self.approx[0], f"{self.approx[1]} under not/oneOf/if: its complement is not exact")
            return StrSet.all()  # relaxed: the negated constraint is ignored
        if self.empty:
            return StrSet.all()
        if self.is_all:
            return StrSet.none()
        dfa = char_dfa.complement(materialize(self))
        if self.approx:
            safe = char_dfa.from_ir(ir.star(ir.char_class(self.approx[2])))
            return StrSet(dfa=char_dfa.intersect(dfa, safe), approx=(self.approx[0], self.approx[1], None))
        return StrSet(dfa=dfa)

    def accepts(self, text: str) -> bool:
        if self.empty:
            return False
        if self.dfa is None and not self.exprs:
            return self.lo <= len(text) and (self.hi is None or len(text) <= self.hi)
        return char_dfa.accepts(materialize(self), text)

    def to_ir(self) -> ir.Expr:
        """Character-level IR of the set (to be JSON-encoded and quoted by the caller)."""
        if self.empty or (self.hi is not None and self.lo > self.hi):
            return ir.NOTHING
        if self.dfa is not None:
            return char_dfa.to_ir(self.dfa)
        if not self.exprs:
            return ir.repeat(ir.ANY_CHAR, self.lo, self.hi)
        if len(self.exprs) == 1:
            expr = self.exprs[0]
            if not self.lo and self.hi is None:
                return expr
            try:
                return restrict_length(expr, self.lo, self.hi, "maxLength")
            except UnsupportedFeatureError:
                pass
        return char_dfa.to_ir(materialize(self))


def _approx(a: tuple | None, b: tuple | None) -> tuple | None:
    """Combined exactness: the safe characters of both (None if either has none)."""
    if a is None or b is None:
        return a or b
    safe = None if a[2] is None or b[2] is None else ir.normalize_ranges(
        (max(x[0], y[0]), min(x[1], y[1])) for x in a[2] for y in b[2] if max(x[0], y[0]) <= min(x[1], y[1]))
    return (a[0], a[1], safe)


@lru_cache(maxsize=256)
def materialize(s: StrSet) -> char_dfa.CharDFA:
    """The DFA of ``s`` (GrammarBudgetError from ``char_dfa`` when too big)."""
    if s.dfa is not None:
        return s.dfa
    if s.empty:
        return char_dfa.complement(char_dfa.universal())
    dfa = None
    for e in s.exprs:
        d = char_dfa.from_ir(e)
        dfa = d if dfa is None else char_dfa.intersect(dfa, d)
    if s.lo or s.hi is not None:
        if dfa is not None and s.hi is not None:
            lo, hi = length_bounds(char_dfa.to_ir(dfa))
            if hi is not None and hi <= s.hi and lo >= s.lo:
                return dfa
        lengths = char_dfa.lengths(s.lo, s.hi)
        dfa = lengths if dfa is None else char_dfa.intersect(dfa, lengths)
    return dfa if dfa is not None else char_dfa.universal()


def length_keyword(s: StrSet) -> str:
    return "maxLength" if s.hi is not None else "minLength"


__all__ = ["StrSet", "materialize", "length_keyword", "GrammarBudgetError"]
