"""The NFA builder's size estimates, which stop counting at ``SIZE_CAP``, agree with the plain
estimate wherever it is below the cap, and are at the cap wherever it is not.

Sharing, inlining and repetition budgets all compare estimates with thresholds below the cap,
so this is what keeps the builder's decisions those of the full estimate. The reference here is
the estimate written out directly, recursively over the IR, on random grammars whose nodes are
shared (front ends build DAGs) and whose rules reference each other.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from grammar import fsm, ir
from grammar.errors import GrammarError
from grammar.rule_graph import children

_leaves = st.one_of(
    st.binary(min_size=1, max_size=40).map(ir.Literal),
    st.sampled_from([ir.char_class([(0x61, 0x7A)]), ir.ANY_CHAR, ir.char_class([(0x30, 0x39), (0x4E00, 0x9FFF)])]),
    st.just(ir.EMPTY),
    st.sampled_from(["r1", "r2"]).map(ir.Ref),
)


def _node(sub):
    return st.one_of(
        st.lists(sub, min_size=2, max_size=4).map(lambda xs: ir.Seq(tuple(xs))),
        st.lists(sub, min_size=2, max_size=4).map(lambda xs: ir.Choice(tuple(xs))),
        st.tuples(sub, st.integers(0, 40), st.one_of(st.none(), st.integers(0, 40))).map(
            lambda t: ir.Repeat(t[0], t[1], None if t[2] is None else t[1] + t[2])
        ),
        st.lists(sub, min_size=1, max_size=3).map(
            lambda xs: ir.Graph(0, frozenset({len(xs)}), tuple((i, x, i + 1) for i, x in enumerate(xs)))
        ),
    )


_exprs = st.recursive(_leaves, _node, max_leaves=30)


@st.composite
def _grammars(draw):
    body = draw(_exprs)
    # Sharing by identity and by value: the same subexpression placed twice.
    twice = draw(_exprs)
    root = ir.Seq((body, twice, ir.Choice((twice, ir.Literal(b"x")))))
    r1 = draw(_exprs)  # may reference itself: then it is called, never inlined
    r2 = draw(st.one_of(_leaves.filter(lambda e: not isinstance(e, ir.Ref)), st.just(ir.Seq((ir.Literal(b"q"), ir.Ref("r1"))))))
    return ir.Grammar({"root": root, "r1": r1, "r2": r2})


def _reference_size(builder: fsm._Builder, e: ir.Expr, memo: dict) -> int:
    """The whole estimate, without a cap."""
    if id(e) in memo:
        return memo[id(e)]

    def cost(child: ir.Expr) -> int:
        size = _reference_size(builder, child, memo)
        return 1 if size >= fsm.SHARE_MIN_STATES and id(child) in builder.repeated else size

    if isinstance(e, ir.Literal):
        value = len(e.data)
    elif isinstance(e, ir.CharClass):
        value = 1 + sum(len(seq) - 1 for seq in fsm.class_byte_sequences(e.ranges))
    elif isinstance(e, (ir.Seq, ir.Choice)):
        value = 1 + sum(cost(x) for x in e.items)
    elif isinstance(e, ir.Repeat):
        copies = max(e.min if e.max is None else e.max, 1)
        item = _reference_size(builder, e.item, memo)
        value = 1 + (2 if copies > 1 and item >= fsm.SHARE_MIN_STATES else cost(e.item)) * copies
    elif isinstance(e, ir.Graph):
        value = 1 + len(e.edges) + sum(cost(x) for _, x, _ in e.edges)
    elif isinstance(e, ir.Ref):
        if e.name in builder.recursive:
            value = 1
        else:
            body = _reference_size(builder, builder.grammar.rules[e.name], memo)
            inline = body < fsm.SHARE_MIN_STATES or (builder.ref_counts.get(e.name, 0) <= 1 and body <= fsm.INLINE_MAX_STATES)
            value = body if inline else 1
    else:
        value = 1
    memo[id(e)] = value
    return value


def _all_nodes(grammar: ir.Grammar) -> list[ir.Expr]:
    out, seen = [], set()
    todo = list(grammar.rules.values())
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        out.append(e)
        todo.extend(children(e))
    return out


@settings(max_examples=150, deadline=None)
@given(_grammars(), st.randoms(use_true_random=False))
def test_capped_estimates_agree_with_the_whole_estimate(grammar, rnd):
    try:
        builder = fsm._Builder(grammar, 10_000_000)
    except GrammarError:  # a left-recursive draw
        return
    nodes = _all_nodes(grammar)
    rnd.shuffle(nodes)  # the capped walk memoizes partial work: ask in any order
    reference: dict[int, int] = {}
    for e in nodes:
        expected = _reference_size(builder, e, reference)
        assert builder.size(e) == min(expected, fsm.SIZE_CAP), e


def test_a_big_body_is_sized_without_visiting_all_of_it():
    items = tuple(ir.Literal(bytes([0x61 + i % 26]) * 3) for i in range(2000))
    big = ir.Seq(items)
    builder = fsm._Builder(ir.Grammar({"root": ir.Seq((ir.Ref("big"), ir.Literal(b"!"))), "big": big}), 10_000_000)
    assert builder.size(big) == fsm.SIZE_CAP
    assert len(builder._size_memo) < 200  # the first ~100 items reach the cap
