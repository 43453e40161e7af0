"""``ScheduleBatch``: the requests of one forward and what each feeds, turned into a
``ForwardBatch`` (tensors for the runner) and a ``SamplingBatchInfo`` (for the rows that sample).

Each row feeds ``fill_ids[kv_len : kv_len + num_tokens]``; it samples when that reaches the end
of its ``fill_ids``. KV slots for every fed token are allocated here, all or nothing: ``None``
from ``allocate`` means the pool is short and the scheduler must evict, retract or wait.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..mem_cache.memory_pool import ReqToTokenPool, TokenToKVPool
from ..model_executor.forward_batch import CaptureHiddenMode, ForwardBatch, ForwardInput
from ..sampling.sampling_batch_info import SamplingBatchInfo
from .req import Req


@dataclass
class ScheduleBatch:
    reqs: list[Req]
    num_tokens: list[int]  # tokens each row feeds this step
    out_cache_loc: list[torch.Tensor] = field(default_factory=list)
    sampling_rows: list[int] = field(default_factory=list)  # rows whose forward reaches the end
    sampling_info: SamplingBatchInfo | None = None

    def __post_init__(self) -> None:
        self.sampling_rows = [i for i, r in enumerate(self.reqs) if r.kv_len + self.num_tokens[i] == r.seq_len]

    @property
    def total_tokens(self) -> int:
        return sum(self.num_tokens)

    def sampling_reqs(self) -> list[Req]:
        return [self.reqs[i] for i in self.sampling_rows]

    def allocate(self, pool: TokenToKVPool) -> bool:
        locs = pool.alloc(self.total_tokens)
        if locs is None:
            return False
        self.out_cache_loc = list(locs.split(self.num_tokens))
        return True

    def input_logprob_rows(self) -> list[bool]:
        """Rows that want prompt logprobs and feed prompt tokens this step."""
        return [r.return_logprob and r.kv_len < len(r.origin_input_ids) for r in self.reqs]

    def to_forward_batch(
        self, req_to_token_pool: ReqToTokenPool, token_to_kv_pool: TokenToKVPool, vocab_size: int, eos_ids: frozenset[int]
    ) -> ForwardBatch:
        wants_input_logprobs = self.input_logprob_rows()
        inputs = [
            ForwardInput(r.req_pool_idx, r.kv_len, r.fill_ids[r.kv_len : r.kv_len + n], locs, wants)  # type: ignore[arg-type]
            for r, n, locs, wants in zip(self.reqs, self.num_tokens, self.out_cache_loc, wants_input_logprobs)
        ]
        sampling = self.sampling_reqs()
        if sampling:
            self.sampling_info = SamplingBatchInfo.from_params(
                [r.sampling_params for r in sampling],
                vocab_size,
                token_to_kv_pool.device,
                generators=[r.generator for r in sampling],
                has_grammar=[r.grammar_applies for r in sampling],
                prompt_ids=[r.origin_input_ids for r in sampling],
                output_ids=[r.output_ids for r in sampling],
                eos_token_ids=sorted(eos_ids),
            )
        hidden = CaptureHiddenMode.LAST if any(r.return_hidden_states for r in sampling) else CaptureHiddenMode.NULL
        return ForwardBatch.init_new(
            inputs,
            req_to_token_pool,
            token_to_kv_pool,
            sampling_info=self.sampling_info,
            return_logprob=any(r.return_logprob for r in sampling),
            capture_hidden_mode=hidden,
        )
