"""``SpeculativeWorker``: what the scheduler calls when speculation is on.

* ``plan``: a draft budget per decoding request (its adaptive ``k``, at most ``max_draft_tokens``,
  never past ``max_new_tokens`` or the context), then the drafter's proposals.
* ``verify``: the target's processed distribution at every verified position (the Sampler's own
  pipeline, with the grammar mask of each position and penalties counting the drafts before it),
  then ``verify_drafts`` per request; logprobs are the target's, reported as without speculation.
* ``k`` adapts per request: all drafts accepted -> one more next time (up to the maximum); a
  rejection -> the accepted length + 1. With ``verify_cost`` set (the cost of one more verified
  row relative to a decode forward, measured per machine and dtype: ``bench/spec_bench.py``'s
  last table), ``k`` is instead the length that maximizes expected output tokens per unit of
  forward cost, ``(1 + a + ... + a^k) / (1 + verify_cost * k)``, where ``a`` is the request's
  recent per-draft acceptance (a decayed count, from a prior of ``PRIOR``); 0 when no length
  pays, and an idle request's estimate drifts back towards the prior so it tries again.

Requests that asked for hidden states, or whose reasoning section is still open, do not draft.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..managers.req import Req
from ..managers.schedule_batch import RowResult, ScheduleBatch
from ..sampling.sampler import NO_TOKEN, Sampler
from ..forward.forward_batch import ForwardBatch
from .drafters import Draft, Drafter
from .verify import verify_drafts

# The cost model's acceptance prior (as pseudo-counts of accepted / rejected drafts), and how
# much of a request's record each verification keeps (recent drafts weigh most).
PRIOR = (1.0, 1.0)
DECAY = 0.7


@dataclass
class SpeculativeConfig:
    algorithm: str = "none"  # none | ngram | grammar | draft_model, or joined with "+" (ngram+grammar)
    num_draft_tokens: int = 4
    draft_model_path: str | None = None
    draft_num_layers: int | None = None  # a self-speculative draft: the target's first layers
    adaptive: bool = True
    jump_forward: bool = True  # the engine's jump-forward: drafts carry forced runs, accepted unverified
    verify_cost: float | None = None  # one more verified row / a decode forward; None: the accept-all rule

    @property
    def enabled(self) -> bool:
        return self.algorithm != "none"


class SpeculativeWorker:
    def __init__(self, drafter: Drafter, sampler: Sampler, config: SpeculativeConfig) -> None:
        self.drafter = drafter
        self.sampler = sampler
        self.config = config
        self.stats = {"steps": 0, "drafted": 0, "accepted": 0, "forced": 0}

    def plan(self, reqs: list[Req]) -> list[Draft]:
        budgets = []
        for req in reqs:
            uncached = req.seq_len - req.kv_len
            room = min(req.remaining_tokens - 1, req.context_len - req.seq_len - 1)
            if self.config.verify_cost is not None and self.config.adaptive:
                k = self._cost_k(req)
            else:
                k = req.spec_k if req.spec_k is not None else self.config.num_draft_tokens
            ok = not req.return_hidden_states and (req.grammar is None or req.reasoning_done) and uncached >= 1
            budgets.append(max(0, min(k, room)) if ok else 0)
        return self.drafter.propose(reqs, budgets)

    def verify(self, batch: ScheduleBatch, logits: torch.Tensor, forward: ForwardBatch, advanced: dict[int, int]) -> list[RowResult]:
        """``logits``: the verified positions of the sampling rows, in virtual-row order
        (``ModelRunner.sampling_logits``); ``forward`` carries their layout and sampling info."""
        info, layout = forward.sampling_info, forward.row_layout
        assert info is not None and layout is not None
        dist = self.sampler.distribution(logits, info)
        chosen = torch.zeros(info.batch_size, dtype=torch.int64, device=logits.device)
        verdicts = []
        for span in layout.spans:
            req, draft, start, k = batch.reqs[span.row], batch.drafts[span.row], span.start, span.drafts
            usable = min(k, advanced.get(span.index, k))
            if draft.forced:  # jump-forward's tokens: certain, whatever the target's distribution
                for j in range(usable):
                    if draft.forced[j]:
                        dist.probs[start + j].zero_()
                        dist.probs[start + j, draft.tokens[j]] = 1.0
            v = verify_drafts(dist.probs[start : start + usable + 1], draft.tokens[:usable],
                              None if draft.probs is None else draft.probs[:usable], req.generator)  # fmt: skip
            emitted = draft.tokens[: v.accepted] + [v.token]
            chosen[start : start + len(emitted)] = torch.tensor(emitted)
            verdicts.append((start, k, v.accepted, emitted))
        out = self.sampler.logprobs_of(dist, chosen, info)
        lps = out.logprobs.tolist() if out.logprobs is not None else None
        top_ids = out.top_logprobs_ids.tolist() if out.top_logprobs_ids is not None else None
        top_vals = out.top_logprobs_values.tolist() if out.top_logprobs_values is not None else None
        results = []
        for (start, k, accepted, emitted), row in zip(verdicts, batch.sampling_rows):
            req = batch.reqs[row]
            if bool(dist.dead[start + accepted]):
                emitted = emitted[:accepted] + [NO_TOKEN]
            span = range(start, start + len(emitted))
            forced = batch.drafts[row].forced
            results.append(RowResult(
                tokens=emitted, accepted=accepted, drafted=k, forced=forced[:accepted] if forced else None,
                logprobs=[lps[j] for j in span] if lps is not None and req.return_logprob else None,
                top_logprobs=[list(zip(top_vals[j], top_ids[j])) for j in span] if top_ids is not None and req.top_logprobs_num else None,
            ))  # fmt: skip
            self.drafter.on_verified(req, k, accepted)
            forced = batch.drafts[row].forced or [False] * k
            self._adapt(req, forced[:k].count(False), forced[:accepted].count(False), k - forced[:k].count(False))
        return results

    def _adapt(self, req: Req, drafted: int, accepted: int, forced: int) -> None:
        """``drafted`` / ``accepted``: free (verified) drafts; forced ones are always accepted."""
        self.stats["steps"] += drafted + forced > 0  # verifications of at least one draft
        self.stats["drafted"] += drafted
        self.stats["accepted"] += accepted
        self.stats["forced"] += forced
        if not self.config.adaptive or drafted == 0:
            return
        good, bad = req.spec_record
        req.spec_record = (good * DECAY + accepted, bad * DECAY + (accepted < drafted))
        top = self.config.num_draft_tokens
        current = req.spec_k if req.spec_k is not None else top
        req.spec_k = min(top, max(current, drafted) + 1) if accepted == drafted else max(1, accepted + 1)

    def _cost_k(self, req: Req) -> int:
        """The draft length with the most expected tokens per unit of forward cost."""
        assert self.config.verify_cost is not None
        good, bad = req.spec_record
        rate = (good + PRIOR[0]) / (good + bad + PRIOR[0] + PRIOR[1])
        best_k, best, gain, p = 0, 1.0, 1.0, 1.0
        for k in range(1, self.config.num_draft_tokens + 1):
            p *= rate
            gain += p
            value = gain / (1.0 + self.config.verify_cost * k)
            if value > best:
                best_k, best = k, value
        if best_k == 0:  # not drafting: forget a little, so the request tries again later
            req.spec_record = (good * DECAY, bad * DECAY)
        return best_k

    def release(self, req: Req) -> None:
        self.drafter.release(req)


def build_worker(config: SpeculativeConfig, runner, tokenizer, texts, vocab) -> SpeculativeWorker | None:  # type: ignore[no-untyped-def]
    """The worker ``config`` asks for, drafting for ``runner``'s model over ``vocab``; None when
    speculation is off."""
    if not config.enabled:
        return None
    drafter = build_drafter(config, runner, tokenizer, texts, vocab.vocab_size, frozenset(vocab.eos_token_ids))
    return SpeculativeWorker(drafter, runner.sampler, config)


def build_drafter(config: SpeculativeConfig, target_runner, tokenizer, texts, vocab_size: int, eos_ids: frozenset[int]) -> Drafter:  # type: ignore[no-untyped-def]
    """The drafter named by ``config.algorithm``."""
    drafter = _build(config, target_runner, tokenizer, texts, vocab_size, eos_ids)
    drafter.jump_forward = config.jump_forward
    if drafter.tokenizer is None:
        drafter.tokenizer, drafter.texts = tokenizer, texts
    return drafter


def _build(config: SpeculativeConfig, target_runner, tokenizer, texts, vocab_size: int, eos_ids: frozenset[int]) -> Drafter:  # type: ignore[no-untyped-def]
    from .drafters import ChainDrafter, GrammarDrafter, NgramDrafter

    parts = [p.strip() for p in config.algorithm.split("+") if p.strip()]
    known = {"ngram", "grammar", "draft_model"}
    bad = [p for p in parts if p not in known]
    if bad or not parts:
        raise ValueError(f"speculative_algorithm: unknown drafter(s) {bad or parts}; use none, {', '.join(sorted(known))} or a '+' join")
    grammar = GrammarDrafter(tokenizer, texts)
    first: Drafter | None = None
    if "draft_model" in parts:
        first = _draft_model(config, target_runner, vocab_size, eos_ids)
    elif "ngram" in parts:
        first = NgramDrafter()
    if first is None:
        return grammar
    return ChainDrafter(first, grammar) if "grammar" in parts else first


def _draft_model(config: SpeculativeConfig, target, vocab_size: int, eos_ids: frozenset[int]) -> Drafter:  # type: ignore[no-untyped-def]
    from ..model_executor.model_runner import ModelRunner
    from .draft_model import DraftModelDrafter

    if config.draft_model_path:
        runner = ModelRunner(
            config.draft_model_path, dtype=target.dtype, device=target.device, max_total_tokens=target.max_total_tokens,
            max_running_requests=target.req_to_token_pool.size, context_length=target.context_len,
        )  # fmt: skip
        if runner.model_config.vocab_size < vocab_size:
            raise ValueError("speculative_draft_model_path: the draft model's vocabulary is smaller than the target's")
        return DraftModelDrafter(runner, vocab_size, eos_ids)
    layers = config.draft_num_layers or max(1, target.model_config.num_layers // 4)
    return DraftModelDrafter.from_target(target, layers, vocab_size, eos_ids)
