"""Numba kernel census (issue 25): how many compiled versions numba's cache holds for each
grammar kernel of the current sources (``jit_warmup.compiled_signatures``), after whatever
workloads ran against that cache. Each kernel should have one: every further version is a whole
compile more on a fresh install.

    NUMBA_CACHE_DIR=/tmp/empty python -m grammar.jit_tasks strings && \\
    NUMBA_CACHE_DIR=/tmp/empty python -m grammar.jit_tasks masks && \\
    NUMBA_CACHE_DIR=/tmp/empty python bench/numba_census.py [-v]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from grammar import jit_warmup  # noqa: E402


def main() -> None:
    census = jit_warmup.compiled_signatures()
    used = {name: sigs for name, sigs in census.items() if sigs}
    print(f"{len(census)} kernels, {len(used)} compiled, {sum(map(len, used.values()))} compiled versions")
    for name, sigs in sorted(used.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        if len(sigs) > 1 or "-v" in sys.argv:
            print(f"{len(sigs)} {name}")
            for sig in sigs:
                print(f"    {sig[:300]}")


if __name__ == "__main__":
    main()
