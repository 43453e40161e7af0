"""Context-free grammar benchmark: formcast vs xgrammar vs llguidance, one run, two vocabularies.

For each test grammar in tests/grammars/ (EBNF, fed to every engine as EBNF) plus the JSON-schema
``{}`` path, walk a sample document token by token (mask, then accept) and report:

- TTFM: time to first mask = grammar parse + compile + matcher + first mask, caches cleared;
- TBM p50 / p99: time per ``fill_next_token_bitmask`` call over the walk (after each accept).

Run:  .venv/bin/python bench/grammar_bench.py [--vocabs smollm2,qwen2] [--grammars json,arith] [--repeat 3]
Not collected by pytest.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script from anywhere
GRAMMARS = ROOT / "tests" / "grammars"
JSON_DOC = (
    '{"id": 1234, "name": "Widget \\"Pro\\"", "tags": ["a", "b", "c"], "price": 19.99,\n'
    ' "dims": {"w": 1.5e2, "h": -3, "d": 0}, "ok": true, "none": null,\n'
    ' "items": [[1, 2], [3, [4, [5, {"deep": [6]}]]]], "note": "caf\\u00e9 \\n done"}'
)
SAMPLES = {
    "json": JSON_DOC,
    "arith": "12 + 3.5*(4 - -2)/7 - ((1 + 2) * (3 + 4) - 5)/6 + 100*(2 + 3*(4 + 5*(6 + 7)))",
    "sql": "SELECT name, COUNT(*), t.price FROM orders WHERE price > 10 AND (status = 'open' OR NOT qty < 5)"
           " ORDER BY name DESC, price LIMIT 50;",
    "clike": "int add(int a, int b) { return a + b; }\nint main() {\n  int x = 1;\n  while (x < 10) { x = add(x, 2); }\n"
             "  if (x == 11) { return 0; } else { return x * 2 - 1; }\n}\n",
    "sexp": "(begin (define (fact n) (if (<= n 1) 1 (* n (fact (- n 1)))))\n  (display \"result: \" (fact 10) 'done))",
    "csv": 'id,name,comment\n1,alice,"said ""hi"", left"\n2,bob,\n3,"carol, jr",ok\r\n4,dave,"multi\nline"\n',
    "brackets": "([]{<>})[[{}]]<(){[]}>" * 3,
}


def load_vocab(name: str):
    from engine.hf.tokenizers import load_default_tokenizer, load_qwen2_tokenizer
    from grammar import TokenVocabulary

    tok = load_default_tokenizer() if name == "smollm2" else load_qwen2_tokenizer()
    return tok, TokenVocabulary.from_tokenizer(tok)


def percentiles(samples: list[float]) -> tuple[float, float]:
    arr = np.array(samples) * 1e6
    return float(np.percentile(arr, 50)), float(np.percentile(arr, 99))


def walk(first_mask, fill, accept, tokens) -> tuple[float, list[float], bool]:
    """Return (ttfm seconds, per-mask seconds, all tokens accepted)."""
    t0 = time.perf_counter()
    first_mask()
    ttfm = time.perf_counter() - t0
    times, ok = [], True
    for tok in tokens:
        if not accept(tok):
            ok = False
            break
        t = time.perf_counter()
        fill()
        times.append(time.perf_counter() - t)
    return ttfm, times, ok


def run_formcast(kind: str, text: str, vocab, tokens):
    from grammar import GrammarMatcher, allocate_token_bitmask
    from grammar.api import clear_cache, compile_ebnf, compile_json_schema

    clear_cache(keep_setup=True)
    bitmask = allocate_token_bitmask(1, vocab.vocab_size)
    state = {}

    def first():
        compiled = compile_json_schema({}, vocab) if kind == "schema" else compile_ebnf(text, vocab)
        state["m"] = GrammarMatcher(compiled)
        state["m"].fill_next_token_bitmask(bitmask)

    t0 = time.perf_counter()
    first()
    ttfm = time.perf_counter() - t0
    m = state["m"]
    return (ttfm,) + walk(lambda: None, lambda: m.fill_next_token_bitmask(bitmask), m.accept_token, tokens)[1:]


def run_xgrammar(kind: str, text: str, info, tokens):
    import xgrammar as xg

    bitmask = xg.allocate_token_bitmask(1, info.vocab_size)
    state = {}

    def first():
        compiler = xg.GrammarCompiler(info, cache_enabled=False)
        compiled = compiler.compile_builtin_json_grammar() if kind == "schema" else compiler.compile_grammar(xg.Grammar.from_ebnf(text))
        state["m"] = xg.GrammarMatcher(compiled)
        state["m"].fill_next_token_bitmask(bitmask)

    ttfm, _, _ = walk(first, lambda: None, lambda t: True, [])
    m = state["m"]
    return (ttfm,) + walk(lambda: None, lambda: m.fill_next_token_bitmask(bitmask), m.accept_token, tokens)[1:]


def run_llguidance(kind: str, text: str, lltok, tokens):
    import llguidance
    import llguidance.numpy as lln

    bitmask = lln.allocate_token_bitmask(1, lltok.vocab_size)
    state = {}

    def first():
        if kind == "schema":  # flexible whitespace, as formcast's and xgrammar's defaults allow
            g = llguidance.grammar_from("json_schema", '{"x-guidance": {"whitespace_flexible": true}}')
        else:  # llguidance's GBNF reader wants an alternative's "|" on the rule's line
            g = llguidance.grammar_from("ebnf", re.sub(r"\n[ \t]+\|", " |", text))
        m = llguidance.LLMatcher(lltok, g)
        if m.is_error():
            raise RuntimeError(m.get_error())
        state["m"] = m
        lln.fill_next_token_bitmask(m, bitmask)

    ttfm, _, _ = walk(first, lambda: None, lambda t: True, [])
    m = state["m"]
    return (ttfm,) + walk(lambda: None, lambda: lln.fill_next_token_bitmask(m, bitmask), m.consume_token, tokens)[1:]


def cases(selected: list[str]) -> list[tuple[str, str, str, str]]:
    out = [(n, "ebnf", (GRAMMARS / f"{n}.ebnf").read_text(), SAMPLES[n]) for n in selected if n in SAMPLES]
    if "json-schema" in selected:
        out.append(("json-schema {}", "schema", "", JSON_DOC))
    return out


def warm_up(vocab, info, lltok) -> None:
    """One tiny grammar per engine, so that once-per-process costs (imports, loading formcast's
    cached numba kernels) are not charged to the first grammar's TTFM; not one of the measured
    grammars, so no per-grammar cache is warm."""
    for fn, arg in ((run_formcast, vocab), (run_xgrammar, info), (run_llguidance, lltok)):
        fn("ebnf", 'root ::= "a" | "b"', arg, [])
    from grammar import GrammarMatcher, allocate_token_bitmask, compile_json_schema

    GrammarMatcher(compile_json_schema({"const": 1}, vocab)).fill_next_token_bitmask(allocate_token_bitmask(1, vocab.vocab_size))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocabs", default="smollm2,qwen2")
    ap.add_argument("--grammars", default=",".join([*SAMPLES, "json-schema"]))
    ap.add_argument("--repeat", type=int, default=3, help="runs per cell; the median TTFM and pooled masks are kept")
    args = ap.parse_args()
    import llguidance.hf
    import xgrammar as xg

    print("| grammar | vocab | engine | TTFM ms | TBM p50 µs | TBM p99 µs | masks | ok |")
    print("|---|---|---|---:|---:|---:|---:|---|")
    for vname in args.vocabs.split(","):
        tok, vocab = load_vocab(vname)
        info = xg.TokenizerInfo.from_huggingface(tok, vocab_size=vocab.vocab_size)
        lltok = llguidance.hf.from_tokenizer(tok, n_vocab=vocab.vocab_size)
        warm_up(vocab, info, lltok)
        for name, kind, text, doc in cases(args.grammars.split(",")):
            tokens = tok.encode(doc, add_special_tokens=False)
            for engine, fn, arg in (("formcast", run_formcast, vocab), ("xgrammar", run_xgrammar, info),
                                    ("llguidance", run_llguidance, lltok)):
                ttfms, masks, ok, err = [], [], True, ""
                for _ in range(args.repeat):
                    try:
                        ttfm, times, accepted = fn(kind, text, arg, tokens)
                    except Exception as exc:  # an engine refusing a grammar is a result, not a crash
                        err = f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:60]}"
                        break
                    ttfms.append(ttfm)
                    masks += times
                    ok &= accepted
                if err or not masks:
                    print(f"| {name} | {vname} | {engine} | | | | | {err or 'no masks'} |")
                    continue
                p50, p99 = percentiles(masks)
                print(f"| {name} | {vname} | {engine} | {statistics.median(ttfms) * 1e3:.2f} | {p50:.1f} | {p99:.1f} "
                      f"| {len(masks)} | {'yes' if ok else 'REJECTED a token'} |", flush=True)


if __name__ == "__main__":
    main()
