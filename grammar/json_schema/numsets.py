"""Sets of JSON numbers, closed under intersection, union and complement, and their JSON text.

A ``NumConj`` is an interval intersected with "multiple of m" constraints, "not a multiple of
n" constraints and a few excluded points; a ``NumSet`` is a union of them. ``integer`` is
"multiple of 1", so ``not: {type: integer}`` is "not a multiple of 1". Complements follow
De Morgan: outside the interval, or not a multiple of some m, or a multiple of some n, or
one of the excluded points.

JSON text: the plain cases go to the digit automata of ``numbers`` (integer and decimal
ranges, ``multipleOf`` 10^-k); the others are an exact character DFA: the interval's texts
intersected with a residue automaton over the digits (``value * 10^D mod L``, D the decimal
places involved) minus every spelling of the excluded points. Like ``numbers``, bounded or
constrained numbers are written without exponents (a restriction of the output language).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from math import gcd

import numpy as np

from .. import char_dfa, ir
from ..errors import GrammarBudgetError, UnsupportedFeatureError
from . import numbers

MAX_MODULUS = 5000  # residue automata larger than this are refused
MAX_BOUND_DIGITS = 100  # fraction digits of a number bound (the digit automaton nests per digit)
ONE = Fraction(1)


@dataclass(frozen=True)
class NumConj:
    lo: Fraction | None = None
    lo_x: bool = False
    hi: Fraction | None = None
    hi_x: bool = False
    mult: Fraction | None = None  # a multiple of this (the lcm of every multipleOf)
    nonmults: frozenset[Fraction] = field(default_factory=frozenset)
    excluded: frozenset[Fraction] = field(default_factory=frozenset)

    @property
    def integer(self) -> bool:
        return self.mult is not None and self.mult.denominator == 1

    def point(self) -> Fraction | None:
        if self.lo is not None and self.lo == self.hi and not self.lo_x and not self.hi_x:
            return self.lo
        return None


def _lcm(a: Fraction, b: Fraction) -> Fraction:
    num = a.numerator * b.numerator // gcd(a.numerator, b.numerator)
    return Fraction(num, gcd(a.denominator, b.denominator))


def _is_multiple(x: Fraction, m: Fraction) -> bool:
    return (x / m).denominator == 1


def conj_and(a: NumConj, b: NumConj) -> NumConj | None:
    """The intersection, or None when provably empty."""
    lo, lo_x = a.lo, a.lo_x
    if b.lo is not None and (lo is None or b.lo > lo or (b.lo == lo and b.lo_x)):
        lo, lo_x = b.lo, b.lo_x
    hi, hi_x = a.hi, a.hi_x
    if b.hi is not None and (hi is None or b.hi < hi or (b.hi == hi and b.hi_x)):
        hi, hi_x = b.hi, b.hi_x
    if lo is not None and hi is not None and (lo > hi or (lo == hi and (lo_x or hi_x))):
        return None
    mult = a.mult if b.mult is None else b.mult if a.mult is None else _lcm(a.mult, b.mult)
    out = NumConj(lo, lo_x, hi, hi_x, mult, a.nonmults | b.nonmults, a.excluded | b.excluded)
    if mult is not None and any(_is_multiple(mult, n) for n in out.nonmults):
        return None
    p = out.point()
    if p is not None and (p in out.excluded or not _member(out, p)):
        return None
    return out


def _member(c: NumConj, x: Fraction) -> bool:
    if c.lo is not None and (x < c.lo or (x == c.lo and c.lo_x)):
        return False
    if c.hi is not None and (x > c.hi or (x == c.hi and c.hi_x)):
        return False
    if c.mult is not None and not _is_multiple(x, c.mult):
        return False
    return not any(_is_multiple(x, n) for n in c.nonmults) and x not in c.excluded


@dataclass(frozen=True)
class NumSet:
    conjs: tuple[NumConj, ...]

    @staticmethod
    def all() -> "NumSet":
        return NumSet((NumConj(),))

    @staticmethod
    def none() -> "NumSet":
        return NumSet(())

    @staticmethod
    def of(c: NumConj) -> "NumSet":
        return NumSet((c,))

    def is_empty(self) -> bool:
        return not self.conjs

    def __and__(self, other: "NumSet") -> "NumSet":
        out: dict[NumConj, None] = {}  # distinct, in order (a list scan made this quadratic)
        for a in self.conjs:
            for b in other.conjs:
                c = conj_and(a, b)
                if c is not None:
                    out[c] = None
        return NumSet(tuple(out))

    def __or__(self, other: "NumSet") -> "NumSet":
        if NumConj() in self.conjs or NumConj() in other.conjs:
            return NumSet.all()
        return NumSet(tuple(dict.fromkeys(self.conjs + other.conjs)))

    def complement(self) -> "NumSet":
        out = NumSet.all()
        for c in self.conjs:
            out = out & NumSet(_negate(c))
        return out

    def contains(self, x: Fraction) -> bool:
        return any(_member(c, x) for c in self.conjs)


def _negate(c: NumConj) -> tuple[NumConj, ...]:
    parts: list[NumConj] = []
    if c.lo is not None:
        parts.append(NumConj(hi=c.lo, hi_x=not c.lo_x))
    if c.hi is not None:
        parts.append(NumConj(lo=c.hi, lo_x=not c.hi_x))
    if c.mult is not None:
        parts.append(NumConj(nonmults=frozenset([c.mult])))
    parts += [NumConj(mult=n) for n in c.nonmults]
    parts += [NumConj(lo=x, hi=x) for x in c.excluded]
    return tuple(parts)


# ---------------------------------------------------------------------------- JSON text


def num_ir(s: NumSet, pointer: str, integer_spelling: bool = False) -> ir.Expr:
    """``integer_spelling``: integral conjunctions (a multiple of an integer) accept only texts
    without fraction or exponent, as draft-04's ``integer`` type does; a ``multipleOf: 1`` number
    spelled ``1.0`` is then refused too, a valid text lost, never an invalid one accepted."""
    return ir.choice(*(_conj_ir(c, pointer, integer_spelling and c.integer) for c in s.conjs))


def _conj_ir(c: NumConj, pointer: str, integer_spelling: bool = False) -> ir.Expr:
    p = c.point()
    if p is not None:
        if integer_spelling:
            return numbers.int_range(int(p), int(p)) if p.denominator == 1 else ir.NOTHING
        return point_spellings(p)
    simple = _simple_ir(c, pointer, integer_spelling)
    if simple is not None:
        return simple
    dfa = _exact_dfa(c, pointer)
    if integer_spelling:
        dfa = char_dfa.intersect(dfa, char_dfa.from_ir(ir.seq(ir.optional(ir.literal("-")), numbers.INT_PART)))
    return char_dfa.to_ir(dfa)


def _simple_ir(c: NumConj, pointer: str, integer_spelling: bool = False) -> ir.Expr | None:
    """The ``numbers`` digit automata, for conjunctions without exclusions (None otherwise)."""
    if c.nonmults or c.excluded:
        return None
    m = c.mult
    if m is not None and m.denominator == 1:
        ilo, ihi = numbers.integer_bounds(c.lo, c.lo_x, c.hi, c.hi_x)
        if ilo is not None and ihi is not None and ilo > ihi:
            return ir.NOTHING
        k = m.numerator
        if k != 1 and (ilo is None or ilo < 0) and ihi is None:
            return None  # integer_multiples covers non-negative or small ranges only
        try:
            expr = numbers.int_range(ilo, ihi) if k == 1 else numbers.integer_multiples(k, ilo, ihi, pointer)
        except UnsupportedFeatureError:
            return None
        if integer_spelling:
            return expr
        expr = ir.seq(expr, ir.optional(ir.seq(ir.literal("."), ir.plus(ir.literal("0")))))
        if ilo is None and ihi is None and k == 1:
            # Integral values may carry a positive exponent when unbounded (1e+16); two digits at
            # most, as json.loads turns 1e400 into infinity.
            exponent = ir.seq(ir.char_class([(0x45, 0x45), (0x65, 0x65)]), ir.optional(ir.literal("+")), ir.repeat(numbers.DIGIT, 1, 2))
            expr = ir.seq(expr, ir.optional(exponent))
        return expr
    places = None
    if m is not None:
        places = numbers.decimal_places(m)
        if places is None:
            return None
    if c.lo is None and c.hi is None and places is None:
        return numbers.JSON_NUMBER
    for keyword, bound in (("minimum/exclusiveMinimum", c.lo), ("maximum/exclusiveMaximum", c.hi)):
        # The digit automaton nests one level per fraction digit of a bound.
        if bound is not None and bound.denominator != 1 and _places(bound) > MAX_BOUND_DIGITS:
            raise GrammarBudgetError(
                f"{keyword} {float(bound):g} has {_places(bound)} fraction digits, over the budget of {MAX_BOUND_DIGITS} at {pointer or '/'}"
            )
    return numbers.number_range(c.lo, c.lo_x, c.hi, c.hi_x, max_fraction_digits=places)


def point_spellings(v: Fraction) -> ir.Expr:
    """Every exponent-free spelling of the number ``v`` (``5``, ``5.0``, ``-0``, ``0.50``...)."""
    neg = v < 0
    mag = -v if neg else v
    whole, frac = divmod(mag, 1)
    digits = ""
    while frac:
        frac *= 10
        d, frac = divmod(frac, 1)
        digits += str(int(d))
        if len(digits) > 400:
            raise UnsupportedFeatureError(f"number {v} has no short decimal spelling")
    body = ir.literal(str(int(whole)))
    tail = ir.seq(ir.literal("." + digits), ir.star(ir.literal("0"))) if digits else ir.optional(ir.seq(ir.literal("."), ir.plus(ir.literal("0"))))
    text = ir.seq(body, tail)
    if v == 0:
        return ir.seq(ir.optional(ir.literal("-")), text)
    return ir.seq(ir.literal("-"), text) if neg else text


def _places(m: Fraction) -> int:
    """Decimal places of the terminating-decimal multiples of ``m`` (see module docstring)."""
    d = m.denominator
    a = b = 0
    while d % 2 == 0:
        d //= 2
        a += 1
    while d % 5 == 0:
        d //= 5
        b += 1
    return max(a, b)


def _terminating(m: Fraction) -> Fraction:
    """The smallest m' such that the multiples of m that are finite decimals are the multiples of m'."""
    d = m.denominator
    r = d
    while r % 2 == 0:
        r //= 2
    while r % 5 == 0:
        r //= 5
    return m * r


def _exact_dfa(c: NumConj, pointer: str) -> char_dfa.CharDFA:
    """Interval texts x residue automaton, minus the excluded points' spellings."""
    mults = [] if c.mult is None else [_terminating(c.mult)]
    nonmults = [_terminating(n) for n in c.nonmults]
    if c.lo is not None or c.hi is not None:
        base = numbers.number_range(c.lo, c.lo_x, c.hi, c.hi_x)  # exponent-free
    else:
        base = ir.seq(ir.optional(ir.literal("-")), numbers.INT_PART, ir.optional(numbers.FRACTION))
    dfa = char_dfa.from_ir(base)
    if mults or nonmults:
        dfa = char_dfa.intersect(dfa, _residue_dfa(mults, nonmults, pointer))
    for x in c.excluded:
        dfa = char_dfa.difference(dfa, char_dfa.from_ir(point_spellings(x)))
    return dfa


def _residue_dfa(mults: list[Fraction], nonmults: list[Fraction], pointer: str) -> char_dfa.CharDFA:
    """Texts ``-?(0|[1-9][0-9]*)(.[0-9]+)?`` whose value is a multiple of every m and of no n.

    The value times 10^D is an integer K (D: the most decimal places among m and n, padding
    the fraction with zeros); the automaton tracks K mod L (L: the lcm of every m and n times
    10^D) digit by digit. A nonzero digit beyond D places makes the value a multiple of none."""
    D = max(_places(m) for m in mults + nonmults)
    scale = 10**D
    m_mods = [int(m * scale) for m in mults]
    n_mods = [int(n * scale) for n in nonmults]
    L = 1
    for k in m_mods + n_mods:
        L = L * k // gcd(L, k)
    if L > MAX_MODULUS:
        raise UnsupportedFeatureError(f"residues modulo {L} are too many")

    def ok(r: int, f: int) -> bool:
        k = r * 10 ** (D - f) % L
        return all(k % m == 0 for m in m_mods) and all(k % n for n in n_mods)

    # One symbol per digit, then '-' and '.'; everything else is dead.
    bounds = np.array([0, 0x2D, 0x2E, 0x2F, *range(0x30, 0x3B), 0xD800, 0xE000, char_dfa.LIMIT], dtype=np.int64)
    MINUS, DOT, D0 = 1, 2, 4
    ids: dict[tuple, int] = {}
    order: list[tuple] = []

    def sid(key: tuple) -> int:
        if key not in ids:
            ids[key] = len(order)
            order.append(key)
        return ids[key]

    def frac_next(r: int, f: int, d: int) -> tuple:
        if f < D:
            return ("frac", (r * 10 + d) % L, f + 1)
        return ("frac", r, f) if d == 0 else ("over",)

    sid(("start",))
    rows: list[list[int]] = []
    accepting: list[bool] = []
    i = 0
    while i < len(order):
        key = order[i]
        row = [-1] * (len(bounds) - 1)
        kind = key[0]
        acc = False
        if kind in ("start", "minus"):
            if kind == "start":
                row[MINUS] = sid(("minus",))
            row[D0] = sid(("int0",))
            for d in range(1, 10):
                row[D0 + d] = sid(("int", d % L))
        elif kind in ("int", "int0"):
            r = key[1] if kind == "int" else 0
            if kind == "int":
                for d in range(10):
                    row[D0 + d] = sid(("int", (r * 10 + d) % L))
            row[DOT] = sid(("dot", r))
            acc = ok(r, 0)
        elif kind in ("dot", "frac"):
            r, f = key[1], key[2] if kind == "frac" else 0
            for d in range(10):
                row[D0 + d] = sid(frac_next(r, f, d))
            acc = kind == "frac" and ok(r, f)
        else:  # "over"
            for d in range(10):
                row[D0 + d] = sid(("over",))
            acc = not m_mods
        rows.append(row)
        accepting.append(acc)
        i += 1
    table = np.array(rows, dtype=np.int32)
    return char_dfa.from_table(bounds, table, np.array(accepting, dtype=bool))
