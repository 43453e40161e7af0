"""A thread-safe least-recently-used cache bounded by the bytes of its values."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable, Generic, Hashable, TypeVar

V = TypeVar("V")


class ByteLRU(Generic[V]):
    """``key -> value`` with a byte budget: inserting past ``max_bytes`` evicts the least recently
    used entries. One lock guards the dictionary; values are computed outside it, so a slow
    computation never blocks readers (two threads may compute the same value; the first stored
    wins and both return it)."""

    def __init__(self, max_bytes: int, size_of: Callable[[V], int]) -> None:
        self.max_bytes = max_bytes
        self._size_of = size_of
        self._items: OrderedDict[Hashable, tuple[V, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: Hashable) -> V | None:
        with self._lock:
            hit = self._items.get(key)
            if hit is None:
                self.misses += 1
                return None
            self.hits += 1
            self._items.move_to_end(key)
            return hit[0]

    def put(self, key: Hashable, value: V) -> V:
        """Store ``value`` unless ``key`` is already present; return the stored value."""
        size = self._size_of(value)
        with self._lock:
            hit = self._items.get(key)
            if hit is not None:
                self._items.move_to_end(key)
                return hit[0]
            self._items[key] = (value, size)
            self._bytes += size
            while self._bytes > self.max_bytes and len(self._items) > 1:
                _, (_, dropped) = self._items.popitem(last=False)
                self._bytes -= dropped
            return value

    def get_or_compute(self, key: Hashable, compute: Callable[[], V]) -> V:
        hit = self.get(key)
        return hit if hit is not None else self.put(key, compute())

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._bytes = 0

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._items
