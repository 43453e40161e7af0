"""Compile scaling benchmark: formcast vs llguidance vs xgrammar as one constraint grows, one run.

Four families of constraints, each at growing sizes:

- ``enum``:    ``{"enum": [...]}`` of N distinct SKU-like strings sharing prefixes, N = 10^2 .. 10^5;
- ``object``:  an object of N required integer properties, ``additionalProperties: false``,
               N = 10, 100, 1000, 5000;
- ``literal``: a regex matching one N-byte printable text (metacharacters escaped), N = 10^3 .. 10^6;
- ``nesting``: D nested objects ``{"type": "object", "properties": {"a": inner}, "required": ["a"]}``,
               D = 10, 100, 1000.

For each (engine, family, size), in a fresh spawned process (so that one case's caches, memory
and crashes cannot leak into the next): load the Qwen2 vocabulary, prepare the engine and warm it
up on a tiny constraint of the same kind (imports, tokenizer tables and JIT kernels are not the
constraint's cost), then measure

- compile ms:    source -> compiled grammar -> matcher (``Engine.start`` of bench/common.py);
- first mask ms: the mask of the initial state (``Session.fill``);
- peak MB:       peak RSS during compile + first mask minus the RSS before it (``ru_maxrss``,
                 with the kernel's peak reset after loading, so the tokenizer's own load peak
                 cannot hide a smaller compile peak; native memory is counted, unlike tracemalloc).

A case that runs past ``--timeout`` is killed and recorded as ``timeout`` (larger sizes of that
family are then skipped for that engine); a formcast ``GrammarError`` is ``refused: <Class>``,
any other exception ``error: <Class>``, a dead child ``crash: ...``.

Run:  .venv/bin/python bench/scale_bench.py [--families enum,object,literal,nesting]
      [--engines formcast,llguidance,xgrammar] [--max-size N] [--quick] [--timeout 60]
      [--json out.json] [--plot out.png]
Smoke run (sizes up to 1000):  .venv/bin/python bench/scale_bench.py --quick
Not collected by pytest.
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing as mp
import os
import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ENGINES, load_tokenizer, machine_line, markdown_table, ratio  # noqa: E402

DEFAULT_ENGINES = ("formcast", "llguidance", "xgrammar")
QUICK_MAX_SIZE = 1000
# Loading the Qwen2 vocabulary and one engine takes ~10 s on an idle machine; this only catches a
# child that hangs before the measured part starts (the --timeout clock starts after it).
SETUP_SECONDS = 300.0
MB = 1 << 20


# ---------------------------------------------------------------------- constraint families


def enum_schema(n: int) -> str:
    # Shared prefixes ("item-0001...") make a real trie, as product names and SKUs do.
    return json.dumps({"enum": [f"item-{i:06d}-{'abcdefghij'[i % 10]}" for i in range(n)]})


def object_schema(n: int) -> str:
    props = {f"field_{i:05d}": {"type": "integer"} for i in range(n)}
    return json.dumps({"type": "object", "properties": props, "required": list(props), "additionalProperties": False})


def nested_schema(depth: int) -> str:
    # Built as text: json.dumps (and json.loads) of a 1000-deep dict pass Python's recursion limit
    # in the benchmark itself. additionalProperties is spelled out because the engines' defaults
    # differ (xgrammar's strict mode forbids extra keys, formcast and llguidance allow them), and
    # every engine should compile the same language.
    head = '{"type": "object", "properties": {"a": '
    tail = '}, "required": ["a"], "additionalProperties": false}'
    return head * depth + '{"type": "integer"}' + tail * depth


LITERAL_TEXT = ("Order #1042 (priority: high) costs $19.99 + 7.5% tax; ship to [dock 3] {ref: A|B} "
                "by 09:30? yes* ^maybe^ C:\\path\\to\\file.txt - done. ")
# Only what is special in every engine's regex dialect: re.escape also escapes " ", "#", "-", "&"
# and "~", which not every dialect accepts escaped.
REGEX_META = frozenset("\\.^$|?*+()[]{}")


def literal_regex(n: int) -> str:
    text = (LITERAL_TEXT * (n // len(LITERAL_TEXT) + 1))[:n]
    return "".join("\\" + c if c in REGEX_META else c for c in text)


@dataclass(frozen=True)
class Family:
    kind: str  # the Engine.start kind: "json_schema" or "regex"
    sizes: tuple[int, ...]
    make: Callable[[int], str]
    unit: str  # what the size counts, for the plot's axis


FAMILIES: dict[str, Family] = {
    "enum": Family("json_schema", (10**2, 10**3, 10**4, 10**5), enum_schema, "strings"),
    "object": Family("json_schema", (10, 100, 1000, 5000), object_schema, "properties"),
    "literal": Family("regex", (10**3, 10**4, 10**5, 10**6), literal_regex, "bytes"),
    "nesting": Family("json_schema", (10, 100, 1000), nested_schema, "depth"),
}

WARM_UP = {  # one tiny constraint per kind, not one of the measured ones
    "json_schema": '{"type": "object", "properties": {"a": {"enum": ["x", "y"]}, "b": {"type": "integer"}},'
                   ' "required": ["a", "b"], "additionalProperties": false}',
    "regex": r"ab\.c|d",
}


# ---------------------------------------------------------------------- the child: one case


def current_rss() -> int:
    """Resident set size now, in bytes (Linux); 0 where /proc is missing."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def max_rss() -> int:
    """Peak resident set size so far, in bytes (``ru_maxrss`` is in KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def reset_peak_rss() -> int:
    """Reset the kernel's peak-RSS mark to the current RSS and return the baseline to subtract.

    Without the reset the tokenizer load's transient peak would stay the process peak, and a
    compile that peaks below it would read as 0 MB. Where the reset is unsupported the baseline
    is the peak so far, so the delta is what the compile adds above the load peak (a lower bound).
    """
    gc.collect()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # 5: reset the peak RSS (Linux >= 4.0)
    except OSError:
        return max_rss()
    return current_rss() or max_rss()


def describe(exc: BaseException) -> tuple[str, str]:
    """``(status, message)``: formcast's GrammarError family is a refusal, anything else an error."""
    from grammar import GrammarError

    kind = "refused" if isinstance(exc, GrammarError) else "error"
    lines = str(exc).splitlines()
    return f"{kind}: {type(exc).__name__}", lines[0][:300] if lines else ""


def child_main(conn: Any, engine_name: str, family: str, size: int, vocab_name: str) -> None:
    """Set up, say "ready", then compile and take the first mask; send one result dict."""
    try:
        t0 = time.perf_counter()
        tok, vocab = load_tokenizer(vocab_name)
        engine = ENGINES[engine_name]()
        engine.prepare(tok, vocab)
        fam = FAMILIES[family]
        engine.start(fam.kind, WARM_UP[fam.kind]).fill()
        source = fam.make(size)  # built before the baseline: the source text is not the engine's memory
        setup = {"setup_s": time.perf_counter() - t0, "vocab_size": vocab.vocab_size, "source_chars": len(source)}
        base = reset_peak_rss()
    except BaseException as exc:  # noqa: BLE001 (reported, the parent goes on)
        status, message = describe(exc)
        conn.send(("done", {"status": f"setup {status}", "error": message}))
        return
    conn.send(("ready", setup))
    try:
        t0 = time.perf_counter()
        session = engine.start(fam.kind, source)
        t1 = time.perf_counter()
        session.fill()
        t2 = time.perf_counter()
    except BaseException as exc:  # noqa: BLE001 (an engine refusing a constraint is a result)
        status, message = describe(exc)
        conn.send(("done", {**setup, "status": status, "error": message,
                            "failed_after_ms": (time.perf_counter() - t0) * 1e3,
                            "peak_mb": max(0, max_rss() - base) / MB, "rss_base_mb": base / MB}))
        return
    conn.send(("done", {**setup, "status": "ok", "compile_ms": (t1 - t0) * 1e3, "first_mask_ms": (t2 - t1) * 1e3,
                        "peak_mb": max(0, max_rss() - base) / MB, "rss_base_mb": base / MB}))


# ---------------------------------------------------------------------- the parent: one process per case


def receive(conn: Any, seconds: float) -> tuple[str, dict] | str:
    """The child's next message, or "timeout" / "dead" (a closed pipe: the child exited)."""
    if not conn.poll(seconds):
        return "timeout"
    try:
        return conn.recv()
    except (EOFError, OSError):
        return "dead"


def run_case(ctx: Any, engine: str, family: str, size: int, vocab: str, timeout: float) -> dict:
    row: dict[str, Any] = {"engine": engine, "family": family, "size": size}
    conn, child_end = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=child_main, args=(child_end, engine, family, size, vocab), daemon=True)
    proc.start()
    child_end.close()  # so that the child's exit closes the pipe and ends a poll
    try:
        msg = receive(conn, SETUP_SECONDS)
        if isinstance(msg, tuple) and msg[0] == "ready":
            row.update(msg[1])
            msg = receive(conn, timeout)
        if msg == "timeout":
            row["status"] = "timeout" if "setup_s" in row else "setup timeout"
        elif msg == "dead":
            proc.join(5)
            code = proc.exitcode
            row["status"] = f"crash: signal {-code}" if code is not None and code < 0 else f"crash: exit {code}"
        else:
            row.update(msg[1])
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join(5)
        conn.close()
    return row


def sizes_of(family: str, max_size: int | None) -> list[int]:
    return [s for s in FAMILIES[family].sizes if max_size is None or s <= max_size]


def run_all(families: list[str], engines: list[str], max_size: int | None, vocab: str, timeout: float) -> list[dict]:
    ctx = mp.get_context("spawn")  # a fresh interpreter per case: no inherited caches or memory
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    rows = []
    for family in families:
        for engine in engines:
            given_up: str | None = None  # a timeout or crash at one size: larger ones would only repeat it
            for size in sizes_of(family, max_size):
                if given_up:
                    row = {"engine": engine, "family": family, "size": size, "status": f"skipped ({given_up})"}
                else:
                    row = run_case(ctx, engine, family, size, vocab, timeout)
                    if row["status"] == "timeout" or row["status"].startswith("crash"):
                        given_up = f"{row['status']} at {size:,}"
                rows.append(row)
                print(f"  {family:<8} {size:>9,} {engine:<11} " + (
                      f"compile {fmt_ms(row['compile_ms'])} ms, first mask {fmt_ms(row['first_mask_ms'])} ms, "
                      f"peak {fmt_mb(row['peak_mb'])} MB" if row["status"] == "ok" else row["status"]),
                      file=sys.stderr, flush=True)
    return rows


# ---------------------------------------------------------------------- report


def fmt_ms(ms: float | None) -> str:
    if ms is None:
        return "-"
    return f"{ms:.2f}" if ms < 10 else f"{ms:.1f}" if ms < 1000 else f"{ms:,.0f}"


def fmt_mb(mb: float | None) -> str:
    return "-" if mb is None else f"{mb:.1f}" if mb < 100 else f"{mb:,.0f}"


def table(rows: list[dict], families: list[str], engines: list[str]) -> str:
    """One line per (family, size): each engine's compile / first mask / peak, then the ratios."""
    by = {(r["family"], r["size"], r["engine"]): r for r in rows}
    header = ["family", "size"]
    for e in engines:
        header += [f"{e} compile ms", f"{e} first mask ms", f"{e} peak MB"]
    anchors = [a for a in ("llguidance", "xgrammar") if a in engines] if "formcast" in engines else []
    header += [f"formcast/{a} compile" for a in anchors]
    lines = []
    for family in families:
        for size in sorted({r["size"] for r in rows if r["family"] == family}):
            line: list[Any] = [family, f"{size:,}"]
            for e in engines:
                r = by.get((family, size, e), {"status": "-"})
                if r["status"] == "ok":
                    line += [fmt_ms(r["compile_ms"]), fmt_ms(r["first_mask_ms"]), fmt_mb(r["peak_mb"])]
                else:  # the status where the compile time would be
                    line += [r["status"], "-", "-"]
            fc = by.get((family, size, "formcast"), {})
            for a in anchors:
                other = by.get((family, size, a), {})
                line.append(ratio(fc.get("compile_ms", float("nan")), other.get("compile_ms", float("nan"))))
            lines.append(line)
    return markdown_table(header, lines, align_right_from=1)


def error_notes(rows: list[dict]) -> str:
    """The messages behind the table's refused / error cells (one per engine, family and message)."""
    seen: dict[tuple[str, str, str], list[int]] = {}
    for r in rows:
        if r.get("error"):
            seen.setdefault((r["engine"], r["family"], f"{r['status']}: {r['error'][:160]}"), []).append(r["size"])
    return "\n".join(f"- {e}, {f} {', '.join(f'{s:,}' for s in sizes)}: {msg}" for (e, f, msg), sizes in seen.items())


def plot(rows: list[dict], families: list[str], engines: list[str], path: Path) -> bool:
    """Log-log compile time against size, one panel per family; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display on a benchmark machine
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    cols = min(2, len(families))
    rows_n = -(-len(families) // cols)
    fig, axes = plt.subplots(rows_n, cols, figsize=(5.5 * cols, 4 * rows_n), squeeze=False)
    for ax in axes.flat[len(families):]:
        ax.set_visible(False)
    for ax, family in zip(axes.flat, families):
        for e in engines:
            ok = sorted((r["size"], r["compile_ms"]) for r in rows if r["family"] == family and r["engine"] == e
                        and r["status"] == "ok")
            if ok:
                ax.plot(*zip(*ok), marker="o", label=e)
        ax.set(xscale="log", yscale="log", title=family, xlabel=f"size ({FAMILIES[family].unit})",
               ylabel="compile ms")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


# ---------------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", default=",".join(FAMILIES), help=f"comma-separated, from {','.join(FAMILIES)}")
    ap.add_argument("--engines", default=",".join(DEFAULT_ENGINES))
    ap.add_argument("--max-size", type=int, help="leave out sizes above this")
    ap.add_argument("--quick", action="store_true", help=f"smoke run: sizes up to {QUICK_MAX_SIZE:,}")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per case for compile + first mask")
    ap.add_argument("--vocab", choices=("qwen2", "smollm2"), default="qwen2")
    ap.add_argument("--json", type=Path, help="save the raw rows here")
    ap.add_argument("--plot", type=Path, help="save a log-log plot of compile time here (needs matplotlib)")
    args = ap.parse_args(argv)
    families = [f.strip() for f in args.families.split(",") if f.strip()]
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    if bad := [f for f in families if f not in FAMILIES]:
        ap.error(f"unknown families {bad}; choose from {list(FAMILIES)}")
    if bad := [e for e in engines if e not in ENGINES]:
        ap.error(f"unknown engines {bad}; choose from {list(ENGINES)}")
    max_size = min(filter(None, (args.max_size, QUICK_MAX_SIZE if args.quick else None)), default=None)

    t0 = time.monotonic()
    rows = run_all(families, engines, max_size, args.vocab, args.timeout)
    vocab_size = next((r["vocab_size"] for r in rows if "vocab_size" in r), None)
    tokens = f"{vocab_size:,}" if vocab_size else "?"
    print(f"# compile scaling: {args.vocab} vocabulary ({tokens} tokens), timeout {args.timeout:g} s, "
          f"one fresh process per case; {machine_line()}\n")
    print(table(rows, families, engines))
    notes = error_notes(rows)
    if notes:
        print("\n" + notes)
    print(f"\nwall time {time.monotonic() - t0:.0f} s", file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps({"machine": machine_line(), "vocab": args.vocab, "vocab_size": vocab_size,
                                         "timeout_s": args.timeout, "rows": rows}, indent=1) + "\n")
    if args.plot and not plot(rows, families, engines, args.plot):
        print("--plot: matplotlib is not importable, no plot written", file=sys.stderr)


if __name__ == "__main__":
    main()
