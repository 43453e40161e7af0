"""JSON numbers as IR: the exact JSON number grammar, integer ranges and decimal ranges.

Ranges compile to exact digit automata: an integer interval becomes, per digit count, the usual
"prefix then free digits" decomposition; a decimal interval splits into integer parts that are
fully inside the interval (any fraction) and at most two boundary integer parts whose fraction is
constrained digit by digit (``_frac_digits``). Bounded non-integer numbers never use exponents:
``1e2`` is a valid JSON spelling of 100, but an exponent makes the value's magnitude depend on a
later digit, which an exact range automaton cannot afford cheaply. That restricts the output
language (fine for generation) and makes such rare valid instances rejected; documented trade-off.
"""

from __future__ import annotations

from fractions import Fraction
from functools import lru_cache

from .. import ir
from ..errors import UnsupportedFeatureError

DIGIT = ir.char_class([(0x30, 0x39)])
NONZERO = ir.char_class([(0x31, 0x39)])
INT_PART = ir.choice(ir.literal("0"), ir.seq(NONZERO, ir.star(DIGIT)))
FRACTION = ir.seq(ir.literal("."), ir.plus(DIGIT))
EXPONENT = ir.seq(ir.char_class([(0x45, 0x45), (0x65, 0x65)]), ir.optional(ir.char_class([(0x2B, 0x2B), (0x2D, 0x2D)])), ir.plus(DIGIT))
JSON_NUMBER = ir.seq(ir.optional(ir.literal("-")), INT_PART, ir.optional(FRACTION), ir.optional(EXPONENT))
JSON_INTEGER = ir.seq(ir.optional(ir.literal("-")), INT_PART)
# Enumerating multiples is exact; beyond this many we refuse rather than build a huge choice.
MAX_ENUMERATED_MULTIPLES = 1000


@lru_cache(maxsize=4096)
def digit_class(lo: int, hi: int, base: int = 10) -> ir.Expr:
    """One digit with value in ``lo..hi``; base 16 accepts both letter cases."""
    ranges: list[tuple[int, int]] = []
    if lo <= min(hi, 9):
        ranges.append((0x30 + lo, 0x30 + min(hi, 9)))
    if base == 16 and hi >= 10:
        a, b = max(lo, 10) - 10, hi - 10
        ranges += [(0x61 + a, 0x61 + b), (0x41 + a, 0x41 + b)]
    return ir.char_class(ranges)


@lru_cache(maxsize=65536)
def fixed_width_range(lo: str, hi: str, base: int = 10) -> ir.Expr:
    """Digit strings of exactly ``len(lo) == len(hi)`` digits between ``lo`` and ``hi`` (inclusive)."""
    assert len(lo) == len(hi)
    if not lo:
        return ir.EMPTY
    a, b = int(lo[0], base), int(hi[0], base)
    if a == b:
        return ir.seq(digit_class(a, a, base), fixed_width_range(lo[1:], hi[1:], base))
    n = len(lo) - 1
    top = "fF"[0] if base == 16 else "9"
    rest_min, rest_max = "0" * n, top * n
    parts: list[ir.Expr] = []
    start, end = a, b
    if lo[1:] != rest_min:
        parts.append(ir.seq(digit_class(a, a, base), fixed_width_range(lo[1:], rest_max, base)))
        start = a + 1
    tail: ir.Expr = ir.NOTHING
    if hi[1:].lower() != rest_max.lower():
        tail = ir.seq(digit_class(b, b, base), fixed_width_range(rest_min, hi[1:], base))
        end = b - 1
    if start <= end:
        parts.append(ir.seq(digit_class(start, end, base), ir.repeat(digit_class(0, base - 1, base), n, n)))
    parts.append(tail)
    return ir.choice(*parts)


def nonneg_int_range(lo: int, hi: int | None) -> ir.Expr:
    """Canonical decimal spellings (no leading zeros) of the integers in ``[lo, hi]``."""
    lo = max(lo, 0)
    if hi is not None and lo > hi:
        return ir.NOTHING
    parts: list[ir.Expr] = []
    if lo == 0:
        parts.append(ir.literal("0"))
        lo = 1
        if hi is not None and hi < 1:
            return ir.choice(*parts)
    len_lo = len(str(lo))
    len_hi = len(str(hi)) if hi is not None else len_lo
    for width in range(len_lo, len_hi + 1):
        a = max(lo, 10 ** (width - 1))
        b = min(hi, 10**width - 1) if hi is not None else 10**width - 1
        if a <= b:
            parts.append(fixed_width_range(str(a), str(b)))
    if hi is None:
        parts.append(ir.seq(NONZERO, ir.repeat(DIGIT, len_lo, None)))
    return ir.choice(*parts)


def int_range(lo: int | None, hi: int | None) -> ir.Expr:
    """JSON integer texts (``-0`` included when 0 is in range) with value in ``[lo, hi]``."""
    if lo is not None and hi is not None and lo > hi:
        return ir.NOTHING
    parts: list[ir.Expr] = []
    if hi is None or hi >= 0:
        parts.append(nonneg_int_range(max(lo or 0, 0), hi))
    if lo is None or lo < 0:
        mag_lo = 1 if hi is None or hi >= 0 else -hi
        mag_hi = None if lo is None else -lo
        parts.append(ir.seq(ir.literal("-"), nonneg_int_range(mag_lo, mag_hi)))
    if (lo is None or lo <= 0) and (hi is None or hi >= 0):
        parts.append(ir.literal("-0"))
    return ir.choice(*parts)


def integer_bounds(lo: Fraction | None, lo_excl: bool, hi: Fraction | None, hi_excl: bool) -> tuple[int | None, int | None]:
    """The integer interval equivalent to a (possibly fractional, possibly exclusive) interval."""
    ilo = ihi = None
    if lo is not None:
        ilo = (int(lo // 1) + 1) if (lo_excl or lo.denominator != 1) else int(lo)
    if hi is not None:
        ihi = (-int((-hi) // 1) - 1) if (hi_excl or hi.denominator != 1) else int(hi)
    return ilo, ihi


# ---------------------------------------------------------------- decimals


def _frac_nonempty(lo: Fraction | None, lo_excl: bool, hi: Fraction | None, hi_excl: bool) -> bool:
    """Whether some r in [0, 1) satisfies the bounds."""
    if lo is not None and lo >= 1:
        return False
    if hi is not None and (hi < 0 or (hi == 0 and hi_excl)):
        return False
    if lo is not None and hi is not None and (hi < lo or (hi == lo and (lo_excl or hi_excl))):
        return False
    return True


def _zero_ok(lo: Fraction | None, lo_excl: bool, hi: Fraction | None, hi_excl: bool) -> bool:
    lower = lo is None or lo < 0 or (lo == 0 and not lo_excl)
    upper = hi is None or hi > 0 or (hi == 0 and not hi_excl)
    return lower and upper


@lru_cache(maxsize=4096)
def _frac_digits(lo: Fraction | None, lo_excl: bool, hi: Fraction | None, hi_excl: bool, budget: int | None) -> ir.Expr:
    """Digit strings t (possibly empty) with 0.t in the bounds; at most ``budget`` significant
    digits (later ones must be 0) when ``budget`` is not None."""
    if not _frac_nonempty(lo, lo_excl, hi, hi_excl):
        return ir.NOTHING
    free_lo = lo is None or lo < 0 or (lo == 0 and not lo_excl)
    free_hi = hi is None or hi >= 1
    if free_lo and free_hi:
        if budget is None:
            return ir.star(DIGIT)
        return ir.seq(ir.repeat(DIGIT, 0, budget), ir.star(ir.literal("0")))
    if budget == 0 or (hi == 0 and not hi_excl):  # no digit left, or 0.t <= 0: zeros only
        return ir.star(ir.literal("0")) if _zero_ok(lo, lo_excl, hi, hi_excl) else ir.NOTHING
    if budget is None and (lo is None or lo.denominator == 1) and (hi is None or hi.denominator == 1):
        # Integer bounds that are not free: lo == 0 exclusive (some nonzero digit) and/or hi == 0.
        if not free_hi:  # hi == 0 inclusive: only zeros, and lo must allow 0
            return ir.star(ir.literal("0")) if free_lo else ir.NOTHING
        return ir.seq(ir.star(ir.literal("0")), NONZERO, ir.star(DIGIT))
    parts: list[ir.Expr] = [ir.EMPTY] if _zero_ok(lo, lo_excl, hi, hi_excl) else []
    nxt = None if budget is None else budget - 1
    for d in range(10):
        sub_lo = None if lo is None else lo * 10 - d
        sub_hi = None if hi is None else hi * 10 - d
        rest = _frac_digits(sub_lo, lo_excl, sub_hi, hi_excl, nxt)
        if not isinstance(rest, ir.Nothing):
            parts.append(ir.seq(digit_class(d, d), rest))
    return ir.choice(*parts)


def _fraction_part(lo, lo_excl, hi, hi_excl, budget) -> ir.Expr:
    """``(\\.digits)?`` with the fraction value in the bounds."""
    digits = _frac_digits(lo, lo_excl, hi, hi_excl, budget)
    if isinstance(digits, ir.Nothing):
        return ir.NOTHING
    nonempty = ir.seq(ir.literal("."), _strip_empty(digits))
    return ir.choice(ir.EMPTY, nonempty) if _zero_ok(lo, lo_excl, hi, hi_excl) else nonempty


def _strip_empty(expr: ir.Expr) -> ir.Expr:
    """``expr`` minus the empty string, for the shapes ``_frac_digits`` builds."""
    if isinstance(expr, ir.Empty):
        return ir.NOTHING
    if isinstance(expr, ir.Choice):
        return ir.choice(*(_strip_empty(e) for e in expr.items))
    if isinstance(expr, ir.Repeat) and expr.min == 0:
        return ir.seq(expr.item, ir.repeat(expr.item, 0, None if expr.max is None else expr.max - 1))
    if isinstance(expr, ir.Seq) and all(_nullable(e) for e in expr.items):
        head, rest = expr.items[0], expr.items[1:]
        return ir.choice(ir.seq(_strip_empty(head), *rest), ir.seq(_strip_empty(ir.seq(*rest))))
    return expr


def _nullable(expr: ir.Expr) -> bool:
    if isinstance(expr, ir.Empty):
        return True
    if isinstance(expr, ir.Repeat):
        return expr.min == 0 or _nullable(expr.item)
    if isinstance(expr, ir.Seq):
        return all(_nullable(e) for e in expr.items)
    if isinstance(expr, ir.Choice):
        return any(_nullable(e) for e in expr.items)
    return False


def _magnitude_range(lo: Fraction, lo_excl: bool, hi: Fraction | None, hi_excl: bool, budget: int | None) -> ir.Expr:
    """Unsigned JSON number texts (no exponent) with value in the bounds; ``lo >= 0``."""
    full_lo = int(lo // 1) + 1 if (lo_excl or lo.denominator != 1) else int(lo)
    # I + f < I + 1 <= hi for every fraction f: the integer parts whose whole unit interval fits.
    full_hi = None if hi is None else int(hi // 1) - 1
    any_frac = _fraction_part(None, False, None, False, budget)
    parts: list[ir.Expr] = []
    if full_hi is None or full_lo <= full_hi:
        parts.append(ir.seq(nonneg_int_range(full_lo, full_hi), any_frac))
    partial = {int(lo // 1)} if int(lo // 1) < full_lo else set()
    if hi is not None:
        partial.add(int(hi // 1))
    for whole in sorted(partial):
        frac = _fraction_part(lo - whole, lo_excl, None if hi is None else hi - whole, hi_excl, budget)
        parts.append(ir.seq(ir.literal(str(whole)), frac))
    return ir.choice(*parts)


def number_range(
    lo: Fraction | None, lo_excl: bool, hi: Fraction | None, hi_excl: bool, *, max_fraction_digits: int | None = None
) -> ir.Expr:
    """JSON number texts (no exponent) with value in the interval; ``max_fraction_digits``
    limits significant fraction digits (``multipleOf: 0.01`` -> 2)."""
    parts: list[ir.Expr] = []
    budget = max_fraction_digits
    if hi is None or hi > 0 or (hi == 0 and not hi_excl):
        if lo is None or lo < 0:
            parts.append(_magnitude_range(Fraction(0), False, hi, hi_excl, budget))
        else:
            parts.append(_magnitude_range(lo, lo_excl, hi, hi_excl, budget))
    if lo is None or lo < 0 or (lo == 0 and not lo_excl):
        if hi is None or hi >= 0:
            m_lo, m_lo_excl = Fraction(0), False
        else:
            m_lo, m_lo_excl = -hi, hi_excl
        m_hi = None if lo is None else -lo
        parts.append(ir.seq(ir.literal("-"), _magnitude_range(m_lo, m_lo_excl, m_hi, lo_excl, budget)))
    return ir.choice(*parts)


# ---------------------------------------------------------------- multipleOf


def integer_multiples(k: int, lo: int | None, hi: int | None, pointer: str) -> ir.Expr:
    """Integers that are multiples of ``k`` in ``[lo, hi]``: enumerated when the range is small,
    a suffix automaton when ``k`` divides a power of ten and the range is one-sided at 0."""
    if lo is not None and hi is not None:
        first = -((-lo) // k) * k
        count = 0 if first > hi else (hi - first) // k + 1
        if count <= MAX_ENUMERATED_MULTIPLES:
            return ir.choice(*(ir.literal(str(v)) for v in range(first, hi + 1, k)), *( [ir.literal("-0")] if lo <= 0 <= hi else []))
    power = next((m for m in range(1, 4) if 10**m % k == 0), None)
    if power is None or hi is not None or (lo is not None and lo > k):
        raise UnsupportedFeatureError(f"multipleOf {k} combined with this range is not enforced exactly at {pointer or '/'}")
    mod = 10**power
    small = [ir.literal(str(v)) for v in range(0, mod, k)]
    suffixes = [ir.literal(str(v).zfill(power)) for v in range(0, mod, k)]
    big = ir.seq(NONZERO, ir.repeat(DIGIT, 0, None), ir.choice(*suffixes))
    nonneg = ir.choice(*small, big)
    if lo is not None and lo > 0:  # 0 < lo <= k: the positive multiples
        nonneg = ir.choice(*small[1:], big)
    if lo is None:
        return ir.choice(nonneg, ir.seq(ir.literal("-"), nonneg))
    return nonneg


def decimal_places(step: Fraction) -> int | None:
    """``m`` when ``step == 10**-m`` (m >= 1), else None."""
    if step.numerator != 1:
        return None
    m, d = 0, step.denominator
    while d % 10 == 0:
        d //= 10
        m += 1
    return m if d == 1 and m >= 1 else None
