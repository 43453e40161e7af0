"""Checks beyond the grammar's language, enforced by the matcher on the text produced so far.

Some constraints are not regular nor context-free (JSON Schema's ``uniqueItems``: no item may
equal an earlier one). A front end attaches a :class:`TextCheck` to its ``ir.Grammar``
(``grammar.check``); every ``GrammarMatcher`` of that grammar then keeps one check state per
accepted token next to its automaton state, so ``rollback(n)``, ``copy()`` and ``reset()`` keep
both consistent. States are immutable values: copies share them, and a check object holds no
per-request data (what it caches is guarded by its own lock), so matchers of one grammar may run
on different threads.

A check does not refuse text on its own where the grammar may still accept it: it *marks* the
text the automaton reads (bytes no UTF-8 text holds, inserted where a fact the grammar cannot
see is found), and the grammar's branches that tolerate that fact read the mark. So a check
binds only the branches it was compiled for, and the automaton decides which survive.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

import numpy as np


class TextCheck(Protocol):
    def prepare(self, token_bytes: list[bytes]) -> None:
        """Build what ``banned`` needs per vocabulary (called when a grammar is compiled for
        it, so the first mask does not pay for it)."""

    def start(self) -> Any:
        """The state before any text."""

    def feed(self, state: Any, data: bytes) -> tuple[Any, bytes] | None:
        """The state after ``data`` (text the grammar accepts) and the bytes the automaton reads
        for it (``data`` with the check's marks), or None if ``data`` breaks the check."""

    def reserved(self, token_bytes: list[bytes]) -> np.ndarray:
        """Ids of the tokens holding a mark byte: never allowed (only the check writes marks)."""

    def may_ban(self, state: Any) -> bool:
        """Whether any next token could be marked (a cheap test before ``banned``)."""

    def banned(self, state: Any, token_bytes: list[bytes], allowed: np.ndarray, alive: Callable[[bytes], bool]) -> np.ndarray:
        """Token ids among ``allowed`` (ids the grammar allows next) whose marked bytes the
        automaton refuses (``alive(marked)`` is False), or that break the check."""
