"""Per-vocabulary token indexes for the ``uniqueItems`` check (built once per vocabulary).

``closing_index``: the decoded string content a token holds before its first unescaped quote,
for looking up which tokens, read inside a string item, would close it with a given content.
``byte_index``: which tokens contain each byte that can complete an item (a cheap filter before
the tokens are simulated).
"""

from __future__ import annotations

import json
import threading

import numpy as np

_INDEX_LOCK = threading.Lock()
_CLOSING: dict[int, tuple[list[bytes], dict[str, list[int]]]] = {}


def closing_index(token_bytes: list[bytes]) -> dict[str, list[int]]:
    """decoded string content before the first unescaped quote -> token ids (a token read from
    inside a string, no escape pending); once per vocabulary."""
    with _INDEX_LOCK:
        hit = _CLOSING.get(id(token_bytes))
        if hit is not None and hit[0] is token_bytes:
            return hit[1]
    index: dict[str, list[int]] = {}
    for t, data in enumerate(token_bytes):
        q = data.find(b'"')
        while q > 0 and (len(data[:q]) - len(data[:q].rstrip(b"\\"))) % 2:
            q = data.find(b'"', q + 1)  # an escaped quote: look further
        if q < 0:
            continue
        try:
            content = json.loads(b'"' + data[:q] + b'"')
        except ValueError:
            continue
        index.setdefault(content, []).append(t)
    with _INDEX_LOCK:
        _CLOSING[id(token_bytes)] = (token_bytes, index)
    return index


_INDEX: dict[int, tuple[list[bytes], dict[int, np.ndarray]]] = {}


def byte_index(token_bytes: list[bytes]) -> dict[int, np.ndarray]:
    """For each byte that can complete an item: which tokens contain it (once per vocabulary)."""
    with _INDEX_LOCK:
        hit = _INDEX.get(id(token_bytes))
        if hit is not None and hit[0] is token_bytes:
            return hit[1]
    index = {b: np.fromiter((b in t for t in token_bytes), dtype=bool, count=len(token_bytes)) for b in b'",]}el \t\n\r'}
    with _INDEX_LOCK:
        _INDEX[id(token_bytes)] = (token_bytes, index)
    return index
