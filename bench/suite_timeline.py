"""Where the test suite's wall time goes: each worker's tests and compiles on one timeline (issue 23).

A pytest plugin and its report. With ``FORMCAST_SUITE_TIMELINE`` naming a folder, every
pytest-xdist worker writes one JSON line per test start and end, per numba compile finished in
that process (outermost compiles only: a callee compiled inside its caller is the caller's
time), and per decode-attention kernel that had to be compiled into the cache by a child process
(``cpu_decode_attention._load``; the child's compile happens outside the worker, which waits).

    FORMCAST_SUITE_TIMELINE=/tmp/tl PYTHONPATH=bench .venv/bin/python -m pytest -q -p no:cacheprovider \\
        -p suite_timeline -n 2 --dist loadfile --no-loadscope-reorder
    .venv/bin/python bench/suite_timeline.py /tmp/tl

The report: each worker's span and how long it waited at the end for the other, how many
core-seconds the whole machine sat idle (``/proc/stat``), the tests that wait (wall time that
neither the worker's threads nor its reaped children spent on a CPU: a lock, a server, a Ray
actor), the files that took longest, the slowest tests, the in-process compiles by function and
the attention kernels compiled by children. ``--write-durations tests/file_durations.json``
records each file's time, the order in which ``tests/conftest.py`` hands the files out. Run it
on an empty ``NUMBA_CACHE_DIR`` after ``tests/cold_cache_record.py`` (as ``make test`` does) to
see a CI run's compiles. numba is imported only once collection is
over: the test configuration sets its thread counts before anything imports it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

_FOLDER = os.environ.get("FORMCAST_SUITE_TIMELINE")
_out: TextIO | None = None
_started: list[float] = []
_current_test = [""]


def _machine_idle() -> float:
    """Core-seconds the whole machine has spent idle (idle + iowait) since boot; 0 off Linux."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = f.readline().split()
    except OSError:
        return 0.0
    return (int(fields[4]) + int(fields[5])) / os.sysconf("SC_CLK_TCK")


def _clocks() -> dict[str, float]:
    """This worker's CPU (all its threads), its reaped children's, and the machine's idle time."""
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"cpu": time.process_time(), "kids": kids.ru_utime + kids.ru_stime, "idle": _machine_idle()}


def _write(**event: Any) -> None:
    if _out is not None:
        _out.write(json.dumps({"t": time.time(), **event}) + "\n")
        _out.flush()


def pytest_configure(config: Any) -> None:
    global _out
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    if worker == "main" and getattr(config.option, "numprocesses", None):
        return  # pytest-xdist's controller: its test reports are the workers', relayed
    if _FOLDER:
        Path(_FOLDER).mkdir(parents=True, exist_ok=True)
        _out = open(Path(_FOLDER) / f"{worker}.jsonl", "w", encoding="utf-8")  # noqa: SIM115 - open for the session


def _listen_to_numba() -> None:
    from numba.core import event

    class CompileListener(event.Listener):
        def on_start(self, ev: Any) -> None:
            _started.append(time.perf_counter())

        def on_end(self, ev: Any) -> None:
            seconds = time.perf_counter() - _started.pop()
            if not _started:
                fn = getattr(ev.data.get("dispatcher"), "py_func", None)
                name = f"{fn.__module__}.{fn.__qualname__}" if fn is not None else "?"
                _write(kind="compile", fn=name, seconds=seconds, test=_current_test[0])

    event.register("numba:compile", CompileListener())


def _watch_attention_children() -> None:
    try:
        from engine.layers import cpu_decode_attention as attention
    except ImportError:
        return
    load = getattr(attention, "_load", None)
    if not attention.available() or load is None:  # no numba, or the kernel loads another way now
        return

    def timed_load(kernel: Any, key: tuple) -> None:
        fresh = hasattr(kernel, "compile") and not attention._in_cache(kernel, attention._signature(key[2]))
        start = time.perf_counter()
        load(kernel, key)
        if fresh:
            _write(kind="child_compile", key=list(key), seconds=time.perf_counter() - start, test=_current_test[0])

    attention._load = timed_load


def pytest_collection_finish(session: Any) -> None:
    if _out is not None:
        _listen_to_numba()
        _watch_attention_children()


def pytest_runtest_logstart(nodeid: str, location: Any) -> None:
    _current_test[0] = nodeid
    _write(kind="start", test=nodeid, **_clocks())


def pytest_runtest_logfinish(nodeid: str, location: Any) -> None:
    _write(kind="end", test=nodeid, **_clocks())


@dataclass
class WorkerTimeline:
    """One worker's events, read back."""

    name: str
    tests: dict[str, float] = field(default_factory=dict)  # node id -> seconds, setup to teardown
    first: float = float("inf")
    last: float = 0.0
    compiles: Counter = field(default_factory=Counter)  # function -> seconds
    children: list[tuple[tuple, float, str]] = field(default_factory=list)  # (key, seconds, test)
    # node id -> (own CPU, reaped children's CPU, machine idle core-seconds), setup to teardown
    clocks: dict[str, tuple[float, float, float]] = field(default_factory=dict)
    idle: list[tuple[float, float]] = field(default_factory=list)  # (wall time, machine idle so far)

    @classmethod
    def read(cls, path: Path) -> WorkerTimeline:
        timeline = cls(path.stem)
        starts: dict[str, dict] = {}
        for line in path.read_text(encoding="utf-8").splitlines():
            ev = json.loads(line)
            if "idle" in ev:
                timeline.idle.append((ev["t"], ev["idle"]))
            if ev["kind"] == "start":
                starts[ev["test"]] = ev
                timeline.first = min(timeline.first, ev["t"])
            elif ev["kind"] == "end" and ev["test"] in starts:
                begin = starts[ev["test"]]
                timeline.tests[ev["test"]] = ev["t"] - begin["t"]
                timeline.last = max(timeline.last, ev["t"])
                if "cpu" in ev and "cpu" in begin:
                    timeline.clocks[ev["test"]] = tuple(ev[k] - begin[k] for k in ("cpu", "kids", "idle"))
            elif ev["kind"] == "compile":
                timeline.compiles[ev["fn"]] += ev["seconds"]
            elif ev["kind"] == "child_compile":
                timeline.children.append((tuple(ev["key"]), ev["seconds"], ev["test"]))
        return timeline


def read_workers(folder: Path) -> list[WorkerTimeline]:
    """The timelines of the workers that ran tests in a run's folder."""
    workers = [WorkerTimeline.read(p) for p in sorted(folder.glob("*.jsonl"))]
    return [w for w in workers if w.tests]


def report(folder: Path, workers: list[WorkerTimeline], top: int = 15) -> str:
    if not workers:
        return f"no test events under {folder}"
    start, end = min(w.first for w in workers), max(w.last for w in workers)
    lines = [f"first test to last: {end - start:.1f} s over {len(workers)} worker(s)", "",
             "| worker | tests | sum of test times | span | idle at the end | in-process compiles | child compiles |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]  # fmt: skip
    for w in workers:
        lines.append(
            f"| {w.name} | {len(w.tests)} | {sum(w.tests.values()):.1f} s | {w.last - w.first:.1f} s | {end - w.last:.1f} s "
            f"| {sum(w.compiles.values()):.1f} s | {sum(s for _, s, _ in w.children):.1f} s ({len(w.children)}) |"
        )
    marks = sorted(m for w in workers for m in w.idle)
    if len(marks) > 1:
        idle = marks[-1][1] - marks[0][1]
        span = marks[-1][0] - marks[0][0]
        lines += ["", f"The machine was idle for {idle:.1f} core-seconds of the {span:.1f} s between the first mark "
                  f"and the last ({os.cpu_count()} cores: {idle / span:.2f} cores idle on average)."]
    # A test that waits: wall time that neither the worker's threads nor its reaped children spent
    # on a CPU (a server or a Ray actor not reaped by the worker counts as waiting here).
    waiting = sorted(((s - sum(w.clocks[t][:2]), t, s, w.clocks[t]) for w in workers for t, s in w.tests.items()
                      if t in w.clocks), reverse=True)[:top]
    if waiting:
        lines += ["", f"Tests that wait, {top} longest (wall, own CPU, reaped children's CPU, machine idle during it):"]
        lines += [f"  {wait:7.1f} s waiting  {t}  ({s:.1f}, {c[0]:.1f}, {c[1]:.1f}, {c[2]:.1f} core-s idle)"
                  for wait, t, s, c in waiting]
    files = Counter(file_durations(workers))
    lines += ["", f"Files, {top} longest:"] + [f"  {s:7.1f} s  {f}" for f, s in files.most_common(top)]
    tests = sorted(((s, t) for w in workers for t, s in w.tests.items()), reverse=True)[:top]
    lines += ["", f"Tests, {top} slowest:"] + [f"  {s:7.1f} s  {t}" for s, t in tests]
    compiles: Counter = Counter()
    for w in workers:
        compiles.update(w.compiles)
    lines += ["", f"In-process numba compiles, {top} costliest (all workers):"]
    lines += [f"  {s:7.1f} s  {f}" for f, s in compiles.most_common(top)]
    children = sorted((c for w in workers for c in w.children), key=lambda c: -c[1])
    lines += ["", f"Decode-attention kernels compiled by a child ({len(children)}, {sum(c[1] for c in children):.1f} s of waiting):"]
    lines += [f"  {s:7.1f} s  (head_dim, lanes, bf16) = {key}  first needed by {test}" for key, s, test in children]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path, help="the FORMCAST_SUITE_TIMELINE folder of a run")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--write-durations", type=Path, metavar="JSON",
                    help="also write each file's summed test time there (tests/file_durations.json orders the files)")
    args = ap.parse_args()
    workers = read_workers(args.folder)
    print(report(args.folder, workers, args.top))
    if args.write_durations:
        args.write_durations.write_text(json.dumps(file_durations(workers), indent=1, sort_keys=True) + "\n", encoding="utf-8")


def file_durations(workers: list[WorkerTimeline]) -> dict[str, float]:
    """Seconds of each test file in a run, setup to teardown of its tests, on every worker."""
    files: Counter = Counter()
    for w in workers:
        for test, seconds in w.tests.items():
            files[test.split("::")[0]] += seconds
    return {name: round(seconds, 1) for name, seconds in files.items()}


if __name__ == "__main__":
    main()
