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

PROMPT = [(7 * i + 3) % 300 for i in range(37)]
STEPS = 6


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    import transformers as tf

    config = tf.LlamaConfig(vocab_size=320, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                            num_key_value_heads=2, max_position_embeddings=512, initializer_range=0.08)  # fmt: skip
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny-llama")
    tf.LlamaForCausalLM(config).eval().save_pretrained(str(path))
    return path


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
