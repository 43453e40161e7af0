"""JSON value equality for ``uniqueItems``: the keys under which two item texts compare equal."""

from __future__ import annotations

import json
import re
from typing import Any

def equality_keys(text: bytes) -> frozenset[str]:
    """Keys equal for equal JSON values: numbers by exact decimal value, and also by float value
    (jsonschema compares floats), objects regardless of key order, ``true`` apart from ``1``."""
    try:
        value = json.loads(text, parse_float=_Num, parse_int=_Num)
    except ValueError:  # not JSON (only text the grammar refuses gets here): nothing to compare
        return frozenset()
    return frozenset({json.dumps(_norm(value, False), sort_keys=True), json.dumps(_norm(value, True), sort_keys=True)})


class _Num(str):
    """A number's text, kept as written (json.loads hands it over unparsed)."""


_NUMBER = re.compile(r"(-?)(\d+)(?:\.(\d+))?(?:[eE]([+-]?\d+))?")


def _exact_key(text: str) -> str:
    """The value of a JSON number as digits and a power of ten (never overflows)."""
    m = _NUMBER.fullmatch(text)
    sign, whole, frac, exp = m.group(1), m.group(2), m.group(3) or "", m.group(4) or "0"
    digits = (whole + frac).lstrip("0")
    if not digits:
        return "0"
    if len(exp.lstrip("+-")) > 18:
        return sign + "huge" if not exp.startswith("-") else "tiny"  # all alike: stricter, never looser
    stripped = digits.rstrip("0")
    return f"{sign}{stripped}e{int(exp) - len(frac) + len(digits) - len(stripped)}"


def _norm(v: Any, as_float: bool) -> Any:
    if isinstance(v, _Num):
        return {"#f": repr(float(v))} if as_float else {"#x": _exact_key(v)}
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return v
    if isinstance(v, list):
        return [_norm(x, as_float) for x in v]
    return {k: _norm(x, as_float) for k, x in v.items()}
