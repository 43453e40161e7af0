"""``format: regex`` as IR: a subset of regular expressions valid in ECMA-262 and in Python's ``re``.

Regular-expression syntax is context-free (groups nest); with groups nested at most
``MAX_DEPTH`` deep it is regular, and written here directly as IR. The subset keeps what both
dialects read the same way and what schema authors write: literals, ``.``, the escapes
``\\d \\w \\s`` (and capitals) and escaped metacharacters, classes with ordered ranges of digits or
same-case letters, non-capturing and capturing groups, alternation, anchors, and the quantifiers
``* + ?``, ``{n}``, ``{n,}``, ``{n,m}`` (one digit each, n <= m), each optionally lazy. It leaves
out what the dialects disagree on or what cannot be checked without counting (backreferences,
lookaround, named groups, ``{`` as a literal, longer bounds).
"""

from __future__ import annotations

from functools import lru_cache

from .. import ir

MAX_DEPTH = 3
_META = "\\^$.|?*+()[]{}"
_ESCAPABLE = "\\^$.|?*+()[]{}/-"


def _lit(text: str) -> ir.Expr:
    return ir.literal(text)


def _chars_except(excluded: str) -> ir.Expr:
    return ir.char_class([(ord(c), ord(c)) for c in excluded] + [(0, 0x1F)], negate=True)


def _escape() -> ir.Expr:
    return ir.seq(_lit("\\"), ir.char_class([(ord(c), ord(c)) for c in _ESCAPABLE + "dDwWsSntrfv"]))


def _ranges() -> ir.Expr:
    alts = []
    for lo_c, hi_c in (("0", "9"), ("a", "z"), ("A", "Z")):
        for a in range(ord(lo_c), ord(hi_c) + 1):
            alts.append(ir.seq(_lit(chr(a) + "-"), ir.char_class([(a, ord(hi_c))])))
    return ir.choice(*alts)


def _class() -> ir.Expr:
    plain = _chars_except("\\]^-[")
    item = ir.choice(_ranges(), plain, _escape())
    return ir.seq(_lit("["), ir.optional(_lit("^")), ir.plus(item), _lit("]"))


def _quantifier() -> ir.Expr:
    digit = ir.char_class([(0x30, 0x39)])
    bounded = ir.choice(*(ir.seq(_lit(f"{{{n},"), ir.char_class([(0x30 + n, 0x39)]), _lit("}")) for n in range(10)))
    core = ir.choice(ir.char_class([(0x2A, 0x2B), (0x3F, 0x3F)]), ir.seq(_lit("{"), digit, _lit("}")),
                     ir.seq(_lit("{"), digit, _lit(",}")), bounded)
    return ir.seq(core, ir.optional(_lit("?")))


@lru_cache(maxsize=1)
def regex_format() -> ir.Expr:
    anchor = ir.char_class([(0x24, 0x24), (0x5E, 0x5E)])
    simple = ir.choice(_chars_except(_META), _lit("."), _escape(), _class())
    alternation: ir.Expr = ir.NOTHING
    for _ in range(MAX_DEPTH + 1):
        atom = simple if isinstance(alternation, ir.Nothing) else ir.choice(
            simple, ir.seq(_lit("("), ir.optional(_lit("?:")), alternation, _lit(")")))
        piece = ir.choice(ir.seq(atom, ir.optional(_quantifier())), anchor)
        branch = ir.star(piece)
        alternation = ir.seq(branch, ir.star(ir.seq(_lit("|"), branch)))
    return alternation
