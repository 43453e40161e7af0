"""The typed constraint key, the on-disk grammar store, compile processes and a cold numba cache
(issue 25; issue 23 item 2).

Each path that produces a ``CompiledGrammar`` without running the front end in this process
(read from disk, built from a child's arrays, compiled on an empty numba cache) must give the
same masks and the same verdicts as the plain in-process compile.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from grammar import CompileBudget, Constraint, GrammarBudgetError, SchemaError, TokenVocabulary, api
from grammar.compile_worker import CompilePool
from grammar.disk_cache import DiskCache
from mask_reference import probe_fingerprint

ROOT = Path(__file__).resolve().parents[1]
VOCAB = TokenVocabulary.byte_level()

SCHEMA = {"type": "object", "properties": {"id": {"type": "integer", "minimum": 3}, "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}}},
          "required": ["id"], "additionalProperties": False}
CONSTRAINTS = [
    Constraint.json_schema(SCHEMA),
    Constraint.regex(r"[a-z]{2,6}(,[0-9]+)*;"),
    Constraint.ebnf('root ::= "(" item ("," item)* ")"\nitem ::= [a-z]+ | root'),
    Constraint.json_schema({"type": "array", "items": {"anyOf": [{"type": "string", "format": "date"}, {"type": "null"}]}}),
]
PROBES = [b"", b"{", b'{"id": 4', b'{"id": 12, "tags": ["ab"', b"abc", b"abc,1", b"(", b"(a,(b", b"[", b'["2024-0', b"[null,"]


def _fingerprint(compiled) -> str:
    """A digest of the masks along every probe prefix the grammar accepts (and the verdicts)."""
    return probe_fingerprint(compiled, PROBES)


def _fresh(constraint, **kw):
    api.clear_cache()
    return api.compile_constraint(constraint, VOCAB, **kw)


@pytest.fixture(scope="module")
def plain():
    return {c: _fingerprint(_fresh(c, disk=None)) for c in CONSTRAINTS}


# --- one typed key --------------------------------------------------------------------------


def test_a_schema_has_one_key_whatever_its_spelling():
    from engine.constrained.grammar_backend import GrammarBackend
    from engine.sampling_params import SamplingParams

    as_dict = GrammarBackend.key_of(SamplingParams(json_schema=SCHEMA))
    as_text = GrammarBackend.key_of(SamplingParams(json_schema=json.dumps(SCHEMA, indent=2)))
    assert as_dict == as_text == Constraint.json_schema(SCHEMA) and hash(as_dict) == hash(as_text)
    assert as_dict.digest == as_text.digest and len(as_dict.digest) == 64
    # Key order is meaning (properties are emitted in order); options are part of the key.
    reordered = {"type": "object", "properties": dict(reversed(list(SCHEMA["properties"].items())))}
    assert Constraint.json_schema(reordered) != Constraint.json_schema({**reordered, "properties": SCHEMA["properties"]})
    strict = GrammarBackend.key_of(SamplingParams(json_schema=SCHEMA, json_schema_strict=True))
    assert strict != as_dict and strict.option("strict_properties") is True
    assert GrammarBackend.key_of(SamplingParams()) is None


def test_the_api_and_the_backend_share_one_compiled_grammar():
    from engine.constrained.grammar_backend import GrammarBackend
    from engine.sampling_params import SamplingParams

    api.clear_cache()
    backend = GrammarBackend(VOCAB)
    try:
        compiled = backend.compile(SamplingParams(json_schema=json.dumps(SCHEMA)))
        assert api.compile_json_schema(SCHEMA, VOCAB) is compiled
        assert compiled.constraint == Constraint.json_schema(SCHEMA)
    finally:
        backend.shutdown()


def test_a_shut_down_backend_starts_no_compile_process():
    # The switch to compiled grammar kernels calls start_compile_processes from another thread; on
    # a fresh install it can come after the engine closed (spec_bench's first engine did).
    from engine.constrained.grammar_backend import GrammarBackend

    backend = GrammarBackend(VOCAB, compile_processes=1)
    backend.shutdown()
    backend.start_compile_processes()


def test_bad_json_text_is_refused_before_any_compile():
    with pytest.raises(SchemaError, match="not valid JSON"):
        Constraint.json_schema('{"type": ')


# --- the on-disk store ------------------------------------------------------------------------


def test_disk_entries_give_the_same_masks(tmp_path, plain):
    disk = DiskCache(tmp_path)
    for c in CONSTRAINTS:
        written = _fresh(c, disk=disk)
        assert written.compiled_here  # compiled here, then stored
    assert disk.stats["writes"] == len(CONSTRAINTS) and len(list(tmp_path.glob("*.npz"))) == len(CONSTRAINTS)
    restarted = DiskCache(tmp_path)  # a new process's view of the same directory
    for c in CONSTRAINTS:
        loaded = _fresh(c, disk=restarted)
        assert not loaded.compiled_here, "read from disk, not compiled"
        assert _fingerprint(loaded) == plain[c], c
    assert restarted.stats["hits"] == len(CONSTRAINTS)


def test_a_damaged_entry_is_ignored_and_rebuilt(tmp_path, plain):
    disk = DiskCache(tmp_path)
    c = CONSTRAINTS[0]
    _fresh(c, disk=disk)
    (entry,) = tmp_path.glob("*.npz")
    for damage in (entry.read_bytes()[: entry.stat().st_size // 2], b"not a zip at all"):
        entry.write_bytes(damage)
        rebuilt = _fresh(c, disk=disk)
        assert rebuilt.compiled_here and _fingerprint(rebuilt) == plain[c]
        assert _fingerprint(_fresh(c, disk=DiskCache(tmp_path))) == plain[c]  # the rewritten entry loads
    assert disk.stats["corrupt"] == 2


def test_the_store_is_bounded_in_bytes(tmp_path):
    assert not DiskCache(tmp_path, max_bytes=1).store("k", _fresh(CONSTRAINTS[1], disk=None).nfa)  # larger than the bound
    _fresh(CONSTRAINTS[1], disk=DiskCache(tmp_path))
    (first,) = tmp_path.glob("*.npz")
    size = first.stat().st_size
    disk = DiskCache(tmp_path, max_bytes=3 * size)
    for i in range(6):  # entries of about the same size
        _fresh(Constraint.regex(f"[a-z]{{2,6}}(,[0-9]+)*;{i}"), disk=disk)
    kept = list(tmp_path.glob("*.npz"))
    assert 2 <= len(kept) <= 3 and sum(p.stat().st_size for p in kept) <= 3 * size and disk.stats["evicted"] >= 3
    assert first not in kept  # the oldest went first


def test_concurrent_writers_leave_a_whole_entry(tmp_path, plain):
    c = CONSTRAINTS[2]
    nfa = _fresh(c, disk=None).nfa
    disks = [DiskCache(tmp_path) for _ in range(8)]
    key = disks[0].key(c, VOCAB.fingerprint, CompileBudget())
    threads = [threading.Thread(target=lambda d=d: [d.store(key, nfa) for _ in range(5)]) for d in disks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [p.name for p in tmp_path.iterdir()] == [f"{key}.npz"]  # no temporary file left behind
    loaded = DiskCache(tmp_path).load(key).to_payload()
    assert all(np.array_equal(loaded[k], v) for k, v in nfa.to_payload().items())
    assert _fingerprint(_fresh(c, disk=DiskCache(tmp_path))) == plain[c]


def test_the_key_follows_the_vocabulary_and_the_budget(tmp_path):
    disk = DiskCache(tmp_path)
    c = CONSTRAINTS[1]
    base = disk.key(c, VOCAB.fingerprint, CompileBudget())
    assert disk.key(c, VOCAB.fingerprint, CompileBudget(max_compile_seconds=None)) == base  # the backstop decides nothing
    assert disk.key(c, "another vocabulary", CompileBudget()) != base
    assert disk.key(c, VOCAB.fingerprint, CompileBudget(max_nfa_states=1000)) != base
    assert disk.key(Constraint.regex(c.source, flavor="ecma"), VOCAB.fingerprint, CompileBudget()) != base


# --- compile processes -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pool():
    p = CompilePool(1)
    yield p
    p.close()


def test_a_child_compiles_the_same_grammar(pool, plain):
    for c in CONSTRAINTS:
        compiled = _fresh(c, front_end=pool, disk=None)
        assert not compiled.compiled_here, "built from the child's arrays"
        assert compiled.compile_steps > 0
        assert _fingerprint(compiled) == plain[c], c


def test_a_child_refuses_with_the_same_error(pool):
    hostile = Constraint.json_schema({"type": "string", "minLength": 1_000_000_000})
    with pytest.raises(GrammarBudgetError) as here:
        _fresh(hostile, disk=None)
    with pytest.raises(GrammarBudgetError) as there:
        _fresh(hostile, front_end=pool, disk=None)
    assert str(there.value) == str(here.value)
    with pytest.raises(GrammarBudgetError, match="max_compile_steps"):
        _fresh(Constraint.regex("(" + "|".join(f"w{i:05d}" for i in range(9000)) + ")"), front_end=pool, disk=None,
               budget=CompileBudget(max_compile_steps=1000))


def test_a_dead_child_is_replaced(pool, plain):
    child = pool._idle.get()
    if child is not None:
        child.proc.kill()
        child.proc.wait()
    pool._idle.put(child)
    c = CONSTRAINTS[1]
    assert _fingerprint(_fresh(c, front_end=pool, disk=None)) == plain[c]


# --- a cold numba cache ---------------------------------------------------------------------------


def test_the_warm_marker_has_a_place():
    # Without a place for the marker, every process would spawn the warm-up children again.
    from grammar import jit_warmup

    assert jit_warmup._marker() is not None


def test_a_second_process_on_a_cold_cache_waits_instead_of_compiling_again(tmp_path, monkeypatch):
    # Two test workers (or server replicas) starting on one empty cache: the one holding the
    # warm-up lock compiles, the other spawns no children and returns once the marker appears.
    import threading

    from grammar import jit_warmup

    marker = tmp_path / "formcast-warm-test"
    monkeypatch.setattr(jit_warmup, "_marker", lambda: marker)
    monkeypatch.setattr(jit_warmup.subprocess, "Popen", lambda *a, **k: pytest.fail("spawned a compile child"))
    holder = jit_warmup._take_lock(blocking=False)
    assert holder is not None and (tmp_path / "formcast-warm.lock").exists()
    second = jit_warmup._spawn()
    assert second.elsewhere and not second.procs

    def finish() -> None:  # the holder's children are done: marker, then the lock is released
        marker.touch()
        holder.close()

    timer = threading.Timer(0.2, finish)
    timer.start()
    lines: list[str] = []
    assert second.wait(progress=lines.append)
    timer.join()
    assert lines and "another process" in lines[0]


# Kernels allowed more than one compiled version, with how many at most. The determinizer's one
# generic growth: a version per element type (int8, int32, int64, bool), as many as the four typed
# copies it replaced. Its sort of long runs (``_sort_long``, and ``_sort_run`` when a test calls
# it: callers inline it): node ids (int32) and packed (state, id) keys (int64).
SIGNATURE_ALLOWLIST: dict[str, int] = {"determinizer._grow": 4, "determinizer._sort_run": 2, "determinizer._sort_long": 2}


def _cold_start_census(tmp_path: Path, request) -> tuple[dict, dict]:  # type: ignore[no-untyped-def]
    """(what a cold interpreter computed, the warm reference). The cold one is the record the test
    command's warm-up wrote when it started on an empty cache (``make test`` on a fresh machine),
    else ``tests/cold_cache_record.py`` run here on an empty temporary cache."""
    recorded = os.environ.get("FORMCAST_COLD_CACHE_RECORD")
    if recorded and Path(recorded).is_file():
        return json.loads(Path(recorded).read_text()), request.getfixturevalue("plain")
    record = tmp_path / "cold.json"
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba"))
    env.pop("FORMCAST_NO_JIT_WARMUP", None)
    script = ROOT / "tests" / "cold_cache_record.py"
    proc = subprocess.Popen([sys.executable, str(script), str(record)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        plain = request.getfixturevalue("plain")  # the warm reference, computed meanwhile
        _, err = proc.communicate(timeout=1800)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0 and record.is_file(), err[-3000:]
    return json.loads(record.read_text()), plain


@pytest.mark.slow
def test_an_empty_numba_cache_gives_the_same_results_and_compiles_each_kernel_once(tmp_path, request):
    # One cold interpreter for both checks (a cold start costs minutes on 2 cores): the warm-up
    # children compile into an empty NUMBA_CACHE_DIR, that interpreter loads what they wrote and
    # compiles whatever they did not; the masks and verdicts must be the warm process's, and the
    # cache must hold one version of each kernel (cold start pays per version).
    cold, plain = _cold_start_census(tmp_path, request)
    assert cold["warm_after"], "the warm-up did not mark the cache warm"
    assert cold["fingerprints"] == {c.digest: plain[c] for c in CONSTRAINTS}
    signatures = cold["signatures"]
    assert sum(1 for sigs in signatures.values() if sigs) >= 30, "the census sees the kernels compiled"
    again = {name: sigs for name, sigs in signatures.items() if len(sigs) > SIGNATURE_ALLOWLIST.get(name, 1)}
    assert not again, "kernels compiled more than once (pass int64 / C-contiguous arrays): " + json.dumps(again, indent=1)[:4000]


# --- precompile ----------------------------------------------------------------------------------


def test_backend_precompile_fills_the_store_a_restart_reads(tmp_path):
    from engine.constrained.grammar_backend import GrammarBackend
    from engine.sampling_params import SamplingParams

    api.clear_cache()
    backend = GrammarBackend(VOCAB, disk=DiskCache(tmp_path))
    try:
        out = backend.precompile([{"json_schema": SCHEMA}, SamplingParams(regex="[0-9]+"), {"regex": "(unclosed"}, {"json_schema": "{"}])
    finally:
        backend.shutdown()
    assert out[:2] == [None, None] and "regex" in out[2] and "json_schema" in out[3]
    assert len(list(tmp_path.glob("*.npz"))) == 2
    api.clear_cache()
    restarted = GrammarBackend(VOCAB, disk=DiskCache(tmp_path))
    try:
        compiled = restarted.compile(SamplingParams(json_schema=SCHEMA))
        assert not compiled.compiled_here and restarted.disk.stats["hits"] == 1
    finally:
        restarted.shutdown()


def test_formcast_precompile_command(tmp_path, smollm2_vocab, capsys):
    from engine.entrypoints.cli import main

    lines = [json.dumps(SCHEMA), json.dumps({"regex": "[a-z]{3}"}), json.dumps({"type": "string", "minLength": 1_000_000_000})]
    path = tmp_path / "constraints.jsonl"
    path.write_text("\n".join(lines) + "\n")
    code = main(["precompile", str(path), "--cache-dir", str(tmp_path / "store")])
    out = capsys.readouterr().out.splitlines()
    assert code == 1  # one constraint was refused
    assert out[0] == "0: compiled" and out[1] == "1: compiled" and out[2].startswith("2: refused: json_schema:")
    assert len(list((tmp_path / "store").glob("*.npz"))) == 2


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux's")
@pytest.mark.parametrize("busy", [True, False])
def test_a_compile_beside_running_requests_waits_for_idle_cpu_first(monkeypatch, busy):
    # While requests run, a compile takes only idle CPU for its first IDLE_SECONDS (their decode
    # steps keep the cores), then the caller's priority again, never starved; with nothing
    # running it keeps the caller's priority. The verdict is the same either way.
    from grammar import compile_worker

    calls: list[bool] = []
    real = compile_worker._set_idle
    monkeypatch.setattr(compile_worker, "_set_idle", lambda pid, idle: (calls.append(idle), real(pid, idle)))
    monkeypatch.setattr(compile_worker, "_can_leave_idle", lambda: True)
    monkeypatch.setattr(compile_worker, "IDLE_SECONDS", 1e-4)  # back at once
    pool = CompilePool(1, busy=lambda: busy)
    try:
        c = CONSTRAINTS[0]
        assert _fingerprint(_fresh(c, front_end=pool, disk=None)) == _fingerprint(_fresh(c, disk=None))
        (child,) = pool._children
        assert calls[:1] == ([True] if busy else []) and (not busy or calls[-1] is False)
        if busy and os.geteuid() == 0:  # leaving SCHED_IDLE needs the privilege _can_leave_idle checks
            assert os.sched_getscheduler(child.proc.pid) == os.SCHED_OTHER
    finally:
        pool.close()
