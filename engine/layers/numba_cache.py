"""numba's on-disk cache, keyed also on the LLVM IR that a compiled loop inlines from other modules.

numba keys a cached function on the bytes of its own source file. The block products' loops
(``ggml_quants``) call intrinsics whose LLVM IR other modules write (``octet_dot``, ``int_dot``):
an edit to those alone (a checkout that changes only them) would load the old machine code from
the cache, and the products would compute what the old IR said. ``register()`` puts locators at
the front of numba's list that, for the files in ``INLINED``, key on the file's bytes together
with the bytes of the modules it inlines; numba's own locators handle every other file.

It must run before the caller's ``@njit(cache=True)`` decorators do (numba picks a function's
locator when it enables the cache): ``ggml_quants`` calls it first thing.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

from numba.core import caching

_HERE = Path(__file__).resolve().parent

# caller file -> the modules whose LLVM IR its compiled functions inline
INLINED: dict[Path, tuple[Path, ...]] = {
    _HERE / "ggml_quants.py": (_HERE / "octet_dot.py", _HERE / "int_dot.py"),
    _HERE / "row_ops.py": (_HERE / "vector_exp.py",),
    _HERE / "cpu_decode_attention.py": (_HERE / "vector_exp.py",),
}


@functools.lru_cache(maxsize=None)
def _hash(paths: tuple[Path, ...], stamps: tuple[tuple[float, int], ...]) -> bytes:
    """sha256 over the files' bytes, in order (``stamps``: their mtimes and sizes, the memo key)."""
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.read_bytes())
    return digest.digest()


def source_stamp(caller: Path) -> bytes:
    """The cache key of ``caller``'s compiled functions: its bytes and its inlined modules'."""
    paths = (caller, *INLINED[caller])
    return _hash(paths, tuple((p.stat().st_mtime, p.stat().st_size) for p in paths))


def _keyed_on_inlined(base: type) -> type:
    class Locator(base):  # type: ignore[misc, valid-type]
        formcast_inlined = True

        @classmethod
        def from_function(cls, py_func, py_file):  # type: ignore[no-untyped-def]
            if Path(py_file).resolve() not in INLINED:
                return None
            return super().from_function(py_func, py_file)

        def get_source_stamp(self) -> bytes:
            return source_stamp(Path(self._py_file).resolve())

    Locator.__name__ = Locator.__qualname__ = f"Inlined{base.__name__}"
    return Locator


def register() -> None:
    """Idempotent. numba versions without the locator list keep their own keys (nothing to do)."""
    classes = getattr(getattr(caching, "CacheImpl", None), "_locator_classes", None)
    if classes is None or any(getattr(c, "formcast_inlined", False) for c in classes):
        return
    bases = [c for c in (getattr(caching, n, None) for n in ("UserProvidedCacheLocator", "InTreeCacheLocator", "UserWideCacheLocator")) if c is not None]
    classes[:0] = [_keyed_on_inlined(base) for base in bases]
