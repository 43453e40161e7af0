"""JSON strings as IR: the decoded value is constrained, the encoded text is emitted.

``pattern``, ``format``, ``enum`` and length keywords speak about the *decoded* string, while the
automaton reads JSON text. So a string constraint is first lowered at character level (regex IR,
literals, length repeats) and then :func:`encode_value` rewrites every character into all of its
JSON spellings: raw UTF-8 (except ``"``, ``\\`` and controls), the short escapes, and ``\\uXXXX``
in either hex case, with surrogate pairs for astral characters. One encoded character is one
decoded character, so lengths stay exact.
"""

from __future__ import annotations

import re
from functools import lru_cache

from .. import ir
from ..budget import on_compile_end
from ..errors import UnsupportedFeatureError
from .numbers import digit_class, fixed_width_range

QUOTE = ir.literal('"')
_SHORT_ESCAPES = {0x22: '\\"', 0x5C: "\\\\", 0x2F: "\\/", 0x08: "\\b", 0x0C: "\\f", 0x0A: "\\n", 0x0D: "\\r", 0x09: "\\t"}
_MUST_ESCAPE = ((0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C))


@lru_cache(maxsize=65536)
def _hex4(lo: int, hi: int) -> ir.Expr:
    return fixed_width_range(f"{lo:04x}", f"{hi:04x}", base=16)


def _u_tail(lo: int, hi: int) -> ir.Expr:
    """``uXXXX`` for the code units ``lo..hi``: a ``\\u`` escape after its backslash."""
    return ir.seq(ir.literal("u"), _hex4(lo, hi))


def _astral_tails(lo: int, hi: int) -> list[ir.Expr]:
    """Surrogate-pair spellings of the astral code points ``lo..hi``, after the first backslash."""
    out: list[ir.Expr] = []
    h_lo, h_hi = 0xD800 + ((lo - 0x10000) >> 10), 0xD800 + ((hi - 0x10000) >> 10)
    l_lo, l_hi = 0xDC00 + ((lo - 0x10000) & 0x3FF), 0xDC00 + ((hi - 0x10000) & 0x3FF)

    def pair(h1: int, h2: int, l1: int, l2: int) -> ir.Expr:
        return ir.seq(_u_tail(h1, h2), ir.literal("\\"), _u_tail(l1, l2))

    if h_lo == h_hi:
        return [pair(h_lo, h_lo, l_lo, l_hi)]
    out.append(pair(h_lo, h_lo, l_lo, 0xDFFF))
    if h_lo + 1 <= h_hi - 1:
        out.append(pair(h_lo + 1, h_hi - 1, 0xDC00, 0xDFFF))
    out.append(pair(h_hi, h_hi, 0xDC00, l_hi))
    return out


_PRINTABLE_ASCII = (0x20, 0x7E)
# Printable ASCII that JSON never escapes and never spells as \uXXXX (see encode_char_class):
# text made of these has exactly one spelling, itself.
_ONE_SPELLING = re.compile(rb"[\x20\x21\x23-\x2e\x30-\x5b\x5d-\x7e]*")


@lru_cache(maxsize=8192)
def encode_char_class(ranges: tuple[tuple[int, int], ...]) -> ir.Expr:
    """Every JSON spelling of one character from ``ranges``: the raw character, or a backslash
    and one of its escapes."""
    shorts = tuple(cp for cp in _SHORT_ESCAPES if any(lo <= cp <= hi for lo, hi in ranges))
    # \uXXXX is allowed for every character except printable ASCII: json.dumps never writes
    # `\u0069` for "i" (with or without ensure_ascii), while small models drift into such
    # spellings of keys and values and then waste their token budget on them.
    wide = ir.subtract_ranges(ranges, [_PRINTABLE_ASCII])
    return ir.choice(ir.char_class(ir.subtract_ranges(ranges, _MUST_ESCAPE)), _escaped(shorts, wide))


@lru_cache(maxsize=1024)
def _escaped(shorts: tuple[int, ...], wide: tuple[tuple[int, int], ...]) -> ir.Expr:
    """A backslash and the rest of an escape of one of these characters. One object per set:
    the classes of a key complement's trie (each "any character but the next letters of the
    named keys") share it, so a grammar builds its hundred-odd states of hex digits once."""
    tails: list[ir.Expr] = [ir.literal(_SHORT_ESCAPES[cp][1:]) for cp in shorts]
    for lo, hi in wide:
        if lo <= 0xFFFF:
            tails.append(_u_tail(lo, min(hi, 0xFFFF)))
        if hi >= 0x10000:
            tails.extend(_astral_tails(max(lo, 0x10000), hi))
    return ir.seq(ir.literal("\\"), ir.choice(*tails))


ANY_ENCODED_CHAR = encode_char_class(ir.ANY_CHAR.ranges)


def encode_value(expr: ir.Expr) -> ir.Expr:
    """Rewrite a character-level expression over decoded text into one over JSON string text
    (without the quotes)."""
    if isinstance(expr, (ir.Empty, ir.Nothing)):
        return expr
    if isinstance(expr, ir.CharClass):
        return encode_char_class(expr.ranges)
    if isinstance(expr, ir.Literal):
        if _ONE_SPELLING.fullmatch(expr.data):  # the common case (enum words): spelled as is
            return expr
        text = expr.data.decode("utf-8")
        return ir.seq(*(encode_char_class(((ord(c), ord(c)),)) for c in text))
    if isinstance(expr, ir.Seq):
        return ir.seq(*(encode_value(e) for e in expr.items))
    if isinstance(expr, ir.Choice):
        return ir.choice(*(encode_value(e) for e in expr.items))
    if isinstance(expr, ir.Repeat):
        return ir.repeat(encode_value(expr.item), expr.min, expr.max)
    if isinstance(expr, ir.Graph):
        return ir.Graph(expr.start, expr.finals, tuple((a, encode_value(x), b) for a, x, b in expr.edges))
    raise UnsupportedFeatureError(f"cannot JSON-encode a {type(expr).__name__} inside a string constraint")


# The caches of quoted bodies hold IR that is mostly one schema's own: 256 entries keep the hits
# of a compile, where thousands kept half a million IR objects alive across a MaskBench run for
# the collector to walk (full collections of 0.7 s).
@lru_cache(maxsize=256)
def quoted(value_expr: ir.Expr) -> ir.Expr:
    """A JSON string whose decoded value is in the character-level language ``value_expr``."""
    return ir.seq(QUOTE, _closed(encode_value(value_expr)))


def _closed(body: ir.Expr, depth: int = 0) -> ir.Expr:
    """``body`` followed by the closing quote, the quote moved into the alternatives and the
    last items of sequences. Free text (``ANY*``) then ends with its own quote wherever it
    occurs: repeated all over a grammar, ``ANY* "`` is built once and called, and a state
    inside it cannot return to its caller before the quote, so a mask of its top frames alone
    stays exact (the string-region route) instead of leaking at every character. (The key
    complement ``not_in`` has a free tail at every node of its trie.)"""
    if depth < 200 and isinstance(body, ir.Choice):
        return ir.choice(*(_closed(item, depth + 1) for item in body.items))
    if depth < 200 and isinstance(body, ir.Seq) and body.items:
        return ir.seq(*body.items[:-1], _closed(body.items[-1], depth + 1))
    return ir.seq(body, QUOTE)


@lru_cache(maxsize=65536)
def string_literal(text: str) -> ir.Expr:
    """Every JSON spelling of the string ``text``."""
    return quoted(ir.literal(text))


def any_string(min_len: int = 0, max_len: int | None = None) -> ir.Expr:
    return ir.seq(QUOTE, ir.repeat(ANY_ENCODED_CHAR, min_len, max_len), QUOTE)


@lru_cache(maxsize=256)
def not_in(words: frozenset[str]) -> ir.Expr:
    """Character-level language of all strings except ``words`` (a trie complement)."""
    if not words:
        return ir.star(ir.ANY_CHAR)
    parts: list[ir.Expr] = [] if "" in words else [ir.EMPTY]
    firsts = sorted({w[0] for w in words if w})
    others = ir.char_class([(ord(c), ord(c)) for c in firsts], negate=True)
    parts.append(ir.seq(others, ir.star(ir.ANY_CHAR)))
    for c in firsts:
        parts.append(ir.seq(ir.literal(c), not_in(frozenset(w[1:] for w in words if w and w[0] == c))))
    return ir.choice(*parts)


@lru_cache(maxsize=256)
def quoted_not_in(words: frozenset[str]) -> ir.Expr:
    """``quoted(not_in(words))``, built in one pass over the trie: the key beside the named keys
    of every object that allows extra keys, where encoding the complement and then moving its
    closing quote in were two more passes over it."""
    return ir.seq(QUOTE, _closed_complement(words, 0))


# The key-set caches are emptied when each compile ends. A key set's IR grows with its names
# (hundreds of objects for a common object, thousands for a large one): 256 key sets kept
# across compiles were 87,000 of the 104,000 objects the garbage collector tracked after 150
# MaskBench schemas, and its full collections, 21 ms each, landed inside masks. Within a compile
# (where the hits are: one object reached from several places) they work as before.
on_compile_end(not_in.cache_clear)
on_compile_end(quoted_not_in.cache_clear)


_FREE_TEXT = ir.star(ANY_ENCODED_CHAR)


def _closed_complement(words: frozenset[str], depth: int) -> ir.Expr:
    """``_closed(encode_value(not_in(words)), depth)``, node by node of the trie."""
    if depth >= 190:  # near _closed's depth limit: its own way, exactly
        return _closed(encode_value(not_in(words)), depth)
    if not words:
        return ir.seq(_FREE_TEXT, QUOTE)
    firsts = tuple(sorted({w[0] for w in words if w}))
    parts: list[ir.Expr] = [] if "" in words else [QUOTE]
    # A new node per trie node, as the three passes made: the NFA builder shares a subexpression
    # by how often it occurs, so one node object under many parents would change what it shares.
    parts.append(ir.seq(_other_char(firsts), _FREE_TEXT, QUOTE))
    for c in firsts:
        rest = frozenset(w[1:] for w in words if w and w[0] == c)
        parts.append(ir.seq(_encoded_char(c), _closed_complement(rest, depth + 2)))
    return ir.choice(*parts)


@lru_cache(maxsize=4096)
def _other_char(firsts: tuple[str, ...]) -> ir.Expr:
    """Any character but ``firsts``, encoded."""
    return encode_char_class(ir.char_class([(ord(c), ord(c)) for c in firsts], negate=True).ranges)


@lru_cache(maxsize=4096)
def _encoded_char(c: str) -> ir.Expr:
    return encode_value(ir.literal(c))


# ---------------------------------------------------------------- lengths


def length_bounds(expr: ir.Expr) -> tuple[int, int | None]:
    """Minimum and maximum number of characters of a character-level expression."""
    if isinstance(expr, ir.Empty):
        return 0, 0
    if isinstance(expr, ir.Nothing):
        return 0, 0
    if isinstance(expr, ir.CharClass):
        return 1, 1
    if isinstance(expr, ir.Literal):
        n = len(expr.data.decode("utf-8"))
        return n, n
    if isinstance(expr, ir.Seq):
        lo, hi = 0, 0
        for e in expr.items:
            a, b = length_bounds(e)
            lo += a
            hi = None if hi is None or b is None else hi + b
        return lo, hi
    if isinstance(expr, ir.Choice):
        bounds = [length_bounds(e) for e in expr.items]
        his = [b for _, b in bounds]
        return min(a for a, _ in bounds), None if None in his else max(his)  # type: ignore[type-var]
    if isinstance(expr, ir.Repeat):
        a, b = length_bounds(expr.item)
        return a * expr.min, None if expr.max is None or b is None else b * expr.max
    if isinstance(expr, ir.Graph):
        return _graph_length_bounds(expr)
    raise UnsupportedFeatureError(f"cannot measure the length of a {type(expr).__name__}")


def _graph_length_bounds(g: ir.Graph) -> tuple[int, int | None]:
    """Shortest and longest path (in characters) from start to a final state; None if a cycle
    on some accepting path makes lengths unbounded."""
    spans = {(a, b): length_bounds(x) for a, x, b in g.edges}
    out: dict[int, list[tuple[int, int, int | None]]] = {}
    for (a, b), (lo, hi) in spans.items():
        out.setdefault(a, []).append((b, lo, hi))
    shortest = {g.start: 0}
    changed = True
    while changed:  # Bellman-Ford on non-negative weights: at most |nodes| rounds
        changed = False
        for a, edges in out.items():
            if a in shortest:
                for b, lo, _ in edges:
                    if shortest[a] + lo < shortest.get(b, 1 << 62):
                        shortest[b] = shortest[a] + lo
                        changed = True
    finals = [f for f in g.finals if f in shortest]
    if not finals:
        return 0, 0
    # Longest path by an iterative depth-first search (graphs can have thousands of states):
    # unbounded when a cycle or an unbounded edge lies on a path to a final state.
    longest: dict[int, int | None] = {}  # -1: no final reachable
    on_path: set[int] = set()
    stack: list[tuple[int, int]] = [(g.start, 0)]
    low = min(shortest[f] for f in finals)
    while stack:
        a, i = stack.pop()
        edges = out.get(a, [])
        if i == 0:
            on_path.add(a)
        if i < len(edges):
            stack.append((a, i + 1))
            b = edges[i][0]
            if b in on_path:
                return low, None
            if b not in longest:
                stack.append((b, 0))
            continue
        best: int | None = 0 if a in g.finals else -1
        for b, _, hi in edges:
            rest = longest[b]
            if rest is not None and rest < 0:
                continue
            if rest is None or hi is None:
                return low, None
            best = max(best, hi + rest)  # type: ignore[type-var]
        longest[a] = best
        on_path.discard(a)
    return low, longest[g.start]


def restrict_length(expr: ir.Expr, lo: int, hi: int | None, keyword: str) -> ir.Expr:
    """``expr`` intersected with "between lo and hi characters", for the shapes where that is
    exact without an automaton product: the bound is redundant, or one variable-length repeat of a
    fixed-width item carries all the slack. Otherwise UnsupportedFeatureError naming ``keyword``."""
    a, b = length_bounds(expr)
    if a >= lo and (hi is None or (b is not None and b <= hi)):
        return expr
    if hi is not None and a > hi or (b is not None and b < lo):
        return ir.NOTHING
    if isinstance(expr, ir.Choice):
        return ir.choice(*(restrict_length(e, lo, hi, keyword) for e in expr.items))
    if isinstance(expr, ir.Repeat):
        w_lo, w_hi = length_bounds(expr.item)
        if w_lo == w_hi and w_lo > 0:
            k_lo = max(expr.min, -(-lo // w_lo))
            k_hi = hi // w_lo if hi is not None else None
            if expr.max is not None:
                k_hi = expr.max if k_hi is None else min(k_hi, expr.max)
            if k_hi is not None and k_lo > k_hi:
                return ir.NOTHING
            return ir.repeat(expr.item, k_lo, k_hi)
    if isinstance(expr, ir.Seq):
        spans = [length_bounds(e) for e in expr.items]
        variable = [i for i, (x, y) in enumerate(spans) if x != y]
        if len(variable) == 1:
            i = variable[0]
            fixed = sum(x for j, (x, _) in enumerate(spans) if j != i)
            inner = restrict_length(expr.items[i], max(lo - fixed, 0), None if hi is None else hi - fixed, keyword)
            return ir.seq(*expr.items[:i], inner, *expr.items[i + 1 :])
    raise UnsupportedFeatureError(f"{keyword} combined with this pattern/format is not enforced exactly")


HEX_DIGIT = digit_class(0, 15, 16)
