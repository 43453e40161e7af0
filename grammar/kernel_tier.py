"""Which build of the grammar's numba kernels runs: the compiled one (numba's on-disk cache) or,
for the seconds after a fresh install while ``jit_warmup``'s children compile them, the same
source run as plain Python (issue 25: a first constrained result in seconds, and no request that
waits for a JIT compile).

The Python build is each kernel module's own source executed a second time, with numba's
decorators made no-ops (``njit`` returns the function, the determinizer's structref ``Core`` is a
plain class with the same fields, ``numba.typed.Dict`` a dict), so it computes what the compiled
kernels compute, only slower; the trie walk, which as plain Python would visit one node per
interpreter loop, is ``token_walk.walk_levels`` (numpy, one trie level at a time). Same masks,
same verdicts, same compile steps: ``tests/test_kernel_tier.py`` compares them.

Where the two meet:

* kernels over arrays alone choose per call: ``pick(kernel)`` is the compiled dispatcher once the
  process runs compiled kernels (or at once for a kernel declared with its signatures, which
  numba compiles when its module is imported), else its Python twin;
* the determinizer's ``Core`` belongs to the build that made it (compiled code cannot read a plain
  class): a ``LazyAutomaton`` keeps the determinizer it was created with, and a walk over a core
  picks by the core (``pick_for(core, kernel)``). A grammar built in the Python tier keeps running
  as Python until it is freed; no cache keeps it past the switch (``CompiledGrammar.runs_python``),
  so later requests compile it again on the compiled kernels.

A process is in the Python tier only between :func:`use_python` and the switch of
:func:`switch_when` (the ``Engine`` on a cold cache); tests, library calls and warm starts never leave
the compiled build.
"""

from __future__ import annotations

import builtins
import importlib
import logging
import threading
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

# The modules holding njit kernels, in import order (a module's Python twin imports the twins of
# the kernel modules it imports).
KERNEL_MODULES = ("determinizer", "token_trie", "char_dfa_kernels", "token_walk", "regions")
_PACKAGE = __package__  # "grammar"
_HERE = Path(__file__).resolve().parent

_compiled = True  # the process runs the compiled kernels (the default, and after a switch)
_local = threading.local()  # .compiled: this thread runs compiled kernels whatever _compiled says
_twins: dict[str, types.ModuleType] = {}
_twins_lock = threading.RLock()


def compiled() -> bool:
    """True when new work on this thread runs on the compiled kernels."""
    return _compiled or getattr(_local, "compiled", False)


# ------------------------------------------------------------------ numba as no-ops


def _njit(*args: Any, **kwargs: Any) -> Any:
    if len(args) == 1 and callable(args[0]) and not kwargs:
        return args[0]  # @njit
    return lambda fn: fn  # @njit(...) / @njit("signature", ...)


class _StructRefProxy:
    pass


def _define_proxy(cls: type, _type: Any, fields: list[str]) -> None:
    def __init__(self, *values: Any) -> None:  # the structref's positional constructor
        for name, value in zip(fields, values):
            setattr(self, name, value)

    cls.__init__ = __init__


class _TypedDict:
    @staticmethod
    def empty(**_kinds: Any) -> dict:
        return {}


_NUMBA = types.SimpleNamespace(
    njit=_njit,
    types=types.SimpleNamespace(StructRef=object, unliteral=lambda t: t, int64=np.int64, int32=np.int32),
)
_STRUCTREF = types.SimpleNamespace(register=lambda cls: cls, StructRefProxy=_StructRefProxy, define_proxy=_define_proxy)
_NUMBA_MODULES = {
    "numba": _NUMBA,
    "numba.experimental": types.SimpleNamespace(structref=_STRUCTREF),
    "numba.experimental.structref": _STRUCTREF,
    "numba.typed": types.SimpleNamespace(Dict=_TypedDict),
}


class _PackageView:
    """What ``from . import X`` / ``from .X import Y`` see inside a twin: the twins of the kernel
    modules, and every compiled kernel another module re-exports (``automaton.expand_cell``)
    replaced by its twin; anything else is the real object."""

    def __init__(self, real: types.ModuleType) -> None:
        self._real = real

    def __getattr__(self, name: str) -> Any:
        if name in KERNEL_MODULES and self._real.__name__ == _PACKAGE:
            return twin(name)
        value = getattr(self._real, name)
        if _is_kernel(value):
            return python_function(value)
        return value


def _import(name: str, globals: dict | None = None, locals: dict | None = None, fromlist: tuple = (), level: int = 0) -> Any:
    if level == 0 and (name == "numba" or name.startswith("numba.")):
        if not fromlist:
            return _NUMBA
        return _NUMBA_MODULES[name]
    if level == 1:
        if name in KERNEL_MODULES:
            return twin(name)
        real = builtins.__import__(name, globals, locals, fromlist, level)
        return _PackageView(real) if fromlist else real
    return builtins.__import__(name, globals, locals, fromlist, level)


_BUILTINS = dict(vars(builtins), __import__=_import)


def _is_kernel(value: Any) -> bool:
    return callable(value) and hasattr(value, "py_func") and getattr(value.py_func, "__module__", "").startswith(f"{_PACKAGE}.")


def twin(name: str) -> types.ModuleType:
    """The Python build of kernel module ``name`` (built on first use, then kept)."""
    with _twins_lock:
        module = _twins.get(name)
        if module is not None:
            return module
        path = _HERE / f"{name}.py"
        module = types.ModuleType(f"{_PACKAGE}.{name}", f"{name} run as Python (kernel_tier)")
        module.__dict__.update(__builtins__=_BUILTINS, __package__=_PACKAGE, __file__=str(path))
        _twins[name] = module  # before running it: twins may import each other
        try:
            exec(compile(path.read_text(), str(path), "exec"), module.__dict__)  # noqa: S102 - our own source
        except BaseException:
            del _twins[name]
            raise
        if name == "token_walk":  # the walk one level at a time instead of one node per loop
            module._walk_kernel = module.walk_levels_kernel
        return module


def python_function(kernel: Any) -> Callable:
    """The Python twin of compiled ``kernel`` (a numba dispatcher of a kernel module)."""
    module = kernel.py_func.__module__.rpartition(".")[2]
    return _quiet(getattr(twin(module), kernel.py_func.__name__))


def _quiet(fn: Callable) -> Callable:
    # numpy warns where numba wraps silently (the hashes' uint64 products overflow on purpose).
    def run(*args: Any, **kwargs: Any) -> Any:
        with np.errstate(all="ignore"):
            return fn(*args, **kwargs)

    run.__name__ = run.__qualname__ = getattr(fn, "__name__", "kernel")
    return run


_PICKED: dict[Any, Callable] = {}


def _twin_of(kernel: Any) -> Callable:
    fn = _PICKED.get(kernel)
    if fn is None:
        fn = _PICKED[kernel] = python_function(kernel)
    return fn


def _compiled_at_import(kernel: Any) -> bool:
    # A kernel declared with its signatures (``@njit("void(uint32[::1], ...)")``) is compiled, or
    # loaded from the cache, when its module is imported, and numba then refuses to compile it
    # again: it never waits for a JIT compile, and its twin would only be slower.
    return getattr(kernel, "_can_compile", True) is False


def pick(kernel: Any) -> Callable:
    """``kernel`` itself in a process running compiled kernels (or when it was compiled at import),
    else its Python twin (a function that is not a numba dispatcher, as inside a twin, is
    returned as it is)."""
    if _compiled or not hasattr(kernel, "py_func") or getattr(_local, "compiled", False) or _compiled_at_import(kernel):
        return kernel
    return _twin_of(kernel)


def is_python(core: Any) -> bool:
    """Whether ``core`` (a determinizer ``Core``) was made by the Python twin."""
    return isinstance(core, _StructRefProxy)


def pick_for(core: Any, kernel: Any) -> Callable:
    """The build of ``kernel`` that can read ``core``: its Python twin for a core the twin made."""
    if not isinstance(core, _StructRefProxy) or not hasattr(kernel, "py_func"):
        return kernel
    return _twin_of(kernel)


_ENTRY_POINTS: dict[str, types.SimpleNamespace] = {}


def determinizer() -> Any:
    """The determinizer a new automaton should use: the compiled module, or its twin's names
    (functions that keep numpy quiet where numba wraps silently)."""
    if compiled():
        return importlib.import_module(f"{_PACKAGE}.determinizer")
    with _twins_lock:
        names = _ENTRY_POINTS.get("determinizer")
        if names is None:
            module = twin("determinizer")
            names = _ENTRY_POINTS["determinizer"] = types.SimpleNamespace(**{
                k: _quiet(v) if isinstance(v, types.FunctionType) and v.__module__ == module.__name__ else v
                for k, v in vars(module).items() if not k.startswith("__")
            })
        return names


class compiled_here:
    """``with compiled_here():`` this thread runs the compiled kernels (loading them before a
    switch), whatever the process does."""

    def __enter__(self) -> None:
        self._before = getattr(_local, "compiled", False)
        _local.compiled = True

    def __exit__(self, *exc: object) -> None:
        _local.compiled = self._before


# ------------------------------------------------------------------ the switch


def use_python() -> None:
    """From now on new grammar work runs the Python twins (until :func:`switch_when`'s switch)."""
    global _compiled
    _compiled = False


def switch_when(done: Callable[[], bool], before_switch: Callable[[], None] | None = None,
                after_switch: list[Callable[[], None]] | None = None) -> threading.Thread:
    """On a thread: wait for ``done()`` (it joins the warm-up children and returns whether every
    kernel compiled), run ``before_switch`` on the compiled kernels (loading them from numba's
    cache, so no request pays even that), switch the process to them, then call each of
    ``after_switch``. A warm-up that failed switches too: the kernels it left out then compile on
    first use, as without the tier."""
    hooks = list(after_switch or [])

    def wait_then_switch() -> None:
        global _compiled
        try:
            if not done():
                log.warning("the grammar kernels' warm-up failed; they compile on first use")
            if before_switch is not None:
                with compiled_here():
                    before_switch()
        except Exception:  # noqa: BLE001 - the switch must happen whatever the warm-up did
            log.exception("grammar kernel warm-up")
        _compiled = True
        for hook in hooks:
            try:
                hook()
            except Exception:  # noqa: BLE001
                log.exception("after the switch to compiled grammar kernels")

    thread = threading.Thread(target=wait_then_switch, name="formcast-kernel-tier", daemon=True)
    thread.start()
    return thread
