"""Character-level IR -> NFA -> DFA (subset construction), for ``char_dfa``.

Thompson construction over code point ranges, with two zero-width edges for strict anchors:
``START`` passes only before the first character, ``END`` only after the last. Subset
construction keeps, per DFA state, disjoint code point intervals per move; the result is
tabulated and minimized by ``char_dfa_kernels``.
"""

from __future__ import annotations

from functools import lru_cache

from . import ir
from .char_dfa_kernels import END, MAX_DFA_STATES, MAX_NFA_STATES, START, CharDFA, minimize, tabulate
from .errors import GrammarBudgetError, GrammarError



class _NFA:
    def __init__(self) -> None:
        self.eps: list[list[int]] = []
        self.ranges: list[list[tuple[int, int, int]]] = []
        self.starts: list[list[int]] = []  # edges passable only before the first character
        self.ends: list[list[int]] = []  # edges passable only after the last character

    def new(self) -> int:
        if len(self.eps) >= MAX_NFA_STATES:
            raise GrammarBudgetError(f"regular expression needs more than {MAX_NFA_STATES} automaton states")
        for lst in (self.eps, self.ranges, self.starts, self.ends):
            lst.append([])
        return len(self.eps) - 1

    def build(self, expr: ir.Expr, s: int, t: int) -> None:
        work = [(expr, s, t)]
        while work:
            e, a, b = work.pop()
            if isinstance(e, ir.Empty):
                self.eps[a].append(b)
            elif isinstance(e, ir.Nothing):
                pass
            elif isinstance(e, ir.CharClass):
                self.ranges[a].extend((lo, hi, b) for lo, hi in e.ranges)
            elif isinstance(e, ir.Literal):
                text = e.data.decode("utf-8")
                cur = a
                for i, ch in enumerate(text):
                    nxt = b if i == len(text) - 1 else self.new()
                    self.ranges[cur].append((ord(ch), ord(ch), nxt))
                    cur = nxt
            elif e == START:
                self.starts[a].append(b)
            elif e == END:
                self.ends[a].append(b)
            elif isinstance(e, ir.Seq):
                cur = a
                for i, item in enumerate(e.items):
                    nxt = b if i == len(e.items) - 1 else self.new()
                    work.append((item, cur, nxt))
                    cur = nxt
            elif isinstance(e, ir.Choice):
                work.extend((item, a, b) for item in e.items)
            elif isinstance(e, ir.Repeat):
                self._repeat(e, a, b, work)
            elif isinstance(e, ir.Graph):
                nodes = {k: self.new() for k in {e.start, *e.finals, *(x for x, _, _ in e.edges), *(y for _, _, y in e.edges)}}
                self.eps[a].append(nodes[e.start])
                for f in e.finals:
                    self.eps[nodes[f]].append(b)
                work.extend((x, nodes[p], nodes[q]) for p, x, q in e.edges)
            else:
                raise GrammarError(f"a {type(e).__name__} is not a character-level regular expression")

    def _repeat(self, e: ir.Repeat, a: int, b: int, work: list) -> None:
        cur = a
        for _ in range(e.min):
            nxt = self.new()
            work.append((e.item, cur, nxt))
            cur = nxt
        if e.max is None:
            loop = self.new()
            self.eps[cur].append(loop)
            work.append((e.item, loop, loop))
            self.eps[loop].append(b)
            return
        self.eps[cur].append(b)
        for _ in range(e.max - e.min):
            nxt = self.new()
            work.append((e.item, cur, nxt))
            self.eps[nxt].append(b)
            cur = nxt


def _closure(nfa: _NFA, seeds, at_start: bool) -> frozenset[int]:
    seen = set(seeds)
    todo = list(seen)
    while todo:
        q = todo.pop()
        nxt = nfa.eps[q] + nfa.starts[q] if at_start else nfa.eps[q]
        for r in nxt:
            if r not in seen:
                seen.add(r)
                todo.append(r)
    return frozenset(seen)


def _accepts_here(nfa: _NFA, states: frozenset[int], final: int, at_start: bool) -> bool:
    """Whether ``final`` is reachable without consuming: through ``$`` edges too (we are at the end)."""
    seen = set(states)
    todo = list(seen)
    while todo:
        q = todo.pop()
        if q == final:
            return True
        nxt = nfa.eps[q] + nfa.ends[q] + (nfa.starts[q] if at_start else [])
        for r in nxt:
            if r not in seen:
                seen.add(r)
                todo.append(r)
    return False


def _moves(nfa: _NFA, states: frozenset[int]) -> list[tuple[int, int, frozenset[int]]]:
    """(lo, hi, target NFA states) over disjoint code point intervals."""
    events: dict[int, list[tuple[int, int]]] = {}
    for q in states:
        for lo, hi, t in nfa.ranges[q]:
            events.setdefault(lo, []).append((1, t))
            events.setdefault(hi + 1, []).append((-1, t))
    out: list[tuple[int, int, frozenset[int]]] = []
    active: dict[int, int] = {}
    points = sorted(events)
    for i, p in enumerate(points[:-1]):
        for delta, t in events[p]:
            active[t] = active.get(t, 0) + delta
            if not active[t]:
                del active[t]
        if active:
            out.append((p, points[i + 1] - 1, frozenset(active)))
    return out


@lru_cache(maxsize=512)
def build(expr: ir.Expr) -> CharDFA:
    """The minimal DFA of a character-level IR expression."""
    nfa = _NFA()
    start, final = nfa.new(), nfa.new()
    nfa.build(expr, start, final)
    first = _closure(nfa, [start], True)
    ids: dict[frozenset[int], int] = {first: 0}
    order = [first]
    rows: list[list[tuple[int, int, int]]] = []
    accepting: list[bool] = []
    i = 0
    while i < len(order):
        cur = order[i]
        at_start = i == 0
        accepting.append(_accepts_here(nfa, cur, final, at_start))
        row = []
        for lo, hi, targets in _moves(nfa, cur):
            nxt = _closure(nfa, targets, False)
            j = ids.get(nxt)
            if j is None:
                if len(order) >= MAX_DFA_STATES:
                    raise GrammarBudgetError(f"regular expression needs more than {MAX_DFA_STATES} DFA states")
                j = ids[nxt] = len(order)
                order.append(nxt)
            row.append((lo, hi, j))
        rows.append(row)
        i += 1
    return minimize(tabulate(rows, accepting))
