"""Attention over the paged cache: the compiled CPU decode kernel against the SDPA reference path
(group sizes 1 to 7, head dims 16 to 128, scattered slots, rows of very different lengths, decode
rows mixed with extend rows), and the length grouping of the reference path."""

from __future__ import annotations

import pytest
import torch

from engine.layers import cpu_decode_attention
from engine.layers.attention import MAX_PADDING_SHARE, TorchAttention, group_decode_rows
from engine.mem_cache.memory_pool import ReqToTokenPool, TokenToKVPool
from engine.model_executor.forward_batch import ForwardBatch, ForwardInput

pytestmark = pytest.mark.skipif(not cpu_decode_attention.available(), reason="numba is not installed")


def _batch(lengths: list[int], extend: list[int], kv_heads: int, dim: int, seed: int, dtype=torch.float32):
    """Rows with ``lengths`` tokens cached at scattered slots, each feeding ``extend`` new tokens."""
    g = torch.Generator().manual_seed(seed)
    total = sum(lengths) + sum(extend)
    pool = TokenToKVPool(total + 50, num_layers=1, num_kv_heads=kv_heads, head_dim=dim, dtype=dtype)
    reqs = ReqToTokenPool(len(lengths), max(lengths) + max(extend) + 1)
    scattered = pool.alloc(total + 50)[torch.randperm(total + 50, generator=g)][:total]
    pool.k_buffer[0, scattered] = torch.randn(total, kv_heads, dim, generator=g).to(dtype)
    pool.v_buffer[0, scattered] = torch.randn(total, kv_heads, dim, generator=g).to(dtype)
    inputs, used = [], 0
    for r, (n, e) in enumerate(zip(lengths, extend)):
        reqs.write(r, 0, scattered[used : used + n])
        used += n
        inputs.append(ForwardInput(r, n, [1] * e, scattered[used : used + e]))
        used += e
    return ForwardBatch.init_new(inputs, reqs, pool)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
# Each (head dim, query heads per task, dtype) is a kernel of its own, compiled on first use (about
# 4 s each on an empty cache): the geometries reuse the kernels the other tests' models need
# (head dim 16, one query head per KV head: the tiny MoE models) where the check allows.
@pytest.mark.parametrize("heads,kv_heads,dim", [(9, 3, 64), (4, 4, 16), (8, 2, 128), (14, 2, 128), (6, 3, 48)])
def test_cpu_kernel_matches_sdpa(heads, kv_heads, dim, dtype):
    lengths = [1, 7, 300, 64, 1023, 5]
    extend = [1, 1, 1, 4, 1, 9]  # decode rows beside extend rows
    batch = _batch(lengths, extend, kv_heads, dim, seed=heads + dim, dtype=dtype)
    t = batch.num_tokens
    g = torch.Generator().manual_seed(7)
    q = torch.randn(t, heads, dim, generator=g).to(dtype)
    k = torch.randn(t, kv_heads, dim, generator=g).to(dtype)
    v = torch.randn(t, kv_heads, dim, generator=g).to(dtype)
    outs = []
    for use_kernel in (True, False):
        backend = TorchAttention(use_paged_kernel=use_kernel)
        batch.attn_metadata = backend.init_forward_metadata(batch)
        assert (batch.attn_metadata.paged_decode is not None) == use_kernel
        outs.append(backend.forward(q, k, v, 0, batch))
    # bfloat16: the kernel accumulates in float32, SDPA partly in bfloat16; compare at that grain.
    tol = 2e-5 if dtype == torch.float32 else 2e-2
    assert torch.allclose(outs[0].float(), outs[1].float(), atol=tol), (outs[0].float() - outs[1].float()).abs().max()


def test_length_groups_bound_the_padding():
    lengths = [64, 70, 1000, 990, 65, 300, 310, 2000, 1]
    groups = group_decode_rows(lengths)
    assert sorted(r for grp in groups for r in grp) == list(range(len(lengths)))
    for grp in groups[:-1]:
        longest = max(lengths[r] for r in grp)
        assert longest * len(grp) <= (1 + MAX_PADDING_SHARE) * sum(lengths[r] for r in grp)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,kv_heads,dim", [(9, 3, 64), (8, 2, 128)])
def test_soft_capped_decode_rows_take_the_cpu_kernel(heads, kv_heads, dim, dtype):
    # Gemma 2's soft-capped layers: decode rows through the compiled kernel's capped variant,
    # equal to the spelled-out softmax of the reference path (also within a sliding window).
    lengths, extend = [1, 7, 300, 64, 1023, 5], [1, 1, 1, 4, 1, 9]
    batch = _batch(lengths, extend, kv_heads, dim, seed=heads + dim, dtype=dtype)
    g = torch.Generator().manual_seed(3)
    t = batch.num_tokens
    q = (torch.randn(t, heads, dim, generator=g) * 4).to(dtype)
    k, v = torch.randn(t, kv_heads, dim, generator=g).to(dtype), torch.randn(t, kv_heads, dim, generator=g).to(dtype)
    for window in (None, 100):
        outs = []
        for use_kernel in (True, False):
            backend = TorchAttention(use_paged_kernel=use_kernel)
            batch.attn_metadata = backend.init_forward_metadata(batch)
            assert (backend._metadata(batch, window, 1.5).paged_decode is not None) == use_kernel
            outs.append(backend.forward(q, k, v, 0, batch, window=window, scale=0.3, softcap=1.5))
        tol = 2e-5 if dtype == torch.float32 else 2e-2
        assert torch.allclose(outs[0].float(), outs[1].float(), atol=tol), (outs[0].float() - outs[1].float()).abs().max()
