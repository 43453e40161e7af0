"""Large alternations of literals as a prefix trie: ``enum`` of 100,000 product names, regex and
EBNF alternations of many words.

A plain ``ir.choice`` of n words becomes n parallel branches: the automaton's start state holds
all of them, and every determinized state on the way is a set of many NFA states. As a trie (an
``ir.Graph`` with one node per distinct prefix, unary chains folded into one edge) the NFA is
already deterministic on the shared prefixes, its size is the words' total length at most, and
the IR stays flat however long the words are (no nesting per character, so no recursion later).

Only ref-free sequences take part (literals, and sequences of literals and other ref-free pieces
such as the JSON spellings of one character); anything else stays a plain alternative beside the
trie, so rule analyses (left recursion, nullability) see exactly what they saw before.
"""

from __future__ import annotations

from typing import Union

from . import ir
from .budget import TRIE_WORD_STEPS, charge

# Below this many sequence-like alternatives a plain choice is as good and keeps the IR familiar.
TRIE_MIN_ALTERNATIVES = 32

Atom = Union[bytes, ir.Expr]  # one character's UTF-8 bytes (or one raw byte), or a ref-free piece


def trie_choice(*items: ir.Expr) -> ir.Expr:
    """``ir.choice(*items)``, with the literal-like alternatives folded into a prefix trie when
    there are many of them (the same language)."""
    plain = ir.choice(*items)
    if not isinstance(plain, ir.Choice) or len(plain.items) < TRIE_MIN_ALTERNATIVES:
        return plain
    if all(isinstance(item, ir.Literal) for item in plain.items):
        texts = _texts(plain.items)
        if texts is not None:
            return _radix_graph(sorted(texts))
    words: list[list[Atom]] = []
    others: list[ir.Expr] = []
    for item in plain.items:
        atoms = _atoms(item)
        if atoms is None:
            others.append(item)
        else:
            words.append(atoms)
    if len(words) < TRIE_MIN_ALTERNATIVES:
        return plain
    return ir.choice(_trie_graph(words), *others)


def _atoms(item: ir.Expr) -> list[Atom] | None:
    """The item as a sequence of atoms, or None when it is not a ref-free sequence."""
    parts = item.items if isinstance(item, ir.Seq) else (item,)
    out: list[Atom] = []
    for part in parts:
        if isinstance(part, ir.Literal):
            out.extend(_characters(part.data))
        elif isinstance(part, ir.Ref) or isinstance(part, (ir.Empty, ir.Nothing)):
            return None
        elif isinstance(part, (ir.CharClass, ir.ByteClass)) or not any(True for _ in ir.iter_refs(part)):
            out.append(part)
        else:
            return None
    return out or None


def _texts(items: tuple[ir.Expr, ...]) -> list[str] | None:
    try:
        return [item.data.decode("utf-8") for item in items]  # type: ignore[union-attr]
    except UnicodeDecodeError:
        return None


def _radix_graph(words: list[str]) -> ir.Graph:
    """The compressed trie of sorted, distinct, non-empty words, built in one pass: each word
    shares its longest common prefix with the one before it, so only the rightmost path of the
    trie is ever open (about two dictionary updates a word instead of one a character)."""
    depth = [0]  # node -> length of the prefix it stands for
    edge_of: dict[int, tuple[int, str, int]] = {}  # node -> (parent, a word through it, start)
    stack = [0]  # the open path: nodes of the previous word
    finals: set[int] = set()
    previous = ""
    for count, word in enumerate(words):
        if count & 4095 == 4095:
            charge("building the trie of a large alternation", 4096 * TRIE_WORD_STEPS)
        shared = _common_prefix_length(previous, word)
        last = -1
        while depth[stack[-1]] > shared:
            last = stack.pop()
        top = stack[-1]
        if depth[top] < shared:  # the new word leaves the edge top -> last in its middle: split it
            middle = len(depth)
            depth.append(shared)
            _, through, start = edge_of[last]
            edge_of[middle] = (top, through, start)
            edge_of[last] = (middle, through, shared)
            stack.append(middle)
            top = middle
        leaf = len(depth)
        depth.append(len(word))
        edge_of[leaf] = (top, word, depth[top])
        stack.append(leaf)
        finals.add(leaf)
        previous = word
    edges = tuple(
        (parent, ir.Literal(through[start : depth[child]].encode("utf-8")), child) for child, (parent, through, start) in edge_of.items()
    )
    return ir.Graph(0, frozenset(finals), edges)


def _common_prefix_length(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i + 16 <= n and a[i : i + 16] == b[i : i + 16]:  # long shared prefixes a chunk at a time
        i += 16
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _characters(data: bytes) -> list[bytes]:
    """Split at character boundaries, so every edge literal stays decodable text (the JSON
    encoder and the character counters read literals as UTF-8)."""
    try:
        return [c.encode("utf-8") for c in data.decode("utf-8")]
    except UnicodeDecodeError:
        return [bytes([b]) for b in data]


def _trie_graph(words: list[list[Atom]]) -> ir.Graph:
    children: list[dict[Atom, int]] = [{}]
    final = [False]
    for count, word in enumerate(words):
        if count & 4095 == 4095:
            charge("building the trie of a large alternation", 4096 * TRIE_WORD_STEPS)
        node = 0
        for atom in word:
            nxt = children[node].get(atom)
            if nxt is None:
                nxt = children[node][atom] = len(children)
                children.append({})
                final.append(False)
            node = nxt
        final[node] = True
    # One edge per branch, a unary chain of nodes folded into it: the IR holds about as many
    # edges as the trie has branching points, and literal runs stay whole.
    edges: list[tuple[int, ir.Expr, int]] = []
    finals: set[int] = set()
    todo = [0]
    while todo:
        node = todo.pop()
        if final[node]:
            finals.add(node)
        for atom, child in children[node].items():
            run: list[Atom] = [atom]
            while not final[child] and len(children[child]) == 1:
                (atom, child), = children[child].items()
                run.append(atom)
            edges.append((node, _run_expr(run), child))
            todo.append(child)
    return ir.Graph(0, frozenset(finals), tuple(edges))


def _run_expr(run: list[Atom]) -> ir.Expr:
    parts: list[ir.Expr] = []
    text = bytearray()
    for atom in run:
        if isinstance(atom, bytes):
            text += atom
            continue
        if text:
            parts.append(ir.Literal(bytes(text)))
            text = bytearray()
        parts.append(atom)
    if text:
        parts.append(ir.Literal(bytes(text)))
    return parts[0] if len(parts) == 1 else ir.Seq(tuple(parts))
