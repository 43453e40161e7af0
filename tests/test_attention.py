"""Attention over the paged cache: the compiled CPU decode kernel against the SDPA reference path
(group sizes 1 to 7, head dims 32 to 128, scattered slots, rows of very different lengths, decode
rows mixed with extend rows), and the length grouping of the reference path."""

from __future__ import annotations

import pytest
import torch

from engine.layers import cpu_decode_attention
from engine.layers.attention import MAX_PADDING_SHARE, TorchAttention, group_decode_rows
from engine.mem_cache.memory_pool import ReqToTokenPool, TokenToKVPool
from engine.model_executor.forward_batch import ForwardBatch, ForwardInput

pytestmark = pytest.mark.skipif(not cpu_decode_attention.available(), reason="numba is not installed")


def _batch(lengths: list[int], extend: list[int], kv_heads: int, dim: int, seed: int):
    """Rows with ``lengths`` tokens cached at scattered slots, each feeding ``extend`` new tokens."""
    g = torch.Generator().manual_seed(seed)
    total = sum(lengths) + sum(extend)
    pool = TokenToKVPool(total + 50, num_layers=1, num_kv_heads=kv_heads, head_dim=dim, dtype=torch.float32)
    reqs = ReqToTokenPool(len(lengths), max(lengths) + max(extend) + 1)
    scattered = pool.alloc(total + 50)[torch.randperm(total + 50, generator=g)][:total]
    pool.k_buffer[0, scattered] = torch.randn(total, kv_heads, dim, generator=g)
    pool.v_buffer[0, scattered] = torch.randn(total, kv_heads, dim, generator=g)
    inputs, used = [], 0
    for r, (n, e) in enumerate(zip(lengths, extend)):
        reqs.write(r, 0, scattered[used : used + n])
        used += n
        inputs.append(ForwardInput(r, n, [1] * e, scattered[used : used + e]))
        used += e
    return ForwardBatch.init_new(inputs, reqs, pool)


@pytest.mark.parametrize("heads,kv_heads,dim", [(9, 3, 64), (4, 4, 32), (8, 2, 128), (14, 2, 64), (6, 3, 48)])
def test_cpu_kernel_matches_sdpa(heads, kv_heads, dim):
    lengths = [1, 7, 300, 64, 1023, 5]
    extend = [1, 1, 1, 4, 1, 9]  # decode rows beside extend rows
    batch = _batch(lengths, extend, kv_heads, dim, seed=heads + dim)
    t = batch.num_tokens
    g = torch.Generator().manual_seed(7)
    q = torch.randn(t, heads, dim, generator=g)
    k = torch.randn(t, kv_heads, dim, generator=g)
    v = torch.randn(t, kv_heads, dim, generator=g)
    outs = []
    for use_kernel in (True, False):
        backend = TorchAttention(use_paged_kernel=use_kernel)
        batch.attn_metadata = backend.init_forward_metadata(batch)
        assert (batch.attn_metadata.paged_decode is not None) == use_kernel
        outs.append(backend.forward(q, k, v, 0, batch))
    assert torch.allclose(outs[0], outs[1], atol=2e-5), (outs[0] - outs[1]).abs().max()


def test_length_groups_bound_the_padding():
    lengths = [64, 70, 1000, 990, 65, 300, 310, 2000, 1]
    groups = group_decode_rows(lengths)
    assert sorted(r for grp in groups for r in grp) == list(range(len(lengths)))
    for grp in groups[:-1]:
        longest = max(lengths[r] for r in grp)
        assert longest * len(grp) <= (1 + MAX_PADDING_SHARE) * sum(lengths[r] for r in grp)
