"""Where time to first mask goes: formcast's JSON Schema compile on MaskBench schemas, by phase.

Each schema is compiled once, in a fresh compile cache, then its first mask is filled (what
``maskbench.py`` times as TTFM). Phase functions are wrapped with inclusive timers, so a phase
includes the phases it calls (``lowering`` includes ``metaschema`` and ``key and string
products``, the character-automaton products of key sets and string constraints; ``automaton
build`` includes ``NFA build``, which includes ``rule graph``). The table averages the schemas
whose TTFM is at or under the chosen percentile (the median-sized schemas that set TTFM p50), or
at or above it with ``--above`` (the tail), plus the share of time the cyclic garbage collector
ran (all generations) during those compiles.

    python bench/profile_compile.py --sample 300 --seed 0 --upto 60
    python bench/profile_compile.py --sample 300 --seed 0 --above 95     # the slowest schemas
    PYTHONPATH=/path/to/older/checkout python bench/profile_compile.py ...   # the same, for that checkout
    ... --out before.json, then ... --same-as before.json   # two versions on the schemas both compile
"""

from __future__ import annotations

import argparse
import functools
import gc
import importlib
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))  # after PYTHONPATH: an older checkout placed first is the one profiled
sys.path.append(str(ROOT / "bench"))

from maskbench import DEFAULT_INPUT, load_records, load_tokenizer  # noqa: E402

PHASES = {  # label -> (module, qualified name); missing ones are skipped (older checkouts)
    "lowering": ("grammar.json_schema", "json_schema_to_grammar"),
    "metaschema": ("grammar.json_schema.refs", "load_schema"),
    "automaton build": ("grammar.compiler", "CompiledGrammar.__init__"),
    "NFA build": ("grammar.fsm", "build_nfa"),
    "rule graph": ("grammar.rule_graph", "RuleGraph.of"),
    "key and string products": ("grammar.char_dfa", "_product"),
}


def _wrap(spent: dict[str, float], label: str, module: str, qualname: str) -> bool:
    try:
        owner = importlib.import_module(module)
        *path, name = qualname.split(".")
        for part in path:
            owner = getattr(owner, part)
        fn = getattr(owner, name)
    except (ImportError, AttributeError):
        return False

    @functools.wraps(fn)
    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[label] = spent.get(label, 0.0) + time.perf_counter() - t0

    setattr(owner, name, timed)
    # Callers that imported the function by name keep the original: patch those references too.
    for mod in list(sys.modules.values()):
        if getattr(mod, "__name__", "").startswith("grammar") and getattr(mod, name, None) is fn:
            setattr(mod, name, timed)
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--input", type=Path, default=DEFAULT_INPUT)
    ap.add_argument("--sample", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--upto", type=float, default=60.0, help="average the schemas at or under this TTFM percentile")
    ap.add_argument("--above", type=float, help="average the schemas at or above this TTFM percentile instead (the tail)")
    ap.add_argument("--out", type=Path, help="write the ids of the schemas this run compiled (JSON)")
    ap.add_argument("--same-as", type=Path, help="count only schemas that the run which wrote this --out file compiled too")
    args = ap.parse_args()

    import grammar
    from grammar.api import clear_cache

    tok = load_tokenizer("qwen2")
    vocab = grammar.TokenVocabulary.from_tokenizer(tok)
    mask = np.zeros((1, (vocab.vocab_size + 31) // 32), dtype=np.int32)
    records = load_records(args.input, 0, None, args.sample, args.seed)
    spent: dict[str, float] = {}
    labels = [label for label, (m, q) in PHASES.items() if _wrap(spent, label, m, q)]
    gc_time = [0.0, 0.0]

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            gc_time[1] = time.perf_counter()
        else:
            gc_time[0] += time.perf_counter() - gc_time[1]

    def first_mask(schema) -> None:
        clear_cache(keep_setup=True)
        compiled = grammar.compile_json_schema(schema, vocab)
        grammar.GrammarMatcher(compiled).fill_next_token_bitmask(mask, 0)

    first_mask({"type": "object", "properties": {"a": {"type": "string"}}})  # per-vocabulary setup
    gc.callbacks.append(on_gc)
    rows = []
    if args.same_as is not None:  # two versions compared on the schemas both compile
        both = set(json.loads(args.same_as.read_text()))
        records = [r for r in records if r["id"] in both]
    compiled_ids = []
    for record in records:
        spent.clear()
        gc_time[0] = 0.0
        t0 = time.perf_counter()
        try:
            first_mask(record["schema"])
        except grammar.GrammarError:
            continue
        compiled_ids.append(record["id"])
        rows.append(((time.perf_counter() - t0) * 1e3, {k: v * 1e3 for k, v in spent.items()}, gc_time[0] * 1e3))
    gc.callbacks.remove(on_gc)
    if args.out is not None:
        args.out.write_text(json.dumps(compiled_ids))
    ttfm = np.array([r[0] for r in rows])
    print(f"{len(rows)} schemas compiled; TTFM p50 {np.percentile(ttfm, 50):.2f} ms, p90 {np.percentile(ttfm, 90):.2f} ms")
    if args.above is not None:
        cut = float(np.percentile(ttfm, args.above))
        kept = [r for r in rows if r[0] >= cut]
        print(f"the {len(kept)} at or above p{args.above:g} ({cut:.2f} ms), average per schema:\n")
    else:
        cut = float(np.percentile(ttfm, args.upto))
        kept = [r for r in rows if r[0] <= cut]
        print(f"the {len(kept)} at or under p{args.upto:g} ({cut:.2f} ms), average per schema:\n")
    print("| phase | ms | share of TTFM |\n| --- | ---: | ---: |")
    total = sum(r[0] for r in kept) / len(kept)
    print(f"| TTFM | {total:.2f} | 100% |")
    for label in labels:
        ms = sum(r[1].get(label, 0.0) for r in kept) / len(kept)
        print(f"| {label} | {ms:.2f} | {ms / total:.0%} |")
    ms = sum(r[2] for r in kept) / len(kept)
    print(f"| garbage collector | {ms:.2f} | {ms / total:.0%} |")


if __name__ == "__main__":
    main()
