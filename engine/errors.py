"""The engine's request errors: one class per thing a caller can get wrong, all ``FieldError``s.

A ``FieldError`` is a ``ValueError`` whose ``field`` names the offending request field (a
``SamplingParams`` field, ``prompt``, ``input_ids``, ...) and whose message starts with it, so
the server maps the whole family to HTTP 400 with the field as ``param``. ``InvalidGrammar`` is
also a ``grammar.GrammarError``: a constraint the grammar layer refused, named by its field.

This module sits below every engine subpackage (it imports only ``grammar.errors``), so the
Engine, the server, the extraction jobs and the grammar backend share the classes without
importing one another.
"""

from __future__ import annotations

from grammar.errors import GrammarError


class FieldError(ValueError):
    """A request field the engine refuses; ``field`` names it."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name


class PromptError(FieldError):
    """A prompt the engine cannot run (empty, too long, token ids out of range)."""


class InvalidSamplingParams(FieldError):
    """A sampling parameter out of range."""


class InvalidGrammar(FieldError, GrammarError):
    """A constraint that cannot be compiled."""

    retryable = False


class CompileTimeout(InvalidGrammar):
    """The compile ran past its wall-clock backstop: the machine was slow, the constraint was
    not refused (never cached; a retry may succeed; 503 over HTTP)."""

    retryable = True
