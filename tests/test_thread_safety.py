"""Compiling and masking from many threads at once gives what one thread gives.

The engine compiles on a worker pool and fills masks in a thread beside the forward pass, so the
shared pieces (the compile cache, the per-vocabulary trie and region splits, a compiled grammar's
automaton and row cache) are exercised here by 8 threads started together on a barrier, every
mask compared with the one a single thread computed first. A compile must also leave
process-wide state alone (it used to raise and restore the recursion limit).
"""

from __future__ import annotations

import random
import sys
import threading

import numpy as np

import grammar
from grammar import GrammarMatcher, ir
from grammar.api import clear_cache
from grammar.compiler import compile_grammar

CONSTRAINTS = [
    ("json_schema", {"type": "object", "properties": {"name": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}}, "n": {"type": "integer", "minimum": -5}}, "required": ["name"]}),
    ("json_schema", {"type": "array", "items": {"anyOf": [{"type": "number"}, {"type": "object", "additionalProperties": {"type": "boolean"}}]}}),
    ("regex", r"[A-Z][a-z]{1,12}( [a-z]+){2,6}[.!?]"),
    ("ebnf", 'root ::= expr\nexpr ::= term ("+" term)*\nterm ::= [0-9]+ | "(" expr ")" | "\\"" [^"]* "\\""'),
]


def _compile(kind, source, vocab):
    if kind == "json_schema":
        return grammar.compile_json_schema(source, vocab)
    if kind == "regex":
        return grammar.compile_regex(source, vocab)
    return grammar.compile_ebnf(source, vocab)


def _walk(compiled, vocab, seed: int, steps: int = 40) -> list[tuple[int, np.ndarray]]:
    """(token accepted, mask row before it) along a seeded random walk."""
    rng = random.Random(seed)
    m = GrammarMatcher(compiled)
    out = []
    bitmask = grammar.allocate_token_bitmask(1, vocab.vocab_size)
    for _ in range(steps):
        m.fill_next_token_bitmask(bitmask, 0)
        ids = [t for t in grammar.allowed_token_ids(bitmask[0], vocab.vocab_size) if t not in vocab.eos_token_ids]
        if not ids:
            break
        token = rng.choice(ids)
        out.append((token, bitmask[0].copy()))
        assert m.accept_token(token)
    return out


def _replay(compiled, vocab, walk) -> list[np.ndarray]:
    m = GrammarMatcher(compiled)
    bitmask = grammar.allocate_token_bitmask(1, vocab.vocab_size)
    rows = []
    for token, _ in walk:
        m.fill_next_token_bitmask(bitmask, 0)
        rows.append(bitmask[0].copy())
        assert m.accept_token(token)
    return rows


def test_eight_threads_compile_and_mask_like_one(smollm2_vocab):
    vocab = smollm2_vocab
    clear_cache(keep_setup=True)
    reference = {}
    for i, (kind, source) in enumerate(CONSTRAINTS):
        compiled = _compile(kind, source, vocab)
        reference[i] = [_walk(compiled, vocab, seed) for seed in (1, 2)]
    clear_cache(keep_setup=True)  # the threads compile again, concurrently, and share what they compile

    barrier = threading.Barrier(8)
    failures: list[str] = []

    def worker(k: int) -> None:
        try:
            barrier.wait()
            for j in range(len(CONSTRAINTS)):
                i = (k + j) % len(CONSTRAINTS)
                kind, source = CONSTRAINTS[i]
                compiled = _compile(kind, source, vocab)
                walk = reference[i][k % 2]
                rows = _replay(compiled, vocab, walk)
                for step, ((_, expected), got) in enumerate(zip(walk, rows)):
                    if not np.array_equal(expected, got):
                        failures.append(f"thread {k}, constraint {i}, step {step}")
                        return
        except Exception as exc:  # surfaced below with the thread that raised it
            failures.append(f"thread {k}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    assert not failures, failures


def test_uncached_compiles_of_one_grammar_in_threads_agree(smollm2_vocab):
    """Distinct CompiledGrammar objects built at once (no cache) mask alike."""
    vocab = smollm2_vocab
    g = ir.Grammar({"root": ir.seq(ir.literal('{"k": "'), ir.star(ir.char_class([(0x20, 0x21), (0x23, 0x7E)])), ir.literal('"}'))})
    expected = _walk(compile_grammar(g, vocab), vocab, seed=3, steps=25)
    results: list[list[np.ndarray] | str] = [""] * 8
    barrier = threading.Barrier(8)

    def worker(k: int) -> None:
        try:
            barrier.wait()
            results[k] = _replay(compile_grammar(g, vocab), vocab, expected)
        except Exception as exc:
            results[k] = f"{type(exc).__name__}: {exc}"

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    for k, rows in enumerate(results):
        assert not isinstance(rows, str), f"thread {k}: {rows}"
        assert all(np.array_equal(e, r) for (_, e), r in zip(expected, rows)), f"thread {k} disagrees"


def test_compiling_a_deeply_nested_grammar_leaves_the_recursion_limit_alone(monkeypatch):
    """The NFA builder's size estimates used to recurse and raise the recursion limit meanwhile."""
    def refuse(limit):  # pragma: no cover - only runs if something changes the limit
        raise AssertionError(f"compile changed the process-wide recursion limit to {limit}")

    monkeypatch.setattr(sys, "setrecursionlimit", refuse)
    expr = ir.literal("x")
    for i in range(3 * sys.getrecursionlimit()):
        expr = ir.Seq((ir.literal("(") if i % 2 else ir.literal("["), expr)) if i % 3 else ir.Choice((expr, ir.literal(str(i % 10))))
    vocab = grammar.TokenVocabulary.byte_level()
    compiled = compile_grammar(ir.Grammar({"root": expr}), vocab)
    m = GrammarMatcher(compiled)
    assert m.accept_bytes("[") or m.accept_bytes("(") or m.accept_bytes("x")


def test_mask_kernels_release_the_gil():
    """The engine fills masks in a thread beside the forward pass: every compiled function a
    mask runs must be compiled with nogil (a walk holding the GIL would stall torch)."""
    from grammar import determinizer, regions, token_walk

    kernels = [token_walk._walk_kernel, token_walk._check_kernel, token_walk.set_token_bits, token_walk.range_positions,
               token_walk._copy_duplicates, determinizer.expand_row, determinizer.step_bytes, determinizer.truncate,
               determinizer.split_config, determinizer.differing_bytes, determinizer.sibling_of,
               determinizer.live_bytes, determinizer.config_depth, determinizer.config_size,
               regions._find_region_kernel, regions._chain_next_kernel, regions._chain_region_kernel, regions._extend_chain_kernel]
    for kernel in kernels:
        assert kernel.targetoptions.get("nogil") is True, kernel.py_func.__name__
