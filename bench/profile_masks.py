"""Where a cold mask's time goes: formcast's masks on MaskBench schemas, split by phase.

Walks each schema's test instances token by token the way ``maskbench.py`` does (compile caches
cleared per schema, Qwen2 vocabulary), timing every ``fill_next_token_bitmask``. Functions of
each phase are wrapped with exclusive timers (a callee's time is not charged to its caller), so
the slowest masks can be broken down into:

- determinize: lazy determinization (``LazyAutomaton.expand``: closures, stack interning);
- stacks: truncation of deep recursive configurations and the shared top-frame masks' bookkeeping;
- region: finding string-like regions; shape tables: per-shape splits shared across grammars;
- siblings: finding a state's sibling and their differing bytes, splitting configurations into parts;
- walk: the trie walk and token-major checks (with the configurations they create on the way);
  pack: bool -> int32 packing; other: the rest.

and how many configurations each mask creates (a walk reaching states nobody reached before).

Phase functions that do not exist in the checked-out version are skipped, so the same script
profiles older commits too (run it with that checkout first on ``PYTHONPATH``).

    python bench/profile_masks.py --sample 100 --top 20 [--warm-cells]
    python bench/profile_masks.py --ids o35868,o79409 --top 10      # chosen records of the whole split
"""

from __future__ import annotations

import argparse
import functools
import gc
import importlib
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))  # after PYTHONPATH: an older checkout placed first is the one profiled
sys.path.append(str(ROOT / "bench"))

PHASES: dict[str, list[str]] = {
    "determinize": [
        "grammar.automaton.LazyAutomaton.expand",
        "grammar.automaton.LazyAutomaton.resolve",
        "grammar.automaton.LazyAutomaton.resolve_many",
    ],
    "stacks": [
        "grammar.automaton.LazyAutomaton.truncate",
        "grammar.automaton.LazyAutomaton.max_depth",
        "grammar.token_masks.TokenMaskComputer.walk_truncated",
        "grammar.compiler.CompiledGrammar._truncated_mask",
        "grammar.token_masks.GrammarMasks._truncated_mask",
        "grammar.token_masks.GrammarMasks._shared_top",
    ],
    "region": ["grammar.token_masks.TokenMaskComputer._region_of", "grammar.regions.find_region"],
    "shape tables": [
        "grammar.token_masks.TokenMaskComputer._split_for",
        "grammar.token_masks.TokenMaskComputer._stay_for",
        "grammar.regions.split_region",
    ],
    "siblings": [
        "grammar.automaton.LazyAutomaton.sibling_of",
        "grammar.automaton.LazyAutomaton.differing_bytes",
        "grammar.automaton.LazyAutomaton.split",
    ],
    "walk": [
        "grammar.token_trie.walk_trie",
        "grammar.token_masks.TokenMaskComputer._walk",
        "grammar.token_masks.TokenMaskComputer._simulate",
        "grammar.token_walk.walk_trie",
        "grammar.token_walk.check_tokens",
    ],
    "pack": ["grammar.bitmask.pack_bool_mask"],
    "other": ["grammar.matcher.GrammarMatcher.fill_next_token_bitmask"],
}

_frames: list[list[float]] = []  # [time spent in timed callees] per active timed call
_spent: dict[str, float] = defaultdict(float)


def _timed(phase: str, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        frame = [0.0]
        _frames.append(frame)
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            dt = time.perf_counter() - t0
            _frames.pop()
            _spent[phase] += dt - frame[0]
            if _frames:
                _frames[-1][0] += dt

    return wrapper


def install() -> list[str]:
    """Wrap every phase function that exists; returns the names wrapped."""
    wrapped = []
    for phase, names in PHASES.items():
        for name in names:
            module_name, _, attr = name.rpartition(".")
            owner = None
            try:
                module = importlib.import_module(module_name)
                fn, owner = getattr(module, attr), module
            except (ImportError, AttributeError):
                cls_module, _, cls = module_name.rpartition(".")
                try:
                    owner = getattr(importlib.import_module(cls_module), cls)
                    fn = getattr(owner, attr)
                except (ImportError, AttributeError):
                    continue
            timed = _timed(phase, fn)
            setattr(owner, attr, timed)
            # Functions imported by name into other grammar modules are wrapped there too.
            for mod in list(sys.modules.values()):
                if getattr(mod, "__name__", "").startswith("grammar.") and getattr(mod, attr, None) is fn:
                    setattr(mod, attr, timed)
            wrapped.append(name)
    return wrapped


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--input", type=Path, default=Path("/work/shared/bench/maskbench/dev.jsonl.gz"))
    ap.add_argument("--sample", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--ids", default="", help="comma-separated parts of record ids: profile only those records")
    ap.add_argument("--warm-cells", action="store_true",
                    help="walk each schema's instances once first, then forget its masks but keep its automaton: "
                         "profile the masks without the time spent computing new cells (see mask_cells_share.py)")
    args = ap.parse_args()
    import grammar
    from engine.hf.tokenizers import load_qwen2_tokenizer
    from grammar.api import clear_cache
    from mask_cells_share import forget_masks
    from maskbench import load_records

    print(f"grammar from {Path(grammar.__file__).parent}", file=sys.stderr)
    tok = load_qwen2_tokenizer()
    vocab = grammar.TokenVocabulary.from_tokenizer(tok)
    mask = np.zeros((1, (vocab.vocab_size + 31) // 32), dtype=np.int32)
    grammar.GrammarMatcher(grammar.compile_regex("a", vocab)).fill_next_token_bitmask(mask, 0)  # per-vocabulary setup
    grammar.GrammarMatcher(grammar.compile_json_schema({"type": "object"}, vocab)).fill_next_token_bitmask(mask, 0)
    print("wrapped: " + ", ".join(install()), file=sys.stderr)
    # What the engine does once loaded (and maskbench.py --gc-freeze): full collections skip the
    # startup heap; without it they took 100-200 ms inside two masks of a 1,000-schema run.
    gc.collect()
    gc.freeze()
    masks: list[tuple[float, dict, str, int, int]] = []
    records = load_records(args.input, 0, None, None if args.ids else args.sample, args.seed)
    if args.ids:
        records = [r for r in records if any(part in r["id"] for part in args.ids.split(","))]
    for record in records:
        clear_cache(keep_setup=True)
        gc.freeze()  # the profile's own rows (a dict per mask, 300,000 by the end) are not walked
        try:
            compiled = grammar.compile_json_schema(record["schema"], vocab)
        except grammar.GrammarError:
            continue
        if args.warm_cells:
            for test in record["tests"]:
                m = grammar.GrammarMatcher(compiled)
                m.fill_next_token_bitmask(mask, 0)
                for token in tok.encode(json.dumps(test["data"], ensure_ascii=False), add_special_tokens=False):
                    if not m.accept_token(token):
                        break
                    m.fill_next_token_bitmask(mask, 0)
            forget_masks(compiled)
        for i, test in enumerate(record["tests"]):
            m = grammar.GrammarMatcher(compiled)
            m.fill_next_token_bitmask(mask, 0)
            for pos, token in enumerate(tok.encode(json.dumps(test["data"], ensure_ascii=False), add_special_tokens=False)):
                if not m.accept_token(token):
                    break
                _spent.clear()
                routes = dict(getattr(compiled.masks, "routes", {}))
                configurations = compiled.automaton.num_states
                t0 = time.perf_counter()
                m.fill_next_token_bitmask(mask, 0)
                dt = time.perf_counter() - t0
                _spent["new configurations"] = compiled.automaton.num_states - configurations
                for route, n in getattr(compiled.masks, "routes", {}).items():
                    if n != routes.get(route, 0):
                        _spent["route " + route] = n - routes.get(route, 0)
                masks.append((dt, dict(_spent), record["id"], i, pos))
    report(masks, args.top)


def report(masks: list, top: int) -> None:
    times = np.array([m[0] for m in masks]) * 1e6
    print(f"{len(masks)} masks: p50 {np.percentile(times, 50):.0f} µs, p90 {np.percentile(times, 90):.0f} µs, "
          f"p99 {np.percentile(times, 99):.0f} µs, max {times.max():.0f} µs\n")
    phases = list(PHASES)
    print("| schema | test@token | total ms | " + " | ".join(phases) + " |")
    print("|---|---|---:|" + "---:|" * len(phases))
    slowest = sorted(masks, key=lambda m: -m[0])[:top]
    for dt, spent, rid, i, pos in slowest:
        print(f"| {rid[:48]} | {i}@{pos} | {dt * 1e3:.1f} | " + " | ".join(f"{spent.get(p, 0) * 1e3:.1f}" for p in phases) + " |")
    p95 = np.percentile(times, 95)
    tail = [m for m in masks if m[0] * 1e6 >= p95]
    for label, group in ((f"slowest {top}", slowest), (f"masks at or above p95 ({p95:.0f} µs)", tail), ("all masks", masks)):
        total = sum(m[0] for m in group)
        shares = {p: sum(m[1].get(p, 0) for m in group) / total * 100 for p in phases}
        print(f"\nshare of time, {label} ({total:.2f} s): " + ", ".join(f"{p} {shares[p]:.0f}%" for p in phases))
    # Which mask routes computed rows during the tail's masks (a mask may compute several rows:
    # a sibling's, parts of a truncated top), with the time of the masks they ran in.
    by_route: dict[str, list[float]] = defaultdict(list)
    for dt, spent, *_ in tail:
        for key in spent:
            if key.startswith("route "):
                by_route[key[6:]].append(dt)
    for label, group in ((f"masks at or above p95", tail), ("all masks", masks)):
        created = [m[1].get("new configurations", 0) for m in group]
        print(f"\nnew configurations a mask creates, {label}: {np.mean(created):.1f} on average, "
              f"{np.mean([c > 0 for c in created]) * 100:.0f}% create some")
    print(f"\nroutes that ran in the {len(tail)} masks at or above p95 (masks, their total s): "
          + ", ".join(f"{r} {len(v)}, {sum(v):.2f}" for r, v in sorted(by_route.items(), key=lambda kv: -sum(kv[1]))))
    # Where in a document the masks over 1 ms fall (the token's index in its test instance; 0 is
    # the mask after the first token, "{" for an object), and what each kind of position costs.
    over = [m for m in masks if m[0] >= 1e-3]
    if over:
        print(f"\nmasks over 1 ms ({len(over)}) by the token's position in its instance:")
        for label, lo, hi in (("0", 0, 1), ("1-4", 1, 5), ("5-19", 5, 20), ("20-99", 20, 100), ("100+", 100, 1 << 30)):
            group = [m for m in over if lo <= m[4] < hi]
            if group:
                shares = {p: sum(m[1].get(p, 0) for m in group) / sum(m[0] for m in group) * 100 for p in phases}
                print(f"- {label}: {len(group) / len(over) * 100:.0f}%, {np.mean([m[0] for m in group]) * 1e3:.2f} ms and "
                      f"{np.mean([m[1].get('new configurations', 0) for m in group]):.0f} new configurations on average; "
                      + ", ".join(f"{p} {v:.0f}%" for p, v in shares.items() if v >= 5))


if __name__ == "__main__":
    main()
