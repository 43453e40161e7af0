"""KV pools: allocation failure is ``None``, frees are exact, live allocations never share a slot."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.mem_cache.memory_pool import KVPoolError, ReqToTokenPool, TokenToKVPool


def _pool(size: int = 64) -> TokenToKVPool:
    return TokenToKVPool(size, num_layers=2, num_kv_heads=2, head_dim=4, dtype=torch.float32)


def test_alloc_returns_none_when_short_and_never_raises():
    pool = _pool(10)
    first = pool.alloc(7)
    assert first is not None and first.numel() == 7
    assert pool.alloc(4) is None
    assert pool.available_size() == 3
    assert pool.alloc(3) is not None
    assert pool.alloc(1) is None
    req = ReqToTokenPool(2, 16)
    assert req.alloc(2) is not None and req.alloc() is None


def test_slot_zero_is_never_handed_out_and_stays_zero():
    pool = _pool(8)
    locs = pool.alloc(8)
    assert 0 not in locs.tolist()
    pool.set_kv(0, locs, torch.ones(8, 2, 4), torch.ones(8, 2, 4))
    assert pool.k_buffer[:, 0].abs().sum() == 0 and pool.v_buffer[:, 0].abs().sum() == 0


def test_double_free_is_caught():
    pool = _pool(8)
    locs = pool.alloc(3)
    pool.free(locs)
    with pytest.raises(KVPoolError):
        pool.free(locs[:1])
    req = ReqToTokenPool(2, 4)
    (slot,) = req.alloc()
    req.free(slot)
    with pytest.raises(KVPoolError):
        req.free(slot)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 20)), min_size=1, max_size=60))
def test_random_alloc_free_sequences(ops):
    pool = _pool(64)
    start = pool.available_size()
    live: list[torch.Tensor] = []
    for is_alloc, n in ops:
        if is_alloc or not live:
            before = pool.available_size()
            got = pool.alloc(n)
            if got is None:
                assert n > before and pool.available_size() == before
                continue
            assert got.numel() == n and pool.available_size() == before - n
            held = set().union(*(set(x.tolist()) for x in live)) if live else set()
            assert not held & set(got.tolist()), "a live slot was handed out twice"
            assert len(set(got.tolist())) == n and all(1 <= s <= 64 for s in got.tolist())
            live.append(got)
        else:
            victim = live.pop(n % len(live))
            before = pool.available_size()
            pool.free(victim)
            assert pool.available_size() == before + victim.numel()
    for locs in live:
        pool.free(locs)
    assert pool.available_size() == start


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_set_kv_fills_the_slots_it_is_given_and_nothing_else(dtype):
    """A float32 pool copies in its compiled loop, others through ``index_copy_``: the same rows.
    K and V arrive as views of a fused projection (not contiguous), as a forward passes them."""
    pool = TokenToKVPool(9, num_layers=2, num_kv_heads=3, head_dim=8, dtype=dtype)
    assert pool.compiled_copy == (dtype == torch.float32)
    qkv = torch.randn(2, 2 * 3 * 8 + 5)
    k, v = qkv[:, 5 : 5 + 24].view(2, 3, 8), qkv[:, 5 + 24 :].view(2, 3, 8)
    pool.set_kv(1, torch.tensor([6, 2]), k, v)
    expected_k, expected_v = torch.zeros(10, 3, 8, dtype=dtype), torch.zeros(10, 3, 8, dtype=dtype)
    expected_k[[6, 2]], expected_v[[6, 2]] = k.to(dtype), v.to(dtype)
    assert torch.equal(pool.k_buffer[1][[0, 2, 6]], expected_k[[0, 2, 6]])
    assert torch.equal(pool.v_buffer[1][[0, 2, 6]], expected_v[[0, 2, 6]])
    assert torch.equal(pool.k_buffer[0][0], torch.zeros(3, 8, dtype=dtype))  # slot 0 stays zero
