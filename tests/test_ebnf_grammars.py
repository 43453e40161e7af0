"""Oracle tests for the test grammars in tests/grammars/ (an EBNF and an equivalent Lark file each).

For both front ends (EBNF and Lark): strings derived at random from our IR must be accepted by an
independent parser (Lark Earley on the .lark file, Python's json for JSON) and by the matcher,
byte by byte with each mask bit agreeing; random mutations of them are accepted by the matcher
exactly when the independent parser accepts them.
"""

from __future__ import annotations

import functools
import json
import random
from pathlib import Path

import lark
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grammar import Constraint, GrammarMatcher, TokenVocabulary, compile_ebnf, compile_lark, ir

GRAMMARS = Path(__file__).parent / "grammars"
NAMES = ["json", "arith", "sql", "clike", "sexp", "csv", "brackets"]
VOCAB = TokenVocabulary.byte_level()
EOS = VOCAB.vocab_size - 1
SETTINGS = settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))


@functools.lru_cache(maxsize=None)
def compiled(name: str, front: str):
    text = (GRAMMARS / f"{name}.{front}").read_text()
    return compile_ebnf(text, VOCAB) if front == "ebnf" else compile_lark(text, VOCAB)


@functools.lru_cache(maxsize=None)
def oracle_parser(name: str) -> lark.Lark:
    return lark.Lark((GRAMMARS / f"{name}.lark").read_text(), parser="earley", lexer="dynamic_complete")


def _no_constants(value: str):
    raise ValueError(value)


def oracle(name: str, data: bytes) -> bool:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    if name == "json":
        try:
            json.loads(text, parse_constant=_no_constants)
            return True
        except ValueError:
            return False
    try:
        oracle_parser(name).parse(text)
        return True
    except lark.exceptions.LarkError:
        return False


def matcher_accepts(name: str, front: str, data: bytes) -> bool:
    m = GrammarMatcher(compiled(name, front))
    for b in data:
        allowed = bool(m.get_next_token_bitmask()[b // 32] >> (b % 32) & 1)
        assert m.accept_token(b) == allowed, (data, b)
        if not allowed:
            return False
    allowed = bool(m.get_next_token_bitmask()[EOS // 32] >> (EOS % 32) & 1)
    assert allowed == m.can_terminate()
    return m.accept_token(EOS)


# ---------------------------------------------------------------- random derivations from the IR


def _min_lengths(g: ir.Grammar) -> dict[str, int]:
    """Shortest derivation length per rule (a fixpoint), to steer deep derivations to an end."""
    inf = 10**9
    lengths = {n: inf for n in g.rules}

    def ml(e: ir.Expr) -> int:
        if isinstance(e, ir.Literal):
            return len(e.data)
        if isinstance(e, (ir.CharClass, ir.ByteClass)):
            return 1
        if isinstance(e, ir.Ref):
            return lengths[e.name]
        if isinstance(e, ir.Seq):
            return min(inf, sum(ml(i) for i in e.items))
        if isinstance(e, ir.Choice):
            return min(ml(i) for i in e.items)
        if isinstance(e, ir.Repeat):
            return min(inf, e.min * ml(e.item))
        return 0 if isinstance(e, ir.Empty) else inf

    changed = True
    while changed:
        changed = False
        for n, body in g.rules.items():
            v = ml(body)
            if v < lengths[n]:
                lengths[n], changed = v, True
    lengths["__ml__"] = ml  # type: ignore[assignment]
    return lengths


def derive(g: ir.Grammar, rng: random.Random, max_depth: int = 12) -> bytes:
    lengths = _min_lengths(g)
    ml = lengths["__ml__"]
    out = bytearray()

    def pick_char(ranges) -> int:
        ascii_ranges = [(lo, min(hi, 126)) for lo, hi in ranges if lo <= 126 and max(lo, 32) <= min(hi, 126)]
        if ascii_ranges and rng.random() < 0.9:
            lo, hi = rng.choice(ascii_ranges)
            return rng.randint(max(lo, 32), hi)
        lo, hi = rng.choice(ranges)
        return rng.randint(lo, hi)

    def gen(e: ir.Expr, depth: int) -> None:
        deep = depth > max_depth
        if isinstance(e, ir.Literal):
            out.extend(e.data)
        elif isinstance(e, ir.CharClass):
            out.extend(chr(pick_char(e.ranges)).encode())
        elif isinstance(e, ir.ByteClass):
            out.append(pick_char(e.ranges))
        elif isinstance(e, ir.Ref):
            gen(g.rules[e.name], depth + 1)
        elif isinstance(e, ir.Seq):
            for item in e.items:
                gen(item, depth)
        elif isinstance(e, ir.Choice):
            options = list(e.items)
            if deep:
                best = min(ml(o) for o in options)
                options = [o for o in options if ml(o) == best]
            gen(rng.choice(options), depth)
        elif isinstance(e, ir.Repeat):
            hi = e.min if deep else min(e.max if e.max is not None else e.min + 3, e.min + 3)
            for _ in range(rng.randint(e.min, hi)):
                gen(e.item, depth + 1)

    gen(g.rules[g.root], 0)
    return bytes(out)


def mutate(data: bytes, rng: random.Random) -> bytes:
    alphabet = sorted(set(data) | set(b' ()[]{}<>",;:\'\\0123456789abc+-*/=\n\r.'))
    for _ in range(rng.randint(1, 3)):
        i = rng.randint(0, len(data))
        kind = rng.randrange(4)
        if kind == 0 and data:
            data = data[:i] + data[i + 1:]
        elif kind == 1:
            data = data[:i] + bytes([rng.choice(alphabet)]) + data[i:]
        elif kind == 2 and data:
            data = data[:i] + bytes([rng.choice(alphabet)]) + data[i + 1:]
        else:
            j = rng.randint(0, len(data))
            data = data[:i] + data[min(i, j):max(i, j)] + data[i:]
    return data


@functools.lru_cache(maxsize=None)
def ir_of(name: str, front: str) -> ir.Grammar:
    text = (GRAMMARS / f"{name}.{front}").read_text()
    return (Constraint.ebnf(text) if front == "ebnf" else Constraint.lark(text)).to_ir()


@pytest.mark.parametrize("front", ["ebnf", "lark"])
@pytest.mark.parametrize("name", NAMES)
@SETTINGS
@given(seed=st.integers(0, 2**32 - 1))
def test_derived_strings_are_accepted_by_oracle_and_matcher(name: str, front: str, seed: int) -> None:
    data = derive(ir_of(name, front), random.Random(seed))
    assert oracle(name, data), data
    assert matcher_accepts(name, front, data), data


@pytest.mark.parametrize("front", ["ebnf", "lark"])
@pytest.mark.parametrize("name", NAMES)
@SETTINGS
@given(seed=st.integers(0, 2**32 - 1))
def test_mutants_agree_with_oracle(name: str, front: str, seed: int) -> None:
    rng = random.Random(seed)
    data = mutate(derive(ir_of(name, front), rng), rng)
    assert matcher_accepts(name, front, data) == oracle(name, data), data


def test_500_level_nested_json_array() -> None:
    doc = b"[" * 500 + b"1" + b"]" * 500
    assert json.loads(doc) is not None
    assert matcher_accepts("json", "ebnf", doc)
    assert not matcher_accepts("json", "ebnf", doc[:-1])
    assert not matcher_accepts("json", "ebnf", doc + b"]")


def test_500_level_nested_json_array_on_a_real_vocabulary(smollm2_vocab, smollm2_tokenizer) -> None:
    doc = "[" * 500 + '{"a": 1}' + "]" * 500
    m = GrammarMatcher(compile_ebnf((GRAMMARS / "json.ebnf").read_text(), smollm2_vocab))
    for tok in smollm2_tokenizer.encode(doc, add_special_tokens=False):
        mask = m.get_next_token_bitmask()
        assert mask[tok // 32] >> (tok % 32) & 1
        assert m.accept_token(tok)
    assert m.can_terminate()
