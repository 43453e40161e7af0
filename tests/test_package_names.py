"""Formcast's top-level packages must not collide with other distributions' import names.

transformers >= 5.25 requires Hugging Face's ``kernels`` package and imports ``kernels.Mode`` while
loading any model, so formcast's kernels layer is ``formcast_kernels``. ``grammar`` is also an
unrelated PyPI name: ours must win on the path.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name", ["grammar", "formcast_kernels", "engine"])
def test_top_level_packages_come_from_this_repository(name):
    module = __import__(name)
    assert Path(module.__file__).resolve().is_relative_to(REPO), module.__file__


def test_no_top_level_kernels_package_in_this_repository():
    """``import kernels`` from the repository root must reach Hugging Face's package or nothing."""
    assert not list((REPO / "kernels").glob("*.py"))
    spec = importlib.util.find_spec("kernels")
    if spec is not None and spec.origin is not None:
        assert Path(spec.origin).resolve().parent.parent != REPO, spec.origin


def test_transformers_loads_a_model_beside_formcast(tmp_path):
    """transformers' model loading probes ``kernels``; with formcast imported it must still load."""
    import engine  # noqa: F401
    import formcast_kernels  # noqa: F401
    import grammar  # noqa: F401

    tf = pytest.importorskip("transformers")
    config = tf.LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                            num_key_value_heads=2, vocab_size=64)
    tf.LlamaForCausalLM(config).save_pretrained(tmp_path)
    model = tf.AutoModelForCausalLM.from_pretrained(str(tmp_path))
    assert model.config.num_hidden_layers == 1


def test_grammar_imports_neither_torch_nor_transformers():
    """grammar/ must run where torch is absent; tokenizer objects are only passed in."""
    import subprocess
    import sys

    code = "import sys, grammar, grammar.vocab; print(sorted(m for m in ('torch', 'transformers', 'engine', 'formcast_kernels') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
