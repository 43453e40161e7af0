"""How fast the determinizer creates configurations: fresh automata of MaskBench grammars, each
expanded breadth first from its start for a fixed number of whole rows.

A mask at a state nobody reached before (most slow masks of ``maskbench.py``: their walks meet
about 140 new configurations each) spends its time creating configurations: closures, stack
nodes and parent sets interned, rows initialized. This isolates that work from the walks. Every
grammar's automaton is built anew (``LazyAutomaton(nfa)``) a few times; the best time per grammar
counts, and the configurations created must be the same in every tree compared.

    python bench/determinize_bench.py --sample 300 --seed 2 [--rows 300]
    PYTHONPATH=<other checkout> python bench/determinize_bench.py ...   # the same for another tree
    python bench/determinize_bench.py --sample 30 --rows 100 --python-tier   # the kernels' Python twins

Qwen2 vocabulary; the grammar kernels compiled (a warm numba cache) before timing, or with
``--python-tier`` the automata built on the kernels' Python twins (``kernel_tier``: what a fresh
install runs while the kernels compile).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import deque
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))  # after PYTHONPATH: an older checkout placed first is the one timed
sys.path.append(str(ROOT / "bench"))

import grammar  # noqa: E402
import maskbench  # noqa: E402
from grammar.automaton import LazyAutomaton  # noqa: E402


def expand_breadth_first(nfa, rows: int) -> int:
    """Expand ``rows`` whole rows of a fresh automaton, nearest the start first; returns how many
    configurations it then holds."""
    automaton = LazyAutomaton(nfa)
    todo, seen, done = deque([automaton.initial_state]), {automaton.initial_state}, 0
    while todo and done < rows:
        state = todo.popleft()
        automaton.expand(state)
        done += 1
        for target in set(automaton.table[state].tolist()):
            if target >= 0 and target not in seen:
                seen.add(target)
                todo.append(target)
    return automaton.num_states


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--input", type=Path, default=Path("/work/shared/bench/maskbench/dev.jsonl.gz"))
    ap.add_argument("--sample", type=int, default=300)
    ap.add_argument("--seed", type=int, default=2)
    ap.add_argument("--rows", type=int, default=300)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--python-tier", action="store_true", help="new automata run the kernels' Python twins")
    args = ap.parse_args()
    print(f"grammar from {Path(grammar.__file__).parent}", file=sys.stderr)
    vocab = grammar.TokenVocabulary.from_tokenizer(maskbench.load_tokenizer("qwen2"))
    records = maskbench.load_records(args.input, 0, None, args.sample, args.seed)
    nfas = [compiled.automaton.nfa for _record, compiled in maskbench.compiled_schemas(records, vocab)]
    if args.python_tier:
        from grammar import kernel_tier

        kernel_tier.use_python()
    total_s, total_configs, count = 0.0, 0, 0
    for nfa in nfas:
        configs = expand_breadth_first(nfa, args.rows)  # (first use: kernels loaded, pages touched)
        best = float("inf")
        for _ in range(args.repeat):
            start = time.perf_counter()
            if expand_breadth_first(nfa, args.rows) != configs:
                raise SystemExit("a rebuilt automaton differs")
            best = min(best, time.perf_counter() - start)
        total_s += best
        total_configs += configs
        count += 1
    print(f"{count} grammars, {args.rows} rows each: {total_configs:,} configurations in {total_s * 1e3:.0f} ms, "
          f"{total_s / total_configs * 1e6:.2f} µs a configuration")


if __name__ == "__main__":
    main()
