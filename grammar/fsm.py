"""Grammar IR -> byte-level NFA with call edges (one sub-automaton per rule).

Every rule becomes a Thompson-style fragment between its own start and final state. A ``Ref`` to
a rule on a cycle becomes a *call edge* ``(rule, return_state)``: the pushdown automaton in
``automaton.py`` pushes the return state and jumps to the callee's start; reaching the callee's
final state pops. References to non-recursive rules are inlined while small, so regular grammars
(regexes, most JSON schemas) end up as one flat NFA whose stacks never grow.

Characters are encoded to UTF-8 here: a ``CharClass`` becomes byte-range sequences (split so each
position is one contiguous byte range), so the automaton only ever sees bytes.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, field

import numpy as np

from . import ir
from .budget import STATE_STEPS, charge
from .errors import GrammarBudgetError
from .rule_graph import RuleGraph, children

# A non-recursive rule referenced once is copied into its caller up to this many states.
INLINE_MAX_STATES = 300
# A subexpression that occurs more than once and needs at least this many states is built once,
# as a rule of its own, and called (its return address goes on the parser stack) instead of
# being copied: front ends repeat big pieces (string bodies, whitespace, any-JSON values).
SHARE_MIN_STATES = 16
# Size estimates are only ever compared with thresholds below this: they stop counting here.
SIZE_CAP = INLINE_MAX_STATES + 1


@dataclass
class ByteNFA:
    """States are numbers 0 .. num_states - 1; edges are flat parallel lists of ints (one entry
    per edge, in no particular order), so building an NFA allocates no container per state: a
    list per state and kind made the garbage collector's passes a tenth of a compile."""

    num_states: int = 0
    eps_src: list[int] = field(default_factory=list)
    eps_dst: list[int] = field(default_factory=list)
    edge_src: list[int] = field(default_factory=list)  # byte edges: src --[lo, hi]--> dst
    edge_lo: list[int] = field(default_factory=list)
    edge_hi: list[int] = field(default_factory=list)
    edge_dst: list[int] = field(default_factory=list)
    call_src: list[int] = field(default_factory=list)  # calls: src --(rule)--> return state
    call_rule: list[int] = field(default_factory=list)
    call_ret: list[int] = field(default_factory=list)
    final_rule: list[int] = field(default_factory=list)  # rule whose final state this is, else -1
    rule_names: list[str] = field(default_factory=list)
    rule_start: list[int] = field(default_factory=list)
    rule_final: list[int] = field(default_factory=list)
    root_rule: int = 0
    recursive: bool = False  # some rule reaches itself: stacks can grow without bound

    @property
    def has_calls(self) -> bool:
        return len(self.call_src) > 0

    _LISTS = ("eps_src", "eps_dst", "edge_src", "edge_lo", "edge_hi", "edge_dst", "call_src", "call_rule", "call_ret",
              "final_rule", "rule_start", "rule_final")

    def to_payload(self) -> dict[str, np.ndarray]:
        """The NFA as flat int32 arrays (what crosses to another process and goes to disk)."""
        out = {name: np.asarray(getattr(self, name), dtype=np.int32) for name in self._LISTS}
        out["header"] = np.array([self.num_states, self.root_rule, int(self.recursive)], dtype=np.int64)
        out["rule_names"] = np.frombuffer("\0".join(self.rule_names).encode("utf-8", "surrogatepass"), dtype=np.uint8)
        return out

    @classmethod
    def from_payload(cls, payload: dict[str, np.ndarray]) -> "ByteNFA":
        """The inverse of :meth:`to_payload` (raises KeyError/ValueError on a damaged payload).
        The edge columns stay int32 arrays (no Python list rebuilt: the caller's GIL is held for
        none of a big grammar's millions of entries)."""
        num_states, root_rule, recursive = (int(x) for x in payload["header"])
        names = bytes(payload["rule_names"]).decode("utf-8", "surrogatepass")
        nfa = cls(num_states=num_states, root_rule=root_rule, recursive=bool(recursive),
                  rule_names=names.split("\0") if names else [],
                  **{name: np.asarray(payload[name], dtype=np.int32) for name in cls._LISTS})
        lengths = {len(nfa.eps_src), len(nfa.eps_dst)}, {len(nfa.edge_src), len(nfa.edge_lo), len(nfa.edge_hi), len(nfa.edge_dst)}
        if any(len(group) != 1 for group in lengths) or len(nfa.final_rule) != num_states or len(nfa.rule_start) != len(nfa.rule_names):
            raise ValueError("inconsistent NFA payload")
        return nfa

    def arrays(self) -> "NFAArrays":
        """The NFA in compressed-row form for the compiled determinizer (built once)."""
        cached = self.__dict__.get("_arrays")
        if cached is None:
            cached = self.__dict__["_arrays"] = NFAArrays.of(self)
        return cached


@dataclass(frozen=True)
class NFAArrays:
    """A :class:`ByteNFA` as int32 arrays: edges of state q at [ptr[q], ptr[q + 1])."""

    e_ptr: np.ndarray
    e_lo: np.ndarray
    e_hi: np.ndarray
    e_dst: np.ndarray
    eps_ptr: np.ndarray
    eps_dst: np.ndarray
    call_ptr: np.ndarray
    call_callee: np.ndarray
    call_ret: np.ndarray
    final_rule: np.ndarray
    rule_start: np.ndarray
    tail_ret: np.ndarray  # bool: a final state with no way on (a call returning here is in tail position)
    has_edges: np.ndarray  # bool

    @classmethod
    def of(cls, nfa: "ByteNFA") -> "NFAArrays":
        n = nfa.num_states
        e_ptr, (e_lo, e_hi, e_dst) = _csr(n, nfa.edge_src, nfa.edge_lo, nfa.edge_hi, nfa.edge_dst)
        eps_ptr, (eps_dst,) = _csr(n, nfa.eps_src, nfa.eps_dst)
        call_ptr, (call_callee, call_ret) = _csr(n, nfa.call_src, nfa.call_rule, nfa.call_ret)
        final_rule = np.array(nfa.final_rule, dtype=np.int32)
        has_edges = np.diff(e_ptr) > 0
        tail_ret = (final_rule >= 0) & ~has_edges & (np.diff(eps_ptr) == 0) & (np.diff(call_ptr) == 0)
        return cls(
            e_ptr, e_lo, e_hi, e_dst, eps_ptr, eps_dst, call_ptr, call_callee, call_ret, final_rule,
            np.array(nfa.rule_start, dtype=np.int32), tail_ret, has_edges,
        )


def _int32(values) -> np.ndarray:
    """A column as int32 (a built NFA holds lists, one read from a payload holds arrays)."""
    if isinstance(values, np.ndarray):
        return values.astype(np.int32, copy=False)
    return np.fromiter(values, dtype=np.int32, count=len(values))


def _csr(n: int, src: list[int], *columns: list[int]) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
    """Row pointers over states 0..n-1 and the columns of edges grouped by source state (a
    stable sort: a state's edges keep the order they were added in)."""
    src_arr = _int32(src)
    order = np.argsort(src_arr, kind="stable")
    ptr = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(np.bincount(src_arr, minlength=n), out=ptr[1:])
    cols = tuple(_int32(c)[order] for c in columns)
    return ptr, cols


@functools.lru_cache(maxsize=4096)
def class_byte_sequences(ranges: tuple[tuple[int, int], ...]) -> tuple[tuple[tuple[int, int], ...], ...]:
    """UTF-8 byte-range sequences of a whole character class (cached: front ends repeat classes)."""
    return tuple(tuple(seq) for lo, hi in ranges for seq in utf8_byte_sequences(lo, hi))


def utf8_byte_sequences(lo: int, hi: int) -> list[list[tuple[int, int]]]:
    """Byte-range sequences whose concatenations are exactly the UTF-8 encodings of ``lo..hi``."""
    out: list[list[tuple[int, int]]] = []
    for a, b in ((0, 0x7F), (0x80, 0x7FF), (0x800, 0xFFFF), (0x10000, 0x10FFFF)):
        l, h = max(lo, a), min(hi, b)
        if l <= h:
            _split_same_length(l, h, out)
    return out


def _split_same_length(lo: int, hi: int, out: list[list[tuple[int, int]]]) -> None:
    work = [(lo, hi)]
    while work:
        lo, hi = work.pop()
        n = len(chr(lo).encode("utf-8", "surrogatepass"))
        for i in range(1, n):
            m = (1 << (6 * i)) - 1
            if lo & ~m != hi & ~m:
                if lo & m:
                    work += [((lo | m) + 1, hi), (lo, lo | m)]
                    break
                if hi & m != m:
                    work += [(hi & ~m, hi), (lo, (hi & ~m) - 1)]
                    break
        else:
            a = chr(lo).encode("utf-8", "surrogatepass")
            b = chr(hi).encode("utf-8", "surrogatepass")
            out.append([(a[i], b[i]) for i in range(n)])


class _Builder:
    def __init__(self, grammar: ir.Grammar, max_states: int) -> None:
        self.grammar = grammar
        self.max_states = max_states
        self.nfa = ByteNFA()
        self.rule_index: dict[str, int] = {}
        graph = RuleGraph.of(grammar)  # validates references, refuses left recursion
        self.recursive = graph.recursive
        self.ref_counts = graph.ref_counts
        self.repeated = graph.repeated  # ids of composite nodes whose value occurs more than once
        self._graph = graph  # keeps the nodes behind those ids alive
        self._shared_ids: dict[int, int] = {}  # id of a repeated expression -> its rule index
        self._size_memo: dict[int, int] = {}
        self._size_keep: list[ir.Expr] = []  # ids in _size_memo stay unique while these live
        self._inline_memo: dict[str, bool] = {}
        self.pending: list[str] = []  # rules allocated but not yet built (no recursion per rule)
        self.shared_rules: dict[ir.Expr, str] = {}
        self.bodies: dict[str, ir.Expr] = dict(grammar.rules)

    # -- states and edges
    def new_state(self) -> int:
        nfa = self.nfa
        n = nfa.num_states
        if n >= self.max_states:
            raise GrammarBudgetError(
                f"grammar needs more than {self.max_states} automaton states (raise CompileBudget.max_nfa_states)"
            )
        if n & 4095 == 4095:  # a block of 4096 states built
            charge("building the automaton", 4096 * STATE_STEPS)
        nfa.num_states = n + 1
        nfa.final_rule.append(-1)
        return n

    def eps(self, s: int, t: int) -> None:
        self.nfa.eps_src.append(s)
        self.nfa.eps_dst.append(t)

    def edge(self, s: int, lo: int, hi: int, t: int) -> None:
        nfa = self.nfa
        nfa.edge_src.append(s)
        nfa.edge_lo.append(lo)
        nfa.edge_hi.append(hi)
        nfa.edge_dst.append(t)

    def call(self, s: int, rule: int, t: int) -> None:
        nfa = self.nfa
        nfa.call_src.append(s)
        nfa.call_rule.append(rule)
        nfa.call_ret.append(t)

    def rule(self, name: str) -> int:
        """Index of rule ``name``, building its fragment on first use."""
        if name in self.rule_index:
            return self.rule_index[name]
        nfa = self.nfa
        idx = len(nfa.rule_names)
        self.rule_index[name] = idx
        start, final = self.new_state(), self.new_state()
        nfa.rule_names.append(name)
        nfa.rule_start.append(start)
        nfa.rule_final.append(final)
        nfa.final_rule[final] = idx
        self.pending.append(name)
        return idx

    def build_pending(self) -> None:
        while self.pending:
            name = self.pending.pop()
            idx = self.rule_index[name]
            self.build(self.bodies[name], self.nfa.rule_start[idx], self.nfa.rule_final[idx], body=True)

    # -- Thompson construction with an explicit work list (no recursion limit on deep IR)
    def build(self, expr: ir.Expr, start: int, end: int, body: bool = False) -> None:
        work: list[tuple[ir.Expr, int, int]] = []
        if body:  # a rule's own body is built in place, never turned into a call to itself
            self._dispatch[type(expr)](self, expr, start, end, work)
        else:
            work.append((expr, start, end))
        while work:
            e, s, t = work.pop()
            self._build_one(e, s, t, work)

    def _build_one(self, e: ir.Expr, s: int, t: int, work: list) -> None:
        if id(e) in self.repeated and self.size(e) >= SHARE_MIN_STATES:
            self._call_shared(e, s, t)
            return
        self._dispatch[type(e)](self, e, s, t, work)

    def _call_shared(self, e: ir.Expr, s: int, t: int) -> None:
        """A call edge to the one rule built for ``e`` (created on first use; value-equal
        expressions share it, looked up by identity first: hashing deep IR is not free)."""
        rule = self._shared_ids.get(id(e))
        if rule is None:
            name = self.shared_rules.get(e)
            if name is None:
                name = self.shared_rules[e] = f"__shared{len(self.shared_rules)}"
                self.bodies[name] = e
            rule = self._shared_ids[id(e)] = self.rule(name)
        self.call(s, rule, t)

    def _empty(self, e: ir.Empty, s: int, t: int, work: list) -> None:
        self.eps(s, t)

    def _nothing(self, e: ir.Nothing, s: int, t: int, work: list) -> None:
        pass

    def _literal(self, e: ir.Literal, s: int, t: int, work: list) -> None:
        data = e.data
        if len(data) == 1:
            self.edge(s, data[0], data[0], t)
            return
        # A chain of len-1 fresh states, allocated at once (long literals and tries are most of
        # a huge constraint's states).
        self._wire_chain(data, s, self._new_chain(len(data) - 1), t)

    def _wire_chain(self, data: bytes, s: int, first: int, t: int) -> None:
        """Edges spelling ``data`` (two bytes or more) from ``s`` to ``t`` through the fresh states
        ``first .. first + len(data) - 2``."""
        nfa = self.nfa
        last = first + len(data) - 2
        inner = data[1:-1]
        nfa.edge_src.append(s)
        nfa.edge_src.extend(range(first, last + 1))
        nfa.edge_lo.append(data[0])
        nfa.edge_lo.extend(inner)
        nfa.edge_lo.append(data[-1])
        nfa.edge_hi.append(data[0])
        nfa.edge_hi.extend(inner)
        nfa.edge_hi.append(data[-1])
        nfa.edge_dst.extend(range(first, last + 1))
        nfa.edge_dst.append(t)

    def _new_chain(self, count: int) -> int:
        """``count`` fresh states with consecutive numbers; returns the first."""
        nfa = self.nfa
        n = nfa.num_states
        if n + count > self.max_states:
            raise GrammarBudgetError(
                f"grammar needs more than {self.max_states} automaton states (raise CompileBudget.max_nfa_states)"
            )
        if (n + count) >> 12 != n >> 12:
            charge("building the automaton", (((n + count) >> 12) - (n >> 12)) * 4096 * STATE_STEPS)
        nfa.num_states = n + count
        nfa.final_rule.extend(itertools.repeat(-1, count))
        return n

    def _byte_class(self, e: ir.ByteClass, s: int, t: int, work: list) -> None:
        for lo, hi in e.ranges:
            self.edge(s, lo, hi, t)

    def _char_class(self, e: ir.CharClass, s: int, t: int, work: list) -> None:
        self._build_char_class(e, s, t)

    def _seq(self, e: ir.Seq, s: int, t: int, work: list) -> None:
        cur = s
        last = len(e.items) - 1
        for i, item in enumerate(e.items):
            nxt = t if i == last else self.new_state()
            work.append((item, cur, nxt))
            cur = nxt

    def _choice(self, e: ir.Choice, s: int, t: int, work: list) -> None:
        work.extend((item, s, t) for item in e.items)

    def _repeat(self, e: ir.Repeat, s: int, t: int, work: list) -> None:
        self._build_repeat(e, s, t, work)

    def _graph(self, e: ir.Graph, s: int, t: int, work: list) -> None:
        if all(type(x) is ir.Literal for _, x, _ in e.edges):
            self._literal_graph(e, s, t)
            return
        nodes: dict[int, int] = {}

        def node(k: int) -> int:
            if k not in nodes:
                nodes[k] = self.new_state()
            return nodes[k]

        self.eps(s, node(e.start))
        for f in e.finals:
            self.eps(node(f), t)
        work.extend((x, node(a), node(b)) for a, x, b in e.edges)

    def _ref(self, e: ir.Ref, s: int, t: int, work: list) -> None:
        if self._should_inline(e.name):
            work.append((self.grammar.rules[e.name], s, t))
        else:
            self.call(s, self.rule(e.name), t)

    def _literal_graph(self, e: ir.Graph, s: int, t: int) -> None:
        """A graph of literal edges (the trie of a big enum or alternation) in two bulk
        allocations: its nodes, then every edge's inner chain states."""
        nodes: dict[int, int] = {e.start: 0}
        for a, _, b in e.edges:
            nodes.setdefault(a, len(nodes))
            nodes.setdefault(b, len(nodes))
        first = self._new_chain(len(nodes))
        node_state = {k: first + i for k, i in nodes.items()}
        cur = self._new_chain(sum(len(x.data) - 1 for _, x, _ in e.edges))
        for a, x, b in e.edges:
            data, na, nb = x.data, node_state[a], node_state[b]  # type: ignore[union-attr]
            if len(data) == 1:
                self.edge(na, data[0], data[0], nb)
            else:
                self._wire_chain(data, na, cur, nb)
                cur += len(data) - 1
        self.eps(s, node_state[e.start])
        for f in e.finals:
            self.eps(node_state[f], t)

    _dispatch = {
        ir.Empty: _empty,
        ir.Nothing: _nothing,
        ir.Literal: _literal,
        ir.ByteClass: _byte_class,
        ir.CharClass: _char_class,
        ir.Seq: _seq,
        ir.Choice: _choice,
        ir.Repeat: _repeat,
        ir.Graph: _graph,
        ir.Ref: _ref,
    }

    def _build_char_class(self, e: ir.CharClass, s: int, t: int) -> None:
        edge = self.edge
        # Share the continuation tails: states keyed by the remaining byte-range suffix.
        tails: dict[tuple[tuple[int, int], ...], int] = {}
        for sequence in class_byte_sequences(e.ranges):
            cur = s
            for i, (blo, bhi) in enumerate(sequence):
                if i == len(sequence) - 1:
                    edge(cur, blo, bhi, t)
                    break
                rest = sequence[i + 1 :]
                nxt = tails.get(rest) if i > 0 else None
                if nxt is None:
                    nxt = self.new_state()
                    if i > 0:
                        tails[rest] = nxt
                edge(cur, blo, bhi, nxt)
                cur = nxt

    def _build_repeat(self, e: ir.Repeat, s: int, t: int, work: list) -> None:
        copies = e.min if e.max is None else e.max
        # A big item repeated a counted number of times (a JSON string character under
        # maxLength: 32767) is built once and called from each position: 2 states a copy.
        shared = copies > 1 and self.size(e.item) >= SHARE_MIN_STATES
        need = (2 if shared else self.size(e.item)) * max(copies, 1)
        if self.nfa.num_states + need > self.max_states:
            raise GrammarBudgetError(
                f"repetition {{{e.min},{e.max}}} needs about {need} automaton states, over the budget of {self.max_states}"
            )

        def item(a: int, b: int) -> None:
            if shared:
                self._call_shared(e.item, a, b)
            else:
                work.append((e.item, a, b))

        cur = s
        for _ in range(e.min):
            nxt = self.new_state()
            item(cur, nxt)
            cur = nxt
        if e.max is None:
            loop = self.new_state()  # fresh, so the loop never leaks into sibling branches
            self.eps(cur, loop)
            item(loop, loop)
            self.eps(loop, t)
            return
        self.eps(cur, t)
        for i in range(e.max - e.min):
            nxt = t if i == e.max - e.min - 1 else self.new_state()
            item(cur, nxt)
            if nxt != t:
                self.eps(nxt, t)
            cur = nxt

    # -- size estimates for budgets and inlining
    def size(self, e: ir.Expr) -> int:
        """Estimated NFA states of ``e``, or ``SIZE_CAP`` for every estimate at or above it.

        Every decision compares an estimate with a threshold below the cap (sharing, inlining,
        a repetition's budget), so the walk stops adding children once a node reaches it: sizing
        a big rule body visits a few hundred nodes, not all of them. Depth-first over distinct
        nodes with an explicit stack (no recursion however deep the IR)."""
        memo = self._size_memo
        got = memo.get(id(e))
        if got is not None:
            return got
        stack = [self._size_frame(e)]
        while stack:
            frame = stack[-1]
            node, kids, i, total = frame
            while i < len(kids) and total < SIZE_CAP:
                child = kids[i]
                value = memo.get(id(child))
                if value is None:
                    break
                total += self._size_share(node, child, value)
                i += 1
            else:
                memo[id(node)] = min(total, SIZE_CAP)
                self._size_keep.append(node)
                stack.pop()
                continue
            frame[2], frame[3] = i, total
            stack.append(self._size_frame(kids[i]))
        return memo[id(e)]

    def _size_frame(self, e: ir.Expr) -> list:
        """``[node, the children its estimate adds up, next child, the sum so far]``."""
        kind = type(e)
        if kind is ir.Seq or kind is ir.Choice:
            return [e, e.items, 0, 1]
        if kind is ir.Repeat:
            return [e, (e.item,), 0, 1]
        if kind is ir.Graph:
            return [e, tuple(x for _, x, _ in e.edges), 0, 1 + len(e.edges)]
        if kind is ir.Ref:
            if e.name in self.recursive:
                return [e, (), 0, 1]
            return [e, (self.grammar.rules[e.name],), 0, 0]
        if kind is ir.Literal:
            return [e, (), 0, len(e.data)]
        if kind is ir.CharClass:
            # One state per UTF-8 byte of each byte-range sequence (an upper bound: tails are
            # shared); "any character" is about a dozen, enough to be built once and called
            # when repeated thousands of times ([\s\S]{100000}).
            return [e, (), 0, 1 + sum(len(seq) - 1 for seq in class_byte_sequences(e.ranges))]
        return [e, (), 0, 1]

    def _size_share(self, parent: ir.Expr, child: ir.Expr, size: int) -> int:
        """What ``child``, estimated at ``size``, adds to ``parent``'s estimate."""
        kind = type(parent)
        if kind is ir.Ref:
            return size if self._should_inline(parent.name) else 1
        if kind is ir.Repeat:
            copies = max(parent.min if parent.max is None else parent.max, 1)
            if copies > 1 and size >= SHARE_MIN_STATES:
                return 2 * copies  # built once, called from every copy
            return copies * (1 if size >= SHARE_MIN_STATES and id(child) in self.repeated else size)
        # A big child that occurs more than once is built once and called: one edge here
        # (counting it in full makes nested arrays, whose item occurs twice, look exponential).
        return 1 if size >= SHARE_MIN_STATES and id(child) in self.repeated else size

    def _should_inline(self, name: str) -> bool:
        ok = self._inline_memo.get(name)
        if ok is None:
            if name in self.recursive:
                ok = False
            else:
                size = self.size(self.grammar.rules[name])
                ok = size < SHARE_MIN_STATES or (self.ref_counts.get(name, 0) <= 1 and size <= INLINE_MAX_STATES)
            self._inline_memo[name] = ok
        return ok


def build_nfa(grammar: ir.Grammar, max_states: int = 2_000_000) -> ByteNFA:
    """Compile ``grammar`` into a :class:`ByteNFA` (raising GrammarBudgetError past ``max_states``
    states or past the current compile deadline, see ``budget``)."""
    builder = _Builder(grammar, max_states)
    builder.nfa.root_rule = builder.rule(grammar.root)
    builder.build_pending()
    builder.nfa.recursive = bool(builder.recursive)
    return builder.nfa
