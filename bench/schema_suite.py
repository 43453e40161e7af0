"""JSON-Schema-Test-Suite score: formcast (and the anchors) on the official suite's tests.

The suite's required tests of draft-04, -06, -07, 2019-09 and 2020-12 are kept in the repository
(tests/data/json-schema-test-suite; ``--suite`` points at another checkout). ``--draft`` picks
one draft or ``all`` (a table per draft). The suite's schemas seldom name their draft: each root
schema without ``$schema`` gets its draft's, so every engine applies that draft's rules. Every
test group (one schema, several instances) is compiled once; each instance, serialised as
``json.dumps(data, ensure_ascii=False)`` (MaskBench's spelling), is scored on its own:

- correct: accepted iff the suite says valid;
- valid rejected / **invalid accepted**;
- format asserted: a valid instance of ``format.json`` rejected: the suite reads ``format`` as
  an annotation, the engines assert it (formcast's ``json_schema_formats="annotate"``, which
  ``--formats annotate`` passes in the byte-level mode, reads it as the suite does);
- refused, unsatisfiable: the engine refused the schema because no value satisfies it (formcast:
  "no JSON value is valid against it"), the right answer for generation; ``--strict`` counts a
  group with a valid instance among these as wrong;
- refused, unsupported: any other compile error (remote references, budgets);
- timeout / crash: per group.

``--tokenizer bytes`` (the default) runs formcast alone in this process over the byte-level
vocabulary: the compiled language itself, quick enough to iterate on. ``--tokenizer smollm2`` or
``qwen2`` runs formcast, llguidance and xgrammar token by token through MaskBench's worker pool
(``bench/maskbench.py``: same adapters, timeouts and crash isolation).

    python bench/schema_suite.py --draft all
    python bench/schema_suite.py --draft all --tokenizer smollm2 --engines formcast,llguidance,xgrammar --jobs 2
    python bench/schema_suite.py --draft 2020-12 --show refused      # refusals by keyword
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

OUTCOMES = ("correct", "valid rejected", "invalid accepted", "format asserted", "refused, unsatisfiable", "refused, unsupported",
            "timeout", "crash")


SUITE = ROOT / "tests" / "data" / "json-schema-test-suite"  # the suite's required tests, kept in the repository
META_SCHEMAS = {"draft4": "http://json-schema.org/draft-04/schema#", "draft6": "http://json-schema.org/draft-06/schema#",
                "draft7": "http://json-schema.org/draft-07/schema#", "2019-09": "https://json-schema.org/draft/2019-09/schema",
                "2020-12": "https://json-schema.org/draft/2020-12/schema"}
DRAFT_FOLDERS = {"draft4": "draft4", "draft6": "draft6", "draft7": "draft7", "2019-09": "draft2019-09", "2020-12": "draft2020-12"}


def load_suite(path: Path, optional: bool, draft: str = "2020-12") -> list[dict]:
    """MaskBench-style records, one per test group: ``{"id", "schema", "draft", "tests": [{"valid", "data"}]}``.
    The suite's schemas mostly do not name their draft: ``draft`` goes with each record."""
    sub = DRAFT_FOLDERS[draft]
    folder = path / "tests" / sub if (path / "tests").is_dir() else path
    if not folder.is_dir():
        raise SystemExit(f"no {sub} tests under {path}")
    files = sorted(folder.glob("*.json"))
    if optional:
        files += sorted(p for p in (folder / "optional").rglob("*.json"))
    records = []
    for f in files:
        for i, group in enumerate(json.loads(f.read_text(encoding="utf-8"))):
            name = str(f.relative_to(folder))
            schema = group["schema"]
            if isinstance(schema, dict) and "$schema" not in schema:
                schema = {"$schema": META_SCHEMAS[draft], **schema}
            records.append({"id": f"{name}#{i}", "schema": schema, "draft": draft, "description": group["description"],
                            "tests": [{"valid": t["valid"], "data": t["data"], "description": t["description"]} for t in group["tests"]]})
    return records


# ---------------------------------------------------------------------------- bytes (formcast only)
class _Timeout(Exception):
    pass


def _alarm(*_: Any) -> None:
    raise _Timeout()


def run_bytes(records: list[dict], timeout: float, formats: str = "assert") -> list[dict]:
    """formcast over the byte-level vocabulary, in process: one result per group (MaskBench shape)."""
    from grammar import GrammarError, GrammarMatcher, TokenVocabulary
    from grammar.compiler import compile_grammar
    from grammar.json_schema import json_schema_to_grammar

    vocab = TokenVocabulary.byte_level()
    old = signal.signal(signal.SIGALRM, _alarm)
    results = []
    try:
        for rec in records:
            out: dict[str, Any] = {"id": rec["id"], "engine": "formcast"}
            signal.setitimer(signal.ITIMER_REAL, timeout)
            try:
                grammar = json_schema_to_grammar(rec["schema"], draft=rec.get("draft"), formats=formats)
                compiled = compile_grammar(grammar, vocab)
                failures = []
                for i, test in enumerate(rec["tests"]):
                    m = GrammarMatcher(compiled)
                    text = json.dumps(test["data"], ensure_ascii=False).encode("utf-8")
                    ok = m.accept_bytes(text) and m.can_terminate()
                    if ok != test["valid"]:
                        failures.append({"kind": "validation" if test["valid"] else "invalidation", "test": i})
                out.update(status="pass" if not failures else "fail", failures=failures)
            except GrammarError as exc:
                out.update(status="compile", error=f"{type(exc).__name__}: {exc}")
            except _Timeout:
                out.update(status="timeout", error=f"over {timeout:g} s")
            except RecursionError as exc:
                out.update(status="crash", error=f"RecursionError: {exc}")
            except Exception as exc:  # an engine bug: counted, not fatal to the run
                out.update(status="crash", error=f"{type(exc).__name__}: {exc}")
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            results.append(out)
    finally:
        signal.signal(signal.SIGALRM, old)
    return results


# ---------------------------------------------------------------------------- tokens (with anchors)
def run_tokens(records: list[dict], engines: list[str], args: argparse.Namespace) -> list[dict]:
    import maskbench

    tasks = [(e, r) for r in records for e in engines]
    results: list[dict] = []
    t0 = time.monotonic()

    def sink(result: dict) -> None:
        results.append(result)
        if len(results) % 100 == 0:
            print(f"  {len(results)}/{len(tasks)} done, {time.monotonic() - t0:.0f} s", file=sys.stderr)

    maskbench.run_pool(tasks, engines, args, sink)
    return results


# ---------------------------------------------------------------------------- scoring
def score(records: list[dict], results: list[dict], strict: bool = False) -> dict[str, dict[str, list[tuple[str, int]]]]:
    """engine -> outcome -> [(group id, test index)]."""
    by_id = {r["id"]: r for r in records}
    table: dict[str, dict[str, list[tuple[str, int]]]] = {}
    for res in results:
        rec = by_id[res["id"]]
        cells = table.setdefault(res["engine"], {o: [] for o in OUTCOMES})
        n = len(rec["tests"])
        status = res["status"]
        if status == "compile" and "unsatisfiable" in res.get("error", "").lower():
            for i, t in enumerate(rec["tests"]):
                cells["valid rejected" if strict and t["valid"] else "refused, unsatisfiable"].append((rec["id"], i))
            continue
        if status in ("compile", "timeout", "crash"):
            key = "refused, unsupported" if status == "compile" else status
            cells[key] += [(rec["id"], i) for i in range(n)]
            continue
        bad = {f["test"]: f["kind"] for f in res.get("failures", [])}
        for i in range(n):
            kind = bad.get(i)
            key = "correct" if kind is None else "valid rejected" if kind == "validation" else "invalid accepted"
            if key == "valid rejected" and rec["id"].startswith("format.json"):
                key = "format asserted"
            cells[key].append((rec["id"], i))
    return table


def report(records: list[dict], results: list[dict], show: set[str], strict: bool = False) -> str:
    table = score(records, results, strict)
    engines = list(table)
    total = sum(len(r["tests"]) for r in records)
    draft = records[0].get("draft", "") if records else ""
    lines = [f"draft {draft}: {total} tests in {len(records)} groups", "", "| outcome | " + " | ".join(engines) + " |",
             "| --- |" + " ---: |" * len(engines)]
    for o in OUTCOMES:
        cell = f"**{o}**" if o == "invalid accepted" else o
        lines.append(f"| {cell} | " + " | ".join(str(len(table[e][o])) for e in engines) + " |")
    by_id = {r["id"]: r for r in records}
    for e in engines:
        scored = sum(len(table[e][o]) for o in ("correct", "valid rejected", "invalid accepted"))
        wrong = len(table[e]["valid rejected"]) + len(table[e]["invalid accepted"])
        lines.append(f"  {e}: {wrong} of {scored} scored tests wrong ({100 * wrong / max(scored, 1):.2f}%), format cases apart")
    for e in engines:
        for o in ("invalid accepted", "valid rejected"):
            if o in show or o == "invalid accepted":
                for gid, i in table[e][o]:
                    t = by_id[gid]["tests"][i]
                    lines.append(f"  {e} {o}: {gid} test {i} ({t['description']}): {json.dumps(t['data'])[:100]}")
        if "refused" in show:
            import maskbench

            errors = Counter()
            for res in results:
                unsat = "unsatisfiable" in res.get("error", "").lower()
                if res["engine"] == e and res["status"] in ("compile", "timeout", "crash") and not unsat:
                    key = maskbench._keyword_of(res.get("error", "")) if res["status"] == "compile" else res["status"]
                    errors[key] += len(by_id[res["id"]]["tests"])
            lines.append(f"\n{e}: tests lost to refusals, by keyword")
            lines += [f"  {n:5d}  {k}" for k, n in errors.most_common()]
        if "groups" in show:
            lines.append(f"\n{e}: groups not fully correct")
            for res in results:
                if res["engine"] == e and res["status"] != "pass":
                    lines.append(f"  {res['id']}: {res['status']} {res.get('error', '')[:150]}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--suite", type=Path, default=SUITE, help="JSON-Schema-Test-Suite checkout (default: the copy in tests/data)")
    ap.add_argument("--draft", default="2020-12", help=f"{', '.join(DRAFT_FOLDERS)} or all")
    ap.add_argument("--formats", choices=("assert", "annotate"), default="assert", help="formcast's json_schema_formats (byte-level mode)")
    ap.add_argument("--optional", action="store_true", help="also the optional/ tests (formats, bignum, ...)")
    ap.add_argument("--only", help="substring of the file names to run (e.g. 'oneOf')")
    ap.add_argument("--tokenizer", choices=("bytes", "smollm2", "qwen2"), default="bytes")
    ap.add_argument("--engines", default="formcast", help="with a tokenizer: formcast,llguidance,xgrammar")
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds per group and engine")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--show", default="", help="comma list: refused, groups, valid rejected")
    ap.add_argument("--out", type=Path, help="write the per-group results as JSON lines")
    ap.add_argument("--strict", action="store_true", help="count a valid instance of a schema refused as unsatisfiable as rejected")
    args = ap.parse_args(argv)
    drafts = list(DRAFT_FOLDERS) if args.draft == "all" else [args.draft]
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    if args.tokenizer == "bytes" and engines != ["formcast"]:
        ap.error("--tokenizer bytes runs formcast only; pick smollm2 or qwen2 for the anchors")
    out = open(args.out, "w", encoding="utf-8") if args.out else None
    for draft in drafts:
        records = load_suite(args.suite, args.optional, draft)
        if args.only:
            records = [r for r in records if args.only in r["id"]]
        if args.tokenizer == "bytes":
            results = run_bytes(records, args.timeout, args.formats)
        else:
            args.max_minutes, args.gc_freeze = None, False  # maskbench.run_pool's own options
            results = run_tokens(records, engines, args)
        if out:
            for r in results:
                out.write(json.dumps({"draft": draft, **{k: v for k, v in r.items() if k != "tbm_us"}}) + "\n")
        print(report(records, results, {s.strip() for s in args.show.split(",") if s.strip()}, args.strict), "\n", flush=True)
    if out:
        out.close()


if __name__ == "__main__":
    main()
