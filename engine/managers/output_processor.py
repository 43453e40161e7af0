"""After a forward: sampled tokens -> requests. For each row, in order: record the token (and its
logprobs / hidden state when asked), advance the grammar (or watch for the end of the reasoning
section), check the finish rules, and, when the grammar admits exactly one continuation, append
its tokens without sampling (jump-forward; they enter the next forward as one extend).

While a reasoning section is open, the reasoning end tag is watched for (for a constrained
request, or one with ``max_reasoning_tokens``); once the reasoning has used its budget, or only
the room for the shortest constrained answer (and its EOS) is left in ``max_new_tokens``, "\n"
plus the end tag is appended as forced tokens, like jump-forward. A request that asked for
logprobs gets each of them with logprob 0.0 and itself as the only top alternative: reported
logprobs are those of the distribution the token was chosen from (the constraint's), and a forced
token was the only choice; this keeps the logprobs one per output token.

Jump-forward re-tokenizes the forced text with the model's own tokenizer, so the model sees the
tokens it would normally see, and keeps them only if their bytes are exactly the forced bytes
and the grammar accepts each one. It is skipped for requests that asked for logprobs or hidden
states (every reported token must have been sampled) and never exceeds ``max_new_tokens``.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from grammar import GrammarError

from ..layers.logits import LogitsProcessorOutput
from ..mem_cache.memory_pool import TokenToKVPool
from ..sampling.sampler import NO_TOKEN, SamplerOutput
from .detokenizer import TokenTexts
from .finish_reason import FinishDeadEnd
from .io_struct import BatchTokenIDOutput, ReqStepOutput
from .req import Req
from ..constrained.output_budget import min_output_tokens
from ..constrained.jump_forward import forces_text, jump_forward_tokens, jumps_forward
from .schedule_batch import RowResult, ScheduleBatch


class OutputProcessor:
    def __init__(self, tokenizer: Any, texts: TokenTexts, *, enable_jump_forward: bool, reasoning_end: str | None) -> None:
        self.tokenizer = tokenizer
        self.texts = texts
        self.enable_jump_forward = enable_jump_forward
        self.reasoning_end = reasoning_end.encode("utf-8") if reasoning_end else None
        self.stats = {"sampled": 0, "forced": 0, "drafted_kept": 0}
        self._close_ids: list[int] | None = None  # "\n" + the reasoning end tag, as the model's tokens

    # ------------------------------------------------------------------ per step
    def process(
        self,
        batch: ScheduleBatch,
        logits: LogitsProcessorOutput,
        results: list[RowResult],
        advanced: dict[int, int],
        pool: TokenToKVPool,
    ) -> None:
        """Apply one step: ``results`` per sampling row; ``advanced``: how many drafts the mask
        worker pushed into each sampling row's matcher (rolled back to what was accepted)."""
        kv_before = [r.kv_len for r in batch.reqs]
        for row, (r, n) in enumerate(zip(batch.reqs, batch.num_tokens)):
            if row not in batch.sampling_rows:
                r.kv_len += n
        self._record_input_logprobs(batch, logits, kv_before)
        starts = batch.layout.logit_starts()
        for i, (row, result) in enumerate(zip(batch.sampling_rows, results)):
            req = batch.reqs[row]
            produced = len(req.output_ids)
            kept = self._apply_row(req, result, advanced.get(i, 0))
            # KV: what was fed before the drafts, plus the drafts kept; the rest is freed.
            req.kv_len += batch.num_tokens[row] + kept
            rejected = batch.out_cache_loc[row][batch.num_tokens[row] + kept :]
            if rejected.numel():
                pool.free(rejected)
            if req.return_hidden_states and logits.hidden_states is not None and len(req.output_ids) > produced:
                req.hidden_states.append(logits.hidden_states[starts[row]].tolist())  # the state that chose the token
            if req.return_routed_experts and logits.routed_experts is not None:
                self._record_routes(req, logits, starts[row], len(req.output_ids) - produced)
            if not req.finished and not req.reasoning_done:
                self._close_reasoning_if_due(req)
            if not req.finished:
                self._jump_forward(req)

    @staticmethod
    def _record_routes(req: Req, logits: LogitsProcessorOutput, start: int, added: int) -> None:
        """The routes of the positions that produced the ``added`` tokens just kept (drafts that
        verification rejected are not reported)."""
        if added <= 0:
            return
        req.routed_experts.extend(logits.routed_experts[start : start + added].tolist())  # type: ignore[index]
        if req.return_routed_expert_weights and logits.routed_expert_weights is not None:
            req.routed_expert_weights.extend(logits.routed_expert_weights[start : start + added].tolist())

    def _apply_row(self, req: Req, result: RowResult, advanced: int) -> int:
        """Append the row's tokens up to a finish; returns how many drafts were kept. The mask
        worker pushed ``advanced`` drafts into the matcher: they are taken back first and the
        kept tokens accepted one by one, so finish checks always see the matcher in step."""
        if req.grammar is not None and advanced:
            req.grammar.rollback(advanced)
        if result.error is not None:
            req.abort(result.error)
            req.check_finished()
            return 0
        if req.max_new_tokens <= 0:  # prompt scoring only (max_new_tokens=0)
            req.check_finished(0)
            return 0
        tokens = result.tokens
        for j, token in enumerate(tokens):
            if token == NO_TOKEN:
                req.finished_reason = FinishDeadEnd(
                    f"the constraint allows no token after {len(req.output_ids)} output tokens and the output is not complete"
                )
                return min(j, result.accepted)
            if j == result.accepted and j > 0 and self._jump_forward_due(req):
                return j  # without drafts, the forced text would be appended here, not a sample
            if result.forced is not None and j < result.accepted and result.forced[j]:
                self._append_forced(req, token)
            else:
                self._append_sampled(req, token)
                self.stats["drafted_kept"] += j < result.accepted
            if req.return_logprob and result.logprobs is not None:
                req.output_token_logprobs.append((result.logprobs[j], token))
                if result.top_logprobs is not None:
                    req.output_top_logprobs.append(result.top_logprobs[j][: req.top_logprobs_num])
            req.check_finished(1)
            if req.finished:
                return min(j + 1, result.accepted)
        return result.accepted

    def _jump_forward_due(self, req: Req) -> bool:
        return self._jumps_forward(req) and forces_text(req.grammar)  # type: ignore[arg-type]

    def _jumps_forward(self, req: Req) -> bool:
        return jumps_forward(req, self.enable_jump_forward)

    def _append_forced(self, req: Req, token: int) -> None:
        """A draft token that jump-forward would have appended here (accepted unverified)."""
        if not req.grammar.accept_token(token):  # type: ignore[union-attr]
            req.abort(f"internal error: forced draft token {token} is not allowed by the grammar")
            return
        req.output_ids.append(token)
        self._count_forced(req, 1)

    def _append_sampled(self, req: Req, token: int) -> None:
        self.stats["sampled"] += 1
        req.output_ids.append(token)
        req.forced_tail = 0
        if req.first_token_time is None:
            req.first_token_time = time.monotonic()
        if not req.reasoning_done:
            tail = self.texts.token_bytes(req.output_ids[-len(self.reasoning_end or b"") - 1 :])
            if self.reasoning_end and tail.endswith(self.reasoning_end):
                req.reasoning_done = True
            return
        if req.grammar is None:
            return
        try:
            accepted = req.grammar.accept_token(token)
        except GrammarError as exc:
            req.abort(str(exc))
            return
        if not accepted:
            req.abort(f"internal error: sampled token {token} is not allowed by the grammar")

    def _close_reasoning_if_due(self, req: Req) -> None:
        """Append the reasoning end tag (as forced tokens) once the reasoning has used its
        budget, or once only the room for the shortest constrained answer is left."""
        if self.reasoning_end is None:
            return
        close = self._reasoning_close_ids()
        params = req.sampling_params
        limits = [] if params.max_reasoning_tokens is None else [params.max_reasoning_tokens]
        if req.grammar is not None and params.max_new_tokens is not None:
            need = min_output_tokens(req.grammar.compiled)  # taken at compile time; only read here
            if isinstance(need, int):
                limits.append(params.max_new_tokens - len(close) - need - 1)  # and the EOS that ends it
        if not limits or len(req.output_ids) < min(limits):
            return
        req.output_ids.extend(close)
        if req.return_logprob:
            req.output_token_logprobs.extend((0.0, t) for t in close)
            if req.top_logprobs_num:
                req.output_top_logprobs.extend([(0.0, t)] for t in close)
        self._count_forced(req, len(close))
        req.reasoning_done = True
        req.check_finished(len(close))

    def _reasoning_close_ids(self) -> list[int]:
        if self._close_ids is None:
            assert self.reasoning_end is not None
            text = "\n" + self.reasoning_end.decode("utf-8")
            self._close_ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        return self._close_ids

    def _count_forced(self, req: Req, n: int) -> None:
        """``n`` tokens were just appended without sampling."""
        req.forced_tokens += n
        req.forced_tail += n
        self.stats["forced"] += n

    def jump_forward_at_admission(self, req: Req) -> None:
        """Append the text the grammar forces at its start (``{"name":"`` of a JSON object whose
        first key is required) before the prompt is prefilled: the prefill then samples the first
        free token, where it would otherwise sample the first forced one and leave the rest to one
        more forward. At least one token is left to sample; forced text that would end the request
        (a stop string in it) is left to the usual path."""
        if not self._jumps_forward(req) or not req.reasoning_done or req.output_ids:
            return
        ids = jump_forward_tokens(req.grammar, self.tokenizer, self.texts, req.remaining_tokens - 1)  # type: ignore[arg-type]
        if not ids:
            return
        req.output_ids.extend(ids)
        req.check_finished(len(ids))
        if req.finished:
            req.grammar.rollback(len(ids))  # type: ignore[union-attr]
            del req.output_ids[-len(ids) :]
            req.finished_reason = None
            return
        self._count_forced(req, len(ids))

    def _jump_forward(self, req: Req) -> None:
        if not self._jumps_forward(req):
            return
        ids = jump_forward_tokens(req.grammar, self.tokenizer, self.texts, req.remaining_tokens)  # type: ignore[arg-type]
        accepted = len(ids)
        if accepted:
            req.output_ids.extend(ids)
            self._count_forced(req, accepted)
            req.check_finished(accepted)

    @staticmethod
    def results_from_sampler(batch: ScheduleBatch, sampled: SamplerOutput, mask_errors: dict[int, str]) -> list[RowResult]:
        """One ``RowResult`` per sampling row of a step without drafts."""
        ids = sampled.next_token_ids.tolist()
        chosen = sampled.logprobs.tolist() if sampled.logprobs is not None else None
        top_ids = sampled.top_logprobs_ids.tolist() if sampled.top_logprobs_ids is not None else None
        top_vals = sampled.top_logprobs_values.tolist() if sampled.top_logprobs_values is not None else None
        results = []
        for i, row in enumerate(batch.sampling_rows):
            req = batch.reqs[row]
            results.append(RowResult(
                tokens=[ids[i]],
                logprobs=[chosen[i]] if chosen is not None and req.return_logprob else None,
                top_logprobs=[list(zip(top_vals[i], top_ids[i]))] if top_ids is not None and req.top_logprobs_num else None,
                error=mask_errors.get(i),
            ))  # fmt: skip
        return results

    # ------------------------------------------------------------------ prompt logprobs
    def _record_input_logprobs(self, batch: ScheduleBatch, logits: LogitsProcessorOutput, kv_before: list[int]) -> None:
        per_row = logits.input_token_logprobs
        if per_row is None:
            return
        starts = batch.layout.logit_starts()
        for row, req in enumerate(batch.reqs):
            values = per_row[row]
            if values is None:
                continue
            prompt = len(req.origin_input_ids)
            start = kv_before[row]
            if start == 0:
                req.input_token_logprobs.append(None)
            # values[j] is the logprob of the token at start + 1 + j.
            keep = max(0, min(values.numel(), prompt - start - 1))
            req.input_token_logprobs.extend(values[:keep].tolist())
            nxt = start + batch.num_tokens[row]
            if nxt < prompt:  # mid-prefill: this chunk's last logits score the next chunk's first token
                lp = torch.log_softmax(logits.next_token_logits[starts[row]].float(), dim=-1)[req.origin_input_ids[nxt]]
                req.input_token_logprobs.append(float(lp))

    # ------------------------------------------------------------------ reporting
    @staticmethod
    def step_outputs(reqs: list[Req]) -> BatchTokenIDOutput:
        """Outputs for streaming requests with new tokens and for finished requests."""
        out = BatchTokenIDOutput()
        for req in reqs:
            new = req.output_ids[req.sent_offset :]
            if not (req.finished or (req.stream and new)):
                continue
            start = req.sent_offset
            step = ReqStepOutput(
                rid=req.rid,
                new_token_ids=new,
                finished_reason=req.finished_reason,
                prompt_tokens=len(req.origin_input_ids),
                completion_tokens=len(req.output_ids),
                cached_tokens=req.cached_tokens,
                skip_special_tokens=req.sampling_params.skip_special_tokens,
                stop_strings=tuple(req.sampling_params.stop or ()),
                no_stop_trim=req.sampling_params.no_stop_trim,
                forced_tokens=req.forced_tokens,
                timings=req.timings() if req.finished else None,
            )
            if req.return_logprob:
                step.output_token_logprobs = req.output_token_logprobs[start:]
                step.output_top_logprobs = req.output_top_logprobs[start:] if req.top_logprobs_num else None
                if start == 0:
                    step.input_token_logprobs = list(zip(req.input_token_logprobs, req.origin_input_ids))
            if req.return_hidden_states:
                step.hidden_states = req.hidden_states[start:]
            if req.return_routed_experts:
                step.routed_experts = req.routed_experts[start:]
                if req.return_routed_expert_weights:
                    step.routed_expert_weights = req.routed_expert_weights[start:]
            req.sent_offset = len(req.output_ids)
            req.reported = req.finished
            out.outputs.append(step)
        return out
