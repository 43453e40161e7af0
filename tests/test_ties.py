"""The tie rule (engine/sampling/ties.py): greedy picks the lowest id at the maximum, everywhere
(sampler, the verifier's point mass, a draft model's proposals); truncation ranks equal
probabilities by ascending id, against a plain Python reference on rows full of ties."""

from __future__ import annotations

import random

import pytest
import torch

from engine.sampling import Sampler, SamplingBatchInfo
from engine.sampling.ties import descending, greedy_tokens
from engine.speculative.verify import verify_drafts

V = 40


def _info(params: list[dict], vocab: int = V, grammar: bool = False) -> SamplingBatchInfo:
    from engine.sampling_params import SamplingParams

    sp = [SamplingParams(**p) for p in params]
    return SamplingBatchInfo.from_params(sp, vocab, torch.device("cpu"), generators=[None] * len(sp), has_grammar=[grammar] * len(sp))


def test_greedy_takes_the_lowest_id_at_the_maximum():
    logits = torch.tensor([[0.0, 2.0, 1.0, 2.0], [3.0, 3.0, 3.0, 3.0], [-1.0, -2.0, -1.0, -1.0], [0.0, 0.5, 0.25, 0.75]])
    assert greedy_tokens(logits).tolist() == [1, 0, 0, 3]
    # A masked lowest id never wins; -inf everywhere but one token is that token.
    masked = torch.tensor([[float("-inf"), 2.0, 2.0, float("-inf")]])
    assert greedy_tokens(masked).tolist() == [1]
    # A row holding a NaN (a broken forward) takes the last id, never an id that looks chosen.
    broken = torch.tensor([[0.0, float("nan"), 5.0, 1.0], [float("nan")] * 4, [1.0, 9.0, float("nan"), 2.0]])
    assert greedy_tokens(broken).tolist() == [3, 3, 3]


def _reference_order(row: list[float]) -> list[int]:
    return sorted(range(len(row)), key=lambda t: (-row[t], t))


@pytest.mark.parametrize("seed", range(6))
def test_descending_orders_ties_by_id_whatever_topk_returns(seed):
    rng = random.Random(seed)
    width = rng.choice([50, 300, 2000])
    # Few distinct values, so runs of ties straddle every candidate boundary; some zeros.
    levels = [0.0] + [rng.random() for _ in range(4)]
    rows = [[rng.choice(levels) for _ in range(width)] for _ in range(5)]
    values = torch.tensor(rows)
    rows = values.tolist()  # as float32 holds them
    for n in (1, 7, width // 3, width - 1, None):
        vals, ids = descending(values, n)
        for r, row in enumerate(rows):
            want = _reference_order(row)[: n or width]
            got = ids[r].tolist()
            # Zero-valued tail: a row's candidates among zeros are not ranked (never kept by mass).
            cut = next((i for i, t in enumerate(want) if row[t] == 0.0), len(want))
            assert got[:cut] == want[:cut], (seed, n, r)
            assert torch.equal(vals[r], values[r, ids[r]])


def test_sampler_greedy_follows_the_rule_under_a_grammar_mask():
    logits = torch.zeros(2, V)
    logits[:, [3, 5, 9]] = 1.5  # three-way tie
    info = _info([{"temperature": 0.0}, {"temperature": 0.0}], grammar=True)
    info.vocab_mask_numpy()[1, 0] &= ~(1 << 3)  # row 1: the grammar forbids token 3
    out = Sampler().sample(logits.clone(), info)
    assert out.next_token_ids.tolist() == [3, 5]
    dist = Sampler().distribution(logits.clone(), info)
    assert dist.probs.argmax(dim=-1).tolist() == [3, 5] and bool((dist.probs.sum(-1) == 1).all())


def test_verification_of_a_tied_draft_takes_the_rule_token():
    """The verifier accepts only the rule's token among tied maxima, and corrects to it."""
    logits = torch.zeros(3, V)
    logits[:, [4, 7]] = 2.0
    info = _info([{"temperature": 0.0}] * 3)
    probs = Sampler().distribution(logits, info).probs
    assert verify_drafts(probs, [4, 4], None).__dict__ == {"accepted": 2, "token": 4}
    assert verify_drafts(probs, [4, 7], None).__dict__ == {"accepted": 1, "token": 4}


def test_top_k_cut_inside_a_tie_keeps_the_lowest_ids():
    logits = torch.zeros(1, V)
    logits[0, [30, 2, 17, 11]] = 1.0  # four tied, top_k=2 keeps 2 and 11
    logits[0, 5] = 2.0  # unique best
    for top_k, keep_ids in [(1, {5}), (3, {5, 2, 11}), (4, {5, 2, 11, 17})]:
        info = _info([{"temperature": 1.0, "top_k": top_k}])
        dist = Sampler().distribution(logits.clone(), info)
        assert set(dist.probs[0].nonzero().squeeze(1).tolist()) == keep_ids
        drawn = {int(Sampler().sample(logits.clone(), info).next_token_ids[0]) for _ in range(60)}
        assert drawn <= keep_ids


def test_top_p_cut_inside_a_tie_keeps_the_lowest_ids():
    logits = torch.full((1, V), float("-inf"))
    logits[0, [8, 3, 20, 1]] = 0.0  # four tokens of 0.25 each; top_p 0.5 keeps two: 1 and 3
    info = _info([{"temperature": 1.0, "top_p": 0.5}])
    dist = Sampler().distribution(logits.clone(), info)
    assert dist.probs[0].nonzero().squeeze(1).tolist() == [1, 3]
