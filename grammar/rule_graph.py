"""What the NFA builder needs to know about a grammar's rules, found in one pass over the IR.

Front ends build IR as a DAG with heavy sharing (the same string body under every property), so
everything here visits each distinct node once, without recursion however deep the nesting:

- which rules each rule references (undefined references are errors), and which rules lie on a
  reference cycle (those are called through the parser stack, never inlined);
- which composite subexpressions occur more than once (by value: big repeated pieces are built
  once and called) and how often each rule is referenced;
- left recursion (a rule reaching itself before consuming input), refused with a clear error.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import ir
from .errors import GrammarError

_NO_REFS: frozenset[str] = frozenset()


@dataclass
class RuleGraph:
    refs: dict[str, frozenset[str]]  # rule -> the rules its body references
    recursive: set[str]  # rules on a reference cycle
    repeated: set[int]  # ids of composite nodes whose value occurs more than once as a child
    ref_counts: dict[str, int]  # rule -> times it is referenced
    components: list[list[str]]  # strongly connected components, callees before callers
    nodes: list[ir.Expr]  # every distinct node (keeps the ids above meaningful)

    @classmethod
    def of(cls, grammar: ir.Grammar) -> "RuleGraph":
        refs, repeated, ref_counts, nodes = _scan(grammar)
        if grammar.root not in grammar.rules:
            raise GrammarError(f"root rule {grammar.root!r} is not defined")
        for name, used in refs.items():
            for ref in sorted(used):
                if ref not in grammar.rules:
                    raise GrammarError(f"rule {name!r} references undefined rule {ref!r}")
        components = strongly_connected_components(refs)
        recursive = on_cycles(components, refs)
        graph = cls(refs, recursive, repeated, ref_counts, components, nodes)
        if recursive:  # left recursion needs a reference cycle
            graph.check_left_recursion(grammar)
        return graph

    def check_left_recursion(self, grammar: ir.Grammar) -> None:
        """Refuse a grammar where a rule reachable from the root can reach itself before
        consuming a byte (its parser stack would grow without bound)."""
        # Left refs are needed for recursive rules only, and their nullability depends only on
        # the rules those reach: the rest of a big schema stays out of the fixpoint.
        reachable = self._reachable_from(self.recursive & self._reachable_from({grammar.root}))
        components = [[n for n in c if n in reachable] for c in self.components]
        nullable = _nullable_rules(grammar, [c for c in components if c], self.recursive)
        memo: dict[int, bool] = {}
        # A left cycle runs through rules of one reference cycle: only those need their left refs.
        left = {name: _left_refs(grammar.rules[name], nullable, memo) for name in reachable & self.recursive}
        for name in sorted(left):
            seen: set[str] = set()
            todo = list(left[name])
            while todo:
                x = todo.pop()
                if x == name:
                    raise GrammarError(
                        f"rule {name!r} is left-recursive (it can reach itself without consuming input); "
                        "rewrite it with repetition, e.g. `a ::= b (op b)*`"
                    )
                if x not in seen:
                    seen.add(x)
                    todo.extend(left.get(x, ()))

    def _reachable_from(self, roots: set[str]) -> set[str]:
        seen, todo = set(roots), list(roots)
        while todo:
            for ref in self.refs[todo.pop()]:
                if ref not in seen:
                    seen.add(ref)
                    todo.append(ref)
        return seen


def children(e: ir.Expr) -> tuple[ir.Expr, ...]:
    if isinstance(e, (ir.Seq, ir.Choice)):
        return e.items
    if isinstance(e, ir.Repeat):
        return (e.item,)
    if isinstance(e, ir.Graph):
        return tuple(x for _, x, _ in e.edges)
    return ()


def _graph_reach(g: ir.Graph, passable) -> set[int]:  # type: ignore[no-untyped-def]
    """Nodes of ``g`` reachable from its start through edges whose expression is ``passable``."""
    reached, todo = {g.start}, [g.start]
    while todo:
        a = todo.pop()
        for src, x, dst in g.edges:
            if src == a and dst not in reached and passable(x):
                reached.add(dst)
                todo.append(dst)
    return reached


def _scan(grammar: ir.Grammar) -> tuple[dict[str, frozenset[str]], set[int], dict[str, int], list[ir.Expr]]:
    """Referenced rules per rule (bottom-up sets per distinct node), the ids of composite nodes
    whose value occurs more than once as a child, how often each rule is referenced."""
    node_refs: dict[int, frozenset[str]] = {}
    canon: dict[ir.Expr, ir.Expr] = {}  # value -> the first node seen with it
    canon_of: dict[int, int] = {}  # node id -> id of its value's first node
    count: dict[int, int] = {}  # id of a value's first node -> times the value occurs as a child
    ref_counts: dict[str, int] = {}
    keep_alive = []  # ids are only unique while the nodes live
    # Every node is examined on the stack's top until its children are done (a composite node
    # twice: once to push them, once to finish); type tests and loops are inlined, this pass
    # sees every node of a grammar.
    seq, choice, repeat, graph, ref = ir.Seq, ir.Choice, ir.Repeat, ir.Graph, ir.Ref
    for body in grammar.rules.values():
        stack: list[ir.Expr] = [body]
        while stack:
            e = stack[-1]
            key = id(e)
            if key in node_refs:
                stack.pop()
                continue
            kind = type(e)
            if kind is seq or kind is choice:
                kids = e.items  # type: ignore[union-attr]
            elif kind is repeat:
                kids = (e.item,)  # type: ignore[union-attr]
            elif kind is graph:
                kids = children(e)
            else:
                node_refs[key] = frozenset((e.name,)) if kind is ref else _NO_REFS  # type: ignore[union-attr]
                keep_alive.append(e)
                stack.pop()
                continue
            waiting = False
            for child in kids:
                if id(child) not in node_refs:
                    stack.append(child)
                    waiting = True
            if waiting:
                continue
            stack.pop()
            found = _NO_REFS
            for child in kids:
                refs = node_refs[id(child)]
                if refs:
                    found = found | refs if found else refs
                ckind = type(child)
                if ckind is seq or ckind is choice or ckind is repeat or ckind is graph:
                    # Children are done before their parents, so hashing a child never recurses
                    # deeper than its own children.
                    first = canon_of.get(id(child))
                    if first is None:
                        first = canon_of[id(child)] = id(canon.setdefault(child, child))
                    count[first] = count.get(first, 0) + 1
                elif ckind is ref:
                    ref_counts[child.name] = ref_counts.get(child.name, 0) + 1  # type: ignore[union-attr]
            node_refs[key] = found
            keep_alive.append(e)
        if isinstance(body, ir.Ref):
            ref_counts[body.name] = ref_counts.get(body.name, 0) + 1
    repeated = {nid for nid, first in canon_of.items() if count[first] > 1}
    return {name: node_refs[id(body)] for name, body in grammar.rules.items()}, repeated, ref_counts, keep_alive


def on_cycles(components: list[list[str]], graph: dict[str, frozenset[str]]) -> set[str]:
    """Nodes on a cycle of ``graph``: members of a component of two or more, or self-loops."""
    return {n for c in components if len(c) > 1 or c[0] in graph[c[0]] for n in c}


def strongly_connected_components(refs: dict[str, frozenset[str]]) -> list[list[str]]:
    """Strongly connected components of the reference graph, each after every component it
    references (Tarjan's algorithm, iterative)."""
    graph = {name: sorted(r for r in used if r in refs) for name, used in refs.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    result: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = counter
                counter += 1
                stack.append(node)
                on_stack.add(node)
            children = graph[node]
            if i < len(children):
                work.append((node, i + 1))
                child = children[i]
                if child not in index:
                    work.append((child, 0))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            if low[node] == index[node]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == node:
                        break
                result.append(component)
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return result


def _nullable_rules(grammar: ir.Grammar, components: list[list[str]], recursive: set[str]) -> set[str]:
    """Rules that match the empty string: components in dependency order, each iterated to its
    fixpoint (a rule found nullable can make another of its component nullable)."""
    nullable: set[str] = set()
    final: dict[int, bool] = {}  # nodes under rules of finished components never change again
    for component in components:
        if len(component) == 1 and component[0] not in recursive:
            # Not recursive: every Ref in the body points to a finished component.
            if _nullable(grammar.rules[component[0]], nullable, final):
                nullable.add(component[0])
            continue
        changed = True
        while changed:
            changed = False
            memo: dict[int, bool] = {}  # valid for one round: a rule found nullable changes its Refs
            for name in component:
                if name not in nullable and _nullable(grammar.rules[name], nullable, memo):
                    nullable.add(name)
                    changed = True
    return nullable



def _nullable(expr: ir.Expr, nullable_rules: set[str], memo: dict[int, bool]) -> bool:
    """Whether ``expr`` matches the empty string, given which rules do (post-order, no recursion)."""
    stack: list[tuple[ir.Expr, bool]] = [(expr, False)]
    while stack:
        e, done = stack.pop()
        if id(e) in memo:
            continue
        kids = children(e)
        if kids and not done:
            stack.append((e, True))
            stack.extend((c, False) for c in kids if id(c) not in memo)
            continue
        if isinstance(e, ir.Empty):
            value = True
        elif isinstance(e, ir.Ref):
            value = e.name in nullable_rules
        elif isinstance(e, ir.Seq):
            value = all(memo[id(c)] for c in e.items)
        elif isinstance(e, ir.Choice):
            value = any(memo[id(c)] for c in e.items)
        elif isinstance(e, ir.Repeat):
            value = e.min == 0 or memo[id(e.item)]
        elif isinstance(e, ir.Graph):
            value = bool(_graph_reach(e, lambda x: memo[id(x)]) & e.finals)
        else:  # Literal (never empty once built), byte and character classes, Nothing
            value = isinstance(e, ir.Literal) and not e.data
        memo[id(e)] = value
    return memo[id(expr)]


def _left_refs(expr: ir.Expr, nullable_rules: set[str], memo: dict[int, bool]) -> set[str]:
    """Rules that ``expr`` can reference before consuming a byte."""
    found: set[str] = set()
    seen: set[int] = set()
    todo = [expr]
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, ir.Ref):
            found.add(e.name)
        elif isinstance(e, ir.Seq):
            for item in e.items:
                todo.append(item)
                if not _nullable(item, nullable_rules, memo):
                    break
        elif isinstance(e, ir.Choice):
            todo.extend(e.items)
        elif isinstance(e, ir.Repeat) and e.max != 0:
            todo.append(e.item)
        elif isinstance(e, ir.Graph):
            # edges leaving a node reachable without consuming a byte
            starts = _graph_reach(e, lambda x: _nullable(x, nullable_rules, memo))
            todo.extend(x for a, x, _ in e.edges if a in starts)
    return found
