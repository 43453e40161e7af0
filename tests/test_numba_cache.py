"""engine.layers.numba_cache: a compiled loop's cache entry is keyed on the modules whose LLVM IR it
inlines, so an edit to ``octet_dot``, ``int_dot`` or ``vector_exp`` alone never loads stale machine
code."""

from __future__ import annotations

from pathlib import Path

from numba.core import caching

from engine.layers import cpu_decode_attention, ggml_quants, numba_cache, row_ops


def test_the_block_loops_are_keyed_on_the_ir_they_inline():
    locator = ggml_quants._mm_q4_0._cache._impl.locator
    assert getattr(locator, "formcast_inlined", False), type(locator)
    assert locator.get_source_stamp() == numba_cache.source_stamp(Path(ggml_quants.__file__).resolve())


def test_the_loops_that_inline_vector_exp_are_keyed_on_it():
    """The SwiGLU loop and the decode attention kernel inline ``vector_exp.exp32``."""
    vector_exp = Path(numba_cache.__file__).resolve().parent / "vector_exp.py"
    kernel = cpu_decode_attention._build(64, 2, False)
    for function, module in ((row_ops._silu_and_mul, row_ops), (kernel, cpu_decode_attention)):
        locator = function._cache._impl.locator
        assert getattr(locator, "formcast_inlined", False), (module.__name__, type(locator))
        assert vector_exp in numba_cache.INLINED[Path(module.__file__).resolve()]
        assert locator.get_source_stamp() == numba_cache.source_stamp(Path(module.__file__).resolve())


def test_an_edit_to_an_inlined_module_changes_the_key(tmp_path, monkeypatch):
    caller, inlined, other = tmp_path / "caller.py", tmp_path / "inlined.py", tmp_path / "other.py"
    for path in (caller, inlined, other):
        path.write_text("def f():\n    return 1\n")
    monkeypatch.setattr(numba_cache, "INLINED", {caller.resolve(): (inlined.resolve(),)})
    monkeypatch.setattr(caching.config, "CACHE_DIR", str(tmp_path / "cache"))

    def f():  # pragma: no cover - never called
        return 1

    keyed = numba_cache._keyed_on_inlined(caching.UserProvidedCacheLocator)
    assert keyed.from_function(f, str(other)) is None, "other files keep numba's own locators"
    locator = keyed.from_function(f, str(caller))
    before = locator.get_source_stamp()
    inlined.write_text("def f():\n    return 22\n")
    assert locator.get_source_stamp() != before
    numba_cache.register()
    assert sum(getattr(c, "formcast_inlined", False) for c in caching.CacheImpl._locator_classes) == 3, "registered once"
