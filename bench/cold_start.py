"""Cold and warm start (issue 25): each scenario runs in a fresh interpreter, once with an empty
numba cache (``NUMBA_CACHE_DIR`` a new temporary folder: a fresh install) and once with the cache
that run left behind (a second start).

Scenarios:
- ``first-compile``: import, ``compile_json_schema`` of a small schema (an array of anyOf
  date-time / uuid / null, the issue's example) and its first mask, byte-level vocabulary.
- ``engine-first-token``: ``Engine()`` (embedded SmolLM2) to the first token of a JSON-schema
  constrained request; the engine compiles the kernels in child processes while the model loads.
- ``demo``: ``formcast generate`` of the Makefile's demo (JSON record about Marie Curie).

Wall seconds and the CPU seconds of the whole process tree (user + system) per cell; on a
machine other processes load, CPU seconds are the steadier figure. The on-disk grammar store is
off (``FORMCAST_GRAMMAR_CACHE=off``) so that only numba's cache is cold or warm.

    python bench/cold_start.py [--only first-compile,engine-first-token,demo]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
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
from engine import Engine
with Engine() as e:
    out = e.generate("Dates:", {{"json_schema": {SCHEMA!r}, "max_new_tokens": 1}})
    assert out["meta_info"]["completion_tokens"] == 1, out
"""


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


SCENARIOS = {
    "first-compile": lambda: _python(FIRST_COMPILE),
    "engine-first-token": lambda: _python(ENGINE_FIRST_TOKEN),
    "demo": lambda: [sys.executable, "-m", "engine.entrypoints.cli", "generate", "--json-schema", DEMO_SCHEMA,
                     "--prompt", "Give me a JSON record about Marie Curie.", "--max-new-tokens", "96"],
}


def run(cmd: list[str], numba_dir: str) -> tuple[float, float]:
    env = dict(os.environ, NUMBA_CACHE_DIR=numba_dir, FORMCAST_GRAMMAR_CACHE="off",
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[:3]} failed: {proc.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=",".join(SCENARIOS))
    args = parser.parse_args()
    rows = []
    for name in args.only.split(","):
        with tempfile.TemporaryDirectory(prefix="numba-cold-") as numba_dir:
            cold = run(SCENARIOS[name](), numba_dir)
            warm = run(SCENARIOS[name](), numba_dir)
        rows.append((name, cold, warm))
        print(f"  {name}: cold {cold[0]:.1f} s, warm {warm[0]:.1f} s", file=sys.stderr, flush=True)
    print(f"{'scenario':<20} {'cold wall s':>11} {'cold cpu s':>10} {'warm wall s':>11} {'warm cpu s':>10} {'cold/warm wall':>14}")
    for name, (cw, cc), (ww, wc) in rows:
        print(f"{name:<20} {cw:>11.1f} {cc:>10.1f} {ww:>11.1f} {wc:>10.1f} {cw / ww:>14.2f}")


if __name__ == "__main__":
    main()
