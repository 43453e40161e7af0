"""``uniqueItems`` in the matcher: a JSON scanner that marks every item equal to an earlier one.

Uniqueness of items from an infinite domain is not regular, so the grammar accepts duplicates and
this :class:`~grammar.text_check.TextCheck` finds them. *Where* arrays may have to be unique
comes from the structure graph of ``unique`` (each open container holds the set of graph nodes
that apply to it, every branch of a union included). *What* is checked here: an incremental
JSON scanner over the bytes the grammar accepted. When an item of such an array completes
(closing quote, closing bracket, the end of a number or literal), its text is parsed and
compared by JSON value with the earlier items: numbers are equal when equal as exact decimals
*or* as floats (what jsonschema compares), objects regardless of key order, and ``true`` is not
``1``.

A duplicate is not refused here: the scanner writes the byte ``MARK`` (0xFF, never part of UTF-8
text) right after the item into what the automaton reads. The lowering lets only arrays that
allow duplicates accept the mark (``Lowerer.item``), so the automaton itself drops exactly the
branches that required *this* array to be unique and keeps the others (``anyOf: [{}, {uniqueItems:
true, ...}]`` accepts ``[1, 1]`` through its first branch). Each array has its own marks, so
nested arrays, ``oneOf``, ``not``-free ``if``/``then``/``else`` and object properties follow.
Tokens holding a raw 0xFF byte are never allowed (``reserved``).

Scanner states are immutable (the text so far is a linked list of chunks), so matchers copy and
roll back by keeping references. ``banned`` simulates the allowed tokens that could complete an
item (a quote inside a string, a delimiter after a number...), and bans those whose marked text
the automaton refuses. Token indexes per vocabulary live in ``unique_tokens``, value equality in
``unique_values``.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from .unique_tokens import byte_index, closer_counts, closing_index, closing_more, reserved_tokens
from .unique_values import equality_keys

if TYPE_CHECKING:
    from .unique import Node

MARK = 0xFF  # written after a duplicate item; no UTF-8 text contains this byte
VALUE, AFTER, KEY_FIRST, KEY, COLON, STRING, NUMBER, LITERAL, DONE = range(9)
_WS = frozenset(b" \t\n\r")
_NUMBER_CHARS = frozenset(b"0123456789+-.eE")
_LITERALS = {ord("t"): b"rue", ord("f"): b"alse", ord("n"): b"ull"}


# ---------------------------------------------------------------------------- what


@dataclass(frozen=True)
class _Text:
    prev: "_Text | None"
    chunk: bytes
    end: int  # offset just after ``chunk``


def _slice(text: _Text | None, start: int, end: int) -> bytes:
    parts = []
    while text is not None and text.end > start:
        lo = text.end - len(text.chunk)
        a, b = max(start - lo, 0), min(end - lo, len(text.chunk))
        if a < b:
            parts.append(text.chunk[a:b])
        text = text.prev
    return b"".join(reversed(parts))


@dataclass(frozen=True)
class _Frame:
    array: bool
    nodes: frozenset[int]
    unique: bool
    seen: frozenset = frozenset()  # equality keys of the completed items (unique arrays)
    index: int = -1  # index of the current item (arrays)
    key: str | None = None  # current member key (objects)
    item_start: int = 0  # where the current item began (unique arrays)


@dataclass(frozen=True)
class ScanState:
    mode: int = VALUE
    frames: tuple[_Frame, ...] = ()
    text: _Text | None = None
    pos: int = 0
    lex_start: int = 0  # where the current string / number / literal began
    is_key: bool = False
    esc: int = 0  # 0, 1 after a backslash, 2..5 hex digits of \uXXXX read
    lit: bytes = b""  # the rest of true / false / null
    root_done: bool = False


class UniqueItemsCheck:
    """The :class:`~grammar.text_check.TextCheck` of a schema with ``uniqueItems``."""

    def __init__(self, nodes: list["Node"], relevant: list[bool]) -> None:
        self._nodes = nodes
        self._relevant = relevant
        self._lock = threading.Lock()
        self._children: dict[tuple[frozenset[int], Any], frozenset[int]] = {}

    # -- structure
    def _child_nodes(self, nodes: frozenset[int], step: Any) -> frozenset[int]:
        key = (nodes, step)
        with self._lock:
            hit = self._children.get(key)
        if hit is not None:
            return hit
        out: set[int] = set()
        for n in nodes:
            node = self._nodes[n]
            if isinstance(step, str):
                out.update(node.names.get(step, ()))
                out.update(j for lang, j in node.langs if lang.may_accept(step))
            else:
                out.update(j for lo, hi, j in node.indexes if lo <= step and (hi is None or step <= hi))
        res = frozenset(j for j in out if self._relevant[j])
        with self._lock:
            if len(self._children) > 100_000:
                self._children.clear()
            self._children[key] = res
        return res

    def _unique(self, nodes: frozenset[int]) -> bool:
        return any(self._nodes[n].unique for n in nodes)

    # -- TextCheck
    def prepare(self, token_bytes: list[bytes]) -> None:
        byte_index(token_bytes)
        closer_counts(token_bytes)
        closing_index(token_bytes)
        closing_more(token_bytes)
        reserved_tokens(token_bytes)

    def reserved(self, token_bytes: list[bytes]) -> np.ndarray:
        return reserved_tokens(token_bytes)

    def start(self) -> ScanState:
        return ScanState()

    def may_ban(self, state: ScanState) -> bool:
        return any(f.unique and f.seen for f in state.frames)

    def feed(self, state: ScanState, data: bytes) -> tuple[ScanState, bytes] | None:
        if not data:
            return state, data
        if MARK in data:
            return None  # the mark is the check's to write, never the model's
        return _Scan(self, state, data).run()

    def banned(
        self, state: ScanState, token_bytes: list[bytes], allowed: np.ndarray, alive: Callable[[bytes], bool]
    ) -> np.ndarray:
        if not self.may_ban(state):
            return np.zeros(0, dtype=np.int64)
        quick = _string_item_bans(state, token_bytes)
        if quick is not None:
            candidates = _members(quick, allowed)
            if any(g.unique and g.seen for g in state.frames[:-1]):
                # An enclosing unique array has items: a token that goes on past the closing
                # quote (closing brackets, another string) may complete one of its items too.
                more = allowed[closing_more(token_bytes)[allowed]]
                candidates = np.union1d(candidates, more)
        else:
            has = byte_index(token_bytes)
            mask = np.zeros(len(allowed), dtype=bool)
            for b in _enders(state.mode):
                if b == ord('"') and state.mode != STRING:
                    # Outside a string, a string item completes only if the token both opens and
                    # closes it: one quote alone cannot complete anything here.
                    mask |= closing_more(token_bytes)[allowed] & has[b][allowed]
                    continue
                mask |= has[b][allowed]
            closes = _closes_needed(state)
            if closes:
                mask &= closer_counts(token_bytes)[allowed] >= closes
            candidates = allowed[mask]
        out = []
        for t in candidates.tolist():
            data = token_bytes[t]
            fed = self.feed(state, data)
            if fed is None or (len(fed[1]) != len(data) and not alive(fed[1])):
                out.append(t)
        return np.array(out, dtype=np.int64)


def _members(ids: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """The ``ids`` found in the sorted array ``allowed`` (no sort of the large side)."""
    if not len(ids) or not len(allowed):
        return np.zeros(0, dtype=np.int64)
    at = np.minimum(np.searchsorted(allowed, ids), len(allowed) - 1)
    return ids[allowed[at] == ids].astype(np.int64)


def _closes_needed(state: ScanState) -> int:
    """How many containers a token must close before an item of a unique array with items can
    complete: those open inside the innermost such array (an object item: 1)."""
    for depth, f in enumerate(reversed(state.frames)):
        if f.array and f.unique and f.seen:
            return depth
    return 0


def _enders(mode: int) -> bytes:
    """Bytes that can complete an item from a scanner in ``mode`` (a cheap filter)."""
    if mode == STRING:
        return b'"'
    if mode == NUMBER:
        return b",]} \t\n\r"
    if mode == LITERAL:
        return b"el"
    return b'",]}el'


def _string_item_bans(state: ScanState, token_bytes: list[bytes]) -> np.ndarray | None:
    """Inside a string that is itself an item of a unique array (and no other unique array has
    items yet): the tokens whose text up to their closing quote completes an earlier item,
    looked up by decoded content instead of simulated. None where this shortcut does not apply
    (mid-escape, a partial character). Tokens that could complete more than this string are the
    caller's to simulate."""
    f = state.frames[-1] if state.frames else None
    if state.mode != STRING or state.is_key or state.esc or f is None or not (f.array and f.unique):
        return None
    try:
        cur = json.loads(b'"' + _slice(state.text, state.lex_start + 1, state.pos) + b'"')
    except ValueError:
        return None
    index = closing_index(token_bytes)
    out: list[int] = []
    for key in f.seen:
        if key.startswith('"'):
            earlier = json.loads(key)
            if earlier.startswith(cur):
                out += index.get(earlier[len(cur):], ())
    return np.array(sorted(set(out)), dtype=np.int64)


class _Scan:
    """One ``feed``: mutable copies of the state's fields, written back at the end."""

    def __init__(self, check: UniqueItemsCheck, s: ScanState, data: bytes) -> None:
        self.check = check
        self.mode, self.frames, self.pos = s.mode, list(s.frames), s.pos
        self.lex_start, self.is_key, self.esc, self.lit = s.lex_start, s.is_key, s.esc, s.lit
        self.root_done = s.root_done
        self.text = _Text(s.text, data, s.pos + len(data))
        self.data = data
        self.base = s.pos
        self.marks: list[int] = []  # offsets into ``data`` where a duplicate item ends

    def run(self) -> tuple[ScanState, bytes]:
        for b in self.data:
            self.byte(b)
            self.pos += 1
        state = ScanState(self.mode, tuple(self.frames), self.text, self.pos, self.lex_start, self.is_key, self.esc, self.lit, self.root_done)
        data = self.data
        if self.marks:
            parts, last = [], 0
            for at in self.marks:
                parts += [data[last:at], bytes([MARK])]
                last = at
            parts.append(data[last:])
            data = b"".join(parts)
        return state, data

    def byte(self, b: int) -> None:
        mode = self.mode
        if mode == STRING:
            self.string_byte(b)
        elif mode == NUMBER:
            if b not in _NUMBER_CHARS:
                self.complete(self.pos)
                self.byte(b)
        elif mode == LITERAL:
            self.lit = self.lit[1:]
            if not self.lit:
                self.complete(self.pos + 1)
        elif b in _WS:
            pass
        elif mode in (VALUE, DONE):
            self.value_start(b)
        elif mode == AFTER:
            if b == ord(","):
                self.mode = VALUE if self.frames[-1].array else KEY
            else:  # ']' or '}'
                self.close()
        elif mode in (KEY, KEY_FIRST):
            if b == ord("}"):
                self.close()
            else:
                self.mode, self.lex_start, self.is_key, self.esc = STRING, self.pos, True, 0
        elif mode == COLON:
            self.mode = VALUE

    def value_start(self, b: int) -> None:
        if b == ord("]"):  # right after '[': the empty array
            self.close()
            return
        if self.frames and self.frames[-1].array:
            f = self.frames[-1]
            self.frames[-1] = replace(f, index=f.index + 1, item_start=self.pos)
        if b in (ord("{"), ord("[")):
            array = b == ord("[")
            nodes = self.child_nodes()
            self.frames.append(_Frame(array, nodes, array and self.check._unique(nodes)))
            self.mode = VALUE if array else KEY_FIRST
        elif b == ord('"'):
            self.mode, self.lex_start, self.is_key, self.esc = STRING, self.pos, False, 0
        elif b in _LITERALS:
            self.mode, self.lex_start, self.lit = LITERAL, self.pos, _LITERALS[b]
        else:
            self.mode, self.lex_start = NUMBER, self.pos

    def child_nodes(self) -> frozenset[int]:
        if not self.frames:
            return frozenset([0]) if self.check._relevant[0] else frozenset()
        f = self.frames[-1]
        if not f.nodes:
            return frozenset()
        return self.check._child_nodes(f.nodes, f.index if f.array else f.key)

    def string_byte(self, b: int) -> None:
        if self.esc == 1:
            self.esc = 2 if b == ord("u") else 0
        elif self.esc >= 2:
            self.esc = 0 if self.esc == 5 else self.esc + 1
        elif b == ord("\\"):
            self.esc = 1
        elif b == ord('"'):
            if self.is_key:
                f = self.frames[-1]
                key = json.loads(_slice(self.text, self.lex_start, self.pos + 1)) if f.nodes else None
                self.frames[-1] = replace(f, key=key)
                self.mode = COLON
            else:
                self.complete(self.pos + 1)

    def close(self) -> None:
        self.frames.pop()
        self.complete(self.pos + 1)

    def complete(self, end: int) -> None:
        """A value ended just before ``end``: compare it with its array's earlier items, and
        mark it there if it repeats one."""
        if self.frames:
            f = self.frames[-1]
            if f.array and f.unique:
                keys = equality_keys(_slice(self.text, f.item_start, end))
                if keys & f.seen:
                    self.marks.append(end - self.base)
                else:
                    self.frames[-1] = replace(f, seen=f.seen | keys)
            self.mode = AFTER
        else:
            self.mode = DONE
