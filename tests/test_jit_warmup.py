"""grammar.jit_warmup.load_cached_kernels: after a vocabulary's setup no grammar kernel that numba's
cache holds is left to load in a request (a load links machine code: up to 20 ms a kernel)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# A fresh interpreter: the test process has called most kernels already. It prints the cached
# builds (for this CPU and these sources) that are still not loaded after the setup, and how many
# loads the setup's load_cached_kernels made.
_SETUP_SCRIPT = """
import json, sys
sys.path.insert(0, sys.argv[1])
from grammar import jit_warmup
from grammar.token_masks import vocabulary_masks
from grammar.vocab import TokenVocabulary

loads = []
original = jit_warmup.load_cached_kernels
jit_warmup.load_cached_kernels = lambda: loads.append(original()) or loads[-1]
vocabulary_masks(TokenVocabulary.byte_level())
left = []
for name, kernel in jit_warmup._kernels():
    if not kernel._can_compile:  # declared with its signatures: numba loaded it at import
        continue
    cache, codegen = kernel._cache, kernel.targetctx.codegen()
    for key in cache._cache_file._load_index():
        if key == cache._index_key(key[0], codegen) and key[0] not in kernel.overloads:
            left.append(f"{name}{key[0]}")
print(json.dumps({"left": left, "loads": loads}))
"""


def test_a_vocabulary_setup_loads_every_cached_kernel():
    from grammar import jit_warmup

    jit_warmup.ensure_warm()  # the child reads the suite's cache (warm: make test warms it first)
    proc = subprocess.run([sys.executable, "-c", _SETUP_SCRIPT, str(ROOT)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["left"] == [], "kernels a request would load on first call: " + ", ".join(out["left"])
    # The routes of warm_up_masks reach only the kernels Python calls first: the rest (row
    # shapes, whole rows, region tables, ...) are this function's.
    assert len(out["loads"]) == 1 and out["loads"][0] > 0


def test_load_cached_kernels_loads_nothing_twice():
    from grammar import jit_warmup

    jit_warmup.load_cached_kernels()
    assert jit_warmup.load_cached_kernels() == 0
