"""The output file: results appended and flushed one line at a time, and what a rerun skips.

Nothing lost: each result is one ``write`` of one whole line to a file opened for appending,
flushed at once (the operating system has it even if the process is killed right after) and
``fsync``-ed at least every ``FSYNC_SECONDS`` and on close (a machine crash loses at most that).

Nothing twice: a rerun first reads the ids already in the file and skips those records. A kill
can leave the last line torn (no newline at its end): if it still parses, it is completed with a
newline; if not, it is cut off and its record runs again. Only the last line can be torn, so any
other line that does not parse means the file is not a formcast output, and the job stops rather
than guess.

``drop_failures`` (``--retry-failed``) rewrites the file without its failed lines, through a
temporary file and an atomic rename, so their records run again and still appear once.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from .records import id_key
from .results import ExtractResult

FSYNC_SECONDS = 1.0


class OutputError(ValueError):
    """The output file cannot be resumed (a line in the middle that is not a result)."""


@dataclass
class ExistingOutput:
    """What a previous run left in the output file."""

    done: set[str] = field(default_factory=set)  # id_key of every record written
    lines: int = 0
    failed: int = 0
    repaired: str | None = None  # what was done to a torn last line, if anything


def read_existing(path: str | Path) -> ExistingOutput:
    """The ids already in ``path`` (which may not exist), after repairing a torn last line."""
    existing = ExistingOutput()
    path = Path(path)
    if not path.exists():
        return existing
    end = 0  # byte offset just past the last good line
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            result = _parse(raw)
            torn = not raw.endswith(b"\n")  # only the last line can lack its newline
            if result is None and not torn:
                raise OutputError(f"{path}:{number}: not a result line of formcast extract; fix or remove it")
            if torn:
                existing.repaired = _repair(path, end, raw, complete=result is not None)
            if result is not None:
                existing.done.add(id_key(result.id))
                existing.lines += 1
                existing.failed += not result.ok
                end += len(raw)
            if torn:
                break
    return existing


def _parse(raw: bytes) -> ExtractResult | None:
    try:
        data = json.loads(raw.decode("utf-8"))
        return ExtractResult.from_json(data)
    except (UnicodeDecodeError, ValueError, KeyError, TypeError):
        return None


def _repair(path: Path, end: int, raw: bytes, complete: bool) -> str:
    with open(path, "r+b") as f:
        if complete:  # killed between the line and its newline
            f.seek(0, os.SEEK_END)
            f.write(b"\n")
            return "completed the last line (its newline was missing)"
        f.truncate(end)
    return f"dropped a torn last line ({len(raw)} bytes) left by an interrupted run; its record runs again"


def drop_failures(path: str | Path) -> int:
    """Rewrite ``path`` without its failed lines (atomically); returns how many were dropped."""
    path = Path(path)
    read_existing(path)  # repairs a torn last line first
    dropped = 0
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as out, open(path, "rb") as f:
            for raw in f:
                result = _parse(raw)
                if result is not None and not result.ok:
                    dropped += 1
                    continue
                out.write(raw)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return dropped


class ResultWriter:
    """Appends results to the output file, one flushed line each."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._file = open(self.path, "ab")
        self._last_sync = time.monotonic()

    def write(self, result: ExtractResult) -> None:
        self._file.write(result.to_line())
        self._file.flush()
        if time.monotonic() - self._last_sync >= FSYNC_SECONDS:
            os.fsync(self._file.fileno())
            self._last_sync = time.monotonic()

    def close(self) -> None:
        if self._file.closed:
            return
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()

    def __enter__(self) -> ResultWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
