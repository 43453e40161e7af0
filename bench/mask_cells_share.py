"""How much of formcast's mask time is computing new automaton cells (lazy determinization).

For each sampled MaskBench schema: compile it, walk its first valid instances token by token
timing every mask (``cold``: what MaskBench measures), then forget every mask the grammar cached
(rows, truncated parts, regions) but keep its automaton, and walk the same tokens again
(``warm cells``: the same routes and walks, with every transition they read already computed).
The difference is the time the walks spent creating configurations (closures, interning).

    python bench/mask_cells_share.py --sample 300 --seed 0

Qwen2 vocabulary, formcast only (a split of formcast's own time; no anchor applies).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import grammar  # noqa: E402
import maskbench  # noqa: E402
from grammar.lru import ByteLRU  # noqa: E402


def forget_masks(compiled) -> None:  # type: ignore[no-untyped-def]
    """Drop every mask ``compiled`` cached (rows, truncated parts, regions); keep its automaton."""
    masks = compiled.masks
    masks._rows = ByteLRU(1 << 30, lambda row: row.nbytes + 64)
    masks._truncated = ByteLRU(1 << 28, lambda t: 64 if isinstance(t, bool) else t.bits.nbytes + t.uncertain.nbytes)
    masks._regions = {}


def _walk(compiled, tokens: list[int], mask: np.ndarray, out: list[float]) -> None:  # type: ignore[no-untyped-def]
    matcher = grammar.GrammarMatcher(compiled)
    matcher.fill_next_token_bitmask(mask, 0)
    for token in tokens:
        if not (mask[0, token >> 5] >> (token & 31)) & 1:
            return
        t0 = time.perf_counter()
        if not matcher.accept_token(token):
            return
        matcher.fill_next_token_bitmask(mask, 0)
        out.append((time.perf_counter() - t0) * 1e6)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--input", type=Path, default=Path("/work/shared/bench/maskbench/dev.jsonl.gz"))
    ap.add_argument("--sample", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--instances", type=int, default=2, help="valid instances walked per schema")
    args = ap.parse_args()
    tok = maskbench.load_tokenizer("qwen2")
    vocab = grammar.TokenVocabulary.from_tokenizer(tok)
    records = maskbench.load_records(args.input, 0, None, args.sample, args.seed)
    mask = np.zeros((1, (vocab.vocab_size + 31) // 32), np.int32)
    cold: list[float] = []
    warm: list[float] = []
    for record, compiled in maskbench.compiled_schemas(records, vocab):
        texts = [json.dumps(t["data"], ensure_ascii=False) for t in record["tests"] if t["valid"]][: args.instances]
        token_lists = [tok.encode(text, add_special_tokens=False) for text in texts]
        for tokens in token_lists:
            _walk(compiled, tokens, mask, cold)
        forget_masks(compiled)
        for tokens in token_lists:
            _walk(compiled, tokens, mask, warm)
    print(f"{args.sample} schemas (seed {args.seed}), {len(cold)} masks each pass\n")
    print("| pass | p50 µs | p90 µs | p99 µs | masks over 1 ms | total s |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, values in (("cold (as MaskBench)", np.array(cold)), ("warm cells, masks recomputed", np.array(warm))):
        p50, p90, p99 = np.percentile(values, [50, 90, 99])
        print(f"| {name} | {p50:.1f} | {p90:.0f} | {p99:.0f} | {(values > 1000).sum()} | {values.sum() / 1e6:.2f} |")
    print(f"\nshare of the cold pass's mask time spent computing new cells: {1 - sum(warm) / sum(cold):.0%}")


if __name__ == "__main__":
    main()
