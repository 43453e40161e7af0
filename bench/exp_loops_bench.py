"""The loops that take an exponential, with ``vector_exp.exp32`` and with the C library's ``expf``
side by side (the anchor: what numba's ``math.exp`` calls), in one process.

* ``exp``: an array of 1,536 float32 arguments (SmolLM2's SwiGLU width);
* ``swiglu``: ``row_ops``' SwiGLU loop (exp32) against the same loop written with ``math.exp``,
  1 and 5 rows;
* the decode attention kernel (``cpu_decode_attention.attend``) is timed alone, 1 and 5 rows over
  ``--keys`` keys, 9 query heads on 3 KV heads, dimension 64 (SmolLM2's geometry): its ``expf``
  variant lives in an older tree, so compare two checkouts by running this in each.

Minimum over ``--calls`` calls, one thread, µs. Not collected by pytest.

    python bench/exp_loops_bench.py [--calls 2000] [--keys 300]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import best_us  # noqa: E402
from numba import njit  # noqa: E402

from engine.layers import cpu_decode_attention, row_ops  # noqa: E402
from test_vector_exp import _exp_all as _exp32_all  # noqa: E402 - the test's two loops, timed here
from test_vector_exp import _expf_all  # noqa: E402


@njit(nogil=True, boundscheck=False)
def _swiglu_expf(gate_up, out):  # pragma: no cover - compiled
    rows, inner = out.shape
    for r in range(rows):
        for j in range(inner):
            g = gate_up[r, j]
            out[r, j] = (g / (np.float32(1.0) + np.float32(math.exp(-g)))) * gate_up[r, inner + j]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--keys", type=int, default=300)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    rows_out = []
    x = (rng.standard_normal(1536) * 4).astype(np.float32)
    out = np.empty_like(x)
    rows_out.append(("exp, 1,536 arguments", best_us(lambda: _expf_all(x, out), args.calls), best_us(lambda: _exp32_all(x, out), args.calls)))
    for rows in (1, 5):
        gate_up = rng.standard_normal((rows, 3072)).astype(np.float32)
        buf = np.empty((rows, 1536), np.float32)
        rows_out.append((f"SwiGLU, {rows} row(s) of 1,536", best_us(lambda: _swiglu_expf(gate_up, buf), args.calls),
                         best_us(lambda: row_ops.silu_and_mul_rows(gate_up), args.calls)))  # fmt: skip
    print("| loop | expf | exp32 | exp32 / expf |")
    print("| --- | ---: | ---: | ---: |")
    for name, old, new in rows_out:
        print(f"| {name} | {old:.1f} | {new:.1f} | {new / old:.2f}x |")
    slots = args.keys + 8
    k_pool = rng.standard_normal((slots, 3, 64)).astype(np.float32)
    v_pool = rng.standard_normal((slots, 3, 64)).astype(np.float32)
    index = np.arange(slots, dtype=np.int64)
    print(f"\n| decode attention, {args.keys} keys, 9 heads on 3 KV heads | µs |")
    print("| --- | ---: |")
    for rows in (1, 5):
        q = rng.standard_normal((rows, 9, 64)).astype(np.float32)
        o = np.empty_like(q)
        start, lengths = np.zeros(rows, np.int64), np.array([args.keys - rows + 1 + i for i in range(rows)], np.int64)
        us = best_us(lambda: cpu_decode_attention.attend(q, k_pool, v_pool, index, start, lengths, o, None, True, None), args.calls)
        print(f"| {rows} row(s) (a verification of {rows - 1} drafts) | {us:.1f} |" if rows > 1 else f"| 1 row (a decode step) | {us:.1f} |")


if __name__ == "__main__":
    main()
