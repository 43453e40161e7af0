"""The tie rule, written once: where tokens share a value, the lower token id comes first.

* Greedy: the chosen token is the lowest id among the tokens at the row's highest processed
  logit (after the grammar mask, penalties and min_new_tokens). Half-precision logits tie often
  (bfloat16 values of this size are 0.125 apart), so "the argmax" must name one token, and the
  same one wherever it is computed: the sampler, speculative verification (its point mass), a
  draft model's greedy proposals. They all call ``greedy_tokens``.
* Truncation: top-k / top-p rank tokens by descending probability, ties by ascending id, so a
  cut-off that falls inside a run of equal probabilities keeps the lowest ids of the run; the
  set kept is a function of the probabilities alone (``torch.topk`` leaves the order of equal
  values unspecified). ``descending`` gives that order.

Speculation relies on this for its promises: greedy outputs token-identical to plain decoding,
and sampled outputs distributed as the target's (the verifier uses the same survivors as the
sampler). The logits themselves must also not depend on the forward's shape: see
``engine/layers/attention.py`` (batch invariance).
"""

from __future__ import annotations

import torch


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """[B] int64: per row of ``logits`` [B, V], the lowest token id at the row's maximum."""
    ids = logits.argmax(dim=-1)  # torch documents the first index among equal maxima
    nan = torch.isnan(logits.gather(1, ids.unsqueeze(1))).squeeze(1)  # argmax points at a NaN
    return torch.where(nan, torch.full_like(ids, logits.shape[-1] - 1), ids)  # a NaN row: the last id


def descending(values: torch.Tensor, n: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``n`` (default: all) largest ``values`` [B, V] per row, in descending order, ties by
    ascending id: (values [B, n], ids [B, n]).

    With ``n`` below V the candidates come from ``topk``; a row whose ``n``-th value is positive
    and shared with tokens outside the candidates gets its ties resolved by a full sort, so the
    result never depends on which of the equal values ``topk`` happened to return.
    """
    width = values.shape[-1]
    if n is None or n >= width:
        return values.sort(dim=-1, descending=True, stable=True)
    vals, ids = values.topk(n, dim=-1, sorted=True)
    # Reorder the candidates: ascending id first, then a stable sort by value.
    ids, by_id = ids.sort(dim=-1)
    vals = vals.gather(1, by_id)
    vals, order = vals.sort(dim=-1, descending=True, stable=True)
    ids = ids.gather(1, order)
    last = vals[:, -1:]
    split = (last.squeeze(1) > 0) & ((values >= last).sum(dim=-1) > n)
    if bool(split.any()):
        rows = split.nonzero().squeeze(1)
        full_vals, full_ids = values.index_select(0, rows).sort(dim=-1, descending=True, stable=True)
        vals[rows], ids[rows] = full_vals[:, :n], full_ids[:, :n]
    return vals, ids
