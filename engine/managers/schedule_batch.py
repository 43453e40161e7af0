"""``ScheduleBatch``: the requests of one forward and what each feeds, turned into a
``ForwardBatch`` (tensors for the runner, the ``RowLayout``, and a ``SamplingBatchInfo`` for the
rows that sample).

Each row feeds ``fill_ids[kv_len : kv_len + num_tokens]`` and then its drafts, if speculation
proposed any. A row *samples* when what it feeds reaches the end of its ``fill_ids``; the
``RowLayout`` says which logits rows it owns (``model_executor/row_layout.py``). Each virtual row
of the ``SamplingBatchInfo`` has the request's parameters, penalties counting the drafts before
it, and the grammar mask of that position. KV slots for every fed token are allocated here, all or nothing: ``False`` from
``allocate`` means the pool is short and the scheduler must evict, drop drafts, retract or wait.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..mem_cache.memory_pool import ReqToTokenPool, TokenToKVPool
from ..forward.forward_batch import CaptureHiddenMode, ForwardBatch, ForwardInput
from ..forward.row_layout import RowLayout
from ..sampling.sampling_batch_info import SamplingBatchInfo
from .req import Req


@dataclass
class Draft:
    """What a drafter (``speculative/drafters.py``) proposes for one row: fed after the row's
    tokens and verified at its ``k + 1`` positions."""

    tokens: list[int]
    probs: torch.Tensor | None = None  # [len(tokens), V]: the drafter's distribution; None = point masses
    forced: list[bool] | None = None  # per token: appended by jump-forward there (accepted unverified)


@dataclass
class RowResult:
    """What one sampling row produced this step."""

    tokens: list[int]  # accepted drafts, then one sampled token (NO_TOKEN: the mask allowed none)
    accepted: int = 0  # how many leading ``tokens`` are accepted drafts
    drafted: int = 0
    logprobs: list[float] | None = None  # per token, when the request asked
    top_logprobs: list[list[tuple[float, int]]] | None = None
    hidden: list[float] | None = None
    error: str | None = None  # a grammar error while filling this row's mask
    forced: list[bool] | None = None  # per accepted draft: a jump-forward token (not sampled)


@dataclass
class ScheduleBatch:
    reqs: list[Req]
    num_tokens: list[int]  # tokens of fill_ids each row feeds this step
    drafts: list[Draft] = field(default_factory=list)  # per row; empty drafts when none
    out_cache_loc: list[torch.Tensor] = field(default_factory=list)
    sampling_rows: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.drafts:
            self.drafts = [Draft([]) for _ in self.reqs]
        self.sampling_rows = [i for i, r in enumerate(self.reqs) if r.kv_len + self.num_tokens[i] == r.seq_len]

    @property
    def has_drafts(self) -> bool:
        return any(d.tokens for d in self.drafts)

    def fed(self, row: int) -> int:
        return self.num_tokens[row] + len(self.drafts[row].tokens)

    @property
    def total_tokens(self) -> int:
        return sum(self.fed(i) for i in range(len(self.reqs)))

    def sampling_reqs(self) -> list[Req]:
        return [self.reqs[i] for i in self.sampling_rows]

    def drop_drafts(self) -> None:
        self.drafts = [Draft([]) for _ in self.reqs]

    def allocate(self, pool: TokenToKVPool) -> bool:
        locs = pool.alloc(self.total_tokens)
        if locs is None:
            return False
        self.out_cache_loc = list(locs.split([self.fed(i) for i in range(len(self.reqs))]))
        return True

    @property
    def layout(self) -> RowLayout:
        """Each row's scored positions (its drafts + 1) and the rows that sample."""
        return RowLayout(tuple(len(d.tokens) for d in self.drafts), tuple(self.sampling_rows))

    # ------------------------------------------------------------------ tensors
    def to_forward_batch(
        self, req_to_token_pool: ReqToTokenPool, token_to_kv_pool: TokenToKVPool, vocab_size: int, eos_ids: frozenset[int]
    ) -> ForwardBatch:
        """The runner's batch: tensors, the row layout and (when a row samples) the
        ``SamplingBatchInfo`` of its virtual rows. Records the fed tokens' KV slots in the
        request-to-token table; the ``ScheduleBatch`` itself is left as it was."""
        layout = self.layout
        inputs = []
        for i, (r, n, locs) in enumerate(zip(self.reqs, self.num_tokens, self.out_cache_loc)):
            feed = r.fill_ids[r.kv_len : r.kv_len + n] + self.drafts[i].tokens
            wants = r.return_logprob and len(r.input_token_logprobs) < len(r.origin_input_ids) and r.kv_len < len(r.origin_input_ids)
            inputs.append(ForwardInput(r.req_pool_idx, r.kv_len, feed, locs, wants, layout.num_logits(i)))  # type: ignore[arg-type]
        sampling = self.sampling_reqs()
        info = self._sampling_info(layout, vocab_size, token_to_kv_pool.device, eos_ids) if sampling else None
        hidden = CaptureHiddenMode.LAST if any(r.return_hidden_states for r in sampling) else CaptureHiddenMode.NULL
        batch = ForwardBatch.init_new(
            inputs,
            req_to_token_pool,
            token_to_kv_pool,
            sampling_info=info,
            row_layout=layout,
            return_logprob=any(r.return_logprob for r in sampling),
            capture_hidden_mode=hidden,
        )
        batch.capture_routed_experts = any(r.return_routed_experts for r in sampling)
        return batch

    def _sampling_info(self, layout: RowLayout, vocab_size: int, device: torch.device, eos_ids: frozenset[int]) -> SamplingBatchInfo:
        params, gens, grammar, prompts, outputs = [], [], [], [], []
        for span in layout.spans:
            req, drafts = self.reqs[span.row], self.drafts[span.row].tokens
            for j in range(span.drafts + 1):
                params.append(req.sampling_params)
                gens.append(None if self.has_drafts else req.generator)  # verification draws its own uniforms
                grammar.append(req.grammar_applies)
                prompts.append(req.origin_input_ids)
                outputs.append(req.output_ids + drafts[:j] if j else req.output_ids)
        return SamplingBatchInfo.from_params(
            params, vocab_size, device, generators=gens, has_grammar=grammar,
            prompt_ids=prompts, output_ids=outputs, eos_token_ids=sorted(eos_ids),
        )  # fmt: skip
