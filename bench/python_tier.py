"""What the demo request's grammar work costs with the grammar kernels run as plain Python
(issue 25: a tier for before numba has compiled them), against the compiled kernels.

Each mode runs in a fresh interpreter: ``compiled`` (numba's cache as it is: run
``python -m grammar.jit_warmup`` first), ``python`` (every grammar dispatcher replaced by its
``py_func``, the determinizer's structref ``Core`` by a plain class), ``python+levels`` (the same,
with the trie walk as ``token_walk.walk_levels``). Per mode: CPU seconds of the vocabulary setup
(trie and mask warm-up), of compiling the Makefile demo's JSON schema, and of one mask and one
step per token of a fixed answer; and a digest of every mask, which must agree across modes.

    python bench/python_tier.py
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODES = ("compiled", "python", "python+levels")
KERNEL_MODULES = ["grammar.determinizer", "grammar.char_dfa_kernels", "grammar.regions", "grammar.token_trie", "grammar.token_walk"]
ANSWER = '{"name": "Marie Curie", "born": 1867, "fields": ["Physics", "Chemistry", "Radioactivity"]}'


def _as_python(levels: bool) -> None:
    """Replace every grammar kernel by its Python function (and ``_walk_kernel`` by the level walk)."""
    import importlib

    from numba.core.registry import CPUDispatcher

    import grammar.determinizer as det

    class PyCore:  # the structref's fields as plain attributes
        def __init__(self, *values):
            for name, value in zip(det._FIELDS, values):
                setattr(self, name, value)

    for name in KERNEL_MODULES:
        module = importlib.import_module(name)
        for attr, value in list(vars(module).items()):
            if isinstance(value, CPUDispatcher):
                setattr(module, attr, value.py_func)
    det.Core = PyCore
    for module in [m for n, m in list(sys.modules.items()) if n.startswith("grammar") and m is not None]:
        for attr, value in list(vars(module).items()):
            if isinstance(value, CPUDispatcher) and value.py_func.__module__ in KERNEL_MODULES:
                setattr(module, attr, value.py_func)
    from grammar import jit_warmup, token_walk

    jit_warmup._tried = True  # no warm-up children
    if levels:
        token_walk._walk_kernel = token_walk.walk_levels_kernel


def child(mode: str) -> None:
    import hashlib
    import time

    if mode != "compiled":
        _as_python(levels=mode == "python+levels")
    from engine.entrypoints.engine import load_tokenizer
    from engine.hf.model_files import default_model_dir
    from grammar import TokenVocabulary, compile_json_schema
    from grammar.token_masks import vocabulary_masks

    sys.path.insert(0, str(ROOT / "bench"))
    from cold_start import DEMO_SCHEMA

    import json

    tokenizer = load_tokenizer(default_model_dir())
    vocab = TokenVocabulary.from_tokenizer(tokenizer)
    ids = tokenizer.encode(ANSWER)
    t0 = time.process_time()
    vocabulary_masks(vocab)
    t1 = time.process_time()
    grammar = compile_json_schema(json.loads(DEMO_SCHEMA), vocab)
    t2 = time.process_time()
    digest = hashlib.sha256()
    state = grammar.initial_state
    for token in [*ids, None]:
        digest.update(grammar.token_mask(state).tobytes())
        if token is not None:
            state = grammar.next_state(state, token)
    t3 = time.process_time()
    print(f"| {mode} | {t1 - t0:.2f} | {t2 - t1:.2f} | {t3 - t2:.2f} ({len(ids) + 1} masks) | {digest.hexdigest()[:16]} |", flush=True)


def main() -> None:
    print("| grammar kernels | vocabulary setup CPU s | schema compile CPU s | masks + steps CPU s | mask digest |")
    print("| --- | ---: | ---: | ---: | --- |", flush=True)
    for mode in MODES:
        subprocess.run([sys.executable, __file__, "--child", mode], cwd=ROOT, check=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        sys.path.insert(0, str(ROOT))
        child(sys.argv[2])
    else:
        main()
