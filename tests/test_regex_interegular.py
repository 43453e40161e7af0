"""A second, independent regex oracle: interegular's own FSM.

interegular parses the pattern itself and enumerates the strings its FSM accepts, shortest first;
every such string must be accepted by formcast (bytes walked through the matcher, then EOS), and a
one-character mutation of it must get the same verdict from both automata. Unlike ``re``, this
explores the language systematically instead of through sampled inputs.
"""

from __future__ import annotations

import itertools
import random

import pytest

from grammar import GrammarMatcher, TokenVocabulary, compile_regex

interegular = pytest.importorskip("interegular")

VOCAB = TokenVocabulary.byte_level()
PATTERNS = [
    r"[a-c]{2}(x|yz)?",
    r"(ab|a)(bc|c)*d",
    r"-?(0|[1-9][0-9]*)(\.[0-9]{1,2})?",
    r"[A-Z][a-z]{0,3}( [A-Z][a-z]{0,3})?",
    r"(\+1 )?[0-9]{3}-[0-9]{4}",
    r"(yes|no|maybe)!*",
    r"[^a-y\n]{1,3}z",
    r"(a|b)*a(a|b){3}",
]


def formcast_accepts(compiled, text: str) -> bool:
    m = GrammarMatcher(compiled)
    return m.accept_bytes(text.encode()) and m.can_terminate()


@pytest.mark.parametrize("pattern", PATTERNS)
def test_enumerated_strings_agree(pattern):
    fsm = interegular.parse_pattern(pattern).to_fsm()
    compiled = compile_regex(pattern, VOCAB)
    rng = random.Random(pattern)
    alphabet = "abcxyz019 -.+!Zz\n"
    count = 0
    # interegular yields a placeholder for "any character outside the pattern's alphabet"
    # (negated classes): stand a concrete such character in for it.
    other = next(c for c in "~#é%" if c not in fsm.alphabet)
    for chars in itertools.islice(fsm.strings(), 300):
        text = "".join(c if isinstance(c, str) else other for c in chars)
        assert formcast_accepts(compiled, text), f"{pattern!r} should accept {text!r}"
        mutated = list(text)
        if mutated:
            mutated[rng.randrange(len(mutated))] = rng.choice(alphabet)
        else:
            mutated = [rng.choice(alphabet)]
        mutated_text = "".join(mutated)
        assert formcast_accepts(compiled, mutated_text) == fsm.accepts(mutated_text), (pattern, mutated_text)
        count += 1
    assert count >= 10
