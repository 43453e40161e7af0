"""``Sampler``: logits [B, V] + ``SamplingBatchInfo`` -> next token ids and logprobs.

One pipeline, in a fixed order (mask first: every later step sees only allowed tokens):
  raw logprobs (if asked) -> logit_bias -> grammar bitmask -> min_new_tokens (stop ids masked)
  -> rows with no allowed token are set aside
  -> penalties -> greedy (``ties.greedy_tokens``) | temperature -> softmax -> top-k -> top-p -> min-p -> draw.

Truncation semantics (as Hugging Face's warpers and vLLM): top-k keeps the k most likely tokens;
top-p then keeps the smallest prefix (by descending probability) of the *renormalized* top-k
distribution whose mass reaches ``top_p``; min-p keeps tokens with ``p >= min_p * p_max``. The
token is drawn from the survivors, renormalized. Ties (greedy, and cut-offs inside a run of
equal probabilities) follow ``ties.py``: the lowest token id first.

Drawing: inverse-CDF with one uniform per row. Seeded rows take their uniform from their own
generator, so a seeded request yields the same tokens whatever else is in the batch; every
operation here is row-wise. A row whose mask allows nothing gets token id ``-1`` and
``finished_no_allowed_token[row] = True`` (the caller finishes it); it never touches other rows.
``logits`` are modified in place.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from grammar.caches import CACHES
from formcast_kernels import apply_token_bitmask_inplace
from formcast_kernels.bitmask_torch import clear_workspaces

from .logprobs import gather_logprobs, truncated_log_softmax
from .sampling_batch_info import SamplingBatchInfo
from .ties import descending, greedy_tokens

CACHES.on_clear(clear_workspaces)  # the mask kernels' buffers go with the grammar caches

NO_TOKEN = -1


@dataclass
class SamplerOutput:
    """What one sampling step returns; row ``i`` is request ``i`` of the batch."""

    next_token_ids: torch.Tensor  # [B] int64; NO_TOKEN (-1) where nothing was allowed
    logprobs: torch.Tensor | None  # [B] float32, chosen token; None when no row asked
    top_logprobs_ids: torch.Tensor | None  # [B, max top_logprobs_num] int64
    top_logprobs_values: torch.Tensor | None  # [B, max top_logprobs_num] float32
    finished_no_allowed_token: torch.Tensor  # [B] bool: the grammar mask allowed no token


@dataclass
class TargetDistribution:
    """What ``Sampler.distribution`` returns: per row, the normalized probabilities a token is
    drawn from, and what ``logprobs_of`` needs to report logprobs as ``sample`` would."""

    probs: torch.Tensor  # [B, V'] float32, rows sum to 1 (dead rows: uniform junk, see ``dead``)
    logits: torch.Tensor  # processed logits (mask, penalties applied)
    keep: torch.Tensor | None  # truncation survivors, None = all
    raw: torch.Tensor | None  # raw logprobs when some row asked for them
    dead: torch.Tensor  # [B] bool: the mask allowed nothing


class Sampler:
    """Stateless; one instance serves every step."""

    def sample(self, logits: torch.Tensor, info: SamplingBatchInfo) -> SamplerOutput:
        """Choose one token per row of ``logits`` [B, V'] (V' >= info.vocab_size is allowed)."""
        logits, raw, dead = self._prepare(logits, info)
        token_ids, keep = self._choose(logits, info)
        token_ids = torch.where(dead, torch.full_like(token_ids, NO_TOKEN), token_ids)
        out = SamplerOutput(token_ids, None, None, None, dead)
        if any(info.return_logprob):
            self._fill_logprobs(out, logits, raw, keep, info)
        return out

    def distribution(self, logits: torch.Tensor, info: SamplingBatchInfo) -> TargetDistribution:
        """The distribution each row would sample from, for speculative verification: the same
        pipeline as ``sample`` up to the draw. Greedy rows are a point mass on the argmax."""
        logits, raw, dead = self._prepare(logits, info)
        argmax = greedy_tokens(logits)
        if info.is_all_greedy:
            probs = torch.zeros_like(logits).scatter_(1, argmax.unsqueeze(1), 1.0)
            return TargetDistribution(probs, logits, None, raw, dead)
        _, keep = self._choose(logits, info, uniforms=torch.zeros(info.batch_size, device=logits.device))
        probs = torch.softmax(logits / info.temperatures, dim=-1)
        if keep is not None:
            probs = probs * keep
        probs = probs / probs.sum(dim=-1, keepdim=True)
        if bool(info.greedy.any()):
            point = torch.zeros_like(probs).scatter_(1, argmax.unsqueeze(1), 1.0)
            probs = torch.where(info.greedy.unsqueeze(1), point, probs)
        return TargetDistribution(probs, logits, keep, raw, dead)

    def logprobs_of(self, dist: TargetDistribution, token_ids: torch.Tensor, info: SamplingBatchInfo) -> SamplerOutput:
        """``SamplerOutput`` for tokens chosen from ``dist`` elsewhere (speculative verification),
        with logprobs reported exactly as ``sample`` reports them."""
        token_ids = torch.where(dist.dead, torch.full_like(token_ids, NO_TOKEN), token_ids)
        out = SamplerOutput(token_ids, None, None, None, dist.dead)
        if any(info.return_logprob):
            self._fill_logprobs(out, dist.logits, dist.raw, dist.keep, info)
        return out

    def _prepare(self, logits: torch.Tensor, info: SamplingBatchInfo) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """Everything before the draw, in place: raw logprobs (if asked), padded columns, the
        grammar bitmask, min_new_tokens, dead rows, penalties."""
        assert logits.dim() == 2 and logits.shape[0] == info.batch_size, "one logits row per request"
        logits = logits.float() if logits.dtype != torch.float32 else logits
        raw = torch.log_softmax(logits, dim=-1) if any(info.raw_logprobs) else None
        if logits.shape[1] > info.vocab_size:
            logits[:, info.vocab_size :] = float("-inf")  # padded embedding rows are never sampled
        _apply_logit_bias(logits, info)  # before the mask: a bias never revives a masked token
        if info.vocab_mask is not None:
            rows = info.grammar_row_indices()
            apply_token_bitmask_inplace(logits, info.vocab_mask, indices=rows, vocab_size=info.vocab_size)
        _suppress_early_stops(logits, info)
        dead = torch.isneginf(logits.amax(dim=-1))
        if bool(dead.any()):
            logits[dead] = 0.0  # keep the row finite; its token is replaced by NO_TOKEN below
        if info.penalties is not None:
            info.penalties.apply(logits)
        return logits, raw, dead

    # --- token choice -----------------------------------------------------------------------

    def _choose(
        self, logits: torch.Tensor, info: SamplingBatchInfo, uniforms: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Token ids [B] and the kept-token mask [B, V'] used for processed logprobs (None = all)."""
        if info.is_all_greedy:
            return greedy_tokens(logits), None
        probs = torch.softmax(logits / info.temperatures, dim=-1)
        uniforms = self._uniforms(info) if uniforms is None else uniforms
        sampled = ~info.greedy
        truncated = sampled & ((info.top_ks < info.vocab_size) | (info.top_ps < 1.0))
        plain = sampled & ~truncated
        ids = greedy_tokens(logits) if bool(info.greedy.any()) else torch.zeros_like(info.top_ks)
        keep = None
        if info.need_top_k or info.need_top_p or info.need_min_p:
            keep = torch.ones_like(probs, dtype=torch.bool)
        if bool(plain.any()):
            rows = plain.nonzero().squeeze(1)
            sub = probs.index_select(0, rows)
            if info.need_min_p:
                sub_keep = sub >= (info.min_ps[rows] * sub.amax(dim=-1)).unsqueeze(1)
                sub = sub * sub_keep
                keep[rows] = sub_keep
            ids[rows] = _inverse_cdf(sub, uniforms[rows])
        if bool(truncated.any()):
            rows = truncated.nonzero().squeeze(1)
            # top_k == vocab_size means "off": widen it to the logits' width (padded columns).
            top_ks = torch.where(info.top_ks >= info.vocab_size, probs.shape[1], info.top_ks)
            sub_ids, sub_keep = _sample_truncated(
                probs.index_select(0, rows), uniforms[rows], top_ks[rows], info.top_ps[rows], info.min_ps[rows]
            )
            ids[rows] = sub_ids
            keep[rows] = sub_keep
        return ids, keep

    def _uniforms(self, info: SamplingBatchInfo) -> torch.Tensor:
        """One U[0, 1) per row; seeded rows draw from their own generator."""
        u = torch.rand(info.batch_size, device=info.device)
        for row, gen in enumerate(info.generators):
            if gen is not None:
                u[row] = torch.rand(1, generator=gen, device=gen.device)[0]
        return u

    # --- logprobs ---------------------------------------------------------------------------

    def _fill_logprobs(
        self,
        out: SamplerOutput,
        logits: torch.Tensor,
        raw: torch.Tensor | None,
        keep: torch.Tensor | None,
        info: SamplingBatchInfo,
    ) -> None:
        scaled = logits / info.temperatures
        processed = truncated_log_softmax(scaled, keep)
        if raw is not None:
            use_raw = torch.tensor(info.raw_logprobs, device=logits.device).unsqueeze(1)
            processed = torch.where(use_raw, raw, processed)
        processed[out.finished_no_allowed_token] = float("-inf")
        chosen, ids, values = gather_logprobs(processed, out.next_token_ids, max(info.top_logprobs_nums))
        out.logprobs, out.top_logprobs_ids, out.top_logprobs_values = chosen, ids, values


def _apply_logit_bias(logits: torch.Tensor, info: SamplingBatchInfo) -> None:
    for row, bias in enumerate(info.logit_biases):
        if bias:
            ids = torch.tensor(list(bias), dtype=torch.int64, device=logits.device)
            values = torch.tensor(list(bias.values()), dtype=logits.dtype, device=logits.device)
            logits[row].index_add_(0, ids, values)


def _suppress_early_stops(logits: torch.Tensor, info: SamplingBatchInfo) -> None:
    """Mask stop/EOS ids on rows short of ``min_new_tokens``, unless that leaves the row no token
    (the grammar allows only a stop: the grammar wins)."""
    for row, left in enumerate(info.min_tokens_left):
        stop_ids = info.min_tokens_stop_ids[row] if left > 0 else None
        if not stop_ids:
            continue
        ids = torch.tensor(stop_ids, device=logits.device)
        saved = logits[row, ids].clone()
        logits[row, ids] = float("-inf")
        if bool(torch.isneginf(logits[row].amax())):
            logits[row, ids] = saved


def _inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Index drawn from each row of (unnormalized, non-negative) ``probs`` with uniform ``u``."""
    cdf = probs.cumsum(dim=-1)
    target = (uniforms * cdf[:, -1]).unsqueeze(1)
    idx = torch.searchsorted(cdf, target, right=True).squeeze(1)
    idx = idx.clamp(max=probs.shape[1] - 1)
    # Rounding can put u * total at the very top: fall back to the last token with mass.
    bad = probs.gather(1, idx.unsqueeze(1)).squeeze(1) <= 0
    if bool(bad.any()):
        last = probs.shape[1] - 1 - (probs > 0).flip(-1).to(torch.int8).argmax(dim=-1)
        idx = torch.where(bad, last, idx)
    return idx


# Candidates taken with ``topk`` before top-k/top-p truncation: a full sort of [64, 151936] costs
# ~20x a top-1024 selection on the CPU. Rows whose kept prefix may reach beyond the candidates
# (a flat distribution with a large top_p) retry with 16x more, then with a full sort, so the
# result is always exact.
_CANDIDATES = 1024
_CANDIDATE_GROWTH = 16


def _sample_truncated(
    probs: torch.Tensor, uniforms: torch.Tensor, top_ks: torch.Tensor, top_ps: torch.Tensor, min_ps: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k, then top-p on the renormalized top-k, then min-p; draw among the survivors."""
    vocab = probs.shape[1]
    limited = top_ks < vocab
    k_max = int(top_ks[limited].max()) if bool(limited.any()) else 0
    total = probs.sum(dim=-1)
    token_ids = torch.empty_like(top_ks)
    keep = torch.zeros_like(probs, dtype=torch.bool)
    rows = torch.arange(probs.shape[0], device=probs.device)
    cand = max(_CANDIDATES, k_max)
    while rows.numel():
        sub = probs.index_select(0, rows)
        if cand < vocab:
            vals, ords = descending(sub, cand)
            inside = limited[rows] | (vals.sum(dim=-1) >= top_ps[rows] * total[rows])
        else:
            vals, ords = descending(sub)
            inside = torch.ones_like(rows, dtype=torch.bool)
        done = rows[inside]
        vals, ords = vals[inside], ords[inside]
        keep_sorted = _truncate_sorted(vals, top_ks[done], top_ps[done], min_ps[done], total[done], vocab)
        picked = _inverse_cdf(vals * keep_sorted, uniforms[done])
        token_ids[done] = ords.gather(1, picked.unsqueeze(1)).squeeze(1)
        keep[done] = torch.zeros(len(done), vocab, dtype=torch.bool, device=probs.device).scatter_(1, ords, keep_sorted)
        rows = rows[~inside]
        cand *= _CANDIDATE_GROWTH
    return token_ids, keep


def _truncate_sorted(
    sorted_p: torch.Tensor,
    top_ks: torch.Tensor,
    top_ps: torch.Tensor,
    min_ps: torch.Tensor,
    total: torch.Tensor,
    vocab: int,
) -> torch.Tensor:
    """Survivor mask over descending probabilities ``sorted_p`` [n, K] (K may be < V).

    ``total`` is the row's whole mass; with top-k active the top-p reference mass is the top-k mass.
    """
    rank = torch.arange(sorted_p.shape[1], device=sorted_p.device).unsqueeze(0)
    keep = rank < top_ks.unsqueeze(1)
    kept_p = sorted_p * keep
    mass = torch.where(top_ks >= vocab, total, kept_p.sum(dim=-1))
    before = kept_p.cumsum(dim=-1) - kept_p  # mass strictly before each token
    top_p = torch.where(top_ps >= 1.0, torch.full_like(top_ps, 2.0), top_ps)
    keep &= before < (top_p * mass).unsqueeze(1)
    keep &= sorted_p >= (min_ps * sorted_p[:, 0]).unsqueeze(1)
    return keep
