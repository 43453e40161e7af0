"""Compiled grammars on disk, so a restarted process answers known constraints without compiling.

An entry is the compiled NFA of one constraint (``ByteNFA.to_payload``: flat int32 arrays in
one ``.npz`` file); masks and determinized states are rebuilt lazily as before. The file name is
a hash of the :class:`~grammar.constraint.Constraint`, the vocabulary fingerprint (the NFA
does not depend on it, the cached grammar's users do), the budget's verdict limits and the code
that compiled it (formcast's version and a hash of this package's sources), so an upgrade or a
local edit never reads a stale entry.

Safe under concurrent writers: an entry is written to a temporary file in the same directory and
renamed into place (atomic on POSIX), so a reader sees a whole entry or none. A file that does
not load (truncated, corrupt, another format) is deleted and compiled again. The directory is
bounded in bytes: after a write the oldest entries (by modification time, which a hit renews)
are deleted until the total fits. Grammars with a vocabulary-aware check (``uniqueItems``) are
not stored (the check is a Python object).
"""

from __future__ import annotations

import hashlib
import io
import os
import tempfile
import threading
from pathlib import Path

import numpy as np

from .fsm import ByteNFA

DEFAULT_MAX_BYTES = 512 << 20
_SUFFIX = ".npz"


def _code_version() -> str:
    try:
        from importlib.metadata import version

        release = version("formcast")
    except Exception:  # noqa: BLE001 - not installed (a checkout): the sources decide alone
        release = "0"
    digest = hashlib.sha256(release.encode())
    for path in sorted(Path(__file__).resolve().parent.rglob("*.py")):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


_CODE_VERSION: str | None = None


def code_version() -> str:
    """formcast's version and a hash of the grammar package's sources (computed once)."""
    global _CODE_VERSION
    if _CODE_VERSION is None:
        _CODE_VERSION = _code_version()
    return _CODE_VERSION


def default_directory() -> Path:
    """``$FORMCAST_CACHE/grammars`` or ``~/.cache/formcast/grammars`` (beside the vocabularies)."""
    root = os.environ.get("FORMCAST_CACHE")
    return (Path(root) if root else Path.home() / ".cache" / "formcast") / "grammars"


class DiskCache:
    """A bounded directory of compiled NFAs (see the module docstring)."""

    def __init__(self, directory: str | os.PathLike, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self.stats = {"hits": 0, "misses": 0, "writes": 0, "corrupt": 0, "evicted": 0}

    def key(self, constraint, fingerprint: str, budget) -> str:
        text = repr((constraint.digest, fingerprint, repr(budget.verdict_key()), code_version()))
        return hashlib.sha256(text.encode()).hexdigest()

    def _path(self, key: str) -> Path:
        return self.directory / f"{key}{_SUFFIX}"

    def load(self, key: str) -> ByteNFA | None:
        path = self._path(key)
        try:
            with np.load(path, allow_pickle=False) as data:
                nfa = ByteNFA.from_payload({name: data[name] for name in data.files})
        except FileNotFoundError:
            self.stats["misses"] += 1
            return None
        except Exception:  # noqa: BLE001 - any damage: forget the entry, compile again
            self.stats["corrupt"] += 1
            try:
                path.unlink()
            except OSError:
                pass
            return None
        try:
            os.utime(path)  # recently used: evicted last
        except OSError:
            pass
        self.stats["hits"] += 1
        return nfa

    def store(self, key: str, nfa: ByteNFA) -> bool:
        """Write the entry atomically; False when the directory cannot be written."""
        buf = io.BytesIO()
        np.savez(buf, **nfa.to_payload())
        data = buf.getvalue()
        if len(data) > self.max_bytes:
            return False
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=_SUFFIX, dir=self.directory)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                os.replace(tmp, self._path(key))
            except BaseException:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
                raise
        except OSError:
            return False
        self.stats["writes"] += 1
        self._evict()
        return True

    def _evict(self) -> None:
        with self._lock:
            entries = []
            for path in self.directory.glob(f"*{_SUFFIX}"):
                if path.name.startswith(".tmp-"):
                    continue
                try:
                    st = path.stat()
                except OSError:
                    continue  # another process evicted it
                entries.append((st.st_mtime, st.st_size, path))
            total = sum(size for _, size, _ in entries)
            for _, size, path in sorted(entries):
                if total <= self.max_bytes:
                    break
                try:
                    path.unlink()
                    self.stats["evicted"] += 1
                except OSError:
                    pass
                total -= size

    def clear(self) -> None:
        for path in self.directory.glob(f"*{_SUFFIX}"):
            try:
                path.unlink()
            except OSError:
                pass


_ACTIVE: DiskCache | None = None


def configure(directory: str | os.PathLike | None, max_bytes: int = DEFAULT_MAX_BYTES) -> DiskCache | None:
    """Use ``directory`` for every compile of this process (None: no disk cache, the default)."""
    global _ACTIVE
    _ACTIVE = None if directory is None else DiskCache(directory, max_bytes)
    return _ACTIVE


def active() -> DiskCache | None:
    return _ACTIVE
