"""Batch invariance of the forward (engine/layers/attention.py): a token's logits are bit-identical
whether its position is decoded alone, verified among k+1 positions of its row, or computed
beside other requests' rows, in float32, bfloat16 and float16 (the SDPA path), as long as the
forward stays within ``cpu_linear.MAX_ROWS_F32`` tokens. Greedy speculation relies on it to be
token-identical to plain decoding. A tiny random Llama keeps this fast."""

from __future__ import annotations

import pytest
import torch

from engine.layers import attention
from engine.model_executor.forward_batch import ForwardBatch, ForwardInput
from engine.model_executor.model_runner import ModelRunner

from model_loop import write_tiny_llama

PROMPT = [(7 * i + 3) % 300 for i in range(37)]
STEPS = 6


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-llama"), max_position_embeddings=512)


def _forward(runner: ModelRunner, rows: list[tuple[int, int, list[int], int]]) -> list[torch.Tensor]:
    """``rows``: (slot, prefix_len, new tokens, scored positions) -> each row's logits."""
    inputs = [ForwardInput(slot, prefix, ids, runner.token_to_kv_pool.alloc(len(ids)), num_logits=k) for slot, prefix, ids, k in rows]
    batch = ForwardBatch.init_new(inputs, runner.req_to_token_pool, runner.token_to_kv_pool)
    logits = runner.forward(batch).next_token_logits
    return list(logits.split([k for *_, k in rows]))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_verification_scores_what_decoding_scores(folder, dtype):
    runner = ModelRunner(folder, dtype=dtype, max_total_tokens=1024, max_running_requests=4)
    alone, verified, other = (runner.req_to_token_pool.alloc()[0] for _ in range(3))
    for slot in (alone, verified):
        _forward(runner, [(slot, 0, PROMPT, 1)])
    _forward(runner, [(other, 0, PROMPT[:20], 1)])
    # Plain decoding: one position per forward.
    tokens, decoded = [], []
    token = 5
    for step in range(STEPS):
        tokens.append(token)
        (row,) = _forward(runner, [(alone, len(PROMPT) + step, [token], 1)])
        decoded.append(row[0])
        token = int(row[0].argmax())
    # Verification: all positions in one forward, beside another request's decode row.
    got, _ = _forward(runner, [(verified, len(PROMPT), tokens, STEPS), (other, 20, [9], 1)])
    for step in range(STEPS):
        assert torch.equal(got[step], decoded[step]), (dtype, step, (got[step] - decoded[step]).abs().max())


def test_the_grouped_sdpa_path_would_differ_in_half_precision(folder, monkeypatch):
    """The test above has power: verifying through one causal SDPA per row (the old layout)
    changes half-precision logits."""
    monkeypatch.setattr(attention, "MAX_DECODE_LIKE_QUERIES", 0)
    with pytest.raises(AssertionError):
        for dtype in ("bfloat16", "float16"):
            test_verification_scores_what_decoding_scores(folder, dtype)


LONG_PROMPT = [(11 * i + 5) % 300 for i in range(150)]  # more rows than cpu_linear.MAX_ROWS_F32
SCORED = 120  # the prompt's last positions compared


def _prefix_cache_logits(folder, dtype: str, splits=(0, 30, 100, 149)) -> dict[int, torch.Tensor]:
    """The logits of the prompt's last ``SCORED`` positions (those after the split), with the
    first ``split`` tokens prefilled in an earlier forward, as a cached prefix would be."""
    runner = ModelRunner(folder, dtype=dtype, max_total_tokens=2048, max_running_requests=len(splits))
    out = {}
    for split in splits:
        slot = runner.req_to_token_pool.alloc()[0]
        if split:
            _forward(runner, [(slot, 0, LONG_PROMPT[:split], 1)])
        suffix = LONG_PROMPT[split:]
        (logits,) = _forward(runner, [(slot, split, suffix, min(SCORED, len(suffix)))])
        out[split] = logits
    return out


@pytest.fixture
def row_invariant_prefill():
    """The Engine's ``enable_deterministic_inference`` for the test's duration."""
    attention.set_row_invariant_prefill(True)
    yield
    attention.set_row_invariant_prefill(False)


def test_bfloat16_prompt_rows_do_not_depend_on_the_cached_prefix(folder, row_invariant_prefill):
    """With deterministic inference on, a prompt's rows get the same bfloat16 logits whether it is
    prefilled whole (150 rows in one forward), or its last 1, 50 or 120 rows after a cached
    prefix: the prefix cache never changes a greedy output (the loop at every row count, every
    query through the paged kernel)."""
    got = _prefix_cache_logits(folder, "bfloat16")
    whole = got[0]
    for split, logits in got.items():
        n = logits.shape[0]
        assert torch.equal(logits, whole[-n:]), (split, (logits - whole[-n:]).abs().max())


def test_the_gemm_and_sdpa_prefill_differ_in_bfloat16_by_default(folder):
    """The test above has power: by default (bfloat16 on torch's GEMM beyond ``MAX_ROWS_F32`` rows,
    prefill queries through causal SDPA, the faster prefill) the logits move with the split."""
    got = _prefix_cache_logits(folder, "bfloat16")
    whole = got[0]
    assert any(not torch.equal(logits, whole[-logits.shape[0]:]) for logits in got.values())


def test_a_quantized_models_rows_never_depend_on_their_forward():
    """The 8-bit activation blocks of a quantized model (here the embedded SmolLM2's Q4_1 file)
    turn a ~1e-7 rounding difference into other codes: every row must be computed alike whether
    it is prefilled in a long row (more rows than a decode-sized batch; beyond
    ``MAX_DECODE_LIKE_QUERIES`` queries), after a cached prefix, beside another request or
    decoded alone. Before, logits moved by up to 1.06 between a prefill and decoding."""
    from engine.hf.model_files import gguf_path

    runner = ModelRunner(gguf_path(), max_total_tokens=1024, max_running_requests=4)
    assert runner.attn_backend.every_query_alone
    prompt = [(7 * i + 3) % 3000 for i in range(attention.MAX_DECODE_LIKE_QUERIES + 30)]
    whole, cached, decoded = (runner.req_to_token_pool.alloc()[0] for _ in range(3))
    (reference,) = _forward(runner, [(whole, 0, prompt, 40)])  # the last 40 positions' logits
    first = len(prompt) - 40
    _forward(runner, [(cached, 0, prompt[:first], 1)])
    got, _ = _forward(runner, [(cached, first, prompt[first:], 40), (decoded, 0, prompt[:5], 1)])
    assert torch.equal(got, reference)
    for position in range(5, len(prompt)):
        (row,) = _forward(runner, [(decoded, position, [prompt[position]], 1)])
        if position >= first:
            assert torch.equal(row[0], reference[position - first]), (position, (row[0] - reference[position - first]).abs().max())
