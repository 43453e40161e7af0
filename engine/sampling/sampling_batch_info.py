"""``SamplingBatchInfo``: the sampling parameters of one batch as tensors, built once per batch.

Fast-path flags (``need_top_k`` ...) and ``None`` fields (``vocab_mask``, ``penalties``) let the
sampler skip whole steps. The grammar bitmask is an int32 ``[B, ceil(V/32)]`` CPU tensor (pinned
when the batch runs on a GPU); grammar matchers fill their rows through ``vocab_mask_numpy()``,
a zero-copy numpy view. Rows without a grammar are never masked (``grammar_rows``).

Seeds: a request with ``sampling_seed`` samples with its own ``torch.Generator``. The generator
carries state from step to step, so it belongs to the request: pass it back in through
``generators=`` when rebuilding a batch (``filter``/``merge`` keep the same objects).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import torch

from .penalties import PenaltyState

if TYPE_CHECKING:
    import numpy as np

    from ..sampling_params import SamplingParams


def make_generator(params: SamplingParams, device: torch.device | str = "cpu") -> torch.Generator | None:
    """A generator seeded with ``params.sampling_seed`` (None when the request has no seed)."""
    if params.sampling_seed is None:
        return None
    gen = torch.Generator(device=torch.device(device))
    gen.manual_seed(params.sampling_seed)
    return gen


def _has_penalty(p: SamplingParams) -> bool:
    return p.frequency_penalty != 0.0 or p.presence_penalty != 0.0 or p.repetition_penalty != 1.0


@dataclass
class SamplingBatchInfo:
    """Batched sampling parameters; row ``i`` is request ``i`` of the batch."""

    vocab_size: int
    device: torch.device
    temperatures: torch.Tensor  # [B, 1] float32; 1.0 on greedy rows (never divided by 0)
    top_ps: torch.Tensor  # [B] float32
    top_ks: torch.Tensor  # [B] int64; vocab_size when disabled
    min_ps: torch.Tensor  # [B] float32
    greedy: torch.Tensor  # [B] bool: argmax rows (temperature 0 or top_k 1)
    generators: list[torch.Generator | None]
    return_logprob: list[bool]
    top_logprobs_nums: list[int]
    raw_logprobs: list[bool]  # logprobs_mode == "raw"
    grammar_rows: list[bool]
    # min_new_tokens: stop/EOS ids suppressed while a row still owes tokens (see update_penalties).
    min_tokens_left: list[int] = field(default_factory=list)
    min_tokens_stop_ids: list[list[int]] = field(default_factory=list)
    vocab_mask: torch.Tensor | None = None  # int32 [B, W] on the CPU; filled by grammar matchers
    logit_biases: list[dict[int, float] | None] = field(default_factory=list)  # per row, sparse
    penalties: PenaltyState | None = None
    # Fast-path flags, derived in __post_init__.
    is_all_greedy: bool = field(init=False)
    need_top_k: bool = field(init=False)
    need_top_p: bool = field(init=False)
    need_min_p: bool = field(init=False)

    def __post_init__(self) -> None:
        sampled = ~self.greedy
        self.is_all_greedy = bool(self.greedy.all())
        self.need_top_k = bool((sampled & (self.top_ks < self.vocab_size)).any())
        self.need_top_p = bool((sampled & (self.top_ps < 1.0)).any())
        self.need_min_p = bool((sampled & (self.min_ps > 0.0)).any())

    @property
    def batch_size(self) -> int:
        return len(self.generators)

    @classmethod
    def from_params(
        cls,
        params: Sequence[SamplingParams],
        vocab_size: int,
        device: torch.device | str = "cpu",
        *,
        generators: Sequence[torch.Generator | None] | None = None,
        has_grammar: Sequence[bool] | None = None,
        prompt_ids: Sequence[Sequence[int]] | None = None,
        output_ids: Sequence[Sequence[int]] | None = None,
        eos_token_ids: Sequence[int] = (),
    ) -> SamplingBatchInfo:
        """Build the batch form of ``params``.

        ``generators``: the requests' own generators (default: fresh ones from ``sampling_seed``).
        ``has_grammar``: which rows carry a live grammar matcher (default: rows whose params name
        a grammar). ``prompt_ids``/``output_ids``: tokens so far, for the penalties' counts and
        ``min_new_tokens``. ``eos_token_ids``: suppressed, with each row's ``stop_token_ids``,
        until the row has generated ``min_new_tokens`` (unless that would leave no token).
        """
        device = torch.device(device)
        f32 = lambda xs: torch.tensor(xs, dtype=torch.float32, device=device)  # noqa: E731
        # is_greedy also covers a tiny positive temperature that normalize() did not see.
        greedy = [p.is_greedy for p in params]
        top_ks = [vocab_size if (p.top_k is None or p.top_k < 0) else min(p.top_k, vocab_size) for p in params]
        grammar_rows = list(has_grammar) if has_grammar is not None else [p.grammar is not None for p in params]
        penalties = None
        if any(_has_penalty(p) for p in params):
            penalties = PenaltyState.build(
                [p.frequency_penalty for p in params],
                [p.presence_penalty for p in params],
                [p.repetition_penalty for p in params],
                vocab_size, device, prompt_ids, output_ids,
            )
        return cls(
            vocab_size=vocab_size,
            device=device,
            temperatures=f32([1.0 if g else float(p.temperature) for p, g in zip(params, greedy)]).unsqueeze(1),
            top_ps=f32([float(p.top_p) for p in params]),
            top_ks=torch.tensor(top_ks, dtype=torch.int64, device=device),
            min_ps=f32([float(p.min_p) for p in params]),
            greedy=torch.tensor(greedy, dtype=torch.bool, device=device),
            generators=list(generators) if generators is not None else [make_generator(p, device) for p in params],
            return_logprob=[bool(p.logprobs or p.top_logprobs_num) for p in params],
            top_logprobs_nums=[int(p.top_logprobs_num) for p in params],
            raw_logprobs=[p.logprobs_mode == "raw" for p in params],
            grammar_rows=grammar_rows,
            min_tokens_left=[
                max(0, p.min_new_tokens - (len(output_ids[i]) if output_ids is not None else 0))
                for i, p in enumerate(params)
            ],
            min_tokens_stop_ids=[
                sorted(set(p.stop_token_ids or []) | (set() if p.ignore_eos else set(eos_token_ids))) for p in params
            ],
            vocab_mask=_allocate_mask(len(params), vocab_size, device) if any(grammar_rows) else None,
            logit_biases=[p.logit_bias or None for p in params],
            penalties=penalties,
        )

    # --- grammar bitmask --------------------------------------------------------------------

    def vocab_mask_numpy(self) -> np.ndarray | None:
        """Zero-copy numpy view of the bitmask, for ``GrammarMatcher.fill_next_token_bitmask``."""
        return None if self.vocab_mask is None else self.vocab_mask.numpy()

    def reset_vocab_mask(self) -> None:
        """Allow every token in every row again (before matchers fill this step's rows)."""
        if self.vocab_mask is not None:
            self.vocab_mask.fill_(-1)

    def grammar_row_indices(self) -> list[int]:
        return [i for i, g in enumerate(self.grammar_rows) if g]

    # --- batch changes ----------------------------------------------------------------------

    def update_penalties(self, output_ids: torch.Tensor) -> None:
        """Record this step's sampled tokens (one per row; ids < 0 are skipped): penalty counts
        and the rows' remaining ``min_new_tokens``."""
        if self.penalties is not None:
            self.penalties.update(output_ids)
        ids = output_ids.tolist()
        self.min_tokens_left = [left - 1 if left > 0 and t >= 0 else left for left, t in zip(self.min_tokens_left, ids)]

    def filter(self, keep_indices: Sequence[int] | torch.Tensor) -> SamplingBatchInfo:
        """A new batch with the rows ``keep_indices``, in that order."""
        keep_list = [int(i) for i in (keep_indices.tolist() if isinstance(keep_indices, torch.Tensor) else keep_indices)]
        keep = torch.tensor(keep_list, dtype=torch.int64, device=self.device)
        pick = lambda xs: [xs[i] for i in keep_list]  # noqa: E731
        grammar_rows = pick(self.grammar_rows)
        mask = None
        if any(grammar_rows) and self.vocab_mask is not None:
            mask = _allocate_mask(len(keep_list), self.vocab_size, self.device)
            mask.copy_(self.vocab_mask.index_select(0, keep.cpu()))
        return replace(
            self,
            temperatures=self.temperatures.index_select(0, keep),
            top_ps=self.top_ps.index_select(0, keep),
            top_ks=self.top_ks.index_select(0, keep),
            min_ps=self.min_ps.index_select(0, keep),
            greedy=self.greedy.index_select(0, keep),
            generators=pick(self.generators),
            return_logprob=pick(self.return_logprob),
            top_logprobs_nums=pick(self.top_logprobs_nums),
            raw_logprobs=pick(self.raw_logprobs),
            grammar_rows=grammar_rows,
            min_tokens_left=pick(self.min_tokens_left),
            min_tokens_stop_ids=pick(self.min_tokens_stop_ids),
            logit_biases=pick(self.logit_biases) if self.logit_biases else [],
            vocab_mask=mask,
            penalties=None if self.penalties is None else self.penalties.filter(keep),
        )

    def merge(self, other: SamplingBatchInfo) -> SamplingBatchInfo:
        """A new batch: the rows of ``self`` followed by the rows of ``other``."""
        if other.vocab_size != self.vocab_size:
            raise ValueError(f"cannot merge batches with vocab sizes {self.vocab_size} and {other.vocab_size}")
        cat = lambda a, b: torch.cat([a, b.to(self.device)])  # noqa: E731
        grammar_rows = self.grammar_rows + other.grammar_rows
        mask = None
        if any(grammar_rows):
            mask = _allocate_mask(len(grammar_rows), self.vocab_size, self.device)
            for start, part in ((0, self.vocab_mask), (self.batch_size, other.vocab_mask)):
                if part is not None:
                    mask[start : start + part.shape[0]].copy_(part)
        penalties = None
        if self.penalties is not None or other.penalties is not None:
            mine = self.penalties or PenaltyState.neutral(self.batch_size, self.vocab_size, self.device)
            theirs = other.penalties or PenaltyState.neutral(other.batch_size, self.vocab_size, self.device)
            penalties = mine.merge(theirs)
        return replace(
            self,
            temperatures=cat(self.temperatures, other.temperatures),
            top_ps=cat(self.top_ps, other.top_ps),
            top_ks=cat(self.top_ks, other.top_ks),
            min_ps=cat(self.min_ps, other.min_ps),
            greedy=cat(self.greedy, other.greedy),
            generators=self.generators + other.generators,
            return_logprob=self.return_logprob + other.return_logprob,
            top_logprobs_nums=self.top_logprobs_nums + other.top_logprobs_nums,
            raw_logprobs=self.raw_logprobs + other.raw_logprobs,
            grammar_rows=grammar_rows,
            min_tokens_left=self.min_tokens_left + other.min_tokens_left,
            min_tokens_stop_ids=self.min_tokens_stop_ids + other.min_tokens_stop_ids,
            logit_biases=(self.logit_biases or [None] * self.batch_size) + (other.logit_biases or [None] * other.batch_size),
            vocab_mask=mask,
            penalties=penalties,
        )


def _allocate_mask(batch: int, vocab_size: int, device: torch.device) -> torch.Tensor:
    """All-ones int32 bitmask on the CPU, pinned when the batch runs on a GPU (async upload)."""
    width = (vocab_size + 31) // 32
    mask = torch.full((batch, width), -1, dtype=torch.int32)
    if device.type == "cuda":
        mask = mask.pin_memory()
    return mask
