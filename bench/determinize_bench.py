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
    python bench/determinize_bench.py --compiled-loop   # the breadth-first loop compiled too

The breadth-first loop runs in Python by default, as a mask's routes call the determinizer (a
row at a time); about half of that time is the loop's own. ``--compiled-loop`` runs it as one
numba kernel, the way a trie walk creates configurations inside its kernel: the determinizer's
cost alone.

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

import numpy as np  # noqa: E402
from numba import njit  # noqa: E402

import grammar  # noqa: E402
import maskbench  # noqa: E402
from grammar import determinizer  # noqa: E402
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


# Not cached: numba keys a cached kernel by its own file only, so a cached copy of this one would
# keep running the determinizer it was first compiled with after determinizer.py changes (the
# previous session's figures for this loop measured a stale copy: 3.9 µs, against 2.7 µs fresh).
@njit(cache=False)
def _breadth_first_kernel(core, start, rows):  # pragma: no cover - compiled
    """:func:`expand_breadth_first` inside one kernel (targets queued in byte order); returns the
    number of configurations, or a determinizer status < 0."""
    queue = np.empty(1024, np.int64)
    seen = np.zeros(1024, np.bool_)
    queue[0], seen[start] = start, True
    head, tail, done = 0, 1, 0
    while head < tail and done < rows:
        state = queue[head]
        head += 1
        status = determinizer.expand_row(core, state)
        if status < 0:
            return status
        done += 1
        table = determinizer.core_table(core)
        # Room for the row's targets first: an array reassigned inside the byte loop would cost
        # a reference count per byte (determinizer.GROWN_IN_LOOP), a fifth of this loop's time.
        most = 0
        for b in range(256):
            most = max(most, table[state, b])
        if most >= seen.shape[0]:
            grown = np.zeros(2 * most + 2, np.bool_)
            grown[: seen.shape[0]] = seen
            seen = grown
        if tail + 256 > queue.shape[0]:
            longer = np.empty(2 * tail + 256, np.int64)
            longer[:tail] = queue[:tail]
            queue = longer
        for b in range(256):
            target = table[state, b]
            if target >= 0 and not seen[target]:
                seen[target] = True
                queue[tail] = target
                tail += 1
    return determinizer.core_flags(core)[2]


def expand_breadth_first_compiled(nfa, rows: int) -> int:
    automaton = LazyAutomaton(nfa)
    with automaton.lock:
        status = _breadth_first_kernel(automaton.core, automaton.initial_state, rows)
    automaton.check_status(int(status))
    return int(status)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--input", type=Path, default=Path("/work/shared/bench/maskbench/dev.jsonl.gz"))
    ap.add_argument("--sample", type=int, default=300)
    ap.add_argument("--seed", type=int, default=2)
    ap.add_argument("--rows", type=int, default=300)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--python-tier", action="store_true", help="new automata run the kernels' Python twins")
    ap.add_argument("--compiled-loop", action="store_true", help="the breadth-first loop as one numba kernel")
    args = ap.parse_args()
    if args.python_tier and args.compiled_loop:
        raise SystemExit("--compiled-loop needs the compiled kernels (not --python-tier)")
    expand = expand_breadth_first_compiled if args.compiled_loop else expand_breadth_first
    print(f"grammar from {Path(grammar.__file__).parent}", file=sys.stderr)
    vocab = grammar.TokenVocabulary.from_tokenizer(maskbench.load_tokenizer("qwen2"))
    records = maskbench.load_records(args.input, 0, None, args.sample, args.seed)
    nfas = [compiled.automaton.nfa for _record, compiled in maskbench.compiled_schemas(records, vocab)]
    if args.python_tier:
        from grammar import kernel_tier

        kernel_tier.use_python()
    total_s, total_configs, count = 0.0, 0, 0
    for nfa in nfas:
        configs = expand(nfa, args.rows)  # (first use: kernels loaded, pages touched)
        best = float("inf")
        for _ in range(args.repeat):
            start = time.perf_counter()
            if expand(nfa, args.rows) != configs:
                raise SystemExit("a rebuilt automaton differs")
            best = min(best, time.perf_counter() - start)
        total_s += best
        total_configs += configs
        count += 1
    loop = "compiled loop" if args.compiled_loop else "Python loop"
    print(f"{count} grammars, {args.rows} rows each ({loop}): {total_configs:,} configurations in {total_s * 1e3:.0f} ms, "
          f"{total_s / total_configs * 1e6:.2f} µs a configuration")


if __name__ == "__main__":
    main()
