"""Per-NFA-state completion distances (``grammar/completion.py::_state_distances``) on MaskBench
grammars: their total time, the slowest grammars, and, with ``--reference``, the same for another
version of ``completion.py`` (a file, e.g. ``git show <commit>:grammar/completion.py``) whose
distances must be identical.

    python bench/completion_bench.py --sample 1000 --seed 1 [--reference /tmp/completion_old.py]

SmolLM2 vocabulary; every grammar's distances are computed once per version, in the same process,
with the garbage collector on (as in the engine). The distances feed the admission check of a
request's output budget (the shortest output in tokens) and budget-aware masks.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import grammar  # noqa: E402
import maskbench  # noqa: E402
from grammar import completion  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--input", type=Path, default=Path("/work/shared/bench/maskbench/dev.jsonl.gz"))
    ap.add_argument("--sample", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--reference", type=Path, help="another completion.py to time and compare with")
    args = ap.parse_args()
    versions = {"this tree": completion._state_distances}
    if args.reference:
        spec = importlib.util.spec_from_file_location("completion_reference", args.reference)
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        spec.loader.exec_module(module)  # type: ignore[union-attr]
        versions = {"reference": module._state_distances, **versions}
    vocab = grammar.TokenVocabulary.from_tokenizer(maskbench.load_tokenizer("smollm2"))
    records = maskbench.load_records(args.input, 0, None, args.sample, args.seed)
    totals = dict.fromkeys(versions, 0.0)
    slowest: list[tuple[float, str, int, dict[str, float]]] = []
    compiled_count = 0
    for record, compiled in maskbench.compiled_schemas(records, vocab):
        compiled_count += 1
        times, results = {}, []
        for name, fn in versions.items():
            t0 = time.perf_counter()
            results.append(fn(compiled.automaton))
            times[name] = time.perf_counter() - t0
            totals[name] += times[name]
        if any(r != results[0] for r in results[1:]):
            raise SystemExit(f"{record['id']}: the versions' distances differ")
        slowest.append((max(times.values()), record["id"], compiled.automaton.nfa.num_states, times))
    print(f"{compiled_count} grammars ({args.sample} sampled, seed {args.seed})" + (", distances identical" if args.reference else ""))
    print(" | ".join(f"{name}: {total:.2f} s" for name, total in totals.items()))
    print("\n| grammar | NFA states | " + " | ".join(f"{name} ms" for name in versions) + " |")
    print("|---|---:|" + "---:|" * len(versions))
    for _, rid, states, times in sorted(slowest, reverse=True)[:8]:
        print(f"| {rid[:48]} | {states:,} | " + " | ".join(f"{times[name] * 1e3:.0f}" for name in versions) + " |")


if __name__ == "__main__":
    main()
