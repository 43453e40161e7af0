"""The logits head: final hidden states -> next-token logits (and, on request, prompt logprobs
and hidden states). Only the positions that are sampled are multiplied by the vocabulary matrix:
each row's last token, or the last ``num_logits`` tokens of a row whose drafts are verified
(every token under ``TARGET_VERIFY``). ``softcap`` (Gemma) maps logits to cap * tanh(l / cap).
A mixture of experts asked for its routing gets, per scored position, the experts each MoE layer
chose there: the routing of the position whose logits sample a token is that token's route."""

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
    routed_experts: torch.Tensor | None = None  # [scored, moe_layers, top_k] int64 expert ids
    routed_expert_weights: torch.Tensor | None = None  # [scored, moe_layers, top_k] float32


def _softcap(logits: torch.Tensor, cap: float | None) -> torch.Tensor:
    return logits if cap is None else torch.tanh(logits / cap) * cap


def compute_logits(
    hidden: torch.Tensor, lm_head: torch.Tensor, batch: ForwardBatch, softcap: float | None = None
) -> LogitsProcessorOutput:
    idx = batch.logit_indices()
    picked = hidden if idx is None else hidden.index_select(0, idx)
    logits = _softcap(linear(picked, lm_head).float(), softcap)
    out = LogitsProcessorOutput(logits)
    if batch.routed_experts is not None:
        ids, weights = batch.routed_experts
        out.routed_experts = ids if idx is None else ids.index_select(0, idx)
        out.routed_expert_weights = weights if idx is None else weights.index_select(0, idx)
    if any(batch.return_input_logprob):
        out.input_token_logprobs = _input_logprobs(hidden, lm_head, batch, softcap)
    if batch.capture_hidden_mode == CaptureHiddenMode.LAST:
        out.hidden_states = picked.float()
    elif batch.capture_hidden_mode == CaptureHiddenMode.FULL:
        out.hidden_states = hidden.float()
    return out


def _input_logprobs(
    hidden: torch.Tensor, lm_head: torch.Tensor, batch: ForwardBatch, softcap: float | None = None
) -> list[torch.Tensor | None]:
    result: list[torch.Tensor | None] = []
    for r, wanted in enumerate(batch.return_input_logprob):
        start, n = batch.extend_start_loc_cpu[r], batch.extend_seq_lens_cpu[r]
        if not wanted or n < 2:
            result.append(torch.empty(0) if wanted else None)
            continue
        logits = _softcap(linear(hidden[start : start + n - 1], lm_head).float(), softcap)
        nxt = batch.input_ids[start + 1 : start + n]
        result.append(torch.log_softmax(logits, dim=-1).gather(1, nxt.unsqueeze(1)).squeeze(1))
    return result
