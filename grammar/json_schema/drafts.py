"""Which JSON Schema draft a document follows, and what that draft's rules change.

A document names its draft with ``$schema`` at its root; otherwise the caller's option
(``json_schema_draft``) picks one; with neither, formcast keeps its default: the 2020-12 rules,
plus the older spellings (``items`` arrays with ``additionalItems``, ``dependencies``, draft-04
boolean exclusive bounds) where they cannot be confused with a 2020-12 keyword.

Under a named draft, formcast applies that draft's rules (what jsonschema's validator for it
does):

- only the draft's own keywords are assertions; the others (``prefixItems`` in draft-07,
  ``dependencies`` in 2020-12, ``if`` in draft-06...) are unknown keywords, ignored (``view``);
- up to draft-07, ``$ref`` overrides its siblings: they are ignored, ``$id`` included, which
  therefore does not change the base URI of the reference (``refs.normalize_refs``);
- draft-04 spells ``$id`` as ``id``; 2019-09 has ``$recursiveRef`` / ``$recursiveAnchor``
  (resolved as a dynamic reference to the anchor ``RECURSIVE``, ``refs``); drafts before
  2020-12 read ``items`` arrays and ``additionalItems`` (``keywords``).

``format`` is asserted by default (right for generation); ``formats="annotate"`` makes it an
annotation, as the specification's default for validators is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jsonschema

from ..errors import SchemaError

RECURSIVE = "formcast:recursive"  # the dynamic anchor name standing for $recursiveAnchor: true


@dataclass(frozen=True)
class Draft:
    name: str
    validator: type
    keywords: frozenset[str]  # assertion and applicator keywords of this draft

    @property
    def ref_overrides(self) -> bool:
        return self.name in ("draft4", "draft6", "draft7")

    @property
    def id_keyword(self) -> str:
        return "id" if self.name == "draft4" else "$id"


def _keywords(cls: type, *more: str) -> frozenset[str]:
    return frozenset(cls.VALIDATORS) | frozenset(more)


DRAFTS = {
    # Draft-04's boolean exclusive bounds are read by minimum / maximum (``keywords.bounds``).
    "draft4": Draft("draft4", jsonschema.Draft4Validator, _keywords(jsonschema.Draft4Validator, "exclusiveMinimum", "exclusiveMaximum")),
    "draft6": Draft("draft6", jsonschema.Draft6Validator, _keywords(jsonschema.Draft6Validator)),
    "draft7": Draft("draft7", jsonschema.Draft7Validator, _keywords(jsonschema.Draft7Validator, "then", "else")),
    # $recursiveRef becomes a $dynamicRef when references are normalized (``refs``).
    "2019-09": Draft("2019-09", jsonschema.Draft201909Validator,
                     _keywords(jsonschema.Draft201909Validator, "then", "else", "minContains", "maxContains", "$dynamicRef")),
    "2020-12": Draft("2020-12", jsonschema.Draft202012Validator,
                     _keywords(jsonschema.Draft202012Validator, "then", "else", "minContains", "maxContains")),
}
# Every keyword some draft asserts: under a named draft, those it does not know are ignored.
ALL_KEYWORDS = frozenset().union(*(d.keywords for d in DRAFTS.values())) | {"$dynamicRef", "$recursiveRef"}

_ALIASES = {
    "draft4": "draft4", "draft-04": "draft4", "draft-4": "draft4", "4": "draft4",
    "draft6": "draft6", "draft-06": "draft6", "draft-6": "draft6", "6": "draft6",
    "draft7": "draft7", "draft-07": "draft7", "draft-7": "draft7", "7": "draft7",
    "2019-09": "2019-09", "draft2019-09": "2019-09", "draft-2019-09": "2019-09",
    "2020-12": "2020-12", "draft2020-12": "2020-12", "draft-2020-12": "2020-12",
}
DRAFT_NAMES = tuple(DRAFTS)
FORMAT_MODES = ("assert", "annotate")


def draft_named(name: str | None) -> Draft | None:
    """The draft an option names (``"draft-07"``, ``"draft7"``, ``"2019-09"``...), None for None."""
    if name is None:
        return None
    key = _ALIASES.get(str(name).strip().lower())
    if key is None:
        raise SchemaError(f"json_schema_draft must be one of {', '.join(DRAFT_NAMES)} (or None for the default), got {name!r}")
    return DRAFTS[key]


def draft_of(schema: Any, option: str | None) -> Draft | None:
    """The draft of a document: its root ``$schema`` when it names a known draft, else the option."""
    if isinstance(schema, dict) and isinstance(schema.get("$schema"), str):
        cls = jsonschema.validators.validator_for(schema, default=None)
        for draft in DRAFTS.values():
            if cls is draft.validator:
                return draft
    return draft_named(option)


def check_formats(mode: str) -> str:
    if mode not in FORMAT_MODES:
        raise SchemaError(f"json_schema_formats must be 'assert' or 'annotate', got {mode!r}")
    return mode


def view(s: dict, draft: Draft | None, annotate_formats: bool) -> dict:
    """The keywords of schema object ``s`` that are assertions under ``draft``."""
    if draft is not None:
        if draft.ref_overrides and "$ref" in s:
            return {"$ref": s["$ref"]}
        if any(k in ALL_KEYWORDS and k not in draft.keywords for k in s):
            s = {k: v for k, v in s.items() if k not in ALL_KEYWORDS or k in draft.keywords}
    if annotate_formats and "format" in s:
        s = {k: v for k, v in s.items() if k != "format"}
    return s
