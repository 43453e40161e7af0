"""Shortest completions (``grammar/completion.py``) against a breadth-first search of the
determinized automaton: the NFA-level distances (per state, with calls costing their callee's
shortest length) must give, for every configuration reachable from the start, the length of the
shortest string that completes it, on random recursive grammars with empty alternatives, nested
calls and cycles."""

from __future__ import annotations

from collections import deque

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from grammar import GrammarBudgetError, GrammarError, compile_ebnf
from grammar.completion import INF, CompletionDistance

RULES = ["root", "r1", "r2", "r3"]
LIMIT = 20  # distances checked exactly up to here; beyond, only that none is shorter
MAX_SEARCH = 3000
LITERALS = ['"a"', '"bc"', '"def"', '""']

item = st.one_of(st.sampled_from(LITERALS), st.sampled_from(RULES))
alternative = st.lists(item, min_size=1, max_size=3).map(" ".join)
rule_body = st.lists(alternative, min_size=1, max_size=3).map(" | ".join)
grammars = st.lists(rule_body, min_size=len(RULES), max_size=len(RULES)).map(
    lambda bodies: "\n".join(f"{name} ::= {body}" for name, body in zip(RULES, bodies))
)


def _bfs_shortest(automaton, start: int, limit: int = LIMIT) -> int | None:  # type: ignore[no-untyped-def]
    """Bytes of the shortest string completing ``start`` (INF: none within ``limit`` bytes), by
    breadth-first search over whole rows; None when the search grows past MAX_SEARCH states."""
    seen, queue = {start: 0}, deque([start])
    while queue:
        state = queue.popleft()
        if automaton.is_accepting(state):
            return seen[state]
        if seen[state] >= limit:
            continue
        try:
            automaton.expand(state)
        except GrammarBudgetError:
            return None
        for nxt in set(automaton.table[state].tolist()):
            if nxt >= 0 and nxt not in seen:
                if len(seen) >= MAX_SEARCH:
                    return None
                seen[nxt] = seen[state] + 1
                queue.append(nxt)
    return INF


@settings(max_examples=150, deadline=None)
@given(grammars)
def test_start_distance_is_the_shortest_accepted_string(smollm2_vocab, text):
    try:
        compiled = compile_ebnf(text, smollm2_vocab)
    except GrammarError:  # left recursion, an empty language: refused at compile
        assume(False)
    automaton = compiled.automaton
    distances = CompletionDistance(automaton)
    reachable, queue = {automaton.initial_state}, deque([automaton.initial_state])
    while queue and len(reachable) < 30:
        state = queue.popleft()
        try:
            distance = distances.config_distance(state)
            found = _bfs_shortest(automaton, state)
            if found is not None:
                assert distance == found if distance <= LIMIT else found == INF, (text, state, distance, found)
            if distance < INF:
                completion = compiled.shortest_completion(state)
                assert len(completion) == distance and automaton.is_accepting(automaton.step_bytes(state, completion))
            automaton.expand(state)
        except GrammarBudgetError:  # a too ambiguous grammar grows past the automaton's budget
            return
        for nxt in set(automaton.table[state].tolist()):
            if nxt >= 0 and nxt not in reachable:
                reachable.add(nxt)
                queue.append(nxt)
