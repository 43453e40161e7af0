"""The logits head: final hidden states -> next-token logits (and, on request, prompt logprobs
and hidden states). Only the positions that are sampled are multiplied by the vocabulary matrix:
each row's last token, or the last ``num_logits`` tokens of a row whose drafts are verified
(every token under ``TARGET_VERIFY``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..forward.forward_batch import CaptureHiddenMode, ForwardBatch
from .cpu_linear import linear


@dataclass
class LogitsProcessorOutput:
    next_token_logits: torch.Tensor  # [sum(num_logits), V] float32: one row per scored position
    # Per row that asked: logprobs [n - 1] of the row's input tokens 2..n given what precedes them.
    input_token_logprobs: list[torch.Tensor | None] | None = None
    hidden_states: torch.Tensor | None = None  # [scored, H] (LAST) or [T, H] (FULL), final-normed


def compute_logits(hidden: torch.Tensor, lm_head: torch.Tensor, batch: ForwardBatch) -> LogitsProcessorOutput:
    idx = batch.logit_indices()
    picked = hidden if idx is None else hidden.index_select(0, idx)
    logits = linear(picked, lm_head).float()
    out = LogitsProcessorOutput(logits)
    if any(batch.return_input_logprob):
        out.input_token_logprobs = _input_logprobs(hidden, lm_head, batch)
    if batch.capture_hidden_mode == CaptureHiddenMode.LAST:
        out.hidden_states = picked.float()
    elif batch.capture_hidden_mode == CaptureHiddenMode.FULL:
        out.hidden_states = hidden.float()
    return out


def _input_logprobs(hidden: torch.Tensor, lm_head: torch.Tensor, batch: ForwardBatch) -> list[torch.Tensor | None]:
    result: list[torch.Tensor | None] = []
    for r, wanted in enumerate(batch.return_input_logprob):
        start, n = batch.extend_start_loc_cpu[r], batch.extend_seq_lens_cpu[r]
        if not wanted or n < 2:
            result.append(torch.empty(0) if wanted else None)
            continue
        logits = linear(hidden[start : start + n - 1], lm_head).float()
        nxt = batch.input_ids[start + 1 : start + n]
        result.append(torch.log_softmax(logits, dim=-1).gather(1, nxt.unsqueeze(1)).squeeze(1))
    return result
