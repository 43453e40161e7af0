"""Numba kernel census (issue 25): how many compiled versions numba's cache holds for each
grammar kernel of the current sources (``jit_warmup.compiled_signatures``), after whatever
workloads ran against that cache. Each kernel should have one: every further version is a whole
compile more on a fresh install.

    NUMBA_CACHE_DIR=/tmp/empty python -m grammar.jit_warmup && \\
    NUMBA_CACHE_DIR=/tmp/empty python bench/numba_census.py [-v]

``--time core,masks,strings,tails`` first runs those warm-up groups (``grammar/jit_tasks.py``)
in this process and prints the CPU seconds each compiled function took, its callees' compiles
excluded (numba's own overloads, such as ``arrayobj.impl`` for ``np.full``, included): where a
cold start's time goes. Run it on an empty ``NUMBA_CACHE_DIR`` (``NUMBA_OPT`` as the warm-up
children get it: ``jit_warmup.CHILD_ENV``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from grammar import jit_warmup  # noqa: E402


def compile_seconds(groups: list[str]) -> tuple[float, dict[str, float]]:
    """Run ``groups`` here; (CPU seconds in all, {function: exclusive compile CPU seconds})."""
    from numba.core import event

    from grammar import jit_tasks

    stack: list[list[float]] = []
    own: dict[str, float] = {}

    class Timer(event.Listener):
        def on_start(self, ev: event.Event) -> None:
            stack.append([time.process_time(), 0.0])

        def on_end(self, ev: event.Event) -> None:
            t0, callees = stack.pop()
            spent = time.process_time() - t0
            func = ev.data["dispatcher"].py_func
            name = f"{(func.__module__ or '?').rsplit('.', 1)[-1]}.{func.__name__}"
            own[name] = own.get(name, 0.0) + spent - callees
            if stack:
                stack[-1][1] += spent

    event.register("numba:compile", Timer())
    t0 = time.process_time()
    for group in groups:
        jit_tasks.TASKS[group]()
    return time.process_time() - t0, own


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-v", action="store_true", help="every kernel's signatures")
    parser.add_argument("--time", default="", help="warm-up groups to run and time first (comma-separated)")
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    if args.time:
        total, own = compile_seconds(args.time.split(","))
        print(f"{total:.1f} CPU s for {args.time}, {sum(own.values()):.1f} of it compiling")
        print("| function | compile CPU s (callees excluded) |\n| --- | ---: |")
        for name, seconds in sorted(own.items(), key=lambda kv: -kv[1])[: args.top]:
            print(f"| {name} | {seconds:.2f} |")
    census = jit_warmup.compiled_signatures()
    used = {name: sigs for name, sigs in census.items() if sigs}
    print(f"{len(census)} kernels, {len(used)} compiled, {sum(map(len, used.values()))} compiled versions")
    for name, sigs in sorted(used.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        if len(sigs) > 1 or args.v:
            print(f"{len(sigs)} {name}")
            for sig in sigs:
                print(f"    {sig[:300]}")


if __name__ == "__main__":
    main()
