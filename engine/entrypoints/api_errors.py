"""Errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}`` with the status
OpenAI uses, so the ``openai`` client raises the matching exception (``BadRequestError`` for 400,
``AuthenticationError`` for 401, ``NotFoundError`` for 404, ``InternalServerError`` for 5xx).

``to_api_error`` is the one place that turns the engine's own exceptions into HTTP errors:
``InvalidSamplingParams``, ``PromptError`` and ``InvalidGrammar`` are the caller's fault (400) and
keep their message, which names the field (and for a grammar, the keyword or position at fault);
a grammar compile stopped by its wall-clock backstop (``CompileTimeout``) is a 503 with
``Retry-After``: the server was slow, the constraint was not refused.
The engine's field names are translated back to the API's (``max_new_tokens`` -> ``max_tokens``).
"""

from __future__ import annotations

from typing import Any

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from ..constrained.grammar_backend import InvalidGrammar
from ..sampling_params import InvalidSamplingParams
from .engine import PromptError
from .openai_protocol import ErrorInfo, ErrorResponse

# SamplingParams field -> the request field a client sent.
_API_FIELD = {
    "max_new_tokens": "max_tokens",
    "min_new_tokens": "min_tokens",
    "sampling_seed": "seed",
    "top_logprobs_num": "top_logprobs",
}


class APIError(Exception):
    """An error answered to the client; ``headers`` go on the response (e.g. ``Retry-After``)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> ErrorResponse:
        return ErrorResponse(error=ErrorInfo(message=self.message, type=self.type, param=self.param, code=self.code))

    def response(self) -> JSONResponse:
        return JSONResponse(self.body().model_dump(), status_code=self.status, headers=self.headers)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def overloaded(message: str, retry_after_s: int = 1) -> APIError:
    return APIError(503, message, type="server_error", code="overloaded", headers={"Retry-After": str(retry_after_s)})


def shutting_down() -> APIError:
    return APIError(503, "the server is shutting down; retry on another replica or later", type="server_error", code="shutting_down")


def internal_error(message: str) -> APIError:
    return APIError(500, message, type="server_error", code="internal_error")


def to_api_error(exc: BaseException) -> APIError | None:
    """The API error for an engine exception caused by the request, or None for anything else."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, InvalidGrammar) and exc.retryable:
        # The compile's wall-clock backstop ran out under load: not the request's fault, not kept.
        return overloaded(f"{exc} (the constraint was not refused; retry may succeed)", retry_after_s=5)
    if isinstance(exc, (InvalidSamplingParams, PromptError, InvalidGrammar)):
        field = _API_FIELD.get(exc.field, exc.field)
        message = str(exc)
        if field != exc.field and message.startswith(exc.field):
            message = field + message[len(exc.field) :]
        return bad_request(message, param=field)
    return None


def validation_error(exc: RequestValidationError) -> APIError:
    """A pydantic validation failure -> 400 naming the first offending field."""
    errors = exc.errors()
    first: dict[str, Any] = errors[0] if errors else {}
    where, tags = _location(first.get("loc", ()))
    kind = first.get("type", "")
    # A value that fits no member of a union fails once per member: report the union once.
    alternatives = [e for e in errors if _union_head(e) == _union_head(first)] if tags else []
    if len(alternatives) > 1:
        forms = sorted({_location(e["loc"])[1][0] for e in alternatives})
        message = f"{where}: expected one of {', '.join(forms)}; got {_short(first.get('input'))}"
        errors = [e for e in errors if e not in alternatives]
        first = {}
    elif kind == "extra_forbidden":
        message = f"{where}: unknown field (not part of this API; extensions go at the top level of the body)"
    elif kind == "json_invalid":
        message = f"the request body is not valid JSON: {first.get('ctx', {}).get('error', first.get('msg'))}"
        where = "body"
    elif kind == "value_error" and where == "body":
        # A model-level check (``openai_protocol``) names the field at the start of its message.
        message = str(first.get("ctx", {}).get("error", first.get("msg", "invalid body")))
        where = message.split(":", 1)[0]
    elif kind == "missing":
        message = f"{where}: required field missing"
    else:
        message = f"{where}: {first.get('msg', 'invalid value')}"
    more = len(errors) - (1 if first else 0)
    if more > 0:
        message += f" (and {more} more error{'s' if more > 1 else ''})"
    return bad_request(message, param=where)


def _location(loc: Any) -> tuple[str, list[str]]:
    """(dotted field path, the union members named along it). pydantic puts a union member's
    type (``str``, ``list[int]``, ``NamedToolChoice``) into the location; fields are snake_case."""
    parts, tags = [], []
    for p in loc:
        if p == "body":
            continue
        if isinstance(p, str) and (p in ("str", "int", "float", "bool", "dict", "list") or "[" in p or p[:1].isupper()):
            tags.append(p)
        else:
            parts.append(str(p))
    return ".".join(parts) or "body", tags


def _union_head(error: dict[str, Any]) -> tuple:
    """The location up to its first union member (the field that holds the union)."""
    head = []
    for p in error.get("loc", ()):
        if _location((p,))[1]:
            break
        head.append(p)
    return tuple(head)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
