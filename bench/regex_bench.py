"""Regex mask benchmark: formcast vs outlines-core, llguidance and xgrammar, two vocabularies, one run.

For each of ~30 extraction regexes and a sample string that fully matches it, every engine:
- TTFM: compile + matcher + first mask, with fresh caches (formcast: ``clear_cache()`` and a new
  compile; xgrammar: ``cache_enabled=False``; outlines-core builds its ``Index`` eagerly);
  per-vocabulary setup (trie, tokenizer info, outlines ``Vocabulary``) is done once beforehand;
- TBM: time per mask while walking the sample token by token (accept, then mask).
Walk 1 on a fresh compile is what a new request pays; ``--warm`` adds formcast's second walk over
the same compiled grammar (masks served from its per-state cache).

Run:  .venv/bin/python bench/regex_bench.py [--vocabs smollm2,qwen2] [--engines ...] [--repeat 3]
      [--only date,email] [--per-regex] [--warm]
Not collected by pytest.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ENGINES, Formcast, WalkResult, encode, load_tokenizer, machine_line, markdown_table, pct, repeat_walk, timed_walk  # noqa: E402

D = "[0-9]"
OCTET = "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
H16 = "[0-9a-fA-F]{1,4}"
MONTHS = "(January|February|March|April|May|June|July|August|September|October|November|December)"

# (name, pattern, sample). Written for this benchmark; classes are spelled out ([0-9], not \d) so
# every engine reads the same language whatever its Unicode defaults.
REGEXES: list[tuple[str, str, str]] = [
    ("date", rf"{D}{{4}}-(0[1-9]|1[0-2])-(0[1-9]|[12]{D}|3[01])", "2024-02-29"),
    ("date-us", rf"(0?[1-9]|1[0-2])/(0?[1-9]|[12]{D}|3[01])/{D}{{4}}", "7/04/1976"),
    ("date-long", rf"{MONTHS} ([1-9]|[12]{D}|3[01]), {D}{{4}}", "September 17, 1787"),
    ("time", rf"([01]{D}|2[0-3]):[0-5]{D}(:[0-5]{D})?", "23:59:07"),
    ("time-12h", rf"(1[0-2]|0?[1-9]):[0-5]{D} ?([AaPp][Mm])", "9:45 pm"),
    ("iso-timestamp", rf"{D}{{4}}-{D}{{2}}-{D}{{2}}T{D}{{2}}:{D}{{2}}:{D}{{2}}(\.{D}{{1,9}})?(Z|[+-]{D}{{2}}:{D}{{2}})",
     "2026-11-29T09:44:10.123456+01:00"),
    ("email", r"[a-zA-Z0-9._%+-]{1,64}@([a-zA-Z0-9-]{1,63}\.){1,8}[a-zA-Z]{2,24}", "jane.doe+news@mail.example.co.uk"),
    ("url", r"https?://([a-z0-9-]+\.)+[a-z]{2,12}(:[0-9]{2,5})?(/[A-Za-z0-9._~%-]*)*(\?[A-Za-z0-9._~%=&-]*)?",
     "https://docs.example.org:8443/api/v2/items?id=42&sort=desc"),
    ("phone-us", rf"(\+1 )?\(?{D}{{3}}\)?[ .-]?{D}{{3}}[ .-]?{D}{{4}}", "+1 (415) 555-0132"),
    ("phone-e164", r"\+[1-9][0-9]{6,14}", "+442071838750"),
    ("ipv4", rf"({OCTET}\.){{3}}{OCTET}", "192.168.100.254"),
    ("ipv6", rf"({H16}:){{7}}{H16}|(({H16}:){{0,6}}{H16})?::(({H16}:){{0,6}}{H16})?", "2001:db8:85a3::8a2e:370:7334"),
    ("mac", r"([0-9A-F]{2}:){5}[0-9A-F]{2}", "3C:22:FB:7A:10:9E"),
    ("uuid", r"[0-9a-f]{8}-[0-9a-f]{4}-[1-5][0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", "123e4567-e89b-42d3-a456-426614174000"),
    ("money-usd", r"\$(0|[1-9][0-9]{0,2}(,[0-9]{3})*)(\.[0-9]{2})?", "$1,234,567.89"),
    ("money-eur", r"(0|[1-9][0-9]{0,2}(\.[0-9]{3})*),[0-9]{2} (EUR|€)", "12.500,00 €"),
    ("zip-us", rf"{D}{{5}}(-{D}{{4}})?", "94103-1234"),
    ("postcode-uk", r"[A-Z]{1,2}[0-9][A-Z0-9]? [0-9][A-Z]{2}", "SW1A 2AA"),
    ("postcode-ca", r"[A-CEGHJ-NPRSTVXY][0-9][A-CEGHJ-NPRSTV-Z] [0-9][A-CEGHJ-NPRSTV-Z][0-9]", "K1A 0B1"),
    ("sku", r"[A-Z]{3}-[0-9]{4}-[A-Z0-9]{2}(-(XS|S|M|L|XL|XXL))?", "TSH-0042-BL-XL"),
    ("isbn13", rf"97[89]-{D}{{1,5}}-{D}{{1,7}}-{D}{{1,7}}-{D}", "978-3-16-148410-0"),
    ("credit-card", rf"{D}{{4}}( {D}{{4}}){{3}}", "4111 1111 1111 1111"),
    ("semver", r"(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?",
     "2.13.0-rc.1+build.2048"),
    ("hex-color", r"#([0-9a-fA-F]{3}|[0-9a-fA-F]{6}|[0-9a-fA-F]{8})", "#1e90ffcc"),
    ("log-line", rf"{D}{{4}}-{D}{{2}}-{D}{{2}} {D}{{2}}:{D}{{2}}:{D}{{2}},{D}{{3}} (DEBUG|INFO|WARNING|ERROR|CRITICAL) "
     r"\[[a-z_.]+\] [ -~]{1,200}", "2026-11-29 09:44:10,512 WARNING [engine.scheduler] queue depth 128 exceeds soft limit"),
    ("apache-log", rf"{OCTET}(\.{OCTET}){{3}} - - \[{D}{{2}}/[A-Z][a-z]{{2}}/{D}{{4}}:{D}{{2}}:{D}{{2}}:{D}{{2}} [+-]{D}{{4}}\] "
     r'"(GET|POST|PUT|DELETE|HEAD) /[^ "]* HTTP/1\.[01]" [1-5][0-9]{2} [0-9]{1,9}',
     '10.0.0.7 - - [29/Nov/2026:09:44:10 +0000] "GET /index.html?q=1 HTTP/1.1" 200 5123'),
    ("us-ssn", rf"{D}{{3}}-{D}{{2}}-{D}{{4}}", "078-05-1120"),
    ("iban", r"[A-Z]{2}[0-9]{2}( ?[A-Z0-9]{4}){2,7}( ?[A-Z0-9]{1,4})?", "DE89 3704 0044 0532 0130 00"),
    ("lat-lon", r"-?([1-8]?[0-9](\.[0-9]{1,6})?|90(\.0{1,6})?), -?((1[0-7]|[1-9])?[0-9](\.[0-9]{1,6})?|180(\.0{1,6})?)",
     "48.858370, 2.294481"),
    ("person-name", r"[A-Z][a-z]{1,20}( [A-Z]\.)? [A-Z][a-z]{1,20}(-[A-Z][a-z]{1,20})?", "Mary J. Watson-Holmes"),
    ("sentence", r"[A-Z][a-z]*( [a-z]+){3,30}[.!?]", "The quick brown fox jumps over the lazy dog."),
    ("yes-no-maybe", r"(yes|no|maybe)( because [a-z ,]{5,100})?", "maybe because it depends on the weather"),
]


def check_samples() -> None:
    for name, pattern, sample in REGEXES:
        assert re.fullmatch(pattern, sample, re.ASCII), f"sample of {name!r} does not match its pattern"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocabs", default="smollm2,qwen2")
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--only", default="", help="comma-separated regex names (default: all)")
    ap.add_argument("--repeat", type=int, default=3, help="fresh compiles per cell: median TTFM, pooled masks")
    ap.add_argument("--per-regex", action="store_true", help="also print one row per regex and engine")
    ap.add_argument("--warm", action="store_true", help="add formcast's warm walk (masks from its state cache)")
    args = ap.parse_args()
    check_samples()
    cases = [c for c in REGEXES if not args.only or c[0] in args.only.split(",")]
    engines = [ENGINES[n]() for n in args.engines.split(",")]
    print(f"# regex masks: {len(cases)} regexes, repeat {args.repeat}; {machine_line()}\n")
    for vname in args.vocabs.split(","):
        tok, vocab = load_tokenizer(vname)
        for e in engines:
            e.prepare(tok, vocab)
        results = {e.name: {} for e in engines}
        for name, pattern, sample in cases:
            tokens = encode(tok, sample)
            for e in engines:
                results[e.name][name] = repeat_walk(e, "regex", pattern, tokens, args.repeat)
            if args.warm:
                results.setdefault("formcast-warm", {})[name] = warm_walk(engines, pattern, tokens, args.repeat)
        report(vname, vocab.vocab_size, cases, results, args.per_regex)


def warm_walk(engines, pattern, tokens, repeat):
    """formcast's steady state: walk the same compiled grammar again (its mask cache is full)."""
    fc = next((e for e in engines if isinstance(e, Formcast)), None)
    if fc is None:
        return WalkResult(0.0, ok=False, error="needs formcast")
    compiled = fc.compile("regex", pattern)
    timed_walk(fc, "regex", pattern, tokens, start=lambda: fc.session(compiled))  # fill the cache
    runs = [timed_walk(fc, "regex", pattern, tokens, start=lambda: fc.session(compiled)) for _ in range(repeat)]
    out = WalkResult(min(r.ttfm for r in runs), ok=all(r.ok for r in runs))
    for r in runs:
        out.masks += r.masks
    return out


def report(vname: str, vocab_size: int, cases, results, per_regex: bool) -> None:
    us = 1e6
    names = list(results)
    if per_regex:
        rows = []
        for name, _, _ in cases:
            for e in names:
                r = results[e][name]
                rows.append([name, e, f"{r.ttfm * 1e3:.2f}" if not r.error else r.error,
                             f"{pct(r.masks, 50) * us:.1f}", f"{pct(r.masks, 99) * us:.1f}", len(r.masks),
                             "yes" if r.ok else ("-" if r.error else "REJECTED")])
        print(f"## {vname} ({vocab_size} tokens): per regex\n")
        print(markdown_table(["regex", "engine", "TTFM ms", "TBM p50 µs", "TBM p99 µs", "masks", "ok"], rows, 2))
        print()
    rows = []
    fc = results.get("formcast")
    for e in names:
        ok = [r for r in results[e].values() if not r.error]
        ttfm = [r.ttfm for r in ok]
        masks = [m for r in ok for m in r.masks]
        bad = sum(1 for r in results[e].values() if r.error or not r.ok)
        row = [e, f"{len(ok)}/{len(cases)}", bad, f"{pct(ttfm, 50) * 1e3:.2f}", f"{pct(ttfm, 99) * 1e3:.2f}",
               f"{pct(masks, 50) * us:.1f}", f"{pct(masks, 99) * us:.1f}"]
        if fc is not None and e not in ("formcast", "formcast-warm"):
            # Ratios on the regexes both engines ran.
            both = [n for n, r in results[e].items() if not r.error and not fc[n].error]
            f_t = pct([fc[n].ttfm for n in both], 50) / pct([results[e][n].ttfm for n in both], 50)
            f_m = pct([m for n in both for m in fc[n].masks], 50) / pct([m for n in both for m in results[e][n].masks], 50)
            row += [f"{f_t:.2f}x", f"{f_m:.2f}x"]
        else:
            row += ["", ""]
        rows.append(row)
    print(f"## {vname} ({vocab_size} tokens): summary over regexes (TTFM: median of per-regex medians; TBM: pooled)\n")
    print(markdown_table(["engine", "ran", "failed/rejected", "TTFM p50 ms", "TTFM p99 ms", "TBM p50 µs", "TBM p99 µs",
                          "formcast/engine TTFM p50", "formcast/engine TBM p50"], rows))
    print(flush=True)


if __name__ == "__main__":
    main()
