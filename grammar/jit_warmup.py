"""The grammar's numba kernels compiled ahead of first use, in child processes.

On a fresh install numba's cache is empty and the first compile of any constraint would wait
about a minute while every kernel compiles (issue 25). :func:`start` spawns one child process
per kernel group (the compile-time string-set products; the mask-time determinizer and trie
walk), so both cores compile while the caller does something else (the engine loads its model);
each child writes what it compiled to numba's on-disk cache, and the caller's own first use
(``token_masks.vocabulary_masks``, run before the engine reports ready) only loads it.

A marker file in the cache directory, named by a hash of the kernel modules' sources and the
numba and Python versions, records that the cache is warm, so a warm start spawns nothing.
Nothing here changes a result: a child that fails or is never started only means the caller
compiles on first use, as before.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

_HERE = Path(__file__).resolve().parent
# Modules holding numba kernels (a change to any of them invalidates the marker).
KERNEL_MODULES = ("char_dfa.py", "char_dfa_kernels.py", "determinizer.py", "regions.py", "token_walk.py", "token_masks.py", "automaton.py")
GROUPS = ("strings", "masks")


def _marker() -> Path | None:
    """The marker file proving a warm cache (None when numba's cache location is unknown)."""
    try:
        import numba

        from . import char_dfa_kernels

        cache_dir = Path(char_dfa_kernels.product_kernel._cache._cache_path)
    except Exception:  # noqa: BLE001 - numba internals moved: warm up every time (harmless)
        return None
    digest = hashlib.sha256(f"{numba.__version__} {sys.version} {sys.executable}".encode())
    for name in KERNEL_MODULES:
        digest.update((_HERE / name).read_bytes())
    return cache_dir / f"formcast-warm-{digest.hexdigest()[:16]}"


def is_warm() -> bool:
    marker = _marker()
    return marker is not None and marker.exists()


@dataclass
class Warmup:
    """Children compiling kernel groups; :meth:`wait` joins them (printing progress)."""

    procs: list[subprocess.Popen] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)

    def wait(self, progress: Callable[[str], None] | None = None) -> bool:
        """Join the children; True when every group compiled (the marker is then written)."""
        ok = True
        for proc in self.procs:
            if proc.poll() is None and progress is not None:
                progress(f"formcast: compiling grammar kernels (first start after install), {time.monotonic() - self.started:.0f} s so far...")
            ok = proc.wait() == 0 and ok
        if self.procs and ok:
            marker = _marker()
            if marker is not None:
                try:
                    marker.touch()
                except OSError:
                    pass
        if progress is not None and self.procs:
            progress(f"formcast: grammar kernels {'compiled' if ok else 'partly compiled'} in {time.monotonic() - self.started:.0f} s")
        return ok


def start(groups: tuple[str, ...] = GROUPS) -> Warmup:
    """Spawn one child per group unless the cache is already warm (then nothing is spawned)."""
    global _tried
    _tried = True  # this process has taken care of it: ensure_warm need not spawn again
    if is_warm() or os.environ.get("FORMCAST_NO_JIT_WARMUP"):
        return Warmup()
    root = str(_HERE.parent)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p),
               FORMCAST_NO_JIT_WARMUP="1")
    procs = [
        subprocess.Popen([sys.executable, "-m", "grammar.jit_tasks", group], env=env, cwd=root,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for group in groups
    ]
    return Warmup(procs)


def warm_up_now(progress: Callable[[str], None] | None = None) -> bool:
    """Compile every group in parallel children and wait (CI images, ``Engine`` while loading)."""
    return start().wait(progress)


def compiled_signatures() -> dict[str, list[str]]:
    """What numba's cache holds for each kernel of :data:`KERNEL_MODULES`, for the current
    sources: ``{"module.function": [signature, ...]}``, whichever process compiled them. Each
    kernel should compile once (issue 25): another argument type (an int32 where an int64 was
    passed before, a literal constant, another array layout) is a whole compile more."""
    import importlib

    from numba.core.registry import CPUDispatcher

    out: dict[str, list[str]] = {}
    for name in KERNEL_MODULES:
        module = importlib.import_module(f"{__package__}.{name.removesuffix('.py')}")
        for attr, value in vars(module).items():
            if isinstance(value, CPUDispatcher) and value.__module__ == module.__name__ and value._cache is not None:
                index = value._cache._cache_file._load_index()  # {} for another source stamp
                out[f"{name.removesuffix('.py')}.{attr}"] = [str(key[0]) for key in index]
    return out


_tried = False


def ensure_warm() -> None:
    """Once per process: on a cold cache, compile in parallel children before first use (with a
    progress line on stderr); on a warm one, nothing."""
    global _tried
    if _tried:
        return
    _tried = True
    if not is_warm():
        warm_up_now(progress=lambda line: print(line, file=sys.stderr, flush=True))
