"""After a forward: sampled tokens -> requests. For each row, in order: record the token (and its
logprobs / hidden state when asked), advance the grammar (or watch for the end of the reasoning
section), check the finish rules, and, when the grammar admits exactly one continuation, append
its tokens without sampling (jump-forward; they enter the next forward as one extend).

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
from ..sampling.sampler import NO_TOKEN, SamplerOutput
from .detokenizer import TokenTexts
from .io_struct import BatchTokenIDOutput, ReqStepOutput
from .req import Req
from .schedule_batch import ScheduleBatch


class OutputProcessor:
    def __init__(self, tokenizer: Any, texts: TokenTexts, *, enable_jump_forward: bool, reasoning_end: str | None) -> None:
        self.tokenizer = tokenizer
        self.texts = texts
        self.enable_jump_forward = enable_jump_forward
        self.reasoning_end = reasoning_end.encode("utf-8") if reasoning_end else None
        self.stats = {"sampled": 0, "forced": 0}

    # ------------------------------------------------------------------ per step
    def process(
        self,
        batch: ScheduleBatch,
        logits: LogitsProcessorOutput,
        sampled: SamplerOutput | None,
        mask_errors: dict[int, str],
    ) -> None:
        kv_before = [r.kv_len for r in batch.reqs]
        for r, n in zip(batch.reqs, batch.num_tokens):
            r.kv_len += n
        self._record_input_logprobs(batch, logits, kv_before)
        if sampled is None:
            return
        ids = sampled.next_token_ids.tolist()
        chosen = sampled.logprobs.tolist() if sampled.logprobs is not None else None
        top_ids = sampled.top_logprobs_ids.tolist() if sampled.top_logprobs_ids is not None else None
        top_vals = sampled.top_logprobs_values.tolist() if sampled.top_logprobs_values is not None else None
        for i, row in enumerate(batch.sampling_rows):
            req = batch.reqs[row]
            if i in mask_errors:
                req.abort(mask_errors[i])
                req.check_finished()
                continue
            if req.max_new_tokens <= 0:  # prompt scoring only (max_new_tokens=0)
                req.check_finished(0)
                continue
            if ids[i] == NO_TOKEN:
                req.abort("the grammar allows no token at this point")
                req.check_finished()
                continue
            self._append_sampled(req, ids[i])
            if req.return_logprob and chosen is not None:
                req.output_token_logprobs.append((chosen[i], ids[i]))
                if req.top_logprobs_num and top_ids is not None and top_vals is not None:
                    k = req.top_logprobs_num
                    req.output_top_logprobs.append(list(zip(top_vals[i][:k], top_ids[i][:k])))
            if req.return_hidden_states and logits.hidden_states is not None:
                req.hidden_states.append(logits.hidden_states[row].tolist())
            req.check_finished(1)
            if not req.finished and self.enable_jump_forward:
                self._jump_forward(req)

    def _append_sampled(self, req: Req, token: int) -> None:
        self.stats["sampled"] += 1
        req.output_ids.append(token)
        if req.first_token_time is None:
            req.first_token_time = time.monotonic()
        if req.grammar is None:
            return
        if not req.reasoning_done:
            tail = self.texts.token_bytes(req.output_ids[-len(self.reasoning_end or b"") - 1 :])
            if self.reasoning_end and tail.endswith(self.reasoning_end):
                req.reasoning_done = True
            return
        try:
            accepted = req.grammar.accept_token(token)
        except GrammarError as exc:
            req.abort(str(exc))
            return
        if not accepted:
            req.abort(f"internal error: sampled token {token} is not allowed by the grammar")

    def _jump_forward(self, req: Req) -> None:
        if req.grammar is None or not req.reasoning_done or req.return_logprob or req.return_hidden_states:
            return
        try:
            forced = req.grammar.forced_continuation()
        except GrammarError:
            return
        budget = req.remaining_tokens
        if not forced or budget <= 0:
            return
        ids = self.tokenizer.encode(forced.decode("utf-8"), add_special_tokens=False)
        if self.texts.token_bytes(ids) != forced:
            return  # the tokenizer normalizes this text: only sampled tokens are safe here
        accepted = 0
        for token in ids[:budget]:
            if not req.grammar.accept_token(token):
                break
            accepted += 1
        if accepted:
            req.output_ids.extend(ids[:accepted])
            req.forced_tokens += accepted
            self.stats["forced"] += accepted
            req.check_finished(accepted)

    # ------------------------------------------------------------------ prompt logprobs
    def _record_input_logprobs(self, batch: ScheduleBatch, logits: LogitsProcessorOutput, kv_before: list[int]) -> None:
        per_row = logits.input_token_logprobs
        if per_row is None:
            return
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
                lp = torch.log_softmax(logits.next_token_logits[row].float(), dim=-1)[req.origin_input_ids[nxt]]
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
                forced_tokens=req.forced_tokens,
            )
            if req.return_logprob:
                step.output_token_logprobs = req.output_token_logprobs[start:]
                step.output_top_logprobs = req.output_top_logprobs[start:] if req.top_logprobs_num else None
                if start == 0:
                    step.input_token_logprobs = list(zip(req.input_token_logprobs, req.origin_input_ids))
            if req.return_hidden_states:
                step.hidden_states = req.hidden_states[start:]
            req.sent_offset = len(req.output_ids)
            out.outputs.append(step)
        return out
