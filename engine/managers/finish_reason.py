"""Typed finish reasons, reported as SGLang reports them (``to_json``):

* ``{"type": "stop", "matched": <token id>}``: EOS, a ``stop_token_ids`` entry, or the token that
  ended the grammar;
* ``{"type": "stop", "matched": "<stop string>"}``: a stop string (removed from the text);
* ``{"type": "length", "length": n}``: ``max_new_tokens`` or the context limit;
* ``{"type": "abort", "message": "..."}``: refused grammar, grammar budget, abort by the caller;
  a request refused at admission because of one of its fields also carries ``"field": <name>``
  (e.g. ``max_new_tokens`` below the shortest output the constraint allows), so callers can tell
  "never ran because of this field" from other aborts without reading the message;
* ``{"type": "dead_end", "message": "..."}``: the constraint allows no next token and the output
  is not complete (a constraint the compiler admits whose every path dead-ends, e.g. more unique
  items than the item type has values). The output so far is returned; nothing failed in the
  engine, so it is a finish, not an error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class FinishReason:
    def to_json(self) -> dict[str, Any]:
        raise NotImplementedError

    @property
    def kind(self) -> str:
        return str(self.to_json()["type"])


@dataclass(frozen=True)
class FinishMatchedToken(FinishReason):
    matched: int

    def to_json(self) -> dict[str, Any]:
        return {"type": "stop", "matched": self.matched}


@dataclass(frozen=True)
class FinishMatchedStr(FinishReason):
    matched: str

    def to_json(self) -> dict[str, Any]:
        return {"type": "stop", "matched": self.matched}


@dataclass(frozen=True)
class FinishLength(FinishReason):
    length: int

    def to_json(self) -> dict[str, Any]:
        return {"type": "length", "length": self.length}


@dataclass(frozen=True)
class FinishAbort(FinishReason):
    message: str
    field: str | None = None  # the request field that made the engine refuse it at admission

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "abort", "message": self.message}
        if self.field is not None:
            out["field"] = self.field
        return out


@dataclass(frozen=True)
class FinishDeadEnd(FinishReason):
    message: str

    def to_json(self) -> dict[str, Any]:
        return {"type": "dead_end", "message": self.message}
