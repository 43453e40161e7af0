"""Phi-3 LongRoPE past ``original_max_position_embeddings`` against transformers' Phi3ForCausalLM
(fp32, 1e-4), on a tiny model whose original context is 16 tokens so the switch is cheap to reach.

transformers picks the short or long factors per forward call by the sequence's length after it
(largest position + 1) and keeps earlier keys in its cache as they were rotated; the oracle here
feeds transformers the same chunks formcast runs, through its cache. Checked: uncached prefills
below and past the boundary side by side in one batch (every position scored), a chunked prefill
whose chunk crosses the boundary, and decode steps crossing it (one row long, one short in the
same batches), all through the paged KV cache.
"""

from __future__ import annotations

import random

import pytest
import torch

from engine.model_executor.forward_batch import ForwardBatch, ForwardInput
from engine.model_executor.model_runner import ModelRunner

from model_loop import GreedyLoop
from test_model_families import save_tiny
from test_model_runner import TOL

ORIGINAL = 16
ROPE = {
    "rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
    "short_factor": [1.0, 1.3, 1.7, 2.2, 3.0, 4.0], "long_factor": [1.0, 2.0, 4.0, 8.0, 16.0, 32.0],
    "original_max_position_embeddings": ORIGINAL,
}  # fmt: skip


@pytest.fixture(scope="module")
def phi3(tmp_path_factory, one_thread):
    folder = tmp_path_factory.mktemp("phi3_longrope")
    hf = save_tiny("phi3", folder, num_hidden_layers=2, sliding_window=None, original_max_position_embeddings=ORIGINAL, rope_parameters=ROPE)
    runner = ModelRunner(folder, dtype="float32", max_total_tokens=1024, max_running_requests=4)
    return runner, hf


def _hf_chunked(hf, tokens: list[int], chunks: list[int]) -> list[torch.Tensor]:
    """transformers' logits [n, V] per chunk, each chunk one forward after the cache of the previous ones."""
    from transformers import DynamicCache

    cache, start, out = DynamicCache(config=hf.config), 0, []
    with torch.no_grad():
        for n in chunks:
            ids = torch.tensor([tokens[start : start + n]])
            res = hf(ids, cache=cache, use_cache=True, position_ids=torch.arange(start, start + n)[None])
            out.append(res.logits[0].float())
            start += n
    return out


def _tokens(seed: int, n: int, vocab: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, vocab) for _ in range(n)]


def test_config_keeps_the_whole_context(phi3):
    runner, _ = phi3
    cfg = runner.model_config
    assert cfg.context_len == 512 and cfg.rope.original_max_position_embeddings == ORIGINAL
    assert cfg.rope.long_factor == tuple(ROPE["long_factor"]) and cfg.rope.attention_factor > 1.2


def test_uncached_prefills_below_and_past_the_boundary(phi3):
    runner, hf = phi3
    prompts = [_tokens(1, 12, runner.vocab_size), _tokens(2, 40, runner.vocab_size), _tokens(3, ORIGINAL, runner.vocab_size)]
    pools = (runner.req_to_token_pool, runner.token_to_kv_pool)
    slots = runner.req_to_token_pool.alloc(len(prompts))
    locs = [runner.token_to_kv_pool.alloc(len(p)) for p in prompts]
    inputs = [ForwardInput(s, 0, p, loc, num_logits=len(p)) for s, p, loc in zip(slots, prompts, locs)]
    got = runner.forward(ForwardBatch.init_new(inputs, *pools)).next_token_logits.split([len(p) for p in prompts])
    for p, logits in zip(prompts, got):
        assert torch.allclose(logits, _hf_chunked(hf, p, [len(p)])[0], atol=TOL), f"prefill of {len(p)} tokens differs"
    # the long row read the long table at every position, even those below the boundary
    short_read = _hf_chunked(hf, prompts[1], [ORIGINAL, len(prompts[1]) - ORIGINAL])[0]
    assert (got[1][:ORIGINAL] - short_read).abs().max() > 1e-2
    for loc in locs:
        runner.token_to_kv_pool.free(loc)
    runner.req_to_token_pool.free(slots)


def test_chunked_prefill_and_decode_across_the_boundary(phi3):
    runner, hf = phi3
    loop = GreedyLoop(runner)
    crossing = loop.add(_tokens(4, 26, runner.vocab_size))  # chunks 6, 7, 5 (crosses), 8, then decode
    late = loop.add(_tokens(5, 13, runner.vocab_size))  # prefill 10, chunk 3, then decodes across 16
    plans = {id(crossing): [6, 7, 5, 8], id(late): [10, 3]}
    fed: dict[int, list[int]] = {id(crossing): [], id(late): []}
    got: dict[int, list[torch.Tensor]] = {id(crossing): [], id(late): []}
    for _ in range(9):
        rows = [crossing, late]
        for row in rows:
            plan = plans[id(row)]
            if not plan:  # decode: append the greedy token of the last step
                row.tokens.append(int(got[id(row)][-1].argmax()))
                plan.append(1)
        chunks = [plans[id(r)].pop(0) for r in rows]
        for row, n in zip(rows, chunks):
            fed[id(row)].append(n)
        for row, n, logits in zip(rows, chunks, _step_chunks(loop, rows, chunks)):
            got[id(row)].append(logits)
    assert crossing.cached == 31 and late.cached == 20  # both ran past ORIGINAL, late one token at a time
    for row in (crossing, late):
        expect = _hf_chunked(hf, row.tokens[: row.cached], fed[id(row)])
        for i, (g, e) in enumerate(zip(got[id(row)], expect)):
            assert torch.allclose(g, e[-1], atol=TOL), f"forward {i} ({fed[id(row)][: i + 1]}) differs"
        loop.release(row)


def _step_chunks(loop: GreedyLoop, rows, chunks: list[int]) -> torch.Tensor:
    inputs = []
    for row, n in zip(rows, chunks):
        new = row.tokens[row.cached : row.cached + n]
        locs = loop.runner.token_to_kv_pool.alloc(len(new))
        row.locs.append(locs)
        inputs.append(ForwardInput(row.slot, row.cached, new, locs))
        row.cached += len(new)
    pools = (loop.runner.req_to_token_pool, loop.runner.token_to_kv_pool)
    return loop.runner.forward(ForwardBatch.init_new(inputs, *pools)).next_token_logits
