"""``SamplingBatchInfo``: the sampling parameters of one batch as tensors, built once per batch.

Fast-path flags (``need_top_k`` ...) and ``None`` fields (``vocab_mask``, ``penalties``) let the
sampler skip whole steps. The grammar bitmask is an int32 ``[B, ceil(V/32)]`` CPU tensor (pinned
when the batch runs on a GPU); grammar matchers fill their rows through ``vocab_mask_numpy()``,
a zero-copy numpy view. Rows without a grammar are never masked (``grammar_rows``).

Seeds: a request with ``sampling_seed`` samples with its own ``torch.Generator``. The generator
carries state from step to step, so it belongs to the request: pass it back in through
``generators=`` when the next step's batch is built.

A batch lives for one step: the scheduler builds the next one from the requests' tokens so far
(``ScheduleBatch.to_forward_batch``), so penalty counts and ``min_new_tokens`` need no update.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
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
    # min_new_tokens: stop/EOS ids suppressed while a row still owes tokens.
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


def _allocate_mask(batch: int, vocab_size: int, device: torch.device) -> torch.Tensor:
    """All-ones int32 bitmask on the CPU, pinned when the batch runs on a GPU (async upload)."""
    width = (vocab_size + 31) // 32
    mask = torch.full((batch, width), -1, dtype=torch.int32)
    if device.type == "cuda":
        mask = mask.pin_memory()
    return mask
