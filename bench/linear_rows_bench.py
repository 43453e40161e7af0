"""Benchmark: the CPU float products by activation-row count: the packed-panel product that
loaded models use (``engine.layers.panel_linear``), the float loop (``engine.layers.cpu_linear``,
rows four at a time and row after row) and torch's ``F.linear``, on the same operands.

    python bench/linear_rows_bench.py [--threads 1] [--k 576] [--n 1536] [--matrices 8]

One process; per weight dtype (float32, bfloat16) and row count (1, 4, 5, 8, 16): ms per call set
(``--matrices`` distinct [n, k] matrices, so the weights stream from memory rather than sit in
cache), best of 5 after a warm call, CPU time of the process (``time.process_time``: robust to
other processes on the machine; with ``--threads 1`` it is the loop's own cost). Also checks that
the grouped rows equal the rows alone bit for bit (what ``rows_agree`` checks at warm-up), and
that each panel-product row equals that row multiplied alone.
torch's bfloat16 ``F.linear`` runs in bfloat16; the loop accumulates in float32.
Not collected by pytest.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from engine.layers import cpu_linear  # noqa: E402
from engine.layers.panel_linear import PanelWeight  # noqa: E402


def best_ms(fn, reps: int = 5) -> float:  # type: ignore[no-untyped-def]
    fn()
    best = float("inf")
    for _ in range(reps):
        start = time.process_time()
        fn()
        best = min(best, time.process_time() - start)
    return best * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--k", type=int, default=576)
    ap.add_argument("--n", type=int, default=1536)
    ap.add_argument("--matrices", type=int, default=8)
    args = ap.parse_args()
    import numba

    numba.set_num_threads(args.threads)
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    print(f"# {args.matrices} matrices [{args.n} x {args.k}], {args.threads} thread(s); ms per call set (CPU time)\n")
    print("| weights | rows | torch F.linear | loop, row after row | loop, four rows at a time | grouped / alone | bits equal "
          "| panels | panels / torch | panels / best loop | panel rows = alone |")
    print("|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---|")
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        ws = [rng.standard_normal((args.n, args.k), dtype=np.float32) for _ in range(args.matrices)]
        tw = [torch.from_numpy(w).to(dtype) for w in ws]
        pw = [PanelWeight(w) for w in tw]
        for rows in (1, 4, 5, 8, 16, 64):
            x = rng.standard_normal((rows, args.k), dtype=np.float32)
            tx = torch.from_numpy(x).to(dtype)
            outs = {g: [np.empty((rows, args.n), np.float32) for _ in tw] for g in (False, True)}

            def loop(grouped: bool) -> None:
                for w, out in zip(tw, outs[grouped]):
                    cpu_linear._run_loop(x, w, out, grouped)

            with torch.inference_mode():
                t_torch = best_ms(lambda: [F.linear(tx, w) for w in tw])
            alone, grouped = best_ms(lambda: loop(False)), best_ms(lambda: loop(True))
            equal = all(np.array_equal(a, b) for a, b in zip(outs[False], outs[True]))
            x32 = torch.from_numpy(x)
            t_panels = best_ms(lambda: [p.matmul(x32) for p in pw])
            whole = pw[0].matmul(x32)
            panel_rows = all(torch.equal(pw[0].matmul(x32[r : r + 1])[0], whole[r]) for r in range(rows))
            name = str(dtype).removeprefix("torch.")
            print(f"| {name} | {rows} | {t_torch:.2f} | {alone:.2f} | {grouped:.2f} | {grouped / alone:.2f} | {equal} "
                  f"| {t_panels:.2f} | {t_panels / t_torch:.2f} | {t_panels / min(alone, grouped):.2f} | {panel_rows} |", flush=True)


if __name__ == "__main__":
    main()
