"""A whole-vocabulary mask computed from scratch: formcast's trie walk against llguidance's mask.

For each regex, the state after its first bytes is walked over the Qwen2 vocabulary's trie
(``token_walk.walk_trie``, every transition it reads already computed: the walk alone, not the
determinization) and llguidance fills the mask of the same position (a fresh matcher after the
same bytes for each call, one filled first: a matcher keeps the mask of its position, while its
grammar's lexer states are shared). Best of ``--repeat`` calls each, in µs, and the ratio.

    python bench/walk_bench.py [--repeat 30]

An earlier checkout placed first on ``PYTHONPATH`` is the one measured (for a before / after).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))  # after PYTHONPATH: an older checkout placed first is the one measured
sys.path.append(str(ROOT / "bench"))

import grammar  # noqa: E402
import maskbench  # noqa: E402
from common import best_us, machine_line, markdown_table, ratio  # noqa: E402
from grammar.token_walk import walk_trie  # noqa: E402

# (regex, bytes before the measured position): a JSON string's body (most of the vocabulary), a
# lowercase text field, a mixed alternation, a number (few tokens).
CASES = [
    ('"[^"\\\\]*"', b'"'),
    ("[a-z ]{0,400}", b""),
    ('(\\{"a": ?[0-9]+\\}|[a-zA-Z0-9_ ,.]+)*', b""),
    ("[0-9]{1,5}(\\.[0-9]+)?", b""),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=30)
    args = ap.parse_args()
    import llguidance
    import llguidance.hf
    import llguidance.numpy

    tok = maskbench.load_tokenizer("qwen2")
    vocab = grammar.TokenVocabulary.from_tokenizer(tok)
    ll_tok = llguidance.hf.from_tokenizer(tok, eos_token=int(tok.eos_token_id))
    mask = np.zeros((1, (len(tok) + 31) // 32), dtype=np.int32)
    rows = []
    for pattern, prefix in CASES:
        compiled = grammar.compile_regex(pattern, vocab)
        automaton, trie = compiled.automaton, compiled.masks.trie
        state = automaton.step_bytes(automaton.initial_state, prefix)
        allowed = int(np.unpackbits(walk_trie(trie, automaton, state).bits.view(np.uint8)).sum())  # computes the cells
        ours = best_us(lambda: walk_trie(trie, automaton, state), args.repeat)
        spec = llguidance.LLMatcher.grammar_from_regex(pattern)
        matchers = []  # a fresh matcher per call: a matcher keeps the mask of its position
        for _ in range(args.repeat + 1):  # the untimed first fill computes its lexer states, as ours are
            matchers.append(llguidance.LLMatcher(ll_tok, spec, log_level=0))
            if prefix:
                matchers[-1].consume_tokens(tok.encode(prefix.decode(), add_special_tokens=False))
        theirs = best_us(lambda: llguidance.numpy.fill_next_token_bitmask(matchers.pop(), mask, 0), args.repeat)
        rows.append([f"`{pattern}` after {prefix!r}", str(allowed), f"{ours:.0f}", f"{theirs:.0f}", ratio(ours, theirs)])
    print(f"# {machine_line()}; Qwen2 vocabulary, {len(trie.words):,} trie nodes; best of {args.repeat}\n")
    print(markdown_table(["position", "allowed tokens", "formcast walk µs", "llguidance mask µs", "formcast / llguidance"], rows))


if __name__ == "__main__":
    main()
