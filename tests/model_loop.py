"""A minimal greedy loop over ``ModelRunner`` (no scheduler), shared by the runner tests.

Each row holds a request slot and its KV slots; ``step`` runs one forward over every row that
still has tokens to feed (prefill rows and decode rows mix freely) and frees nothing until
``release``. Tests use it to compare the runner's logits and tokens with ``transformers``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from engine.model_executor.forward_batch import ForwardBatch, ForwardInput
from engine.model_executor.model_runner import ModelRunner


@dataclass
class Row:
    slot: int
    tokens: list[int]  # every token of the sequence so far
    cached: int = 0  # tokens already in the KV cache
    locs: list[torch.Tensor] = field(default_factory=list)


class GreedyLoop:
    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner

    def add(self, prompt: list[int]) -> Row:
        slot = self.runner.req_to_token_pool.alloc()
        assert slot is not None, "request pool full"
        return Row(slot[0], list(prompt))

    def step(self, rows: list[Row], chunk: int | None = None) -> torch.Tensor:
        """Feed each row its uncached tokens (at most ``chunk``); next-token logits [B, V]."""
        inputs = []
        for row in rows:
            new = row.tokens[row.cached :][: chunk or None]
            locs = self.runner.token_to_kv_pool.alloc(len(new))
            assert locs is not None, "KV pool full"
            row.locs.append(locs)
            inputs.append(ForwardInput(row.slot, row.cached, new, locs))
            row.cached += len(new)
        pools = (self.runner.req_to_token_pool, self.runner.token_to_kv_pool)
        return self.runner.forward(ForwardBatch.init_new(inputs, *pools)).next_token_logits

    def release(self, row: Row) -> None:
        for locs in row.locs:
            self.runner.token_to_kv_pool.free(locs)
        self.runner.req_to_token_pool.free(row.slot)
        row.locs.clear()

    def greedy(self, prompts: list[list[int]], new_tokens: int, eos: set[int] = frozenset()) -> list[list[int]]:
        rows = [self.add(p) for p in prompts]
        outs: list[list[int]] = [[] for _ in prompts]
        live = list(range(len(rows)))
        for _ in range(new_tokens):
            logits = self.step([rows[i] for i in live])
            for i, tok in zip(list(live), logits.argmax(-1).tolist()):
                outs[i].append(tok)
                rows[i].tokens.append(tok)
                if tok in eos:
                    live.remove(i)
            if not live:
                break
        for row in rows:
            self.release(row)
        return outs


def write_tiny_llama(path: Path, max_position_embeddings: int = 512) -> Path:
    """A random 3-layer transformers Llama (hidden 64, GQA 4/2, vocab 320) saved at ``path``: the
    runner tests' smallest real model."""
    import transformers as tf

    config = tf.LlamaConfig(vocab_size=320, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                            num_key_value_heads=2, max_position_embeddings=max_position_embeddings, initializer_range=0.08)  # fmt: skip
    torch.manual_seed(0)
    tf.LlamaForCausalLM(config).eval().save_pretrained(str(path))
    return path
