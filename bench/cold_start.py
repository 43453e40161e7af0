"""Cold and warm start (issue 25): each scenario runs in a fresh interpreter, once with an empty
numba cache (``NUMBA_CACHE_DIR`` a new temporary folder: a fresh install) and once with the cache
that run left behind (a second start).

Scenarios:
- ``first-compile``: import, ``compile_json_schema`` of a small schema (an array of anyOf
  date-time / uuid / null, the issue's example) and its first mask, byte-level vocabulary.
- ``engine-first-token``: ``Engine()`` (embedded SmolLM2) to the first result of a JSON-schema
  constrained request (``max_new_tokens`` 3: the schema's shortest output, which admission
  requires); the engine compiles the kernels in child processes while the model loads.
  Its cells also give the seconds to ``Engine()`` ready and from ready to the first token.
- ``demo``: ``formcast generate`` of the Makefile's demo (JSON record about Marie Curie).

``--roots`` runs the same scenarios against several source trees (e.g. a checkout of main
before a change and the working tree after it) in one run window, cell by cell, so that the
load other processes put on the machine hits both alike; the table gives each tree's figures
and the ratio to the first tree's. Wall seconds, CPU seconds of the whole process tree (user +
system; on a loaded machine the steadier figure; without the warm-up children that outlive an
engine which answered from the Python tier), when the cell's last process (those children)
exited, and, for cold cells, how many compiled kernel versions the run left in numba's cache
(``.nbc`` files). A cell that runs past ``--timeout`` is
reported as such instead of stopping the bench. The on-disk grammar store is off
(``FORMCAST_GRAMMAR_CACHE=off``) so that only numba's cache is cold or warm.

    python bench/cold_start.py [--only first-compile,demo] [--roots /path/to/main,.] [--timeout 600]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = '{"type":"array","minItems":1,"items":{"anyOf":[{"type":"string","format":"date-time"},{"type":"string","format":"uuid"},{"type":"null"}]}}'
DEMO_SCHEMA = ('{"type":"object","properties":{"name":{"type":"string","maxLength":40},"born":{"type":"integer","minimum":1000,'
               '"maximum":2025},"fields":{"type":"array","items":{"type":"string","maxLength":30},"maxItems":3}},'
               '"required":["name","born","fields"],"additionalProperties":false}')

FIRST_COMPILE = f"""
import json
from grammar import TokenVocabulary, compile_json_schema
c = compile_json_schema(json.loads({SCHEMA!r}), TokenVocabulary.byte_level())
c.token_mask(c.initial_state)
"""
ENGINE_FIRST_TOKEN = f"""
import json, time
t0 = time.perf_counter()
from engine import Engine
with Engine() as e:
    t1 = time.perf_counter()
    out = e.generate("Dates:", {{"json_schema": {SCHEMA!r}, "max_new_tokens": 3}})
    t2 = time.perf_counter()
    assert out["meta_info"]["completion_tokens"] >= 1, out
print("TIMES " + json.dumps({{"ready": t1 - t0, "first_token": t2 - t1}}))
"""

SCENARIOS = {
    "first-compile": lambda: [sys.executable, "-c", FIRST_COMPILE],
    "engine-first-token": lambda: [sys.executable, "-c", ENGINE_FIRST_TOKEN],
    "demo": lambda: [sys.executable, "-m", "engine.entrypoints.cli", "generate", "--json-schema", DEMO_SCHEMA,
                     "--prompt", "Give me a JSON record about Marie Curie.", "--max-new-tokens", "96"],
}


@dataclass
class Cell:
    wall: float
    cpu: float
    versions: int  # compiled kernel versions in the cache after the run
    times: dict | None = None  # the engine scenario's own split
    timed_out: bool = False
    background: float = 0.0  # seconds until the cell's last process (warm-up children) exited

    def text(self) -> str:
        if self.timed_out:
            return f">{self.wall:.0f}"
        return f"{self.wall:.1f}"


def run(cmd: list[str], root: Path, numba_dir: str, timeout: float) -> Cell:
    env = dict(os.environ, NUMBA_CACHE_DIR=numba_dir, FORMCAST_GRAMMAR_CACHE="off",
               PYTHONPATH=os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p))
    env.pop("FORMCAST_NO_JIT_WARMUP", None)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    # A session of its own: on a timeout the whole tree (warm-up children included) is stopped.
    proc = subprocess.Popen(cmd, env=env, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, err = proc.communicate()
        timed_out = True
    wall = time.perf_counter() - t0
    # The engine may answer before its warm-up children are done (the Python tier): they finish
    # in the background, in the cell's process group. The next cell starts once they are gone,
    # and the cell records when that was (their CPU is not in ``cpu``: they outlive their parent).
    while not timed_out:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        if time.perf_counter() - t0 > timeout:
            os.killpg(proc.pid, 9)
            break
        time.sleep(0.1)
    background = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0 and not timed_out:
        raise RuntimeError(f"{cmd[:3]} in {root} failed: {err[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    times = next((json.loads(line[6:]) for line in out.splitlines() if line.startswith("TIMES ")), None)
    return Cell(wall, cpu, sum(1 for _ in Path(numba_dir).rglob("*.nbc")), times, timed_out, background)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=",".join(SCENARIOS))
    parser.add_argument("--roots", default=str(ROOT), help="comma-separated source trees; ratios are to the first")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per cell")
    args = parser.parse_args()
    roots = [Path(r).resolve() for r in args.roots.split(",")]
    print("| scenario | tree | cold wall s | cold: children done s | cold CPU s | kernel versions | warm wall s | warm CPU s | cold / warm | cold wall / first tree's |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |", flush=True)
    for name in args.only.split(","):
        dirs = [tempfile.TemporaryDirectory(prefix="numba-cold-") for _ in roots]
        try:
            cold = [run(SCENARIOS[name](), root, d.name, args.timeout) for root, d in zip(roots, dirs)]
            warm = [run(SCENARIOS[name](), root, d.name, args.timeout) for root, d in zip(roots, dirs)]
        finally:
            for d in dirs:
                d.cleanup()
        for root, c, w in zip(roots, cold, warm):  # each scenario's rows as soon as they are measured
            split = ""
            if c.times and w.times:
                split = (f" (ready {c.times['ready']:.1f} / {w.times['ready']:.1f} s, "
                         f"first token {c.times['first_token']:.1f} / {w.times['first_token']:.1f} s)")
            warm_text = w.text() + (" (cold run stopped: not warm)" if c.timed_out else "")
            print(f"| {name}{split} | {root.name} | {c.text()} | {c.background:.1f} | {c.cpu:.1f} | {c.versions} | {warm_text} | {w.cpu:.1f} | "
                  f"{c.wall / w.wall:.2f} | {c.wall / cold[0].wall:.2f} |", flush=True)


if __name__ == "__main__":
    main()
