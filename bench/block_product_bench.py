"""The block formats' products on one thread or split across a few (issue 24): microseconds per call of
``QuantizedWeight.matmul_rows`` (activation quantization included) for a few matrix shapes and
row counts, with the integer dot products on VNNI (``vpdpbusd``, where the CPU has it) and on the
AVX2 pair (``pmaddubsw`` + ``pmaddwd``), side by side in one run.

Each variant runs in a child process of its own (``FORMCAST_INT_DOT_VNNI`` set for it, and a
fresh numba cache, since the variant is chosen when the loops compile), in alternated rounds so
that a load change hits both alike; the table gives the minimum over each variant's calls and
its ratio to the first variant. The children also hash every product's float32 bits: the bench
fails if two variants disagree (the two instruction sequences must give the same bits).

    python bench/block_product_bench.py [--formats Q4_0,Q4_1,Q4_K,Q8_0] [--rows 1,4] [--rounds 3] [--calls 300] [--threads 1]

``--rows``: activation rows a product (a verification of k drafts is k + 1; rows past
``octet_dot.MAX_ROWS`` take a second call). To compare two trees (another ``MAX_ROWS``), run
the same command in each checkout.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHAPES = [(3072, 576), (576, 1536), (2048, 2048), (11264, 2048), (2048, 5632)]
ROWS = [1, 4]  # default --rows
VARIANTS = {"vnni": "1", "avx2": "0"}


def _raw_blocks(type_name: str, n_out: int, n_in: int, rng):  # type: ignore[no-untyped-def]
    """A random matrix in ``type_name``'s file encoding (gguf's quantizer where it has one; for
    Q4_K random bytes with small finite super-block scales)."""
    import numpy as np
    from gguf import GGMLQuantizationType, quants

    if type_name != "Q4_K":
        return quants.quantize(rng.standard_normal((n_out, n_in)).astype(np.float32), getattr(GGMLQuantizationType, type_name))
    blocks = rng.integers(0, 256, (n_out, n_in // 256, 144), dtype=np.uint8)
    blocks[:, :, 0:4] = np.array([0.01, 0.002], np.float16).view(np.uint8)
    return blocks.reshape(n_out, -1)


def child(formats: list[str], calls: int, threads: int, rows_list: list[int]) -> None:
    import time

    import numba
    import numpy as np

    from engine.layers import int_dot
    from engine.layers.ggml_quants import QuantizedWeight

    numba.set_num_threads(threads)
    split = threads > 1
    rng = np.random.default_rng(0)
    result = {"vnni": int_dot._VNNI, "us": {}, "bits": {}}
    for type_name in formats:
        for n_out, n_in in SHAPES:
            if type_name.endswith("_K") and n_in % 256:
                continue  # K-quant rows are whole 256-element super-blocks
            w = QuantizedWeight.from_gguf(type_name, _raw_blocks(type_name, n_out, n_in, rng), (n_out, n_in))
            for rows in rows_list:
                x = rng.standard_normal((rows, n_in)).astype(np.float32)
                out = w.matmul_rows(x, split=split)  # compiles
                best = float("inf")
                for _ in range(calls):
                    t0 = time.perf_counter()
                    w.matmul_rows(x, split=split)
                    best = min(best, time.perf_counter() - t0)
                key = f"{type_name} {n_out}x{n_in} {rows}"
                result["us"][key] = best * 1e6
                result["bits"][key] = hashlib.sha256(np.ascontiguousarray(out).tobytes()).hexdigest()
    print(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--formats", default="Q4_0,Q4_1,Q4_K,Q8_0")
    parser.add_argument("--rows", default=",".join(map(str, ROWS)), help="comma-separated activation row counts")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--threads", type=int, default=1, help="numba threads; above 1 the products split across them")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    formats = args.formats.split(",")
    if args.child:
        child(formats, args.calls, args.threads, [int(r) for r in args.rows.split(",")])
        return
    caches = {name: tempfile.mkdtemp(prefix=f"formcast-blocks-{name}-") for name in VARIANTS}
    runs: dict[str, list[dict]] = {name: [] for name in VARIANTS}
    try:
        for _ in range(args.rounds):
            for name, flag in VARIANTS.items():
                env = dict(os.environ, FORMCAST_INT_DOT_VNNI=flag, NUMBA_CACHE_DIR=caches[name], PYTHONPATH=str(ROOT))
                cmd = [sys.executable, __file__, "--child", "--formats", args.formats, "--calls", str(args.calls), "--threads", str(args.threads), "--rows", args.rows]
                done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
                runs[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
    finally:
        for cache in caches.values():
            shutil.rmtree(cache, ignore_errors=True)
    first = next(iter(VARIANTS))
    keys = list(runs[first][0]["us"])
    names = list(VARIANTS)
    print(f"VNNI on this CPU: {runs['vnni'][0]['vnni']}; {args.threads} thread(s), minimum of {args.calls} calls per round, "
          f"{args.rounds} rounds, µs (each round's figure)")  # fmt: skip
    print("| format, matrix, rows | " + " | ".join(names) + f" | ratio to {first} (best rounds) |")
    print("| --- | " + " | ".join("---:" for _ in names) + " | ---: |")
    mismatches = []
    for key in keys:
        cells = [" / ".join(f"{r['us'][key]:.0f}" for r in runs[name]) for name in names]
        best = {name: min(r["us"][key] for r in runs[name]) for name in names}
        ratios = " / ".join(f"{best[name] / best[first]:.2f}x" for name in names[1:])
        print(f"| {key} | " + " | ".join(cells) + f" | {ratios} |")
        bits = {r["bits"][key] for name in names for r in runs[name]}
        if len(bits) != 1:
            mismatches.append(key)
    if mismatches:
        sys.exit(f"the variants' products differ in their bits: {', '.join(mismatches)}")
    print("every product has the same bits in every variant and round")


if __name__ == "__main__":
    main()
