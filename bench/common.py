"""Shared benchmark helpers: tokenizers, engine adapters (formcast and the anchors), walks, tables.

Every engine is driven the same way through an :class:`Engine` adapter::

    engine.prepare(tokenizer, vocab)          once per vocabulary (not timed: tokenizer info,
                                              formcast's vocabulary trie, outlines' Vocabulary)
    session = engine.start(kind, source)      compile + matcher, caches cleared  \\ timed together:
    session.fill()                            first mask                          / time to first mask
    session.accept(token_id) -> bool; session.fill()   ... timed per mask while walking a sample

``kind`` is one of ``regex``, ``json_schema``, ``ebnf``. An engine that does not support a kind
raises ``NotImplementedError``; other exceptions are recorded as that engine's result.

Not collected by pytest (bench/ has no tests); run the scripts with the repo venv.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run as a script from anywhere

VOCABS = ("smollm2", "qwen2")


# ---------------------------------------------------------------------- tokenizers


def load_tokenizer(name: str) -> tuple[Any, Any]:
    """``(hf_tokenizer, TokenVocabulary)`` for ``smollm2`` (49,152 tokens) or ``qwen2`` (151,646)."""
    from engine.hf.tokenizers import load_default_tokenizer, load_qwen2_tokenizer
    from grammar import TokenVocabulary

    if name == "smollm2":
        tok = load_default_tokenizer()
    elif name == "qwen2":
        tok = load_qwen2_tokenizer("qwen2")
    else:
        raise ValueError(f"unknown vocabulary {name!r}; choose from {VOCABS}")
    return tok, TokenVocabulary.from_tokenizer(tok)


def encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


# ---------------------------------------------------------------------- engine adapters


class Session:
    """One constrained sequence in one engine."""

    def __init__(self, fill: Callable[[], Any], accept: Callable[[int], bool]) -> None:
        self.fill = fill
        self.accept = accept


class Engine:
    name = "engine"

    def prepare(self, tokenizer: Any, vocab: Any) -> None:
        raise NotImplementedError

    def start(self, kind: str, source: str) -> Session:
        raise NotImplementedError


class Formcast(Engine):
    name = "formcast"

    def prepare(self, tokenizer: Any, vocab: Any) -> None:
        from grammar import GrammarMatcher, allocate_token_bitmask, compile_regex

        self.vocab = vocab
        self.bitmask = allocate_token_bitmask(1, vocab.vocab_size)
        # Warm the per-vocabulary trie (the analogue of the anchors' tokenizer info).
        GrammarMatcher(compile_regex("a", vocab)).fill_next_token_bitmask(self.bitmask, 0)

    def compile(self, kind: str, source: str) -> Any:
        import grammar
        from grammar.api import clear_cache

        clear_cache(keep_setup=True)  # the vocabulary's trie stays warm (see above)
        if kind == "regex":
            return grammar.compile_regex(source, self.vocab)
        if kind == "json_schema":
            return grammar.compile_json_schema(source, self.vocab)  # the text: the compiler parses it within its budgets
        if kind == "ebnf":
            return grammar.compile_ebnf(source, self.vocab)
        raise NotImplementedError(kind)

    def start(self, kind: str, source: str) -> Session:
        return self.session(self.compile(kind, source))

    def session(self, compiled: Any) -> Session:
        """A new matcher over an already compiled grammar (warm: its mask cache is shared)."""
        from grammar import GrammarMatcher

        m = GrammarMatcher(compiled)
        return Session(lambda: m.fill_next_token_bitmask(self.bitmask, 0), m.accept_token)


class OutlinesCore(Engine):
    """outlines-core 0.2: an eager regex -> token index. Its ``Vocabulary.from_pretrained`` needs
    the hub, so the vocabulary is built from formcast's exact token bytes (bytes keys are taken
    as raw bytes; str keys would be matched character by character, wrong for ``Ġ``-style
    tokens). Special tokens are left out, EOS is its own argument."""

    name = "outlines-core"

    def prepare(self, tokenizer: Any, vocab: Any) -> None:
        import outlines_core

        eos = min(vocab.eos_token_ids)
        groups: dict[bytes, list[int]] = {}
        for i, data in enumerate(vocab.token_bytes):
            if data and i not in vocab.special_token_ids:
                groups.setdefault(data, []).append(i)
        self.vocabulary = outlines_core.Vocabulary(eos, groups)
        self.words = (vocab.vocab_size + 31) // 32
        self.bitmask = np.zeros(self.words, dtype=np.int32)

    def start(self, kind: str, source: str) -> Session:
        import outlines_core

        if kind == "json_schema":
            source = outlines_core.json_schema.build_regex_from_schema(source)
        elif kind != "regex":
            raise NotImplementedError(kind)
        guide = outlines_core.Guide(outlines_core.Index(source, self.vocabulary))
        ptr = self.bitmask.ctypes.data

        def accept(token: int) -> bool:
            try:
                guide.advance(token, return_tokens=False)
                return True
            except Exception:
                return False

        return Session(lambda: guide.write_mask_into(ptr, self.words, 4), accept)


class XGrammar(Engine):
    name = "xgrammar"

    def prepare(self, tokenizer: Any, vocab: Any) -> None:
        import xgrammar as xg

        self.info = xg.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab.vocab_size)
        self.bitmask = xg.allocate_token_bitmask(1, vocab.vocab_size)

    def start(self, kind: str, source: str) -> Session:
        import xgrammar as xg

        compiler = xg.GrammarCompiler(self.info, cache_enabled=False)
        if kind == "regex":
            compiled = compiler.compile_regex(source)
        elif kind == "json_schema":
            compiled = compiler.compile_json_schema(source)
        elif kind == "ebnf":
            compiled = compiler.compile_grammar(source)
        else:
            raise NotImplementedError(kind)
        m = xg.GrammarMatcher(compiled)
        return Session(lambda: m.fill_next_token_bitmask(self.bitmask), m.accept_token)


class LLGuidance(Engine):
    name = "llguidance"

    def prepare(self, tokenizer: Any, vocab: Any) -> None:
        import llguidance.hf
        import llguidance.numpy as lln

        self.tok = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab.vocab_size)
        self.bitmask = lln.allocate_token_bitmask(1, self.tok.vocab_size)

    def start(self, kind: str, source: str) -> Session:
        import llguidance
        import llguidance.numpy as lln

        if kind not in ("regex", "json_schema", "ebnf"):
            raise NotImplementedError(kind)
        m = llguidance.LLMatcher(self.tok, llguidance.grammar_from(kind, source))
        if m.is_error():
            raise RuntimeError(m.get_error())
        return Session(lambda: lln.fill_next_token_bitmask(m, self.bitmask), m.consume_token)


ENGINES: dict[str, type[Engine]] = {e.name: e for e in (Formcast, OutlinesCore, XGrammar, LLGuidance)}


# ---------------------------------------------------------------------- measuring


@dataclass
class WalkResult:
    ttfm: float  # seconds: compile + matcher + first mask
    masks: list[float] = field(default_factory=list)  # seconds per mask after each accepted token
    ok: bool = True  # every token of the sample was accepted
    error: str = ""


def timed_walk(engine: Engine, kind: str, source: str, tokens: Sequence[int],
               start: Callable[[], Session] | None = None) -> WalkResult:
    """Compile + first mask (timed together), then accept each token and time each mask.
    ``start`` replaces ``engine.start(kind, source)`` (e.g. a session over a warm grammar)."""
    try:
        t0 = time.perf_counter()
        session = start() if start is not None else engine.start(kind, source)
        session.fill()
        ttfm = time.perf_counter() - t0
    except NotImplementedError:
        return WalkResult(0.0, ok=False, error="unsupported")
    except Exception as exc:  # an engine refusing a constraint is a result, not a crash
        return WalkResult(0.0, ok=False, error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:50] if str(exc) else ''}")
    result = WalkResult(ttfm)
    fill, accept, clock = session.fill, session.accept, time.perf_counter
    for tok in tokens:
        if not accept(tok):
            result.ok = False
            break
        t = clock()
        fill()
        result.masks.append(clock() - t)
    return result


def repeat_walk(engine: Engine, kind: str, source: str, tokens: Sequence[int], repeat: int) -> WalkResult:
    """``repeat`` fresh walks: the median TTFM, the masks of every walk pooled."""
    runs = [timed_walk(engine, kind, source, tokens) for _ in range(repeat)]
    if any(r.error for r in runs):
        return next(r for r in runs if r.error)
    pooled = WalkResult(statistics.median(r.ttfm for r in runs), ok=all(r.ok for r in runs))
    for r in runs:
        pooled.masks += r.masks
    return pooled


def best_us(call: Callable[[], Any], calls: int) -> float:
    """The fastest of ``calls`` calls, in µs, after one untimed call (compiles, caches)."""
    call()
    best = float("inf")
    for _ in range(calls):
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    return best * 1e6


def pct(samples: Iterable[float], q: float) -> float:
    arr = np.fromiter(samples, dtype=float)
    return float(np.percentile(arr, q)) if arr.size else float("nan")


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b and b == b and a == a else "-"


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[Any]], align_right_from: int = 1) -> str:
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join("---" if i < align_right_from else "---:" for i in range(len(header))) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def machine_line() -> str:
    import os
    import platform

    import importlib.metadata as md

    versions = []
    for pkg in ("outlines-core", "xgrammar", "llguidance"):
        try:
            versions.append(f"{pkg} {md.version(pkg)}")
        except md.PackageNotFoundError:
            pass
    return f"{platform.python_implementation()} {platform.python_version()}, {os.cpu_count()} CPUs, " + ", ".join(versions)
