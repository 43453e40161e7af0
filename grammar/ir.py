"""The grammar IR every front end lowers to: rules of expressions over bytes and characters.

Regex, JSON Schema and EBNF all produce a :class:`Grammar`; ``fsm.py`` turns it into a byte-level
automaton. Characters (:class:`CharClass`) stay Unicode code points here so front ends can count
characters (``maxLength``) and rewrite them (JSON string escaping); ``fsm.py`` encodes them as UTF-8.
Constructors (``seq``, ``choice``, ``repeat``...) simplify as they build, so trivially empty or
impossible pieces never reach the automaton.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Union

from .errors import GrammarError

MAX_UNICODE = 0x10FFFF
SURROGATES = (0xD800, 0xDFFF)


@dataclass(frozen=True)
class Empty:
    """Matches the empty string."""


@dataclass(frozen=True)
class Nothing:
    """Matches no string at all (the empty language)."""


@dataclass(frozen=True)
class Literal:
    """Matches exactly these bytes."""

    data: bytes


@dataclass(frozen=True)
class ByteClass:
    """Matches one byte in any of the inclusive ``ranges`` (sorted, disjoint, within 0..255)."""

    ranges: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class CharClass:
    """Matches one Unicode scalar value in the inclusive code point ``ranges`` (sorted, disjoint,
    surrogates excluded), encoded as UTF-8."""

    ranges: tuple[tuple[int, int], ...]


class _CachedHash:
    """Composite nodes hash their whole subtree; front ends build DAGs with heavy sharing, so the
    hash is computed once per node instead of once per lookup."""

    __slots__ = ()

    def __hash__(self) -> int:
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((type(self).__name__,) + tuple(getattr(self, f) for f in self.__dataclass_fields__))
            object.__setattr__(self, "_hash", h)
        return h

    def __getstate__(self) -> dict:
        # String hashes differ between processes: never carry a cached one across pickling.
        state = dict(self.__dict__)
        state.pop("_hash", None)
        return state


@dataclass(frozen=True, eq=True)
class Seq(_CachedHash):
    items: tuple["Expr", ...]
    __hash__ = _CachedHash.__hash__


@dataclass(frozen=True, eq=True)
class Choice(_CachedHash):
    items: tuple["Expr", ...]
    __hash__ = _CachedHash.__hash__


@dataclass(frozen=True, eq=True)
class Repeat(_CachedHash):
    """``item`` repeated ``min`` to ``max`` times (``max=None``: unbounded)."""

    item: "Expr"
    min: int
    max: int | None
    __hash__ = _CachedHash.__hash__


@dataclass(frozen=True, eq=True)
class Graph(_CachedHash):
    """A finite automaton whose edges are expressions: matches the concatenation of the edge
    expressions along any path from ``start`` to a state in ``finals`` (states are ints). Boolean
    operations on regular languages (``char_dfa``) hand their result over in this form, which
    stays linear in the automaton's size where a regular expression could be exponential."""

    start: int
    finals: frozenset[int]
    edges: tuple[tuple[int, "Expr", int], ...]  # (from, expr, to)
    __hash__ = _CachedHash.__hash__


@dataclass(frozen=True)
class Ref:
    """A reference to the rule ``name`` of the enclosing :class:`Grammar` (recursion allowed,
    left recursion refused)."""

    name: str


Expr = Union[Empty, Nothing, Literal, ByteClass, CharClass, Seq, Choice, Repeat, Graph, Ref]

EMPTY = Empty()
NOTHING = Nothing()


@dataclass
class Grammar:
    """Named rules; ``root`` is where matching starts. Rule order is irrelevant."""

    rules: dict[str, Expr]
    root: str = "root"
    # Free-form provenance (front end, options) for error messages and cache keys.
    source_kind: str = field(default="ir")
    # A constraint on the text beyond the language, enforced by the matcher (text_check.TextCheck).
    check: object | None = None

    def validate(self) -> None:
        """Raise GrammarError for an undefined root or an undefined referenced rule."""
        if self.root not in self.rules:
            raise GrammarError(f"root rule {self.root!r} is not defined")
        for name, expr in self.rules.items():
            for ref in iter_refs(expr):
                if ref not in self.rules:
                    raise GrammarError(f"rule {name!r} references undefined rule {ref!r}")


def iter_refs(expr: Expr) -> Iterable[str]:
    """Names of the rules ``expr`` references directly (shared subtrees are visited once)."""
    stack = [expr]
    seen: set[int] = set()
    while stack:
        e = stack.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, Ref):
            yield e.name
        elif isinstance(e, (Seq, Choice)):
            stack.extend(e.items)
        elif isinstance(e, Repeat):
            stack.append(e.item)
        elif isinstance(e, Graph):
            stack.extend(x for _, x, _ in e.edges)


def is_small(expr: Expr, budget: int = 24) -> bool:
    """Whether ``expr`` has at most ``budget`` nodes and no graph: small enough to inline at each
    use rather than share as a rule."""
    stack, seen = [expr], 0
    while stack:
        e = stack.pop()
        seen += 1
        if seen > budget:
            return False
        if isinstance(e, (Seq, Choice)):
            stack.extend(e.items)
        elif isinstance(e, Repeat):
            stack.append(e.item)
        elif isinstance(e, Graph):
            return False
    return True


# ---------------------------------------------------------------- simplifying constructors


def literal(text: str | bytes) -> Expr:
    data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
    return Literal(data) if data else EMPTY


def seq(*items: Expr) -> Expr:
    out: list[Expr] = []
    for item in items:
        if isinstance(item, Nothing):
            return NOTHING
        if isinstance(item, Empty):
            continue
        if isinstance(item, Seq):
            out.extend(item.items)
        elif isinstance(item, Literal) and out and isinstance(out[-1], Literal):
            out[-1] = Literal(out[-1].data + item.data)
        else:
            out.append(item)
    if not out:
        return EMPTY
    return out[0] if len(out) == 1 else Seq(tuple(out))


def choice(*items: Expr) -> Expr:
    out: list[Expr] = []
    seen: set[Expr] = set()
    for item in items:
        parts = item.items if isinstance(item, Choice) else (item,)
        for part in parts:
            if isinstance(part, Nothing) or part in seen:
                continue
            seen.add(part)
            out.append(part)
    if not out:
        return NOTHING
    return out[0] if len(out) == 1 else Choice(tuple(out))


def repeat(item: Expr, min_count: int, max_count: int | None) -> Expr:
    if min_count < 0 or (max_count is not None and max_count < min_count):
        raise GrammarError(f"invalid repetition bounds {{{min_count},{max_count}}}")
    if max_count == 0 or isinstance(item, Empty):
        return EMPTY
    if isinstance(item, Nothing):
        return EMPTY if min_count == 0 else NOTHING
    if min_count == 1 and max_count == 1:
        return item
    return Repeat(item, min_count, max_count)


def optional(item: Expr) -> Expr:
    return repeat(item, 0, 1)


def star(item: Expr) -> Expr:
    return repeat(item, 0, None)


def plus(item: Expr) -> Expr:
    return repeat(item, 1, None)


def normalize_ranges(ranges: Iterable[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """Sort and merge inclusive integer ranges."""
    merged: list[list[int]] = []
    for lo, hi in sorted((int(a), int(b)) for a, b in ranges if a <= b):
        if merged and lo <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    return tuple((lo, hi) for lo, hi in merged)


def subtract_ranges(
    ranges: Iterable[tuple[int, int]], removed: Iterable[tuple[int, int]]
) -> tuple[tuple[int, int], ...]:
    """``ranges`` minus ``removed`` (both inclusive)."""
    out: list[tuple[int, int]] = []
    cuts = normalize_ranges(removed)
    for lo, hi in normalize_ranges(ranges):
        cur = lo
        for clo, chi in cuts:
            if chi < cur or clo > hi:
                continue
            if clo > cur:
                out.append((cur, clo - 1))
            cur = max(cur, chi + 1)
        if cur <= hi:
            out.append((cur, hi))
    return tuple(out)


def invert_ranges(ranges: Iterable[tuple[int, int]], universe_max: int = MAX_UNICODE) -> tuple[tuple[int, int], ...]:
    """The complement of ``ranges`` within ``0..universe_max``."""
    return subtract_ranges([(0, universe_max)], ranges)


def char_class(ranges: Iterable[tuple[int, int]], negate: bool = False) -> Expr:
    """One character from ``ranges`` (or, with ``negate``, from outside them); surrogates never match."""
    rs = normalize_ranges(ranges)
    if negate:
        rs = invert_ranges(rs)
    rs = subtract_ranges(rs, [SURROGATES])
    return CharClass(rs) if rs else NOTHING


def chars(text: str) -> Expr:
    """A literal string written as characters (UTF-8)."""
    return literal(text)


def byte_class(ranges: Iterable[tuple[int, int]], negate: bool = False) -> Expr:
    rs = normalize_ranges(ranges)
    if negate:
        rs = invert_ranges(rs, 255)
    return ByteClass(rs) if rs else NOTHING


ANY_CHAR = CharClass(subtract_ranges([(0, MAX_UNICODE)], [SURROGATES]))
