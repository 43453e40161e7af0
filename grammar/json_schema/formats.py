"""String ``format`` values as character-level IR (exact, or a documented safe restriction).

Every format of the 2020-12 format vocabulary is enforced. Most are written once as a
Python-flavor regex over the decoded string and lowered with ``regex_to_ir``. Where the RFC
grammar is larger than what generation needs (``uri``, ``iri``, ``email``, ``idn-*``), the
expression is a subset: it may reject unusual valid strings but never accepts an invalid one.
``date`` knows month lengths and leap years; ``ipv4`` refuses leading zeros like Python's
``ipaddress``; times refuse the leap second ``:60``. ``idn-hostname`` is ASCII labels without
``--`` (no punycode to validate), at most four labels of 62 characters (under the 253-character
limit). ``regex`` is context-free; ``regex_format`` writes a subset valid in both ECMA-262 and
Python's ``re``, with groups nested at most three deep (which makes it regular).

Validators check formats with different strictness (some not at all without optional
libraries), so every format is a lower bound for the algebra: its complement is refused.
"""

from __future__ import annotations

from functools import lru_cache

from .. import ir
from ..errors import UnsupportedFeatureError

_YEAR = r"(?:[1-9]\d{3}|0[1-9]\d{2}|00[1-9]\d|000[1-9])"
_LEAP_YEAR = r"(?:\d{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)"
_MONTH_DAY = r"(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\d|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\d|30)|02-(?:0[1-9]|1\d|2[0-8]))"
_DATE = rf"(?:{_YEAR}-{_MONTH_DAY}|{_LEAP_YEAR}-02-29)"
_TIME = r"(?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d(?:\.\d+)?(?:[zZ]|[+-](?:[01]\d|2[0-3]):[0-5]\d)"
_DUR_TIME = r"T(?:\d+H(?:\d+M)?(?:\d+S)?|\d+M(?:\d+S)?|\d+S)"
_DURATION = rf"P(?:(?:\d+Y(?:\d+M)?(?:\d+D)?|\d+M(?:\d+D)?|\d+D)(?:{_DUR_TIME})?|{_DUR_TIME}|\d+W)"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = rf"{_LABEL}(?:\.{_LABEL})*"
_ATEXT = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
_EMAIL = rf"{_ATEXT}(?:\.{_ATEXT})*@{_LABEL}(?:\.{_LABEL})+"
_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
_IPV4 = rf"{_OCTET}(?:\.{_OCTET}){{3}}"
_H16 = r"[0-9A-Fa-f]{1,4}"
_LS32 = rf"(?:{_H16}:{_H16}|{_IPV4})"
_IPV6 = "(?:" + "|".join(
    [
        rf"(?:{_H16}:){{6}}{_LS32}",
        rf"::(?:{_H16}:){{5}}{_LS32}",
        rf"(?:{_H16})?::(?:{_H16}:){{4}}{_LS32}",
        rf"(?:(?:{_H16}:){{0,1}}{_H16})?::(?:{_H16}:){{3}}{_LS32}",
        rf"(?:(?:{_H16}:){{0,2}}{_H16})?::(?:{_H16}:){{2}}{_LS32}",
        rf"(?:(?:{_H16}:){{0,3}}{_H16})?::{_H16}:{_LS32}",
        rf"(?:(?:{_H16}:){{0,4}}{_H16})?::{_LS32}",
        rf"(?:(?:{_H16}:){{0,5}}{_H16})?::{_H16}",
        rf"(?:(?:{_H16}:){{0,6}}{_H16})?::",
    ]
) + ")"
_UUID = r"[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}"
_URI_CHAR = r"(?:[A-Za-z0-9\-._~!$&'()*+,;=:@/?]|%[0-9A-Fa-f]{2})"
_URI = rf"[A-Za-z][A-Za-z0-9+.\-]*:{_URI_CHAR}*(?:#{_URI_CHAR}*)?"
_SEG_NC = r"(?:[A-Za-z0-9\-._~!$&'()*+,;=@]|%[0-9A-Fa-f]{2})"
_URI_REF = rf"(?:{_URI}|{_SEG_NC}*(?:[/?]{_URI_CHAR}*)?(?:#{_URI_CHAR}*)?)"
_UCS = r"\u00a0-\ud7ff\uf900-\ufdcf\ufdf0-\uffef\U00010000-\U0001fffd"
_IRI_CHAR = rf"(?:[A-Za-z0-9\-._~!$&'()*+,;=:@/?{_UCS}]|%[0-9A-Fa-f]{{2}})"
_IRI = rf"[A-Za-z][A-Za-z0-9+.\-]*:{_IRI_CHAR}*(?:#{_IRI_CHAR}*)?"
_ISEG_NC = rf"(?:[A-Za-z0-9\-._~!$&'()*+,;=@{_UCS}]|%[0-9A-Fa-f]{{2}})"
_IRI_REF = rf"(?:{_IRI}|{_ISEG_NC}*(?:[/?]{_IRI_CHAR}*)?(?:#{_IRI_CHAR}*)?)"
_JSON_POINTER = r"(?:/(?:[^~/]|~[01])*)*"
_REL_JSON_POINTER = rf"(?:0|[1-9][0-9]*)(?:#|{_JSON_POINTER})"
_PCT = r"%[0-9A-Fa-f]{2}"
_VARCHAR = rf"(?:[A-Za-z0-9_]|{_PCT})"
_VARSPEC = rf"{_VARCHAR}(?:\.?{_VARCHAR})*(?::[1-9][0-9]{{0,3}}|\*)?"
_TEMPLATE_LITERAL = rf"(?:[\x21\x23\x24\x26\x28-\x3b\x3d\x3f-\x5b\x5d\x5f\x61-\x7a\x7e{_UCS}\ue000-\uf8ff]|{_PCT})"
_URI_TEMPLATE = rf"(?:{_TEMPLATE_LITERAL}|\{{[+#./;?&=,!@|]?{_VARSPEC}(?:,{_VARSPEC})*\}})*"

FORMAT_REGEXES: dict[str, str] = {
    "date": _DATE,
    "time": _TIME,
    "date-time": rf"{_DATE}[Tt]{_TIME}",
    "duration": _DURATION,
    "email": _EMAIL,
    "hostname": _HOSTNAME,
    "ipv4": _IPV4,
    "ipv6": _IPV6,
    "uuid": _UUID,
    "uri": _URI,
    "uri-reference": _URI_REF,
    "iri": _IRI,
    "iri-reference": _IRI_REF,
    "json-pointer": _JSON_POINTER,
    "relative-json-pointer": _REL_JSON_POINTER,
    "uri-template": _URI_TEMPLATE,
    "idn-email": _EMAIL,
}


# Formats the specification defines. One of these that we do not implement is refused; any other
# name is not a format at all for validators (they ignore it), so it constrains nothing.
STANDARD_FORMATS = frozenset(FORMAT_REGEXES) | {
    "idn-email", "idn-hostname", "iri", "iri-reference", "uri-template", "json-pointer", "relative-json-pointer", "regex",
}


def format_expr(name: str, pointer: str = "") -> ir.Expr | None:
    """Character-level IR of the strings in ``format`` ``name``; None for a name that is not a
    standard format (an annotation); UnsupportedFeatureError (naming ``pointer``) for a standard
    one not implemented."""
    if name not in FORMAT_REGEXES and name not in ("idn-hostname", "regex"):
        if name not in STANDARD_FORMATS:
            return None
        raise UnsupportedFeatureError(f"format {name!r} is not enforced at {pointer or '/'} (keyword 'format')")
    return _format_ir(name)


# One entry per implemented format (the memo was keyed by the pointer too, so it grew with every
# schema a process compiled and almost never hit: 95 entries and 8,000 objects for the garbage
# collector to walk after 300 MaskBench schemas).
@lru_cache(maxsize=None)
def _format_ir(name: str) -> ir.Expr:
    if name == "idn-hostname":
        return _idn_hostname()
    if name == "regex":
        from .regex_format import regex_format

        return regex_format()
    from ..regex import regex_to_ir

    return regex_to_ir(FORMAT_REGEXES[name], flavor="python", mode="fullmatch")


def _idn_hostname() -> ir.Expr:
    from .. import char_dfa
    from ..regex import regex_to_ir

    label = char_dfa.intersect(char_dfa.from_ir(regex_to_ir(r"[A-Za-z0-9]+(?:-[A-Za-z0-9]+)*")), char_dfa.lengths(1, 62))
    one = char_dfa.to_ir(label)
    return ir.seq(one, ir.repeat(ir.seq(ir.literal("."), one), 0, 3))
