"""``formcast_kernels.paged_decode_attention``: the Triton kernel (run by Triton's interpreter on the CPU,
in a subprocess since the flag is read at import) against the torch reference, on scattered
slots, rows of different lengths (1 to 100), group sizes 1 to 7 and head dims 16 to 96 (also
not powers of two); on a GPU, the compiled kernel against the reference."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from formcast_kernels import PagedRows, paged_decode_attention
from formcast_kernels.decode_attention import paged_decode_attention_reference

NO_CAP = 0.0  # the CPU kernel's softcap argument for uncapped scores (a float32 once passed)

ROOT = Path(__file__).resolve().parents[1]
CASES = [[9, 3, 64, [1, 37, 100]], [4, 4, 16, [5, 64]], [14, 2, 32, [33]], [6, 3, 48, [2, 17, 70]], [7, 1, 96, [40, 1]]]


def make_case(heads: int, kv_heads: int, dim: int, lens: list[int], seed: int, device: str = "cpu"):
    g = torch.Generator().manual_seed(seed)
    slots = sum(lens) + 20
    k = torch.randn(slots, kv_heads, dim, generator=g)
    v = torch.randn(slots, kv_heads, dim, generator=g)
    index = torch.randperm(slots, generator=g)[: sum(lens)]
    starts = torch.tensor([0] + lens[:-1]).cumsum(0)
    q = torch.randn(len(lens), heads, dim, generator=g)
    to = lambda *ts: [t.to(device) for t in ts]  # noqa: E731
    return to(q, k, v, index, starts, torch.tensor(lens))


_SCRIPT = """
import json, os, sys
sys.path.insert(0, os.environ["FORMCAST_ROOT"]); sys.path.insert(0, os.environ["FORMCAST_ROOT"] + "/tests")
import torch
from formcast_kernels import PagedRows
from formcast_kernels.decode_attention_triton import paged_decode_attention_triton
from formcast_kernels.decode_attention import paged_decode_attention_reference
from test_decode_attention_kernel import make_case
ok = []
for i, (heads, kv_heads, dim, lens) in enumerate(json.loads(sys.argv[1])):
    q, k, v, idx, start, n = make_case(heads, kv_heads, dim, lens, seed=i)
    b = torch.empty_like(q)
    paged_decode_attention_reference(q, k, v, PagedRows(idx, start, n), b, dim ** -0.5)
    for split, dot in ((None, False), (32, False), (None, True)):  # one split / 32-token splits / tl.dot
        a = torch.empty_like(q)
        paged_decode_attention_triton(q, k, v, PagedRows(idx, start, n), a, dim ** -0.5, split_size=split, use_dot=dot)
        ok.append(bool(torch.allclose(a, b, atol=1e-5)))
print(json.dumps(ok))
"""


def test_triton_kernel_matches_reference_under_interpreter() -> None:
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", FORMCAST_ROOT=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, json.dumps(CASES)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [True] * (3 * len(CASES))


def test_reference_matches_the_engine_attention_path() -> None:
    """The reference agrees with the CPU decode kernel the engine uses (a second implementation)."""
    from engine.layers import cpu_decode_attention

    if not cpu_decode_attention.available():
        pytest.skip("numba is not installed")
    import numpy as np

    q, k, v, idx, start, n = make_case(9, 3, 64, [3, 50, 9], seed=5)
    ref, got = torch.empty_like(q), torch.empty_like(q)
    paged_decode_attention(q, k, v, PagedRows(idx, start, n), ref)
    cpu_decode_attention.kernel_for(64, 3)(
        q.numpy(), k.view(-1, 64).numpy(), v.view(-1, 64).numpy(), idx.numpy(), start.numpy(), n.numpy(), got.numpy(), np.float32(0.125), 3,
        np.float32(NO_CAP), False,
    )
    assert torch.allclose(ref, got, atol=1e-5)


def test_engine_kernel_rows_do_not_depend_on_their_batch() -> None:
    """Batch invariance, bit for bit: a row's output alone equals its output beside much longer
    rows (a speculative verification scores k+1 rows where plain decoding scores one; any
    per-call choice of code path by the batch's size breaks greedy identity in bfloat16)."""
    import numpy as np

    from engine.layers import cpu_decode_attention

    kernel = cpu_decode_attention.kernel_for(64, 3)
    q, k, v, idx, start, n = make_case(9, 3, 64, [3, 2000, 1500, 7], seed=11)
    k_rows, v_rows, scale = k.view(-1, 64).numpy(), v.view(-1, 64).numpy(), np.float32(0.125)
    together = torch.empty_like(q)
    kernel(q.numpy(), k_rows, v_rows, idx.numpy(), start.numpy(), n.numpy(), together.numpy(), scale, 3, np.float32(NO_CAP), False)
    for b in (0, 3):
        alone = torch.empty_like(q[b : b + 1])
        kernel(q[b : b + 1].numpy().copy(), k_rows, v_rows, idx.numpy(), start[b : b + 1].numpy().copy(),
               n[b : b + 1].numpy().copy(), alone.numpy(), scale, 3, np.float32(NO_CAP), False)
        assert torch.equal(alone[0], together[b]), f"row {b}"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_kernel_on_gpu(dtype) -> None:
    for i, (heads, kv_heads, dim, lens) in enumerate(CASES):
        q, k, v, idx, start, n = make_case(heads, kv_heads, dim, lens, seed=i, device="cuda")
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
        ref = torch.empty_like(q, dtype=torch.float32)
        paged_decode_attention_reference(q.float(), k.float(), v.float(), PagedRows(idx, start, n), ref, dim**-0.5)
        for split in (None, 32):
            got = torch.empty_like(q)
            from formcast_kernels.decode_attention_triton import paged_decode_attention_triton

            paged_decode_attention_triton(q, k, v, PagedRows(idx, start, n), got, dim**-0.5, split_size=split)  # dot on bf16
            assert torch.allclose(got.float(), ref, atol=1e-5 if dtype == torch.float32 else 3e-2)


_CACHE_SCRIPT = """
import sys
sys.path.insert(0, sys.argv[1]); sys.path.insert(0, sys.argv[1] + "/tests")
import numpy as np
from engine.layers import cpu_decode_attention
from test_decode_attention_kernel import make_case
outs = []
for bf16 in (False, True):
    q, k, v, idx, start, n = make_case(9, 3, 64, [7, 100, 1000], seed=3)
    k_rows, v_rows = k.view(-1, 64), v.view(-1, 64)
    if bf16:
        k_rows, v_rows = k_rows.bfloat16().view(torch.uint16), v_rows.bfloat16().view(torch.uint16)
    out = np.empty(q.shape, np.float32)
    cpu_decode_attention.kernel_for(64, 3, bf16)(q.numpy(), k_rows.numpy(), v_rows.numpy(), idx.numpy(), start.numpy(), n.numpy(),
                                                  out, np.float32(0.125), 3, np.float32(0.0), False)
    outs.append(out)
np.save(sys.argv[2], np.stack(outs))
"""


def test_the_first_process_computes_what_the_cache_loading_ones_do(tmp_path) -> None:
    """On an empty numba cache the first process must give the bits every later process gets
    from the cache: before, the compiling process ran another build of the parallel loop's body
    (numba's own copy, summed in another order under fastmath) and its greedy outputs differed
    from every later run's."""
    from engine.layers import cpu_decode_attention

    if not cpu_decode_attention.available():
        pytest.skip("numba is not installed")
    import numpy as np

    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba"))
    script = "import torch\n" + _CACHE_SCRIPT
    outs = []
    for name in ("compiles", "loads"):
        proc = subprocess.run([sys.executable, "-c", script, str(ROOT), str(tmp_path / f"{name}.npy")], env=env,
                              capture_output=True, text=True, timeout=900)  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        outs.append(np.load(tmp_path / f"{name}.npy"))
    assert any((tmp_path / "numba").rglob("*.nbi")), "the first process wrote the cache"
    assert np.array_equal(outs[0], outs[1]), f"max difference {np.abs(outs[0] - outs[1]).max()}"


def _soft_capped_reference(q, k, v, idx, start, n, scale: float, cap: float) -> torch.Tensor:
    """Per row: scores of its keys, cap * tanh(score / cap), softmax, weighted values (float64)."""
    out = torch.empty(q.shape, dtype=torch.float64)
    group = q.shape[1] // k.shape[1]
    for b in range(q.shape[0]):
        rows = idx[start[b] : start[b] + n[b]]
        kb = k[rows].double().repeat_interleave(group, dim=1)  # [n, heads, d]
        vb = v[rows].double().repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,nhd->hn", q[b].double(), kb) * scale
        probs = torch.softmax(torch.tanh(scores / cap) * cap, dim=-1)
        out[b] = torch.einsum("hn,nhd->hd", probs, vb)
    return out


@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("heads,kv_heads,dim", [(9, 3, 64), (16, 2, 128)])  # kernels test_attention.py compiles too
def test_engine_kernel_soft_caps_the_scores(heads, kv_heads, dim, bf16) -> None:
    """The soft-capped variant (Gemma 2) against the spelled-out reference; the scores are made
    large enough for the cap to bend most of them (a kernel ignoring the cap fails)."""
    import numpy as np

    from engine.layers import cpu_decode_attention

    if not cpu_decode_attention.available():
        pytest.skip("numba is not installed")
    q, k, v, idx, start, n = make_case(heads, kv_heads, dim, [1, 40, 700], seed=heads + dim)
    q = q * 6
    if bf16:  # the reference reads the same rounded values
        k, v = k.bfloat16().float(), v.bfloat16().float()
    rows = (lambda t: t.view(-1, dim).bfloat16().view(torch.uint16)) if bf16 else (lambda t: t.view(-1, dim))  # noqa: E731
    scale, cap = 0.2, 1.5
    got = torch.empty_like(q)
    cpu_decode_attention.kernel_for(dim, heads // kv_heads, bf16)(
        q.numpy(), rows(k).numpy(), rows(v).numpy(), idx.numpy(), start.numpy(), n.numpy(), got.numpy(), np.float32(scale), kv_heads,
        np.float32(cap), False,
    )
    ref = _soft_capped_reference(q, k, v, idx, start, n, scale, cap)
    assert torch.allclose(got.double(), ref, atol=2e-6), (got.double() - ref).abs().max()
    uncapped = _soft_capped_reference(q, k, v, idx, start, n, scale, 1e9)
    assert (uncapped - ref).abs().max() > 0.1, "the cap bends the outputs of these scores"
