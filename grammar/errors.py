"""The one exception hierarchy of formcast's grammar layer.

Every error a user can provoke with a constraint is a ``GrammarError`` (a ``ValueError``),
so servers can map the whole family to HTTP 400 with one ``except``.
"""

from __future__ import annotations


class GrammarError(ValueError):
    """A constraint that cannot be compiled or enforced."""


class SchemaError(GrammarError):
    """An invalid or unsatisfiable JSON schema; the message names the keyword and its JSON pointer."""


class RegexSyntaxError(GrammarError):
    """A regular expression that does not parse; the message names the position."""

    def __init__(self, message: str, pattern: str | None = None, position: int | None = None) -> None:
        if position is not None:
            message = f"{message} at position {position}"
            if pattern is not None:
                message += f" in {pattern!r}"
        super().__init__(message)
        self.pattern = pattern
        self.position = position


class GrammarSyntaxError(GrammarError):
    """An EBNF/Lark grammar that does not parse; the message names line and column."""

    def __init__(self, message: str, line: int | None = None, column: int | None = None) -> None:
        if line is not None:
            message = f"{message} (line {line}, column {column})"
        super().__init__(message)
        self.line = line
        self.column = column


class UnsupportedFeatureError(GrammarError):
    """A construct formcast cannot enforce exactly; refused rather than silently ignored."""


class GrammarBudgetError(GrammarError):
    """A constraint whose automaton would exceed the configured state, memory or time budget."""


class GrammarTimeoutError(GrammarError):
    """A compile stopped by the wall-clock backstop (``CompileBudget.max_compile_seconds``): a
    statement about the machine's load, not a refusal of the constraint. Never cached as one;
    a retry may succeed."""

    retryable = True
