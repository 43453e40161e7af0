"""The top-level names ``grammar`` and ``kernels`` are also unrelated PyPI packages (Hugging Face's
``kernels`` is probed by transformers): ours must win, and transformers must not think the HF
``kernels`` package is installed because of ours."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name", ["grammar", "kernels", "engine"])
def test_top_level_packages_come_from_this_repository(name):
    module = __import__(name)
    assert Path(module.__file__).resolve().is_relative_to(REPO), module.__file__


def test_transformers_does_not_see_hf_kernels():
    import engine  # noqa: F401  (formcast importable and imported)
    import grammar  # noqa: F401
    import kernels  # noqa: F401

    transformers_utils = pytest.importorskip("transformers.utils")
    assert transformers_utils.is_kernels_available() is False


def test_grammar_imports_neither_torch_nor_transformers():
    """grammar/ must run where torch is absent; tokenizer objects are only passed in."""
    import subprocess
    import sys

    code = "import sys, grammar, grammar.vocab; print(sorted(m for m in ('torch', 'transformers', 'engine', 'kernels') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
