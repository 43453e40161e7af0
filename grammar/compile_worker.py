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


class _Child:
    def __init__(self) -> None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (_ROOT, os.environ.get("PYTHONPATH", "")) if p))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "grammar.compile_worker"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            env=env, cwd=_ROOT,
        )

    def run(self, constraint, budget):
        _send(self.proc.stdin, (constraint, budget))
        ok, value = _receive(self.proc.stdout)
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
    """``size`` child processes, started on first use; one compile at a time each."""

    def __init__(self, size: int = 1) -> None:
        self.size = max(1, size)
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
                return child.run(constraint, budget)
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
