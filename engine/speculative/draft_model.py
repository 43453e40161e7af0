"""A draft model: any causal LM of the Llama family sharing the target's tokenizer, with its own
KV pool, or the target's own first layers (a self-speculative draft sharing the target's
tensors; ``num_layers`` = all of them makes the target its own draft, useful to test that every
draft is accepted).

For each request it keeps ``kv_len`` (tokens of the request's sequence with K/V in the draft's
cache). ``propose`` catches the draft up on what it has not seen (the tokens accepted since last
time), then drafts ``k`` tokens one forward at a time, all requests batched: each draft token is
drawn from the draft's processed distribution (the request's temperature / top-k / top-p /
min-p and, under a grammar, the grammar's mask at that position), and that distribution is
returned with the draft so verification can use it. ``on_verified`` keeps the cache entries of
accepted drafts and frees the rest.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from grammar import GrammarError, GrammarMatcher

from ..managers.req import Req
from ..forward.forward_batch import ForwardBatch, ForwardInput
from ..model_executor.model_runner import ModelRunner
from ..sampling.sampling_batch_info import SamplingBatchInfo
from ..constrained.jump_forward import forces_text, jump_forward_tokens, jumps_forward
from .drafters import Draft, Drafter, draft_cap
from .verify import draw_token


@dataclass
class _DraftCache:
    slot: int
    kv_len: int = 0
    locs: list[torch.Tensor] = field(default_factory=list)  # slots of tokens 0..kv_len-1, in chunks


class DraftModelDrafter(Drafter):
    name = "draft_model"

    def __init__(self, runner: ModelRunner, vocab_size: int, eos_ids: frozenset[int]) -> None:
        self.runner = runner
        self.vocab_size = vocab_size
        self.eos_ids = eos_ids
        self._caches: dict[str, _DraftCache] = {}

    @classmethod
    def from_target(cls, target: ModelRunner, num_layers: int, vocab_size: int, eos_ids: frozenset[int]) -> DraftModelDrafter:
        draft = target.model.first_layers(num_layers)
        runner = ModelRunner(
            target.model_path, device=target.device, model=draft, max_total_tokens=target.max_total_tokens,
            max_running_requests=target.req_to_token_pool.size, context_length=target.context_len,
        )  # fmt: skip
        return cls(runner, vocab_size, eos_ids)

    # ------------------------------------------------------------------ proposing
    def propose(self, reqs: list[Req], budgets: list[int]) -> list[Draft]:
        rows = [i for i, b in enumerate(budgets) if b > 0 and self._cache(reqs[i]) is not None]
        tokens: dict[int, list[int]] = {i: [] for i in rows}
        probs: dict[int, list[torch.Tensor]] = {i: [] for i in rows}
        forced: dict[int, list[bool]] = {i: [] for i in rows}
        jumps = {i: jumps_forward(reqs[i], self.jump_forward) and self.tokenizer is not None for i in rows}
        matchers = {i: reqs[i].grammar.copy() for i in rows if reqs[i].grammar is not None and reqs[i].grammar_applies}
        live = list(rows)
        while live:
            feeds = []
            for i in live:
                req, cache = reqs[i], self._caches[reqs[i].rid]
                seq = req.fill_ids + tokens[i]
                feeds.append(seq[cache.kv_len :])
            logits = self._forward([reqs[i] for i in live], feeds)
            if logits is None:  # the draft pool is full: stop drafting this step
                break
            dist = self._distribution(logits, [reqs[i] for i in live], [tokens[i] for i in live], [matchers.get(i) for i in live])
            still = []
            for row, i in enumerate(live):
                req = reqs[i]
                token = draw_token(dist[row], float(torch.rand(1, generator=req.generator)) if req.generator is not None else float(torch.rand(1)))
                matcher = matchers.get(i)
                if matcher is not None and not _advance(matcher, token):
                    cache = self._caches[req.rid]
                    self._truncate(cache, cache.kv_len - 1)  # keep "the draft fed all drafts but the last"
                    continue
                tokens[i].append(token)
                probs[i].append(dist[row])
                forced[i].append(False)
                ended = matcher is not None and (matcher.is_terminated() or (jumps[i] and not self._draft_forced_run(
                    req, matcher, budgets[i], tokens[i], probs[i], forced[i], dist.shape[1])))  # fmt: skip
                free = forced[i].count(False)
                if free < budgets[i] and len(tokens[i]) < draft_cap(req, budgets[i]) and token not in self.eos_ids and not ended:
                    still.append(i)
            live = still
        out = [Draft([]) for _ in reqs]
        for i in rows:
            if tokens[i]:
                out[i] = Draft(tokens[i], torch.stack(probs[i]), forced[i] if any(forced[i]) else None)
        return out

    def _draft_forced_run(self, req: Req, matcher: GrammarMatcher, budget: int, tokens: list[int],
                          probs: list[torch.Tensor], forced: list[bool], width: int) -> bool:  # fmt: skip
        """Where the grammar forces text, append jump-forward's tokens for it (point masses,
        marked forced); False when a forced run is due but does not fit (the draft ends)."""
        if not forces_text(matcher):
            return True
        run = jump_forward_tokens(matcher, self.tokenizer, self.texts, req.remaining_tokens - len(tokens))
        if not run or len(tokens) + len(run) > draft_cap(req, budget):
            return False
        for t in run:
            tokens.append(t)
            forced.append(True)
            point = torch.zeros(width, dtype=probs[-1].dtype, device=probs[-1].device)
            point[t] = 1.0
            probs.append(point)
        return not matcher.is_terminated()

    def _cache(self, req: Req) -> _DraftCache | None:
        cache = self._caches.get(req.rid)
        if cache is None:
            slot = self.runner.req_to_token_pool.alloc()
            if slot is None:
                return None
            cache = self._caches[req.rid] = _DraftCache(slot[0])
        return cache

    def _forward(self, reqs: list[Req], feeds: list[list[int]]) -> torch.Tensor | None:
        pool = self.runner.token_to_kv_pool
        locs = pool.alloc(sum(map(len, feeds)))
        if locs is None:
            return None
        inputs = []
        for req, feed, part in zip(reqs, feeds, locs.split([len(f) for f in feeds])):
            cache = self._caches[req.rid]
            inputs.append(ForwardInput(cache.slot, cache.kv_len, feed, part))
            cache.locs.append(part)
            cache.kv_len += len(feed)
        batch = ForwardBatch.init_new(inputs, self.runner.req_to_token_pool, pool)
        return self.runner.forward(batch).next_token_logits

    def _distribution(self, logits: torch.Tensor, reqs: list[Req], drafted: list[list[int]], matchers: list) -> torch.Tensor:  # type: ignore[type-arg]
        info = SamplingBatchInfo.from_params(
            [r.sampling_params for r in reqs], self.vocab_size, logits.device,
            generators=[None] * len(reqs), has_grammar=[m is not None for m in matchers],
            prompt_ids=[r.origin_input_ids for r in reqs], output_ids=[r.output_ids + d for r, d in zip(reqs, drafted)],
            eos_token_ids=sorted(self.eos_ids),
        )  # fmt: skip
        mask = info.vocab_mask_numpy()
        for row, (req, matcher) in enumerate(zip(reqs, matchers)):
            if matcher is not None:
                try:
                    matcher.fill_next_token_bitmask(mask, row, remaining_tokens=max(1, req.remaining_tokens - len(drafted[row])))
                except GrammarError:
                    mask[row] = np.int32(-1)
        return self.runner.sampler.distribution(logits, info).probs

    # ------------------------------------------------------------------ after verification
    def on_verified(self, req: Req, drafted: int, accepted: int) -> None:
        cache = self._caches.get(req.rid)
        if cache is None or drafted == 0:
            return
        # The draft fed the sequence and some of the drafts (not the last, nor a forced run that
        # ends the draft); the request's sequence plus the accepted drafts stay valid.
        keep = min(cache.kv_len, len(req.fill_ids) + accepted)
        self._truncate(cache, keep)

    def release(self, req: Req) -> None:
        cache = self._caches.pop(req.rid, None)
        if cache is not None:
            self._truncate(cache, 0)
            self.runner.req_to_token_pool.free(cache.slot)

    def _truncate(self, cache: _DraftCache, keep: int) -> None:
        if keep >= cache.kv_len:
            return
        flat = torch.cat(cache.locs) if cache.locs else torch.empty(0, dtype=torch.int64, device=self.runner.device)
        self.runner.token_to_kv_pool.free(flat[keep:])
        cache.locs = [flat[:keep]] if keep else []
        cache.kv_len = keep


def _advance(matcher: GrammarMatcher, token: int) -> bool:
    try:
        return matcher.accept_token(token)
    except GrammarError:
        return False
