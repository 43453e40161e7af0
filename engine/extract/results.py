"""``ExtractResult``: one record's outcome, and the output line it becomes.

An output line (JSON, one per record, in the order records finish)::

    {"id": "r17", "line": 17, "value": {"city": "Oslo", "year": 1999}, "text": "{\\"city\\": ...}",
     "finish_reason": {"type": "stop", "matched": 2}, "prompt_tokens": 41, "completion_tokens": 12,
     "error": null}

``line`` is where the record came from (see ``records.py``). ``value`` is the parsed JSON under a
JSON schema, and the generated text itself under a regex or an EBNF grammar (the match). A failed
record has ``value: null`` and ``error: {"type", "message"}`` with one of the ``FailureType``
values; ``text`` and ``finish_reason`` stay when the model ran, so an incomplete output can be
looked at.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


class FailureType:
    """The ``error.type`` values, one per reason a record can fail."""

    MALFORMED_LINE = "malformed_line"  # the input line is not a readable record
    INVALID_RECORD = "invalid_record"  # a field the prompt needs is missing or has the wrong type, a bad id
    DUPLICATE_ID = "duplicate_id"  # the id was already used by an earlier record
    PROMPT_TOO_LONG = "prompt_too_long"  # the prompt does not fit the context (or the KV cache)
    INVALID_PROMPT = "invalid_prompt"  # another prompt the engine refused (e.g. empty)
    REFUSED_CONSTRAINT = "refused_constraint"  # the schema / regex / grammar cannot be compiled
    INCOMPLETE = "incomplete"  # the output did not finish within max_new_tokens (or the context)
    ABORTED = "aborted"  # the engine aborted the request (its message says why)
    INVALID_OUTPUT = "invalid_output"  # finished, but the text does not parse as JSON


@dataclass(frozen=True)
class ExtractError:
    type: str
    message: str


@dataclass(frozen=True)
class ExtractResult:
    """What became of one record; ``to_json()`` is its output line."""

    id: str | int
    line: int
    value: Any = None
    text: str | None = None
    finish_reason: dict[str, Any] | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: ExtractError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_json(self) -> dict[str, Any]:
        error = None if self.error is None else {"type": self.error.type, "message": self.error.message}
        return {
            "id": self.id,
            "line": self.line,
            "value": self.value,
            "text": self.text,
            "finish_reason": self.finish_reason,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "error": error,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ExtractResult:
        error = data.get("error")
        return cls(
            id=data["id"],
            line=data["line"],
            value=data.get("value"),
            text=data.get("text"),
            finish_reason=data.get("finish_reason"),
            prompt_tokens=data.get("prompt_tokens", 0),
            completion_tokens=data.get("completion_tokens", 0),
            error=None if error is None else ExtractError(error["type"], error["message"]),
        )

    def to_line(self) -> bytes:
        """The output line, UTF-8, newline included."""
        data = self.to_json()
        try:
            return (json.dumps(data, ensure_ascii=False) + "\n").encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate from the input: escape everything instead
            return (json.dumps(data, ensure_ascii=True) + "\n").encode("ascii")


def failure(record_id: str | int, line: int, error: ExtractError) -> ExtractResult:
    """A record that never reached the model."""
    return ExtractResult(id=record_id, line=line, error=error)


def from_generation(record_id: str | int, line: int, out: dict[str, Any], kind: str | None, max_new_tokens: int | None) -> ExtractResult:
    """A record the model ran on: ``out`` is the Engine's result, ``kind`` the constraint's field."""
    meta = out["meta_info"]
    reason = meta["finish_reason"]
    text = out["text"]
    base = dict(id=record_id, line=line, text=text, finish_reason=reason,
                prompt_tokens=meta["prompt_tokens"], completion_tokens=meta["completion_tokens"])  # fmt: skip
    if reason["type"] == "length":
        budget = f"max_new_tokens={max_new_tokens}" if max_new_tokens is not None else "the context"
        message = f"incomplete within {budget}: the output stopped after {meta['completion_tokens']} tokens"
        return ExtractResult(**base, error=ExtractError(FailureType.INCOMPLETE, message))
    if reason["type"] == "dead_end":
        return ExtractResult(**base, error=ExtractError(FailureType.INCOMPLETE, reason.get("message", "the constraint allows no completion")))
    if reason["type"] == "abort":
        message = reason.get("message", "aborted")
        if reason.get("field") == "max_new_tokens":
            # Refused at admission (constrained.output_budget): no output of the constraint fits
            # the budget, so the record could only have ended cut; it never ran.
            return ExtractResult(**base, error=ExtractError(FailureType.INCOMPLETE, f"incomplete within max_new_tokens={max_new_tokens}: {message}"))
        return ExtractResult(**base, error=ExtractError(FailureType.ABORTED, message))
    if kind != "json_schema":
        return ExtractResult(**base, value=text)
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        return ExtractResult(**base, error=ExtractError(FailureType.INVALID_OUTPUT, f"not valid JSON ({exc.msg} at column {exc.colno})"))
    return ExtractResult(**base, value=value)
