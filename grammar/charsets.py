"""Character sets shared by the regex front end (and anyone who needs them): the ``\\d \\w \\s``
classes of Python ``re.ASCII`` and ECMA-262, ECMA line terminators, ASCII case folding, and
Unicode General_Category ranges for ECMA ``\\p{...}`` escapes. All ranges are inclusive code points.
"""

from __future__ import annotations

import functools
import unicodedata

from . import ir

__all__ = [
    "Ranges", "DIGIT", "WORD", "PY_SPACE", "ECMA_WHITESPACE", "ECMA_LINE_TERMINATORS", "PY_CLASSES",
    "ECMA_CLASSES", "ascii_fold", "unicode_property", "general_categories",
]

Ranges = tuple[tuple[int, int], ...]
DIGIT: Ranges = ((0x30, 0x39),)
WORD: Ranges = ((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A))
ECMA_WHITESPACE: Ranges = (
    (0x09, 0x0D), (0x20, 0x20), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A),
    (0x2028, 0x2029), (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000), (0xFEFF, 0xFEFF),
)  # WhiteSpace + LineTerminator of ECMA-262 (Zs of Unicode 15)
PY_SPACE: Ranges = ((0x09, 0x0D), (0x20, 0x20))  # [ \\t\\n\\r\\f\\v]
ECMA_LINE_TERMINATORS: Ranges = ((0x0A, 0x0A), (0x0D, 0x0D), (0x2028, 0x2029))
PY_CLASSES: dict[str, Ranges] = {"d": DIGIT, "w": WORD, "s": PY_SPACE}
ECMA_CLASSES: dict[str, Ranges] = {"d": DIGIT, "w": WORD, "s": ECMA_WHITESPACE}


def ascii_fold(ranges: Ranges) -> Ranges:
    """Close ``ranges`` under ASCII case folding (what ``re.IGNORECASE | re.ASCII`` does)."""
    out = list(ranges)
    for lo, hi in ranges:
        for base, other in ((0x61, 0x41), (0x41, 0x61)):
            a, b = max(lo, base), min(hi, base + 25)
            if a <= b:
                out.append((a - base + other, b - base + other))
    return ir.normalize_ranges(out)


_GC_NAMES = {
    "Letter": "L", "Cased_Letter": "LC", "Uppercase_Letter": "Lu", "Lowercase_Letter": "Ll",
    "Titlecase_Letter": "Lt", "Modifier_Letter": "Lm", "Other_Letter": "Lo", "Mark": "M",
    "Combining_Mark": "M", "Nonspacing_Mark": "Mn", "Spacing_Mark": "Mc", "Enclosing_Mark": "Me",
    "Number": "N", "Decimal_Number": "Nd", "digit": "Nd", "Letter_Number": "Nl", "Other_Number": "No",
    "Punctuation": "P", "punct": "P", "Connector_Punctuation": "Pc", "Dash_Punctuation": "Pd",
    "Open_Punctuation": "Ps", "Close_Punctuation": "Pe", "Initial_Punctuation": "Pi",
    "Final_Punctuation": "Pf", "Other_Punctuation": "Po", "Symbol": "S", "Math_Symbol": "Sm",
    "Currency_Symbol": "Sc", "Modifier_Symbol": "Sk", "Other_Symbol": "So", "Separator": "Z",
    "Space_Separator": "Zs", "Line_Separator": "Zl", "Paragraph_Separator": "Zp", "Other": "C",
    "Control": "Cc", "cntrl": "Cc", "Format": "Cf", "Surrogate": "Cs", "Private_Use": "Co",
    "Unassigned": "Cn",
}


@functools.lru_cache(maxsize=1)
def general_categories() -> dict[str, Ranges]:
    """Code point ranges per two-letter General_Category (Python's unicodedata version).

    One scan of all code points (about a second), done only when a pattern uses ``\\p``."""
    out: dict[str, list[tuple[int, int]]] = {}
    prev, start = "", 0
    for cp in range(ir.MAX_UNICODE + 1):
        cat = unicodedata.category(chr(cp))
        if cat != prev:
            if prev:
                out.setdefault(prev, []).append((start, cp - 1))
            prev, start = cat, cp
    out.setdefault(prev, []).append((start, ir.MAX_UNICODE))
    return {k: tuple(v) for k, v in out.items()}


def unicode_property(name: str, general_only: bool = False) -> Ranges | None:
    """Code point ranges of an ECMA ``\\p{name}``: a General_Category value (short or long name),
    or, unless ``general_only``, one of the binary properties Any / ASCII / Assigned; None if unknown."""
    if not general_only and name in ("Any", "ASCII", "Assigned"):
        if name == "Any":
            return ((0, ir.MAX_UNICODE),)
        if name == "ASCII":
            return ((0, 127),)
        return ir.invert_ranges(general_categories()["Cn"])
    code = _GC_NAMES.get(name, name)
    cats = general_categories()
    members = [k for k in cats if k == code or (len(code) == 1 and k[0] == code) or (code == "LC" and k in ("Lu", "Ll", "Lt"))]
    if not members:
        return None
    return ir.normalize_ranges(r for k in members for r in cats[k])
