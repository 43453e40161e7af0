"""MaskBench runner: JSON-schema masks of formcast against llguidance, xgrammar (and outlines-core).

Method (``../shared/bench/maskbench/README.md``), per engine and schema:
- time to first mask (TTFM): schema -> compiled grammar -> matcher -> first mask, compile caches
  cleared before each schema (formcast ``clear_cache()``, xgrammar ``cache_enabled=False``);
- time between masks (TBM): for each token of ``json.dumps(data, ensure_ascii=False)`` (default
  separators, tokenized without special tokens): fill the mask row, check the token's bit, accept
  it; one sample = mask + accept. The final mask (is EOS allowed?) is one more sample.
- class per schema: pass / unsatisfiable (refused as satisfied by no value, and the record holds
  no valid instance: the right answer for generation) / compile (refused) / validation (a valid instance rejected) /
  invalidation (an invalid instance accepted: every token allowed and accepted, EOS allowed) /
  timeout / crash. A schema with both kinds of error counts as an invalidation error.

Each (schema, engine) pair runs in a recycled worker process with a time limit: a hang or a
crash costs that pair only. Workers load the tokenizer and every engine once, then warm up on a
trivial schema so per-tokenizer precomputation (token tries, slicers) stays out of TTFM.

    python bench/maskbench.py --sample 1000 --seed 0 --jobs 2 --out /tmp/mb.jsonl
    python bench/maskbench.py --summarize /tmp/mb.jsonl      # tables again, no run

The summary reports TBM percentiles, the maximum and how many masks took over 1 ms and over
20 ms: a batched engine waits for its slowest mask, so the tail is what users feel. A mask over
20 ms is also counted by its worker's CPU time: with two workers and the parent on two cores, a
mask whose wall time is far above its CPU time waited for the processor, not for the engine.
"""

from __future__ import annotations

import argparse
import gc
import gzip
import json
import multiprocessing as mp
import os
import random
import re
import sys
import time
import traceback
from collections import Counter
from collections.abc import Iterator
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any, Callable

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_INPUT = Path(os.environ.get("MASKBENCH_DEV") or ROOT.parent / "shared" / "bench" / "maskbench" / "dev.jsonl.gz")
CLASSES = ("pass", "unsatisfiable", "compile", "validation", "invalidation", "timeout", "crash")
ANCHORS = ("llguidance", "xgrammar")
RECYCLE_AFTER = 300  # tasks per worker: bounds memory growth of caches and leaks


class Refused(Exception):
    """An engine refused the schema (its compile error)."""


# ---------------------------------------------------------------------------- engine adapters
# An adapter turns a schema into a matcher factory: compile(schema) -> Walker; a Walker has
# fill(mask) (int32 numpy row), accept(token) -> bool, and new() for a fresh matcher.


class FormcastEngine:
    name = "formcast"
    property_order = "declared"  # --formcast-property-order, set before the workers fork
    backstop_seconds: float | None = None  # --formcast-backstop (None: the library default)

    def __init__(self, tok: Any, eos: int) -> None:
        import grammar

        self.vocab = grammar.TokenVocabulary.from_tokenizer(tok)
        self.grammar = grammar
        self.width = (self.vocab.vocab_size + 31) // 32

    def compile(self, schema: Any) -> Callable[[], Any]:
        from grammar.api import clear_cache

        clear_cache(keep_setup=True)
        try:
            budget = None
            if self.backstop_seconds is not None:
                # 0 turns the wall-clock backstop off: verdicts then depend on counted work only,
                # so a run sharing the machine with other work gets the answers a quiet one gets.
                budget = self.grammar.CompileBudget(max_compile_seconds=self.backstop_seconds or None)
            compiled = self.grammar.compile_json_schema(
                schema, self.vocab, json_property_order=self.property_order, budget=budget
            )
        except self.grammar.GrammarError as exc:
            raise Refused(f"{type(exc).__name__}: {exc}") from exc
        return lambda: _FormcastWalker(self.grammar.GrammarMatcher(compiled))


class _FormcastWalker:
    def __init__(self, matcher: Any) -> None:
        self.m = matcher

    def fill(self, mask: np.ndarray) -> None:
        self.m.fill_next_token_bitmask(mask, 0)

    def accept(self, token: int) -> bool:
        return self.m.accept_token(token)


class LLGuidanceEngine:
    name = "llguidance"

    def __init__(self, tok: Any, eos: int) -> None:
        import llguidance
        import llguidance.hf
        import llguidance.numpy

        self.ll = llguidance
        self.fill_fn = llguidance.numpy.fill_next_token_bitmask
        self.tokenizer = llguidance.hf.from_tokenizer(tok, eos_token=eos)

    def compile(self, schema: Any) -> Callable[[], Any]:
        try:
            grm = self.ll.LLMatcher.grammar_from_json_schema(schema, defaults={"whitespace_flexible": True})
        except ValueError as exc:
            raise Refused(str(exc)) from exc
        first = self.ll.LLMatcher(self.tokenizer, grm, log_level=0)
        if first.is_error():
            raise Refused(first.get_error())
        pending = [first]  # the first matcher is the one whose construction TTFM timed

        def new() -> Any:
            m = pending.pop() if pending else self.ll.LLMatcher(self.tokenizer, grm, log_level=0)
            return _LLWalker(m, self.fill_fn)

        return new


class _LLWalker:
    def __init__(self, matcher: Any, fill_fn: Callable) -> None:
        self.m, self.fill_fn = matcher, fill_fn

    def fill(self, mask: np.ndarray) -> None:
        self.fill_fn(self.m, mask, 0)
        if self.m.is_error():
            raise Refused(self.m.get_error())

    def accept(self, token: int) -> bool:
        return bool(self.m.consume_token(token)) and not self.m.is_error()


class XGrammarEngine:
    name = "xgrammar"

    def __init__(self, tok: Any, eos: int) -> None:
        import torch
        import xgrammar

        torch.set_num_threads(1)
        self.xg = xgrammar
        info = xgrammar.TokenizerInfo.from_huggingface(tok, vocab_size=len(tok), stop_token_ids=[eos])
        threads = int(os.environ.get("MASKBENCH_XGR_THREADS", "1"))
        self.compiler = xgrammar.GrammarCompiler(info, max_threads=threads, cache_enabled=False)
        self.tmask = xgrammar.allocate_token_bitmask(1, len(tok))

    def compile(self, schema: Any) -> Callable[[], Any]:
        try:
            compiled = self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=True, strict_mode=False)
        except Exception as exc:  # xgrammar reports bad or unsupported schemas as exceptions
            raise Refused(f"{type(exc).__name__}: {exc}") from exc
        return lambda: _XGWalker(self.xg.GrammarMatcher(compiled), self.tmask)


class _XGWalker:
    def __init__(self, matcher: Any, tmask: Any) -> None:
        self.m, self.tmask, self.view = matcher, tmask, tmask.numpy()

    def fill(self, mask: np.ndarray) -> None:
        self.m.fill_next_token_bitmask(self.tmask)
        mask[0, :] = self.view[0, : mask.shape[1]]  # a copy of ~19 KB, charged to xgrammar

    def accept(self, token: int) -> bool:
        return bool(self.m.accept_token(token))


class OutlinesEngine:
    """outlines-core: the schema becomes one regex, then a full token-level DFA index (slow)."""

    name = "outlines"

    def __init__(self, tok: Any, eos: int) -> None:
        import outlines_core
        from grammar import TokenVocabulary

        self.oc = outlines_core
        vocab = TokenVocabulary.from_tokenizer(tok)
        table: dict[bytes, list[int]] = {}
        for tid, piece in enumerate(vocab.token_bytes):
            if piece and tid != eos and tid not in vocab.special_token_ids:
                table.setdefault(piece, []).append(tid)
        self.vocabulary = outlines_core.Vocabulary(eos, table)
        self.eos = eos

    def compile(self, schema: Any) -> Callable[[], Any]:
        try:
            regex = self.oc.json_schema.build_regex_from_schema(json.dumps(schema))
            index = self.oc.Index(regex, self.vocabulary)
        except Exception as exc:
            raise Refused(f"{type(exc).__name__}: {exc}") from exc
        return lambda: _OutlinesWalker(self.oc.Guide(index), self.eos)


class _OutlinesWalker:
    def __init__(self, guide: Any, eos: int) -> None:
        self.g, self.eos = guide, eos

    def fill(self, mask: np.ndarray) -> None:
        mask[0, :] = 0
        if self.g.is_finished():
            mask[0, self.eos // 32] |= np.int32(1 << (self.eos % 32)) if self.eos % 32 != 31 else np.int32(-(2**31))
            return
        self.g.write_mask_into(mask.ctypes.data, mask.shape[1], 4)

    def accept(self, token: int) -> bool:
        try:
            self.g.advance(token)
            return True
        except Exception:
            return False


ENGINES = {e.name: e for e in (FormcastEngine, LLGuidanceEngine, XGrammarEngine, OutlinesEngine)}


def load_tokenizer(which: str) -> Any:
    # After PYTHONPATH: another checkout placed there is the one measured (a tree compared with
    # this one); inserted first, this checkout's grammar was measured whatever PYTHONPATH said.
    if str(ROOT) not in sys.path:
        sys.path.append(str(ROOT))
    from engine.hf.tokenizers import load_default_tokenizer, load_qwen2_tokenizer

    return load_qwen2_tokenizer() if which == "qwen2" else load_default_tokenizer()


# ---------------------------------------------------------------------------- one schema, one engine
def _allowed(mask: np.ndarray, token: int) -> bool:
    return bool((int(mask[0, token >> 5]) >> (token & 31)) & 1)


def run_one(engine: Any, record: dict, tok: Any, eos: int, width: int, progress: Callable | None = None) -> dict:
    """Compile ``record['schema']`` and walk every test instance; never raises."""
    out: dict[str, Any] = {"id": record["id"], "engine": engine.name, "tbm_us": [], "slow_cpu_us": {},
                           "features": record.get("meta", {}).get("features", [])}
    mask = np.full((1, width), -1, dtype=np.int32)
    texts = [json.dumps(t["data"], ensure_ascii=False) for t in record["tests"]]
    token_lists = [tok.encode(t, add_special_tokens=False) for t in texts]
    try:
        t0 = time.perf_counter()
        new = engine.compile(record["schema"])
        walker = new()
        walker.fill(mask)
        out["ttfm_us"] = (time.perf_counter() - t0) * 1e6
        if progress is not None:  # lets the parent tell a timeout in the walk from one in compile
            progress(out["ttfm_us"])
    except Refused as exc:
        return {**out, "status": "compile", "error": str(exc)[:500]}
    except BaseException as exc:  # an engine bug, not a refusal
        return {**out, "status": "crash", "error": _describe(exc)}
    failures: list[dict] = []
    try:
        for i, (test, tokens) in enumerate(zip(record["tests"], token_lists)):
            walker = walker if i == 0 else new()
            if i > 0:
                try:
                    walker.fill(mask)
                except Refused as exc:
                    verdict = {"pos": 0, "token": None, "why": f"engine error: {str(exc)[:200]}"}
                    if test["valid"]:
                        failures.append({"kind": "validation", "test": i, **verdict, "text": texts[i][:300]})
                    continue
            verdict = _walk(walker, mask, tokens, eos, out["tbm_us"], out["slow_cpu_us"])
            if verdict is not None and test["valid"]:
                failures.append({"kind": "validation", "test": i, **verdict, "text": texts[i][:300]})
            elif verdict is None and not test["valid"]:
                failures.append({"kind": "invalidation", "test": i, "text": texts[i][:300],
                                 "description": str(test.get("description", ""))[:200]})
    except BaseException as exc:
        return {**out, "status": "crash", "error": _describe(exc), "failures": failures}
    kinds = {f["kind"] for f in failures}
    status = "invalidation" if "invalidation" in kinds else "validation" if kinds else "pass"
    return {**out, "status": status, "failures": failures}


SLOW_MASK_US = 5_000  # masks at least this slow also keep their CPU time (``slow_cpu_us``)


def _walk(walker: Any, mask: np.ndarray, tokens: list[int], eos: int, tbm: list[float],
          slow_cpu: dict[str, float]) -> dict | None:
    """Walk one instance from its first mask (already filled); None if accepted with EOS allowed,
    else where it was rejected. ``slow_cpu``: the thread's CPU time of each mask over
    SLOW_MASK_US, by its index in ``tbm`` (the CPU clock is read outside the timed interval)."""
    clock, cpu_clock = time.perf_counter, time.thread_time
    for pos, token in enumerate(tokens):
        if not _allowed(mask, token):
            return {"pos": pos, "token": token, "why": "masked"}
        c0 = cpu_clock()
        t0 = clock()
        try:
            ok = walker.accept(token)
            walker.fill(mask)
        except Refused as exc:  # an engine error state mid-walk (llguidance limits): a rejection
            return {"pos": pos, "token": token, "why": f"engine error: {str(exc)[:200]}"}
        wall_us = (clock() - t0) * 1e6
        if wall_us >= SLOW_MASK_US:
            slow_cpu[str(len(tbm))] = round((cpu_clock() - c0) * 1e6, 1)
        tbm.append(wall_us)
        if not ok:
            return {"pos": pos, "token": token, "why": "accept refused an allowed token"}
    if not _allowed(mask, eos):
        return {"pos": len(tokens), "token": eos, "why": "EOS not allowed"}
    return None


def _describe(exc: BaseException) -> str:
    tb = traceback.extract_tb(exc.__traceback__)
    where = f" at {Path(tb[-1].filename).name}:{tb[-1].lineno}" if tb else ""
    return f"{type(exc).__name__}: {str(exc)[:400]}{where}"


# ---------------------------------------------------------------------------- worker pool
_LOADED: tuple | None = None  # (tokenizer, eos, mask width, engines) loaded once, inherited by fork


def _load(engine_names: list[str], tokenizer: str) -> tuple:
    """Tokenizer and engines, warmed up on a trivial schema (per-tokenizer setup is not TTFM)."""
    global _LOADED
    if _LOADED is None:
        tok = load_tokenizer(tokenizer)
        eos = int(tok.eos_token_id)
        width = (len(tok) + 31) // 32
        engines = {n: ENGINES[n](tok, eos) for n in engine_names}
        warm = {"id": "warmup", "schema": {"type": "object", "properties": {"a": {"type": "string"}}},
                "tests": [{"valid": True, "data": {"a": "x"}}]}
        for e in engines.values():
            run_one(e, warm, tok, eos, width)
        _LOADED = (tok, eos, width, engines)
    return _LOADED


def _worker(conn: Any, engine_names: list[str], tokenizer: str) -> None:
    tok, eos, width, engines = _load(engine_names, tokenizer)
    conn.send(("ready", None))
    while True:
        task = conn.recv()
        if task is None:
            return
        name, record = task
        report = lambda ttfm: conn.send(("compiled", ttfm))  # noqa: E731
        conn.send(("done", run_one(engines[name], record, tok, eos, width, report)))


class _Slot:
    """One worker process and the task it is running."""

    def __init__(self, ctx: Any, engines: list[str], tokenizer: str) -> None:
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker, args=(child, engines, tokenizer), daemon=True)
        self.proc.start()
        child.close()
        self.task: tuple[str, dict] | None = None
        self.ttfm: float | None = None  # set when the running task has compiled
        self.started = 0.0
        self.ready = False
        self.done = 0

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join(5)
        self.conn.close()


def run_pool(tasks: list[tuple[str, dict]], engines: list[str], args: argparse.Namespace, sink: Callable) -> None:
    """Run every (engine, record) task; ``sink(result)`` gets each result as it arrives."""
    ctx = mp.get_context("fork")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # Loading takes ~30 s (tokenizer, llguidance slicer, xgrammar tokenizer info); doing it once
    # here makes a replacement worker (after a timeout or crash) start in milliseconds.
    _load(engines, args.tokenizer)
    if args.gc_freeze:
        # What a serving process does once loaded (formcast's Engine does it): full collections
        # skip the startup heap. Every engine runs in the same kind of forked worker, so all get it.
        gc.collect()
        gc.freeze()
    queue = list(reversed(tasks))
    make = lambda: _Slot(ctx, engines, args.tokenizer)  # noqa: E731
    slots = [make() for _ in range(min(args.jobs, len(tasks)))]
    stop_at = time.monotonic() + args.max_minutes * 60 if args.max_minutes else float("inf")
    while queue or any(s.task for s in slots):
        if queue and time.monotonic() > stop_at:
            print(f"  --max-minutes reached: {len(queue)} tasks not started", file=sys.stderr)
            queue.clear()
        for i, s in enumerate(slots):
            if s.ready and s.task is None and queue:
                s.task, s.started, s.ttfm = queue.pop(), time.monotonic(), None
                s.conn.send(s.task)
        busy = [s for s in slots if s.task]
        deadline = min((s.started + args.timeout for s in busy), default=time.monotonic() + 1)
        ready = wait([s.conn for s in slots], timeout=max(0.01, deadline - time.monotonic()))
        for i, s in enumerate(slots):
            if s.conn in ready:
                try:
                    kind, payload = s.conn.recv()
                except (EOFError, OSError):
                    _lost(s, sink, "crash", f"worker died (exit code {s.proc.exitcode})")
                    slots[i] = make()
                    continue
                if kind == "ready":
                    s.ready = True
                elif kind == "compiled":
                    s.ttfm = payload
                else:
                    sink(payload)
                    s.task, s.done = None, s.done + 1
                    if s.done >= RECYCLE_AFTER:
                        s.conn.send(None)
                        s.proc.join(10)
                        s.kill()
                        slots[i] = make()
            elif s.task and time.monotonic() - s.started > args.timeout:
                _lost(s, sink, "timeout", f"over {args.timeout:g} s")
                slots[i] = make()
    for s in slots:
        s.kill()


def _lost(slot: _Slot, sink: Callable, status: str, error: str) -> None:
    if slot.task is not None:
        name, record = slot.task
        extra = {"phase": "compile"} if slot.ttfm is None else {"phase": "walk", "ttfm_us": slot.ttfm}
        sink({"id": record["id"], "engine": name, "status": status, "error": f"{error} ({extra['phase']})",
              "tbm_us": [], "features": record.get("meta", {}).get("features", []), **extra})
    slot.kill()


# ---------------------------------------------------------------------------- data and report
def compiled_schemas(records: list[dict], vocab: Any) -> Iterator[tuple[dict, Any]]:
    """(record, formcast's compiled grammar) for each record it compiles (refusals skipped), the
    compile caches cleared before each, as TTFM is measured."""
    import grammar
    from grammar.api import clear_cache

    for record in records:
        clear_cache(keep_setup=True)
        try:
            compiled = grammar.compile_json_schema(record["schema"], vocab)
        except grammar.GrammarError:
            continue
        yield record, compiled


def load_records(path: Path, offset: int, limit: int | None, sample: int | None, seed: int) -> list[dict]:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        records = [json.loads(line) for line in f if line.strip()]
    records = records[offset:]
    if limit is not None:
        records = records[:limit]
    if sample is not None:
        # A prefix of one seeded permutation, kept in that order: samples of different sizes are
        # nested, and a run stopped early (--max-minutes) is still a uniform random sample.
        order = list(range(len(records)))
        random.Random(seed).shuffle(order)
        records = [records[i] for i in order[:sample]]
    return records


PCTS = (25, 50, 75, 90, 95, 99, 99.9)


def _stats(values: list[float]) -> list[str]:
    if not values:
        return ["-"] * (len(PCTS) + 2)
    arr = np.asarray(values, dtype=np.float64)
    cells = [arr.mean(), *np.percentile(arr, PCTS), arr.max()]
    return [f"{v:,.0f}" if v >= 10 else f"{v:.1f}" for v in cells]


def classify_unsatisfiable(results: list[dict], records: dict[str, dict]) -> list[dict]:
    """A refusal that says "unsatisfiable" for a schema whose record holds no valid instance is
    the right answer (no value can be generated), its own class; with a valid instance it stays
    a refusal (the verdict is wrong)."""
    out = []
    for r in results:
        record = records.get(r["id"])
        if (r["status"] == "compile" and "unsatisfiable" in r.get("error", "") and record is not None
                and not any(t["valid"] for t in record["tests"])):
            r = {**r, "status": "unsatisfiable"}
        out.append(r)
    return out


def summarize(results: list[dict], engines: list[str]) -> str:
    """The MaskBench table (markdown), engines side by side, plus formcast/anchor ratios."""
    by = {e: [r for r in results if r["engine"] == e] for e in engines}
    ids = [{r["id"] for r in by[e]} for e in engines]
    common = set.intersection(*ids) if ids else set()
    lines = [f"schemas: {len(common)} (on which every engine ran)", "",
             "| metric | " + " | ".join(engines) + " |", "| --- |" + " ---: |" * len(engines)]
    cols = {e: [r for r in by[e] if r["id"] in common] for e in engines}
    ttfm = {e: [r["ttfm_us"] for r in cols[e] if "ttfm_us" in r and r["status"] != "compile"] for e in engines}
    tbm = {e: [x for r in cols[e] for x in r.get("tbm_us", [])] for e in engines}
    labels = ["avg", *(f"p{p:g}" for p in PCTS), "max"]
    for name, data in (("TTFM", ttfm), ("TBM", tbm)):
        table = {e: _stats(data[e]) for e in engines}
        for j, label in enumerate(labels):
            lines.append(f"| {name} {label} (µs) | " + " | ".join(table[e][j] for e in engines) + " |")
    lines.append("| TBM samples (tokens) | " + " | ".join(f"{len(tbm[e]):,}" for e in engines) + " |")
    for limit_us in (1_000, 20_000):  # the stalls a batch feels: how many masks took longer
        cells = []
        for e in engines:
            over = sum(x > limit_us for x in tbm[e])
            cells.append(f"{over:,} ({over / max(len(tbm[e]), 1):.2%})")
        lines.append(f"| TBM masks over {limit_us // 1000} ms | " + " | ".join(cells) + " |")
    cells = []
    for e in engines:  # (results from before slow_cpu_us was recorded count as unknown)
        known = [r for r in cols[e] if "slow_cpu_us" in r or not r.get("tbm_us")]
        over = sum(v > 20_000 for r in known for v in r.get("slow_cpu_us", {}).values())
        cells.append(f"{over:,}" if len(known) == len(cols[e]) else "n/a")
    lines.append("| TBM masks over 20 ms of CPU time | " + " | ".join(cells) + " |")
    counts = {e: Counter(r["status"] for r in cols[e]) for e in engines}
    for c in CLASSES:
        lines.append(f"| {c} | " + " | ".join(str(counts[e][c]) for e in engines) + " |")
    lines.append("| right (pass + unsatisfiable) | " + " | ".join(
        f"{(counts[e]['pass'] + counts[e]['unsatisfiable']) / max(len(cols[e]), 1):.2%}" for e in engines) + " |")
    if "formcast" in engines and any(a in engines for a in ANCHORS):
        lines += ["", "formcast / anchor ratios (lower is better for times):", ""]
        for a in (a for a in ANCHORS if a in engines):
            parts = []
            for name, data, pcts in (("TTFM", ttfm, (50, 90, 99)), ("TBM", tbm, (50, 90, 99, 100))):
                for p in pcts:
                    if data["formcast"] and data[a]:
                        ratio = np.percentile(data["formcast"], p) / max(np.percentile(data[a], p), 1e-9)
                        parts.append(f"{name} {'max' if p == 100 else f'p{p}'} {ratio:.2f}x")
            parts.append(f"passing {counts['formcast']['pass']} vs {counts[a]['pass']}")
            lines.append(f"- vs {a}: " + ", ".join(parts))
    return "\n".join(lines)


KEYWORDS = (
    "$ref", "$defs", "definitions", "$anchor", "$dynamicRef", "patternProperties", "additionalProperties",
    "unevaluatedProperties", "unevaluatedItems", "propertyNames", "dependentRequired", "dependentSchemas",
    "dependencies", "minProperties", "maxProperties", "prefixItems", "additionalItems", "contains",
    "minContains", "maxContains", "uniqueItems", "minItems", "maxItems", "items", "minLength", "maxLength",
    "pattern", "format", "contentEncoding", "contentMediaType", "multipleOf", "exclusiveMinimum",
    "exclusiveMaximum", "minimum", "maximum", "allOf", "anyOf", "oneOf", "not", "if", "then", "else",
    "const", "enum", "required", "properties", "type",
)


def _keyword_of(message: str) -> str:
    """The JSON Schema keyword a message names (quoted first, then bare), else its first words."""
    named = re.search(r"keyword '([^']+)'", message)
    if named:
        return named.group(1)
    for quote in ("'", '"', "`"):
        for kw in KEYWORDS:
            if f"{quote}{kw}{quote}" in message:
                return kw
    words = re.split(r"[\s:,.()\[\]/]+", message)
    for word in words:  # the first bare keyword, if unlike an English word (camelCase or $-prefixed)
        if word in KEYWORDS and (word != word.lower() or word.startswith("$")):
            return word
    return " ".join(message.split()[:6])


def failure_report(results: list[dict], engine: str = "formcast", examples: int = 2) -> str:
    """Why ``engine`` refused or failed schemas: messages grouped by keyword, failing schemas'
    features counted, invalidation errors listed by schema id."""
    rows = [r for r in results if r["engine"] == engine]
    lines = [f"## {engine}: {len(rows)} schemas"]
    for status in ("compile", "crash", "timeout"):
        group: dict[str, list[dict]] = {}
        for r in rows:
            if r["status"] == status:
                key = _keyword_of(r.get("error", "")) if status != "timeout" else f"in {r.get('phase', '?')}"
                group.setdefault(key, []).append(r)
        if group:
            lines.append(f"\n{status} ({sum(map(len, group.values()))}), by keyword:")
        for key, rs in sorted(group.items(), key=lambda kv: -len(kv[1])):
            lines.append(f"  {len(rs):4d}  {key}")
            for r in rs[:examples]:
                lines.append(f"          e.g. {r['id']}: {r.get('error', '')[:160]}")
    for status in ("validation", "invalidation"):
        rs = [r for r in rows if r["status"] == status]
        if not rs:
            continue
        feats = Counter(f for r in rs for f in r.get("features", []))
        lines.append(f"\n{status} ({len(rs)}); schema features among them: "
                     + ", ".join(f"{k} {v}" for k, v in feats.most_common(12)))
        for r in rs[: (len(rs) if status == "invalidation" else examples * 3)]:
            f = next((x for x in r.get("failures", []) if x["kind"] == status), {})
            lines.append(f"    {r['id']}: test {f.get('test')} {f.get('why', '')} at token {f.get('pos', '')}"
                         f" :: {f.get('text', '')[:120]!r}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- command line
def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--input", type=Path, default=DEFAULT_INPUT)
    ap.add_argument("--limit", type=int)
    ap.add_argument("--offset", type=int, default=0)
    ap.add_argument("--sample", type=int, help="deterministic random sample of N schemas (after offset/limit)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--engines", default="formcast,llguidance,xgrammar")
    ap.add_argument("--tokenizer", choices=("qwen2", "smollm2"), default="qwen2")
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds per schema and engine")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--gc-freeze", action="store_true", help="gc.freeze() after loading and warming the engines, "
                    "before forking the workers (as a serving process does)")
    ap.add_argument("--max-minutes", type=float, help="start no new task after this many minutes")
    ap.add_argument("--out", type=Path, help="results, one JSON line per (schema, engine)")
    ap.add_argument("--summarize", type=Path, help="print the tables of an earlier --out file and exit")
    ap.add_argument("--formcast-property-order", choices=("declared", "any"), default="declared",
                    help="formcast's json_property_order: the schema's key order, or every order (a validator's reading)")
    ap.add_argument("--formcast-backstop", type=float,
                    help="formcast's wall-clock compile backstop in seconds (0: off; default: the library's)")
    ap.add_argument("--failures", default="formcast", help="engine whose failures are listed ('' for none)")
    ap.add_argument("--resume", type=Path, help="results file of an earlier run: its (schema, engine) pairs are "
                    "skipped and its results join this run's summary")
    args = ap.parse_args(argv)
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    FormcastEngine.property_order = args.formcast_property_order
    FormcastEngine.backstop_seconds = args.formcast_backstop
    unknown = [e for e in engines if e not in ENGINES]
    if unknown:
        ap.error(f"unknown engines {unknown}; choose from {sorted(ENGINES)}")
    if args.summarize:
        with open(args.summarize, encoding="utf-8") as f:
            results = [json.loads(line) for line in f if line.strip()]
        engines = [e for e in engines if any(r["engine"] == e for r in results)]
    else:
        results = run(args, engines)
    records = {r["id"]: r for r in load_records(args.input, 0, None, None, 0)}
    results = classify_unsatisfiable(results, records)
    print(summarize(results, engines))
    for e in filter(None, args.failures.split(",")):
        if e in engines:
            print("\n" + failure_report(results, e))


def run(args: argparse.Namespace, engines: list[str]) -> list[dict]:
    records = load_records(args.input, args.offset, args.limit, args.sample, args.seed)
    earlier: list[dict] = []
    if args.resume:
        with open(args.resume, encoding="utf-8") as f:
            earlier = [json.loads(line) for line in f if line.strip()]
    done = {(r["engine"], r["id"]) for r in earlier}
    tasks = [(e, r) for r in records for e in engines if (e, r["id"]) not in done]
    print(f"{len(records)} schemas x {len(engines)} engines, {args.jobs} jobs, timeout {args.timeout:g} s",
          file=sys.stderr)
    if "formcast" in engines:
        if str(ROOT) not in sys.path:
            sys.path.append(str(ROOT))
        import grammar

        print(f"formcast's grammar from {Path(grammar.__file__).parent}", file=sys.stderr)
    results: list[dict] = []
    out = open(args.out, "w", encoding="utf-8") if args.out else None
    for r in earlier:  # a resumed run's output holds every result, old and new
        results.append(r)
        if out:
            out.write(json.dumps(r, ensure_ascii=False) + "\n")
    t0 = time.monotonic()

    def sink(result: dict) -> None:
        result["tbm_us"] = [round(x, 2) for x in result.get("tbm_us", [])]
        results.append(result)
        if out:
            out.write(json.dumps(result, ensure_ascii=False) + "\n")
            out.flush()
        if len(results) % 50 == 0:
            print(f"  {len(results)}/{len(tasks)} done, {time.monotonic() - t0:.0f} s", file=sys.stderr)

    try:
        run_pool(tasks, engines, args, sink)
    finally:
        if out:
            out.close()
    print(f"wall time {time.monotonic() - t0:.0f} s", file=sys.stderr)
    return results


if __name__ == "__main__":
    main()
