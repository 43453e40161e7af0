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
    during = [g for t, g in itls if t0 <= t <= t1]
    q = statistics.median(quiet)
    deciles = statistics.quantiles(during, n=10) if len(during) >= 2 else [during[0]] * 9
    return {"compile_s": t1 - t0, "quiet_p50_ms": 1000 * q, "during_p50_ms": 1000 * statistics.median(during),
            "during_p90_ms": 1000 * deciles[8], "tokens_during": len(during), "p50_ratio": statistics.median(during) / q,
            "p90_ratio": deciles[8] / q}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--enum", type=int, default=120_000)
    parser.add_argument("--quiet", type=float, default=8.0, help="seconds of stream before the compile")
    args = parser.parse_args()
    rows = {name: measure(p, args.enum, args.quiet) for name, p in (("thread", 0), ("process", 1))}
    print(f"enum of {args.enum:,} strings compiled while a request streams (SmolLM2, CPU)")
    print(f"{'placement':<10} {'compile s':>9} {'quiet ITL p50 ms':>16} {'during p50 ms':>13} {'during p90 ms':>13} "
          f"{'tokens':>6} {'p50/quiet':>9} {'p90/quiet':>9}")
    for name, r in rows.items():
        print(f"{name:<10} {r['compile_s']:>9.1f} {r['quiet_p50_ms']:>16.1f} {r['during_p50_ms']:>13.1f} {r['during_p90_ms']:>13.1f} "
              f"{r['tokens_during']:>6} {r['p50_ratio']:>9.2f} {r['p90_ratio']:>9.2f}")


if __name__ == "__main__":
    main()
