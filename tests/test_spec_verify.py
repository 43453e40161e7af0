"""Speculative verification keeps the target's distribution: seeded chi-square tests over a
small vocabulary, with a draft model's distribution and with point-mass (n-gram style) drafts,
with and without a grammar-style mask, plus the greedy rule."""

from __future__ import annotations

import itertools

import pytest
import torch

from engine.speculative.verify import verify_drafts

V = 6
SAMPLES = 20_000
# Chi-square critical values at significance 0.001 (df = cells - 1).
CRITICAL = {5: 20.52, 24: 51.18, 35: 66.62}


def _dists(seed: int, positions: int, mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Target p_t and draft q_t for absolute positions t (masked and renormalized if asked)."""
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(positions, V, generator=g) * 1.5, dim=-1)
    q = torch.softmax(torch.randn(positions, V, generator=g) * 1.5, dim=-1)
    if mask is not None:
        p, q = p * mask, q * mask
        p, q = p / p.sum(-1, keepdim=True), q / q.sum(-1, keepdim=True)
    return p, q


def _generate(p: torch.Tensor, q: torch.Tensor, k: int, length: int, g: torch.Generator, point_mass: bool) -> list[int]:
    """Emit ``length`` tokens by repeated draft-then-verify steps; p/q depend on the absolute position."""
    out: list[int] = []
    while len(out) < length:
        t = len(out)
        kk = min(k, p.shape[0] - t - 1)
        if point_mass:  # a deterministic drafter: its guess is whatever it is (here: q's argmax)
            drafts = [int(q[t + j].argmax()) for j in range(kk)]
            probs = None
        else:
            drafts = [int(torch.multinomial(q[t + j], 1, generator=g)) for j in range(kk)]
            probs = q[t : t + kk]
        v = verify_drafts(p[t : t + kk + 1], drafts, probs, g)
        out += drafts[: v.accepted] + [v.token]
    return out[:length]


def _chi_square(counts: torch.Tensor, expected: torch.Tensor) -> float:
    keep = expected > 0
    assert counts[~keep].sum() == 0, "a token with zero target probability was emitted"
    return float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())


@pytest.mark.parametrize("point_mass", [False, True], ids=["draft-model", "point-mass"])
@pytest.mark.parametrize("masked", [False, True], ids=["free", "grammar-mask"])
def test_first_two_tokens_follow_the_target(point_mass, masked):
    mask = torch.tensor([1, 1, 0, 1, 1, 1.0]) if masked else None  # token 2 forbidden, as a grammar would
    p, q = _dists(11 + 2 * point_mass + masked, positions=4, mask=mask)
    g = torch.Generator().manual_seed(1234)
    counts = torch.zeros(V, V)
    for _ in range(SAMPLES):
        a, b = _generate(p, q, k=3, length=2, g=g, point_mass=point_mass)
        counts[a, b] += 1
    expected = torch.outer(p[0], p[1]) * SAMPLES
    cells = int((expected > 0).sum())
    assert _chi_square(counts.flatten(), expected.flatten()) < CRITICAL[cells - 1]


def test_a_biased_verifier_would_be_caught():
    """The test has power: accepting every draft (no rejection) yields q, which it rejects."""
    p, q = _dists(3, positions=2, mask=None)
    g = torch.Generator().manual_seed(5)
    counts = torch.zeros(V)
    for _ in range(SAMPLES):
        counts[int(torch.multinomial(q[0], 1, generator=g))] += 1
    assert _chi_square(counts, p[0] * SAMPLES) > CRITICAL[5]


def test_greedy_accepts_while_the_draft_is_the_argmax():
    p = torch.zeros(4, V)
    for j, best in enumerate([1, 4, 2, 5]):
        p[j, best] = 1.0
    assert verify_drafts(p, [1, 4, 2], None).__dict__ == {"accepted": 3, "token": 5}
    assert verify_drafts(p, [1, 3, 2], None).__dict__ == {"accepted": 1, "token": 4}
    q = torch.full((3, V), 1.0 / V)
    assert verify_drafts(p, [0, 4, 2], q).__dict__ == {"accepted": 0, "token": 1}
    for drafts in itertools.product(range(V), repeat=2):
        got = verify_drafts(p[:3], list(drafts), None)
        expected = 0 if drafts[0] != 1 else (1 if drafts[1] != 4 else 2)
        assert got.accepted == expected


def test_identical_draft_is_always_accepted():
    p, _ = _dists(7, positions=5, mask=None)
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        drafts = [int(torch.multinomial(p[j], 1, generator=g)) for j in range(4)]
        assert verify_drafts(p, drafts, p[:4], g).accepted == 4
