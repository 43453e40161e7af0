"""Per-vocabulary token indexes for the ``uniqueItems`` check (built once per vocabulary).

``closing_index``: the decoded string content a token holds before its first unescaped quote,
for looking up which tokens, read inside a string item, would close it with a given content.
``byte_index``: which tokens contain each byte that can complete an item (a cheap filter before
the tokens are simulated). ``closing_more``: tokens that, read inside a string, could complete
more than that string (another quote or a closing bracket after the first quote).
``reserved_tokens``: the tokens holding the duplicate mark's byte, never allowed.
``closer_counts``: how many closing brackets each token holds.
"""

from __future__ import annotations

import json
import threading

import numpy as np

from ..caches import CACHES

_INDEX_LOCK = threading.Lock()
_CLOSING: dict[int, tuple[list[bytes], dict[str, list[int]]]] = CACHES.table("unique_closing_index", setup=True)


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


_INDEX: dict[int, tuple[list[bytes], dict[int, np.ndarray]]] = CACHES.table("unique_byte_index", setup=True)


def byte_index(token_bytes: list[bytes]) -> dict[int, np.ndarray]:
    """For each byte that can complete an item: which tokens contain it (once per vocabulary)."""
    with _INDEX_LOCK:
        hit = _INDEX.get(id(token_bytes))
        if hit is not None and hit[0] is token_bytes:
            return hit[1]
    lengths = np.fromiter((len(t) for t in token_bytes), dtype=np.int64, count=len(token_bytes))
    flat = np.frombuffer(b"".join(token_bytes), dtype=np.uint8)
    owner = np.repeat(np.arange(len(token_bytes)), lengths)  # the token of each byte of ``flat``
    index = {}
    for b in b'",]}el \t\n\r':
        has = np.zeros(len(token_bytes), dtype=bool)
        has[owner[flat == b]] = True
        index[b] = has
    with _INDEX_LOCK:
        _INDEX[id(token_bytes)] = (token_bytes, index)
    return index


_MORE: dict[int, tuple[list[bytes], np.ndarray]] = CACHES.table("unique_closing_more", setup=True)


def closing_more(token_bytes: list[bytes]) -> np.ndarray:
    """bool per token: a quote, then later another quote or a closing bracket (once per
    vocabulary). Read inside a string item, only such a token can complete an item other than
    that string: an enclosing array or object, or a second string."""
    with _INDEX_LOCK:
        hit = _MORE.get(id(token_bytes))
        if hit is not None and hit[0] is token_bytes:
            return hit[1]

    def more(data: bytes) -> bool:
        q = data.find(b'"')
        return q >= 0 and any(c in data[q + 1:] for c in b'"]}')

    index = np.fromiter((more(t) for t in token_bytes), dtype=bool, count=len(token_bytes))
    with _INDEX_LOCK:
        _MORE[id(token_bytes)] = (token_bytes, index)
    return index


_CLOSERS: dict[int, tuple[list[bytes], np.ndarray]] = CACHES.table("unique_closer_counts", setup=True)


def closer_counts(token_bytes: list[bytes]) -> np.ndarray:
    """int per token: how many ``]`` and ``}`` bytes it holds (once per vocabulary). A token read
    k containers inside a unique array's item completes that item only if it closes them."""
    with _INDEX_LOCK:
        hit = _CLOSERS.get(id(token_bytes))
        if hit is not None and hit[0] is token_bytes:
            return hit[1]
    counts = np.fromiter((t.count(b"]") + t.count(b"}") for t in token_bytes), dtype=np.int32, count=len(token_bytes))
    with _INDEX_LOCK:
        _CLOSERS[id(token_bytes)] = (token_bytes, counts)
    return counts


_RESERVED: dict[int, tuple[list[bytes], np.ndarray]] = {}


def reserved_tokens(token_bytes: list[bytes]) -> np.ndarray:
    """Ids of the tokens holding the byte 0xFF, the check's duplicate mark (once per vocabulary):
    the grammar accepts that byte only as the mark, so these tokens are never allowed."""
    with _INDEX_LOCK:
        hit = _RESERVED.get(id(token_bytes))
        if hit is not None and hit[0] is token_bytes:
            return hit[1]
    ids = np.array([t for t, data in enumerate(token_bytes) if 0xFF in data], dtype=np.int64)
    with _INDEX_LOCK:
        _RESERVED[id(token_bytes)] = (token_bytes, ids)
    return ids
