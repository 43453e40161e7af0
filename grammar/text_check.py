"""Checks beyond the grammar's language, enforced by the matcher on the text produced so far.

Some constraints are not regular nor context-free (JSON Schema's ``uniqueItems``: no item may
equal an earlier one). A front end attaches a :class:`TextCheck` to its ``ir.Grammar``
(``grammar.check``); every ``GrammarMatcher`` of that grammar then keeps one check state per
accepted token next to its automaton state, so ``rollback(n)``, ``copy()`` and ``reset()`` keep
both consistent. States are immutable values: copies share them, and a check object holds no
per-request data (what it caches is guarded by its own lock), so matchers of one grammar may run
on different threads.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np


class TextCheck(Protocol):
    def prepare(self, token_bytes: list[bytes]) -> None:
        """Build what ``banned`` needs per vocabulary (called when a grammar is compiled for
        it, so the first mask does not pay for it)."""

    def start(self) -> Any:
        """The state before any text."""

    def feed(self, state: Any, data: bytes) -> Any | None:
        """The state after ``data`` (text the grammar accepts), or None if it breaks the check."""

    def may_ban(self, state: Any) -> bool:
        """Whether any next token could break the check (a cheap test before ``banned``)."""

    def banned(self, state: Any, token_bytes: list[bytes], allowed: np.ndarray) -> np.ndarray:
        """Token ids among ``allowed`` (ids the grammar allows next) that would break the check."""
