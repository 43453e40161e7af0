"""The grammar's numba kernels compiled ahead of first use, in child processes.

On a fresh install numba's cache is empty and the first compile of any constraint would wait
about a minute while every kernel compiles (issue 25). :func:`start` spawns two child processes,
each running a lane of kernel groups (``LANES``: the determinizer's core then the mask
routes; the compile-time string-set products then the deep-configuration kernels), so both cores
compile while the caller does something else (the engine loads its model); each child writes
what it compiled to numba's on-disk cache, and the caller's own first use
(``token_masks.vocabulary_masks``, run before the engine reports ready) only loads it.

A marker file in the cache directory, named by a hash of the kernel modules' sources and the
numba and Python versions, records that the cache is warm, so a warm start spawns nothing; each
child also marks its own lane when done (all lanes marked is warm too), so children that outlive
their caller (an engine that answered from ``kernel_tier``'s Python twins and exited) still leave
a warm cache. They inherit the warm-up lock and hold it until they exit. A
lock file beside it makes concurrent processes on one cold cache (test workers, server replicas)
compile once: the first spawns the children, the others wait for its marker. Nothing here
changes a result: a child that fails or is never started only means the caller compiles on
first use, as before.

``python -m grammar.jit_warmup`` fills the cache and exits (``make test`` runs it before pytest,
so the test workers only load).
"""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator


_HERE = Path(__file__).resolve().parent
# Modules holding numba kernels (a change to any of them invalidates the marker).
# The kernel groups of ``jit_tasks``, one lane per child process, balanced by compile time.
LANES = (("core", "masks"), ("strings", "tails"))
KERNEL_MODULES = ("char_dfa.py", "char_dfa_kernels.py", "determinizer.py", "regions.py", "token_walk.py", "token_masks.py", "automaton.py", "token_trie.py")


# LLVM optimisation level of the children's compiles (numba's default is 3). Measured (issue 25,
# BENCHMARKS.md): level 1 compiles the grammar kernels in 12% less CPU and their masks and
# compiles run as fast, bit for bit the same. Only our children get it: the caller's process
# keeps its own numba settings. A NUMBA_OPT the user set is left alone.
CHILD_ENV = {"NUMBA_OPT": "1"}


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


def _lane_marker(marker: Path, lane: tuple[str, ...] | list[str]) -> Path:
    return marker.with_name(f"{marker.name}-{'-'.join(lane)}")


def mark_lane_done(lane: list[str]) -> None:
    """Called by a child once its lane's kernels are in the cache."""
    marker = _marker()
    if marker is not None:
        try:
            _lane_marker(marker, lane).touch()
        except OSError:
            pass


def is_warm() -> bool:
    marker = _marker()
    return marker is not None and (marker.exists() or all(_lane_marker(marker, lane).exists() for lane in LANES))


def _take_lock(blocking: bool):
    """The cache's warm-up lock (an open file holding an exclusive ``flock``), or None when it
    is held elsewhere (``blocking=False``) or cannot be had here (no fcntl, no writable cache:
    then nobody waits, as before)."""
    marker = _marker()
    try:
        import fcntl

        if marker is None:
            raise OSError("no cache directory")
        marker.parent.mkdir(parents=True, exist_ok=True)
        handle = open(marker.parent / "formcast-warm.lock", "a+b")  # noqa: SIM115 - held past this call
    except (ImportError, OSError):
        return io.BytesIO()  # a stand-in with close(): no lock
    try:
        fcntl.flock(handle, fcntl.LOCK_EX if blocking else fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        return None
    return handle


@dataclass
class Warmup:
    """Children compiling kernel groups; :meth:`wait` joins them (printing progress)."""

    procs: list[subprocess.Popen] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    lock: object = None  # the warm-up lock while our children compile
    elsewhere: bool = False  # another process held the lock: wait for its marker

    def wait(self, progress: Callable[[str], None] | None = None) -> bool:
        """Join the children; True when every group compiled (the marker is then written)."""
        if self.elsewhere:
            if progress is not None:
                progress("formcast: another process is compiling the grammar kernels; waiting for it...")
            handle = _take_lock(blocking=True)
            if handle is not None:
                handle.close()
            if is_warm():
                return True
            return _spawn().wait(progress)  # it failed or was stopped: compile here
        try:
            return self._join(progress)
        finally:
            if self.lock is not None:
                self.lock.close()  # releases the flock
                self.lock = None

    def _join(self, progress: Callable[[str], None] | None) -> bool:
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


# Niceness of the children when the caller serves requests meanwhile (the engine's Python tier,
# ``kernel_tier``): its requests get the cores first, the compiles take what is left.
BACKGROUND_NICE = 10


def start(background: bool = False) -> Warmup:
    """Spawn one child per lane unless the cache is already warm (then nothing is spawned);
    ``background``: the children run niced (``BACKGROUND_NICE``), for a caller that works
    meanwhile. Either way they hold the warm-up lock and mark their lanes done themselves, so
    they finish the cache even if the caller exits first."""
    global _tried
    _tried = True  # this process has taken care of it: ensure_warm need not spawn again
    if is_warm() or os.environ.get("FORMCAST_NO_JIT_WARMUP"):
        return Warmup()
    return _spawn(BACKGROUND_NICE if background else 0)


def _spawn(nice: int = 0) -> Warmup:
    lock = _take_lock(blocking=False)
    if lock is None:
        return Warmup(elsewhere=True)
    if is_warm():  # the holder finished between our check and the lock
        lock.close()
        return Warmup()
    root = str(_HERE.parent)
    env = dict(CHILD_ENV, **os.environ)
    env.update(PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p), FORMCAST_NO_JIT_WARMUP="1")
    held = (lock.fileno(),) if hasattr(lock, "fileno") and not isinstance(lock, io.BytesIO) else ()
    procs = [
        subprocess.Popen([sys.executable, "-m", "grammar.jit_tasks", *lane], env=env, cwd=root,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, pass_fds=held)
        for lane in LANES
    ]
    for proc in procs if nice else ():
        try:
            os.setpriority(os.PRIO_PROCESS, proc.pid, nice)
        except (AttributeError, OSError):  # not on this platform: the children keep our priority
            pass
    return Warmup(procs, lock=lock)


def warm_up_now(progress: Callable[[str], None] | None = None) -> bool:
    """Compile every group in parallel children and wait (CI images, ``Engine`` while loading)."""
    return start().wait(progress)


def _kernels() -> Iterator[tuple[str, Any]]:
    """(``module.function``, numba dispatcher) of every cached kernel in :data:`KERNEL_MODULES`."""
    import importlib

    from numba.core.registry import CPUDispatcher

    for name in KERNEL_MODULES:
        module = importlib.import_module(f"{__package__}.{name.removesuffix('.py')}")
        for attr, value in vars(module).items():
            if isinstance(value, CPUDispatcher) and value.__module__ == module.__name__ and value._cache is not None:
                yield f"{name.removesuffix('.py')}.{attr}", value


def load_cached_kernels() -> int:
    """Load into this process every kernel build that numba's cache holds for these sources and
    this CPU, and return how many it loaded. A kernel is loaded on its first call otherwise, and a
    load links its machine code: 2 to 20 ms apiece. Measured on MaskBench, one mask a run paid
    three of them (row shapes, region tables and whole rows are first needed deep into some
    schema) and took 20 ms. Each vocabulary's setup calls this, so no request pays a load. Only
    entries keyed for this CPU and this source are loaded, so nothing compiles here."""
    loaded = 0
    try:
        for _name, kernel in _kernels():
            if not getattr(kernel, "_can_compile", True):  # declared with signatures: loaded at import
                continue
            cache, codegen = kernel._cache, kernel.targetctx.codegen()
            for key in cache._cache_file._load_index():
                signature = key[0]
                if signature in kernel.overloads or key != cache._index_key(signature, codegen):
                    continue  # loaded already, or built for another CPU (a shared cache folder)
                kernel.compile(signature)
                loaded += 1
    except (AttributeError, TypeError):  # numba internals moved: kernels load on first use, as before
        pass
    return loaded


def compiled_signatures() -> dict[str, list[str]]:
    """What numba's cache holds for each kernel of :data:`KERNEL_MODULES`, for the current
    sources: ``{"module.function": [signature, ...]}``, whichever process compiled them. Each
    kernel should compile once (issue 25): another argument type (an int32 where an int64 was
    passed before, a literal constant, another array layout) is a whole compile more."""
    out: dict[str, list[str]] = {}
    for name, kernel in _kernels():
        index = kernel._cache._cache_file._load_index()  # {} for another source stamp
        out[name] = [str(key[0]) for key in index]
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


if __name__ == "__main__":
    sys.exit(0 if warm_up_now(progress=lambda line: print(line, file=sys.stderr, flush=True)) else 1)
