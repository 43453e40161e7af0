"""Splitting a compiled CPU loop's independent outputs across threads without a barrier.

    run_rows(lambda n0, n1: kernel(n0, n1, ...), n_out, macs)

``fn(n0, n1)`` computes outputs [n0, n1) (output rows of a product, or independent tasks such as
(request, KV head) pairs of decode attention) and releases the GIL (a ``nogil`` numba loop). A
call of at least ``PARALLEL_MIN_MACS`` multiply-adds is cut into chunks that the calling thread
and ``threads - 1`` pool threads take from one counter; a smaller one runs on the calling thread.

Why not numba's ``prange``: a ``prange`` region ends at a barrier that waits for every pool
thread, so a thread the OS schedules late holds up the whole product. On the loaded 2-core
machine one launch measured 8-20 ms, against 0.1-0.5 ms for a decode GEMV. Here a late thread
finds the chunks taken and returns, and the caller never waits for a thread that has not started.
The price is the handoff: a pool thread woken through a futex, then the GIL, measured at about
the cost of a 576 x 576 quantized GEMV. The quantized integer products, a few dozen per decode
step, use a numba parallel region instead (``ggml_quants._in_threads``), whose threads spin
briefly between regions; on the 2-core machine with one core busy it measured no slower.

Contract the kernels rely on: a chunk covers whole outputs, and every output is computed by the
same compiled function whichever thread runs it and however the range is cut, so an output's
bits do not depend on the split, the thread count or its neighbours (batch invariance; greedy
speculation's identity). Never split a reduction here.

The thread count is numba's (``numba.get_num_threads()``, per calling thread; the ModelRunner sets
it with ``set_threads`` on the threads that run forwards).
``FORMCAST_PARALLEL_MACS`` (or the older ``FORMCAST_GGML_PARALLEL_MACS``) moves the threshold.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numba
from numba.np.ufunc import parallel as numba_parallel

# Below this many multiply-adds the calling thread does the product alone: handing a 576 x 576
# GEMV to another thread costs about what the GEMV costs.
PARALLEL_MIN_MACS = int(os.environ.get("FORMCAST_PARALLEL_MACS", os.environ.get("FORMCAST_GGML_PARALLEL_MACS", 1 << 20)))

RangeFn = Callable[[int, int], None]


class _Chunks:
    """Chunks of [0, n_out) handed out by one counter; ``done`` once every chunk has run."""

    def __init__(self, fn: RangeFn, n_out: int, chunk: int) -> None:
        self.fn, self.n_out, self.chunk = fn, n_out, chunk
        self.count = (n_out + chunk - 1) // chunk
        self.next = itertools.count()
        self.left = self.count
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.error: BaseException | None = None

    def work(self) -> None:
        while True:
            i = next(self.next)  # atomic under the GIL
            if i >= self.count:
                return
            try:
                self.fn(i * self.chunk, min(self.n_out, (i + 1) * self.chunk))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                self.error = exc
            with self.lock:
                self.left -= 1
                if self.left == 0:
                    self.done.set()


_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


_count_getter: Callable[[], int] | None = None


def threads() -> int:
    """The engine's thread count (the ModelRunner sets it; numba keeps one per calling thread).
    ``numba.get_num_threads()`` costs about 2 us from Python (it checks that the threading layer
    is up first), paid by every quantized product of a decode step, a few hundred a SmolLM2
    step; once that layer is up, its getter alone takes 0.15 us."""
    global _count_getter
    if _count_getter is None:
        count = int(numba.get_num_threads())  # starts numba's threading layer
        _count_getter = getattr(numba_parallel, "_get_num_threads", numba.get_num_threads)
        return count
    return int(_count_getter())


def set_threads(n: int) -> None:
    """Use ``n`` threads (at most numba's pool) for the calling thread's compiled loops: numba's
    count is per thread (a thread that never sets it gets every core)."""
    numba.set_num_threads(max(1, min(n, numba.config.NUMBA_NUM_THREADS)))


def _pool() -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        with _POOL_LOCK:
            if _POOL is None:
                _POOL = ThreadPoolExecutor(max_workers=max(1, (os.cpu_count() or 2) - 1), thread_name_prefix="cpu-rows")
    return _POOL


def run_rows(fn: RangeFn, n_out: int, macs: int, min_chunk: int = 16) -> None:
    """``fn(n0, n1)`` over [0, n_out), split across threads when ``macs`` multiply-adds pay for it;
    chunks hold at least ``min_chunk`` outputs (fewer for a cheap output would cost more in calls
    than they balance). An exception in any chunk is raised here after every chunk has run."""
    count = threads()
    if count <= 1 or macs < PARALLEL_MIN_MACS or n_out <= min_chunk:
        fn(0, n_out)
        return
    pieces = max(2 * count, min(16, macs // (512 * 1024)))
    job = _Chunks(fn, n_out, max(min_chunk, -(-n_out // pieces)))
    pool = _pool()
    for _ in range(min(count - 1, job.count - 1)):
        pool.submit(job.work)
    job.work()
    job.done.wait()
    if job.error is not None:
        raise job.error
