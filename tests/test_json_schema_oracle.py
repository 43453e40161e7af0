"""A tiny reference interpreter for the grammar IR (set-of-end-positions semantics), used by the
JSON Schema tests to check acceptance independently of the compiler and matcher."""

from __future__ import annotations

import sys

import pytest

from grammar import ir

sys.setrecursionlimit(max(sys.getrecursionlimit(), 20000))


class IRMatcher:
    def __init__(self, grammar: ir.Grammar) -> None:
        self.rules = grammar.rules
        self.root = grammar.root

    def matches(self, data: bytes) -> bool:
        self.data = data
        self.memo: dict[tuple[int, int], frozenset[int]] = {}
        return len(data) in self._ends(ir.Ref(self.root), 0)

    def _char_at(self, pos: int) -> tuple[int, int] | None:
        d = self.data
        if pos >= len(d):
            return None
        b = d[pos]
        n = 1 if b < 0x80 else 2 if b >> 5 == 6 else 3 if b >> 4 == 14 else 4 if b >> 3 == 30 else 0
        if not n:
            return None
        try:
            ch = d[pos : pos + n].decode("utf-8")
        except UnicodeDecodeError:
            return None
        return (ord(ch), pos + n) if len(ch) == 1 else None

    def _ends(self, e: ir.Expr, pos: int) -> frozenset[int]:
        key = (id(e), pos)
        if key in self.memo:
            return self.memo[key]
        self.memo[key] = frozenset()  # guard against (refused) left recursion
        out = self._compute(e, pos)
        self.memo[key] = out
        return out

    def _compute(self, e: ir.Expr, pos: int) -> frozenset[int]:
        d = self.data
        if isinstance(e, ir.Empty):
            return frozenset([pos])
        if isinstance(e, ir.Nothing):
            return frozenset()
        if isinstance(e, ir.Literal):
            return frozenset([pos + len(e.data)]) if d.startswith(e.data, pos) else frozenset()
        if isinstance(e, ir.ByteClass):
            ok = pos < len(d) and any(lo <= d[pos] <= hi for lo, hi in e.ranges)
            return frozenset([pos + 1]) if ok else frozenset()
        if isinstance(e, ir.CharClass):
            c = self._char_at(pos)
            if c and any(lo <= c[0] <= hi for lo, hi in e.ranges):
                return frozenset([c[1]])
            return frozenset()
        if isinstance(e, ir.Ref):
            return self._ends(self.rules[e.name], pos)
        if isinstance(e, ir.Choice):
            out: set[int] = set()
            for item in e.items:
                out |= self._ends(item, pos)
            return frozenset(out)
        if isinstance(e, ir.Seq):
            cur = {pos}
            for item in e.items:
                cur = {q for p in cur for q in self._ends(item, p)}
                if not cur:
                    break
            return frozenset(cur)
        if isinstance(e, ir.Graph):
            seen_nodes = {(e.start, pos)}
            todo, ends = [(e.start, pos)], set()
            while todo:
                node, p = todo.pop()
                if node in e.finals:
                    ends.add(p)
                for a, x, b in e.edges:
                    if a == node:
                        for q in self._ends(x, p):
                            if (b, q) not in seen_nodes:
                                seen_nodes.add((b, q))
                                todo.append((b, q))
            return frozenset(ends)
        if isinstance(e, ir.Repeat):
            result = {pos} if e.min == 0 else set()
            frontier, count, seen = {pos}, 0, {pos}
            while frontier and (e.max is None or count < e.max):
                frontier = {q for p in frontier for q in self._ends(e.item, p)}
                count += 1
                if e.max is None and count > e.min:
                    frontier -= seen
                    seen |= frontier
                if count >= e.min:
                    result |= frontier
            return frozenset(result)
        raise TypeError(e)


def ir_accepts(grammar: ir.Grammar, text: str | bytes) -> bool:
    data = text.encode("utf-8") if isinstance(text, str) else text
    return IRMatcher(grammar).matches(data)


def test_interpreter_basics() -> None:
    g = ir.Grammar({"root": ir.seq(ir.literal("a"), ir.Ref("r")), "r": ir.choice(ir.EMPTY, ir.seq(ir.literal("("), ir.Ref("r"), ir.literal(")")))})
    assert ir_accepts(g, "a((()))")
    assert not ir_accepts(g, "a(()")
    g2 = ir.Grammar({"root": ir.repeat(ir.char_class([(0x61, 0x62), (0xE9, 0xE9)]), 2, 3)})
    assert ir_accepts(g2, "aé") and ir_accepts(g2, "abb") and not ir_accepts(g2, "a") and not ir_accepts(g2, "abab")
    with pytest.raises(AssertionError):
        assert ir_accepts(g2, "c")
