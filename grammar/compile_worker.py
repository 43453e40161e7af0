"""Compile processes: a constraint's front end and NFA construction run in a child process, so a
big compile never holds the caller's GIL (issue 25: a 120,000-string enum slowed every running
request's decode steps about 8x while it compiled in a thread).

:class:`CompilePool` is a ``front_end`` for ``api.compile_constraint``: it sends the pickled
``(Constraint, CompileBudget)`` to an idle child (``python -m grammar.compile_worker``, which
imports only this package), and gets back ``(NFA payload, steps)`` (flat int32 arrays, see
``ByteNFA.to_payload``) or the GrammarError the front end raised. The caller builds the
``CompiledGrammar`` around the arrays; masks are computed in the caller's process as before
(in numba kernels that release the GIL). A child that dies (killed, out of memory) is replaced
on the next compile and its compile is refused with that reason.
"""

from __future__ import annotations

import os
import pickle
import queue
import struct
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from .errors import GrammarBudgetError, GrammarError

_ROOT = str(Path(__file__).resolve().parent.parent)
_HEADER = struct.Struct("<Q")


def _send(stream, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)))
    stream.write(data)
    stream.flush()


def _receive(stream):
    head = stream.read(_HEADER.size)
    if len(head) < _HEADER.size:
        raise EOFError
    (n,) = _HEADER.unpack(head)
    data = stream.read(n)
    if len(data) < n:
        raise EOFError
    return pickle.loads(data)


# Priority of a compile while requests are running (the caller says so: ``CompilePool.busy``). It
# starts at SCHED_IDLE: on a machine whose cores the running requests' decode steps fill, it takes
# only the time they leave (measured on 2 cores, a 120,000-string enum while a request streamed:
# ITL p50 1.25x / p90 1.58x quiet at the caller's priority, 0.98x / 1.10x idle first; the compile
# 1.5 s -> 4.9 s). After IDLE_SECONDS it is back at the caller's priority, so a machine that is
# never idle delays it, never starves it. With nothing running, a compile keeps the caller's
# priority: it is then what the machine waits for. Verdicts count work, not time (``budget``), so
# neither changes one; only the wall-clock backstop sees a slower compile.
IDLE_SECONDS = 5.0


def _can_leave_idle() -> bool:
    """Whether this process may move a child out of SCHED_IDLE again (Linux lets root do it, or a
    process whose RLIMIT_NICE admits niceness 0); without that, SCHED_IDLE would be for good, so
    it is not used."""
    try:
        import resource

        return hasattr(os, "SCHED_IDLE") and (os.geteuid() == 0 or resource.getrlimit(resource.RLIMIT_NICE)[0] >= 20)
    except (AttributeError, ImportError, OSError, ValueError):
        return False


def _set_idle(pid: int, idle: bool) -> None:
    try:
        os.sched_setscheduler(pid, os.SCHED_IDLE if idle else os.SCHED_OTHER, os.sched_param(0))
    except (AttributeError, OSError):  # not on this platform: the child keeps its priority
        pass


class _Child:
    def __init__(self) -> None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (_ROOT, os.environ.get("PYTHONPATH", "")) if p))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "grammar.compile_worker"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            env=env, cwd=_ROOT,
        )

    def run(self, constraint, budget, idle_first: bool = False):
        back = None
        if idle_first and _can_leave_idle():
            _set_idle(self.proc.pid, True)
            back = threading.Timer(IDLE_SECONDS, _set_idle, (self.proc.pid, False))
            back.daemon = True
            back.start()
        try:
            _send(self.proc.stdin, (constraint, budget))
            ok, value = _receive(self.proc.stdout)
        finally:
            if back is not None:
                back.cancel()
                _set_idle(self.proc.pid, False)
        if ok:
            return value
        raise value

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=5)
            except Exception:  # noqa: BLE001 - a stuck child is killed
                self.proc.kill()


class CompilePool:
    """``size`` child processes, started on first use; one compile at a time each. ``busy``: says
    whether requests are running (a compile then waits for idle CPU first, see IDLE_SECONDS)."""

    def __init__(self, size: int = 1, busy: Callable[[], bool] | None = None) -> None:
        self.size = max(1, size)
        self.busy = busy
        self._idle: queue.SimpleQueue = queue.SimpleQueue()
        for _ in range(self.size):
            self._idle.put(None)  # a slot without a child yet
        self._closed = False
        self._lock = threading.Lock()
        self._children: set[_Child] = set()

    def __call__(self, constraint, budget):
        child = self._idle.get()
        try:
            if child is None or child.proc.poll() is not None:
                child = _Child()
                with self._lock:
                    self._children.add(child)
            try:
                return child.run(constraint, budget, idle_first=self.busy is not None and self.busy())
            except (EOFError, BrokenPipeError, OSError):
                code = child.proc.wait()
                with self._lock:
                    self._children.discard(child)
                child = None
                raise GrammarBudgetError(f"the compile process ended while compiling (exit status {code}: out of memory?)") from None
        finally:
            self._idle.put(child)

    def close(self) -> None:
        with self._lock:
            children, self._children = list(self._children), set()
        for child in children:
            child.close()


def _serve() -> None:
    from .api import front_end_payload

    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing else may write into the reply stream
    while True:
        try:
            constraint, budget = _receive(stdin)
        except EOFError:
            return
        try:
            reply = (True, front_end_payload(constraint, budget))
        except BaseException as exc:  # noqa: BLE001 - every failure goes back to the caller
            reply = (False, exc)
        try:
            _send(stdout, reply)
        except (pickle.PicklingError, TypeError, AttributeError):
            _send(stdout, (False, GrammarError(str(reply[1]))))


if __name__ == "__main__":
    _serve()
