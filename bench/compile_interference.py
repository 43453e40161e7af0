"""Running requests' decode steps while a big constraint compiles (issue 25).

One engine (embedded SmolLM2) streams unconstrained requests back to back; the time between
their tokens (ITL) is recorded. After a quiet phase, a request with a huge constraint (an enum of
``--enum`` strings) is submitted, and the ITL of the running stream is recorded again until that
compile ends. Both compile placements run in the same process, one after the other:

- ``thread``: the front end in the engine's grammar worker thread (``grammar_compile_processes=0``),
- ``process``: in a child process (``grammar_compile_processes=1``, the default), the compiled NFA
  coming back as arrays.

The table gives the ITL p50 / p90 during the compile over the quiet ITL p50 of the same engine
(the goal: at most 1.2). The grammar caches (memory and disk) are off or cleared, so each
placement compiles.

    python bench/compile_interference.py [--enum 120000]
    python bench/compile_interference.py --ticker   # no model: the GIL effect alone
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _stream_itls(engine, stop: threading.Event, out: list[tuple[float, float]]) -> None:
    """Unconstrained requests back to back; (time, gap) between consecutive tokens."""
    while not stop.is_set():
        last = None
        for _ in engine.generate("Tell me a long story about the sea.", {"max_new_tokens": 48, "ignore_eos": True}, stream=True):
            now = time.perf_counter()
            if last is not None:
                out.append((now, now - last))
            last = now
            if stop.is_set():
                break


def measure(processes: int, enum_size: int, quiet_s: float) -> dict[str, float]:
    from engine import Engine
    from grammar import api

    api.clear_cache()
    words = [f"item-{i:06d}-{'abcdefghij'[i % 10]}" for i in range(enum_size)]
    with Engine(grammar_compile_processes=processes, grammar_cache_dir=None) as engine:
        engine.generate("warm up", {"max_new_tokens": 4})
        engine.precompile([{"regex": "[a-z]+"}])  # starts the compile process (if any) outside the window
        itls: list[tuple[float, float]] = []
        stop = threading.Event()
        runner = threading.Thread(target=_stream_itls, args=(engine, stop, itls))
        runner.start()
        time.sleep(quiet_s)
        t0 = time.perf_counter()
        error = engine.precompile([{"json_schema": {"enum": words}}])[0]
        t1 = time.perf_counter()
        stop.set()
        runner.join()
    if error:
        raise RuntimeError(error)
    quiet = [g for t, g in itls if t < t0 - 0.5]
    # No token at all during the compile: the stream stalled for at least the whole compile.
    during = [g for t, g in itls if t0 <= t <= t1] or [t1 - t0]
    q = statistics.median(quiet)
    deciles = statistics.quantiles(during, n=10) if len(during) >= 2 else [during[0]] * 9
    return {"compile_s": t1 - t0, "quiet_p50_ms": 1000 * q, "during_p50_ms": 1000 * statistics.median(during),
            "during_p90_ms": 1000 * deciles[8], "tokens_during": len(during), "p50_ratio": statistics.median(during) / q,
            "p90_ratio": deciles[8] / q}


def _ticks(stop: threading.Event, out: list[tuple[float, float]], work: int = 2000) -> None:
    """A stand-in for a decode loop's Python side: a fixed small step, then a 1 ms wait (the
    forward, GIL released); records the period between step starts, which includes the time the
    thread waits to get the GIL back."""
    last = time.perf_counter()
    while not stop.is_set():
        acc = 0
        for i in range(work):
            acc += i * i
        time.sleep(0.001)
        now = time.perf_counter()
        out.append((now, now - last))
        last = now


def measure_ticker(processes: int, enum_size: int, quiet_s: float = 5.0) -> dict[str, float]:
    """Without a model: a thread of fixed Python steps while the enum compiles in a thread of
    this process or in a compile process (the GIL is what the two placements differ in)."""
    from grammar import Constraint, TokenVocabulary, api
    from grammar.compile_worker import CompilePool

    vocab = TokenVocabulary.byte_level()
    api.compile_regex("[a-z]+", vocab)  # kernels and the vocabulary outside the window
    pool = CompilePool(1) if processes else None
    if pool is not None:
        api.compile_constraint(Constraint.regex("[0-9]+"), vocab, front_end=pool, disk=None)  # the child started
    words = [f"item-{i:06d}-{'abcdefghij'[i % 10]}" for i in range(enum_size)]
    constraint = Constraint.json_schema({"enum": words})
    api.clear_cache()
    ticks: list[tuple[float, float]] = []
    stop = threading.Event()
    ticker = threading.Thread(target=_ticks, args=(stop, ticks))
    ticker.start()
    time.sleep(quiet_s)
    t0 = time.perf_counter()
    api.compile_constraint(constraint, vocab, front_end=pool, disk=None)
    t1 = time.perf_counter()
    stop.set()
    ticker.join()
    if pool is not None:
        pool.close()
    quiet = [g for t, g in ticks if t < t0]
    during = [g for t, g in ticks if t0 <= t <= t1]
    q, d = statistics.median(quiet), statistics.median(during)
    p90 = statistics.quantiles(during, n=10)[8] if len(during) >= 2 else d
    return {"compile_s": t1 - t0, "quiet_p50_ms": 1000 * q, "during_p50_ms": 1000 * d, "during_p90_ms": 1000 * p90,
            "tokens_during": len(during), "p50_ratio": d / q, "p90_ratio": p90 / q}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--enum", type=int, default=120_000)
    parser.add_argument("--quiet", type=float, default=8.0, help="seconds of stream before the compile")
    parser.add_argument("--ticker", action="store_true", help="no model: fixed Python steps stand in for decode steps")
    args = parser.parse_args()
    if args.ticker:
        rows = {name: measure_ticker(p, args.enum) for name, p in (("thread", 0), ("process", 1))}
        print(f"enum of {args.enum:,} strings compiled beside a thread of fixed Python steps (no model)")
        print(f"{'placement':<10} {'compile s':>9} {'quiet period p50 ms':>19} {'during p50 ms':>13} {'during p90 ms':>13} "
              f"{'steps':>6} {'p50/quiet':>9} {'p90/quiet':>9}")
        for name, r in rows.items():
            print(f"{name:<10} {r['compile_s']:>9.1f} {r['quiet_p50_ms']:>19.2f} {r['during_p50_ms']:>13.2f} {r['during_p90_ms']:>13.2f} "
                  f"{r['tokens_during']:>6} {r['p50_ratio']:>9.2f} {r['p90_ratio']:>9.2f}")
        return
    rows = {name: measure(p, args.enum, args.quiet) for name, p in (("thread", 0), ("process", 1))}
    print(f"enum of {args.enum:,} strings compiled while a request streams (SmolLM2, CPU)")
    print(f"{'placement':<10} {'compile s':>9} {'quiet ITL p50 ms':>16} {'during p50 ms':>13} {'during p90 ms':>13} "
          f"{'tokens':>6} {'p50/quiet':>9} {'p90/quiet':>9}")
    for name, r in rows.items():
        print(f"{name:<10} {r['compile_s']:>9.1f} {r['quiet_p50_ms']:>16.1f} {r['during_p50_ms']:>13.1f} {r['during_p90_ms']:>13.1f} "
              f"{r['tokens_during']:>6} {r['p50_ratio']:>9.2f} {r['p90_ratio']:>9.2f}")


if __name__ == "__main__":
    main()
