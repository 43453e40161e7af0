"""The process-wide caches, owned by one object (``CACHES``); ``grammar.clear_cache()`` empties them.

Every cache a module keeps for the life of the process is a named table of ``CACHES``, made with
``CACHES.table(name)``, so one call finds them all:

* per constraint: the compiled grammars (``api``, an LRU);
* setup (``setup=True``), built once per vocabulary or per process and shared by every
  constraint: the token trie and region splits (``token_masks``), the ``uniqueItems`` token
  indexes (``json_schema/unique_tokens``), the metaschema validators and node verdicts
  (``json_schema/refs``), the ``transformers`` processor's grammar backend per vocabulary
  (``engine/hf/processor.py``);
* outside this package, cleared by a function their user registers with ``on_clear`` (setup as
  well): the bitmask kernels' workspaces (``formcast_kernels`` cannot import ``grammar``).

``clear(keep_setup=True)`` empties the per-constraint tables only: a compile after it measures the
constraint alone, not the one-time setup (the benchmarks' TTFM). A module keeps its own lock
around its table; ``clear`` empties each table in one ``dict.clear``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class Caches:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tables: dict[str, tuple[dict, bool]] = {}
        self._hooks: list[Callable[[], None]] = []

    def table(self, name: str, *, setup: bool = False, factory: Callable[[], dict] = dict) -> Any:
        """The table called ``name`` (created on first use; the same object afterwards)."""
        with self._lock:
            if name not in self._tables:
                self._tables[name] = (factory(), setup)
            return self._tables[name][0]

    def on_clear(self, hook: Callable[[], None]) -> None:
        """Call ``hook`` on every ``clear`` (for a cache this package cannot hold itself)."""
        with self._lock:
            if hook not in self._hooks:
                self._hooks.append(hook)

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._tables)

    def clear(self, *, keep_setup: bool = False) -> None:
        """Empty every table and run the registered hooks; with ``keep_setup``, only the
        per-constraint tables."""
        with self._lock:
            tables = [t for t, setup in self._tables.values() if not (keep_setup and setup)]
            hooks = [] if keep_setup else list(self._hooks)
        for t in tables:
            t.clear()
        for hook in hooks:
            hook()


CACHES = Caches()
