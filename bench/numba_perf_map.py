"""Run a script with the grammar kernels named in ``perf``'s reports.

numba's machine code lives in anonymous memory, so ``perf report`` shows the grammar kernels as
bare addresses. This wrapper compiles every kernel in the process (``cache=False``: a kernel
loaded from numba's cache keeps no LLVM module to read symbols from), runs the script, and at
exit writes ``/tmp/perf-<pid>.map``, the file ``perf`` reads for code generated at run time: one
line per function of each loaded kernel's module (the kernel, the functions it links in, and
numba's runtime helpers such as ``NRT_incref``), sized up to the next symbol.

    perf record -k 1 -F 999 -o /tmp/perf.data -- .venv/bin/python bench/numba_perf_map.py \\
        bench/determinize_bench.py --compiled-loop --sample 300 --repeat 5
    perf report -i /tmp/perf.data --no-children --sort sym --stdio

The kernels compile at numba's default optimisation level in this process (the cache the
warm-up children fill is built at level 1), and compiling them takes a minute or two before the
script's own work: read the report for the script's phase, not for the whole run. Call stacks
stop at JIT frames (they carry no unwind tables), so a helper's callers are not attributed.
"""

from __future__ import annotations

import atexit
import os
import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _kernels_uncached() -> None:
    """Make every later ``numba.njit(...)`` compile in this process, keeping its LLVM module."""
    import numba

    original = numba.njit

    def njit(*args, **kwargs):
        kwargs["cache"] = False
        return original(*args, **kwargs)

    numba.njit = njit


def _demangle(name: str) -> str:
    """``_ZN7grammar12determinizer5_stepB...`` -> ``grammar.determinizer._step``."""
    if not name.startswith("_ZN"):
        return name
    rest, parts = name[3:], []
    while rest[:1].isdigit():
        digits = len(rest) - len(rest.lstrip("0123456789"))
        length = int(rest[:digits])
        parts.append(rest[digits:digits + length])
        rest = rest[digits + length:]
    return ".".join(parts) or name


def write_map(path: Path | None = None) -> int:
    """Write the perf map of every compiled kernel in this process; returns its symbol count."""
    from numba.core.registry import CPUDispatcher

    addresses: dict[int, str] = {}
    libraries = set()
    for module in list(sys.modules.values()):
        for value in list(vars(module).values()) if module is not None else ():
            if not isinstance(value, CPUDispatcher):
                continue
            for result in value.overloads.values():
                library = result.library
                if id(library) in libraries or getattr(library, "_final_module", None) is None:
                    continue
                libraries.add(id(library))
                for function in library._final_module.functions:
                    if function.is_declaration:
                        continue
                    try:
                        address = library.get_pointer_to_function(function.name)
                    except Exception:  # noqa: BLE001 - a symbol the engine did not keep
                        continue
                    if address:
                        addresses[address] = _demangle(function.name)
    ordered = sorted(addresses)
    path = path or Path(f"/tmp/perf-{os.getpid()}.map")
    with open(path, "w") as out:
        for i, address in enumerate(ordered):
            size = min(ordered[i + 1] - address, 1 << 20) if i + 1 < len(ordered) else 4096
            out.write(f"{address:x} {size:x} {addresses[address]}\n")
    return len(ordered)


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path.insert(0, str(Path(script).resolve().parent))
    _kernels_uncached()
    atexit.register(lambda: print(f"perf map: {write_map()} symbols for pid {os.getpid()}", file=sys.stderr))
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
