"""Frequency, presence and repetition penalties over a batch, with the token counts they need (built per batch from the tokens so far).

Semantics:
* frequency / presence (OpenAI): ``logit -= frequency_penalty * count + presence_penalty * (count > 0)``
  where ``count`` is how often the token appears among the tokens *generated* so far.
* repetition (Hugging Face ``RepetitionPenaltyLogitsProcessor``): for every token seen in the
  prompt or the output, ``logit / p`` if the logit is positive, else ``logit * p``.
Masked logits (``-inf``) stay ``-inf`` under all three.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass
class PenaltyState:
    """Per-row penalty coefficients and the token statistics they need."""

    frequency: torch.Tensor  # [B, 1] float32
    presence: torch.Tensor  # [B, 1] float32
    repetition: torch.Tensor  # [B, 1] float32
    output_counts: torch.Tensor  # [B, V] int32: occurrences among generated tokens
    seen: torch.Tensor  # [B, V] bool: token occurs in prompt or output

    @classmethod
    def build(
        cls,
        frequency: Sequence[float],
        presence: Sequence[float],
        repetition: Sequence[float],
        vocab_size: int,
        device: torch.device,
        prompt_ids: Sequence[Sequence[int]] | None = None,
        output_ids: Sequence[Sequence[int]] | None = None,
    ) -> PenaltyState:
        """Coefficients per row; counts from the tokens each request has so far (optional)."""
        col = lambda xs: torch.tensor(list(xs), dtype=torch.float32, device=device).unsqueeze(1)  # noqa: E731
        batch = len(frequency)
        state = cls(
            frequency=col(frequency),
            presence=col(presence),
            repetition=col(repetition),
            output_counts=torch.zeros(batch, vocab_size, dtype=torch.int32, device=device),
            seen=torch.zeros(batch, vocab_size, dtype=torch.bool, device=device),
        )
        for row in range(batch):
            if prompt_ids is not None and len(prompt_ids[row]):
                state.seen[row, torch.as_tensor(list(prompt_ids[row]), device=device)] = True
            if output_ids is not None and len(output_ids[row]):
                ids = torch.as_tensor(list(output_ids[row]), device=device)
                state.output_counts[row].index_add_(0, ids, torch.ones_like(ids, dtype=torch.int32))
                state.seen[row, ids] = True
        return state

    def apply(self, logits: torch.Tensor) -> None:
        """Penalize ``logits`` [B, V'] in place (V' may exceed the tracked vocabulary).

        Sparse: only (row, token) pairs seen so far change, so gather them, penalize, scatter back,
        instead of ~10 dense passes over [B, V].
        """
        rows, cols = self.seen.nonzero(as_tuple=True)
        if rows.numel() == 0:
            return
        vals = logits[rows, cols].float()
        rep = self.repetition[rows, 0]
        vals = torch.where(vals > 0, vals / rep, vals * rep)  # HF: divide positive, multiply negative
        counts = self.output_counts[rows, cols].to(vals.dtype)
        vals = vals - counts * self.frequency[rows, 0] - (counts > 0).to(vals.dtype) * self.presence[rows, 0]
        logits[rows, cols] = vals.to(logits.dtype)
