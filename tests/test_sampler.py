"""Sampler and SamplingBatchInfo: each parameter against a direct torch computation, seeds,
dead rows, logprob modes, and seeded statistical checks of the sampled distribution."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from engine.sampling import Sampler, SamplingBatchInfo
from engine.sampling.penalties import PenaltyState
from engine.sampling import sampler as sampler_module
from engine.sampling.sampler import NO_TOKEN
from engine.sampling_params import SamplingParams
from grammar.bitmask import pack_bool_mask

V = 64


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny tensors: intra-op threads only add synchronization (badly so on a loaded machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _logits(batch: int, vocab: int = V, seed: int = 0) -> torch.Tensor:
    return torch.randn(batch, vocab, generator=torch.Generator().manual_seed(seed)) * 2


def _sample(logits: torch.Tensor, params: list[SamplingParams], **kw):
    info = SamplingBatchInfo.from_params(params, V, **kw)
    return Sampler().sample(logits.clone(), info), info


def _set_mask(info: SamplingBatchInfo, row: int, allowed: np.ndarray) -> None:
    info.vocab_mask_numpy()[row] = pack_bool_mask(allowed[None])[0]


def _expected_keep(logits: torch.Tensor, temperature: float, top_k: int, top_p: float, min_p: float) -> torch.Tensor:
    """Direct computation of the surviving tokens of one row (HF/vLLM sequential semantics)."""
    probs = torch.softmax(logits / temperature, dim=-1).double()
    order = sorted(range(len(probs)), key=lambda i: (-float(probs[i]), i))
    kept = order[:top_k] if top_k > 0 else order
    total = sum(float(probs[i]) for i in kept)
    prefix, mass = [], 0.0
    for i in kept:
        if mass >= top_p * total - 1e-12:
            break
        prefix.append(i)
        mass += float(probs[i])
    p_max = float(probs[order[0]])
    survivors = [i for i in prefix if float(probs[i]) >= min_p * p_max]
    keep = torch.zeros(len(probs), dtype=torch.bool)
    keep[survivors] = True
    return keep


def test_greedy_is_argmax_after_mask() -> None:
    logits = _logits(3)
    params = [SamplingParams(temperature=0.0), SamplingParams(top_k=1, regex="x"), SamplingParams(temperature=0.0)]
    info = SamplingBatchInfo.from_params(params, V)
    allowed = np.zeros(V, dtype=bool)
    allowed[[5, 9, 40]] = True
    _set_mask(info, 1, allowed)
    out = Sampler().sample(logits.clone(), info)
    assert out.next_token_ids[0] == logits[0].argmax() and out.next_token_ids[2] == logits[2].argmax()
    assert out.next_token_ids[1] == [5, 9, 40][int(logits[1, [5, 9, 40]].argmax())]
    assert out.logprobs is None and not out.finished_no_allowed_token.any()


def test_mask_is_respected_and_rows_without_grammar_are_untouched() -> None:
    rng = np.random.default_rng(0)
    for step in range(20):
        params = [SamplingParams(regex="r", sampling_seed=step), SamplingParams(sampling_seed=step)]
        info = SamplingBatchInfo.from_params(params, V)
        allowed = rng.random(V) < 0.2
        allowed[rng.integers(V)] = True
        _set_mask(info, 0, allowed)
        info.vocab_mask_numpy()[1] = 0  # row 1 has no grammar: its mask row must be ignored
        out = Sampler().sample(_logits(2, seed=step), info)
        assert allowed[int(out.next_token_ids[0])]
        assert out.next_token_ids[1] >= 0 and not out.finished_no_allowed_token.any()


def test_row_with_no_allowed_token_is_finished_without_disturbing_others() -> None:
    params = [SamplingParams(sampling_seed=1, logprobs=True), SamplingParams(regex="r", sampling_seed=2, logprobs=True), SamplingParams(sampling_seed=3, logprobs=True)]
    logits = _logits(3, seed=4)
    info = SamplingBatchInfo.from_params(params, V)
    info.vocab_mask_numpy()[1] = 0
    out = Sampler().sample(logits.clone(), info)
    assert out.finished_no_allowed_token.tolist() == [False, True, False]
    assert out.next_token_ids[1] == NO_TOKEN and out.logprobs[1] == float("-inf")
    alone = [_sample(logits[[i]], [SamplingParams(sampling_seed=s, logprobs=True)])[0] for i, s in ((0, 1), (2, 3))]
    assert out.next_token_ids[[0, 2]].tolist() == [int(a.next_token_ids[0]) for a in alone]
    assert torch.isfinite(out.logprobs[[0, 2]]).all()


def test_padded_logits_are_never_sampled() -> None:
    logits = torch.full((4, V + 16), -5.0)
    logits[:, V:] = 100.0
    out, _ = _sample(logits, [SamplingParams(), SamplingParams(temperature=0.0), SamplingParams(top_p=0.5), SamplingParams(regex="r")])
    assert (out.next_token_ids < V).all()


def test_penalties_match_direct_computation() -> None:
    logits = _logits(2)
    prompt = [[1, 2, 3], [4]]
    output = [[3, 3, 7], [4, 4, 4, 9]]
    params = [
        SamplingParams(frequency_penalty=0.7, presence_penalty=0.3, repetition_penalty=1.5),
        SamplingParams(frequency_penalty=-0.4, repetition_penalty=0.8),
    ]
    state = SamplingBatchInfo.from_params(params, V, prompt_ids=prompt, output_ids=output).penalties
    got = logits.clone()
    state.apply(got)
    expected = logits.clone()
    for r, p in enumerate(params):
        for t in set(prompt[r]) | set(output[r]):
            x = expected[r, t]
            expected[r, t] = x / p.repetition_penalty if x > 0 else x * p.repetition_penalty
        for t in set(output[r]):
            expected[r, t] -= p.frequency_penalty * output[r].count(t) + p.presence_penalty
    assert torch.allclose(got, expected, atol=1e-6)


def test_penalties_count_the_output_so_far() -> None:
    info = SamplingBatchInfo.from_params([SamplingParams(frequency_penalty=1.0), SamplingParams()], V, output_ids=[[5, 5], [6]])
    assert info.penalties.output_counts[0, 5] == 2 and info.penalties.output_counts[1, 6] == 1
    assert info.penalties.output_counts.sum() == 3 and info.penalties.seen[1, 6]
    logits = torch.zeros(2, V)
    info.penalties.apply(logits)
    assert logits[0, 5] == -2.0 and logits[1, 6] == 0.0  # row 1 has no penalty


def test_no_penalty_state_without_penalties() -> None:
    info = SamplingBatchInfo.from_params([SamplingParams()], V)
    assert info.penalties is None and info.vocab_mask is None


@pytest.mark.parametrize("candidates", [1024, 12, 2])  # small: the topk candidate paths and the full-sort fallback
@pytest.mark.parametrize(
    "temperature,top_k,top_p,min_p",
    [(1.0, -1, 1.0, 0.0), (0.7, -1, 1.0, 0.0), (1.0, 5, 1.0, 0.0), (1.3, -1, 0.6, 0.0), (1.0, 10, 0.5, 0.0), (0.9, -1, 1.0, 0.2), (1.0, 20, 0.9, 0.05), (0.3, -1, 0.9, 0.0), (2.0, -1, 0.95, 0.0)],
)
def test_processed_logprobs_are_log_softmax_of_truncated_distribution(temperature, top_k, top_p, min_p, candidates, monkeypatch) -> None:
    monkeypatch.setattr(sampler_module, "_CANDIDATES", candidates)
    logits = _logits(3, seed=9)
    params = [SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, logprobs=True, top_logprobs_num=V, sampling_seed=s) for s in range(3)]
    out, _ = _sample(logits, params)
    for r in range(3):
        keep = _expected_keep(logits[r], temperature, top_k, top_p, min_p)
        expected = torch.log_softmax((logits[r] / temperature).masked_fill(~keep, float("-inf")), dim=-1)
        got = torch.full((V,), float("-inf"))
        got[out.top_logprobs_ids[r]] = out.top_logprobs_values[r]
        assert torch.equal(torch.isinf(got), torch.isinf(expected))
        assert torch.allclose(got[keep], expected[keep], atol=1e-5)
        assert keep[out.next_token_ids[r]]
        assert math.isclose(float(out.logprobs[r]), float(expected[out.next_token_ids[r]]), abs_tol=1e-5)


def test_raw_and_processed_logprobs_with_mask() -> None:
    logits = _logits(2, seed=5)
    params = [SamplingParams(regex="r", logprobs=True, top_logprobs_num=3, temperature=0.5, sampling_seed=1),
              SamplingParams(regex="r", logprobs=True, top_logprobs_num=3, temperature=0.5, sampling_seed=1, logprobs_mode="raw")]
    info = SamplingBatchInfo.from_params(params, V)
    allowed = np.zeros(V, dtype=bool)
    allowed[[3, 17, 30, 31, 50]] = True
    for r in range(2):
        _set_mask(info, r, allowed)
    out = Sampler().sample(torch.cat([logits[:1], logits[:1]]).clone(), info)
    assert out.next_token_ids[0] == out.next_token_ids[1]  # same seed, same row: same token
    masked = logits[0].masked_fill(~torch.from_numpy(allowed), float("-inf"))
    processed = torch.log_softmax(masked / 0.5, dim=-1)
    raw = torch.log_softmax(logits[0], dim=-1)
    tok = int(out.next_token_ids[0])
    assert math.isclose(float(out.logprobs[0]), float(processed[tok]), abs_tol=1e-5)
    assert math.isclose(float(out.logprobs[1]), float(raw[tok]), abs_tol=1e-5)
    assert torch.allclose(out.top_logprobs_values[0], processed.topk(3).values, atol=1e-5)
    assert out.top_logprobs_ids[0].tolist() == processed.topk(3).indices.tolist()
    assert out.top_logprobs_ids[1].tolist() == raw.topk(3).indices.tolist()


def _run_steps(info: SamplingBatchInfo, rows: list[torch.Tensor], steps: int) -> list[list[int]]:
    sampler, seen = Sampler(), []
    for s in range(steps):
        logits = torch.stack([r + 0.1 * s for r in rows])
        seen.append(sampler.sample(logits, info).next_token_ids.tolist())
    return [list(col) for col in zip(*seen)]


def test_seed_reproduces_tokens_whatever_the_batch() -> None:
    target = SamplingParams(sampling_seed=1234, top_p=0.95, temperature=1.2)
    row = _logits(1, seed=77)[0]
    others = [_logits(1, seed=s)[0] for s in range(5)]
    alone = _run_steps(SamplingBatchInfo.from_params([target], V), [row], 8)[0]
    mixes = [
        [SamplingParams(), target, SamplingParams(sampling_seed=5, top_k=3)],
        [SamplingParams(temperature=0.0), SamplingParams(min_p=0.3), SamplingParams(), SamplingParams(top_p=0.5), target],
    ]
    for mix in mixes:
        pos = mix.index(target)
        rows = [others[i] if i != pos else row for i in range(len(mix))]
        torch.manual_seed(len(mix))  # the unseeded rows' randomness differs between runs
        got = _run_steps(SamplingBatchInfo.from_params([SamplingParams(**vars(p)) for p in mix], V), rows, 8)[pos]
        assert got == alone
    other_seed = _run_steps(SamplingBatchInfo.from_params([SamplingParams(sampling_seed=99, top_p=0.95, temperature=1.2)], V), [row], 8)[0]
    assert other_seed != alone


def test_generators_carry_over_to_the_next_batch() -> None:
    params = [SamplingParams(sampling_seed=7), SamplingParams(sampling_seed=8)]
    row = _logits(1, seed=3)[0]
    reference = _run_steps(SamplingBatchInfo.from_params([params[1]], V), [row], 4)[0]
    info = SamplingBatchInfo.from_params(params, V)
    first = _run_steps(info, [row, row], 2)[1]
    info = SamplingBatchInfo.from_params([params[1], SamplingParams()], V, generators=[info.generators[1], None])
    rest = _run_steps(info, [row, row], 2)[0]
    assert first + rest == reference


def test_vocab_mask_numpy_is_a_view() -> None:
    info = SamplingBatchInfo.from_params([SamplingParams(ebnf="root ::= 'a'")], 100)
    assert info.vocab_mask.shape == (1, 4) and info.vocab_mask.dtype == torch.int32
    info.vocab_mask_numpy()[0, 1] = 7
    assert info.vocab_mask[0, 1] == 7
    info.reset_vocab_mask()
    assert (info.vocab_mask == -1).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_logits(dtype: torch.dtype) -> None:
    logits = _logits(2).to(dtype)
    out, _ = _sample(logits, [SamplingParams(temperature=0.0, logprobs=True), SamplingParams(sampling_seed=0, top_k=4)])
    assert out.next_token_ids[0] == logits[0].float().argmax()
    assert logits[1].float().topk(4).indices.eq(out.next_token_ids[1]).any()


@pytest.mark.parametrize(
    "temperature,top_k,top_p,min_p",
    [(1.0, -1, 1.0, 0.0), (0.8, 4, 1.0, 0.0), (1.0, -1, 0.7, 0.0), (1.0, -1, 1.0, 0.15), (1.5, 6, 0.8, 0.1)],
)
@pytest.mark.parametrize("candidates", [1024, 3])
def test_samples_follow_the_renormalized_distribution(temperature, top_k, top_p, min_p, candidates, monkeypatch) -> None:
    """Seeded statistical test: 40k draws over a 10-token vocabulary, every frequency within
    5 standard errors of the renormalized truncated probability, truncated tokens never drawn."""
    monkeypatch.setattr(sampler_module, "_CANDIDATES", candidates)
    vocab, batch, steps = 10, 4000, 10
    row = torch.tensor([2.0, 1.5, 1.4, 1.0, 0.5, 0.2, 0.0, -0.5, -1.0, -3.0])
    params = [SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)] * batch
    info = SamplingBatchInfo.from_params(params, vocab)
    torch.manual_seed(2024)
    sampler = Sampler()
    counts = torch.zeros(vocab)
    for _ in range(steps):
        ids = sampler.sample(row.expand(batch, vocab).clone(), info).next_token_ids
        counts += torch.bincount(ids, minlength=vocab)
    n = batch * steps
    keep = _expected_keep(row, temperature, top_k, top_p, min_p)
    probs = torch.softmax((row / temperature).masked_fill(~keep, float("-inf")), dim=-1).double()
    assert (counts[~keep] == 0).all()
    freq = counts.double() / n
    stderr = torch.sqrt(probs * (1 - probs) / n)
    assert ((freq - probs).abs() <= 5 * stderr + 1e-12).all(), (freq, probs)


def test_min_new_tokens_suppresses_stops_until_reached() -> None:
    logits = torch.zeros(2, V)
    logits[:, 3] = 50.0  # EOS is overwhelmingly likely
    logits[:, 9] = 40.0  # a stop_token_id
    params = [SamplingParams(temperature=0.0, min_new_tokens=2, stop_token_ids=[9]), SamplingParams(temperature=0.0, min_new_tokens=2, ignore_eos=True)]
    outputs: list[list[int]] = [[], [1]]
    step = lambda: SamplingBatchInfo.from_params(params, V, output_ids=outputs, eos_token_ids=[3])  # noqa: E731
    info = step()
    assert info.min_tokens_left == [2, 1] and info.min_tokens_stop_ids == [[3, 9], []]
    sampler = Sampler()
    first = sampler.sample(logits.clone(), info).next_token_ids.tolist()
    assert first[0] not in (3, 9) and first[1] == 3  # ignore_eos: EOS is not a stop here
    outputs = [o + [t] for o, t in zip(outputs, first)]
    assert sampler.sample(logits.clone(), step()).next_token_ids[0] not in (3, 9)
    outputs = [o + [t] for o, t in zip(outputs, first)]
    info = step()
    assert info.min_tokens_left == [0, 0]
    assert sampler.sample(logits.clone(), info).next_token_ids[0] == 3


def test_min_new_tokens_yields_to_a_grammar_that_only_allows_a_stop() -> None:
    info = SamplingBatchInfo.from_params([SamplingParams(min_new_tokens=5, regex="r")], V, eos_token_ids=[3])
    allowed = np.zeros(V, dtype=bool)
    allowed[3] = True
    _set_mask(info, 0, allowed)
    out = Sampler().sample(_logits(1), info)
    assert out.next_token_ids.tolist() == [3] and not out.finished_no_allowed_token.any()
