"""Log-probabilities reported with sampled tokens.

Two modes, chosen per request by ``SamplingParams.logprobs_mode``:
* ``"processed"`` (default, as SGLang and vLLM report): ``log_softmax`` of the distribution the
  token was actually drawn from -- after penalties, the grammar mask (masked tokens are ``-inf``),
  temperature, and top-k / top-p / min-p truncation (truncated tokens are ``-inf``, the rest
  renormalized). Greedy rows report the processed distribution at temperature 1, untruncated.
* ``"raw"``: ``log_softmax`` of the model's logits as they came out of the forward pass.
"""

from __future__ import annotations

import torch


def gather_logprobs(
    logprobs: torch.Tensor, token_ids: torch.Tensor, top_n: int
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Chosen-token logprobs [B] and, when ``top_n > 0``, the top-N ids/values [B, top_n]."""
    safe_ids = token_ids.clamp(min=0).unsqueeze(1)
    chosen = logprobs.gather(1, safe_ids).squeeze(1)
    chosen = torch.where(token_ids >= 0, chosen, torch.full_like(chosen, float("-inf")))
    if top_n <= 0:
        return chosen, None, None
    values, ids = logprobs.topk(min(top_n, logprobs.shape[1]), dim=1)
    return chosen, ids, values


def truncated_log_softmax(logits: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
    """``log_softmax`` of ``logits`` with tokens outside ``keep`` set to ``-inf``."""
    if keep is not None:
        logits = logits.masked_fill(~keep, float("-inf"))
    return torch.log_softmax(logits, dim=-1)
