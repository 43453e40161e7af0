"""Verification of drafted tokens so that speculation never changes the output distribution.

For one request with drafts ``d_1 .. d_k`` proposed from distributions ``q_1 .. q_k`` (a point
mass for deterministic drafters such as n-grams or the grammar), and the target's processed
distributions ``p_1 .. p_{k+1}`` at the same positions (after penalties, the grammar mask,
temperature and top-k / top-p / min-p):

    for j = 1 .. k:  accept d_j with probability min(1, p_j(d_j) / q_j(d_j))
                     on rejection: emit a token drawn from normalize(max(0, p_j - q_j)), stop
    all accepted:    emit a bonus token drawn from p_{k+1}

Each emitted token is then distributed exactly as the target alone would have drawn it (the
standard speculative sampling argument). Greedy requests have point-mass ``p``: the rule reduces
to "accept while the draft is the greedy token (``sampling.ties``: the lowest id at the maximum), then emit it". Exactly ``k + 1`` uniforms are
drawn per request and step (``k`` acceptance tests, one final draw), from the request's own
generator when it is seeded, so a seeded request is reproducible.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Verified:
    accepted: int  # drafts accepted
    token: int  # the token emitted after them (a correction or the bonus token)


def verify_drafts(
    target: torch.Tensor,
    drafts: list[int],
    draft_probs: torch.Tensor | None,
    generator: torch.Generator | None = None,
) -> Verified:
    """``target`` [k+1, V]: p at each position (rows sum to 1); ``draft_probs`` [k, V] or None
    for point-mass drafts."""
    k = len(drafts)
    assert target.shape[0] == k + 1, "one target distribution per draft, plus the bonus position"
    u = torch.rand(k + 1, generator=generator, device=generator.device if generator is not None else target.device).tolist()
    for j, d in enumerate(drafts):
        p = float(target[j, d])
        q = 1.0 if draft_probs is None else float(draft_probs[j, d])
        if q > 0.0 and u[j] * q < p:
            continue
        residual = target[j].clone()
        if draft_probs is None:
            residual[d] = 0.0
        else:
            residual = (residual - draft_probs[j].to(residual.dtype)).clamp_(min=0.0)
        if float(residual.sum()) <= 0.0:  # p == q up to rounding: any draw from p is exact
            residual = target[j]
        return Verified(j, draw_token(residual, u[k]))
    return Verified(k, draw_token(target[k], u[k]))


def draw_token(weights: torch.Tensor, u: float) -> int:
    """Inverse-CDF draw from non-negative ``weights`` [V] with uniform ``u``."""
    cdf = weights.double().cumsum(0)
    point = torch.tensor([u * float(cdf[-1])], dtype=torch.float64, device=cdf.device)
    idx = int(torch.searchsorted(cdf, point, right=True)[0])
    idx = min(idx, weights.numel() - 1)
    if float(weights[idx]) <= 0.0:  # rounding put the draw past the last token with mass
        idx = int(torch.nonzero(weights > 0)[-1])
    return idx
