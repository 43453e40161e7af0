"""``Req``: one request from admission to finish, as the scheduler sees it.

Token bookkeeping: ``fill_ids = origin_input_ids + output_ids`` is the whole sequence; the first
``kv_len`` of them have K/V in the cache (listed in ``req_to_token[req_pool_idx]``). Every forward
feeds a row ``fill_ids[kv_len:]`` (cut to the step's prefill budget), so one rule covers a prefill,
a chunk of it, a decode step, jump-forward tokens and a request resumed after retraction. A row
samples when the forward reaches the end of ``fill_ids``.

``check_finished`` applies the finish rules in this order, first hit wins: abort; the last token
is EOS, a stop id, or ended the grammar (``stop`` with the token); a stop string appeared
(``stop`` with the string); ``max_new_tokens`` reached (``length``); the context is full
(``length``). A complete output that lands exactly on the budget is thus reported as ``stop``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from ..sampling_params import STOP_REGEX_WINDOW
from .finish_reason import FinishAbort, FinishLength, FinishMatchedStr, FinishMatchedToken, FinishReason
from .io_struct import RequestTimings

if TYPE_CHECKING:
    from concurrent.futures import Future

    import torch

    from grammar import GrammarMatcher

    from ..mem_cache.radix_cache import TreeNode
    from ..sampling_params import SamplingParams


@dataclass(eq=False)
class Req:
    rid: str
    origin_input_ids: list[int]
    sampling_params: SamplingParams
    eos_token_ids: frozenset[int]
    context_len: int
    return_logprob: bool = False
    top_logprobs_num: int = 0
    return_hidden_states: bool = False
    return_routed_experts: bool = False  # weights too when return_routed_expert_weights
    return_routed_expert_weights: bool = False
    stream: bool = False
    # Filled by the scheduler.
    output_ids: list[int] = field(default_factory=list)
    grammar_future: Future | None = None  # compile in flight; the request waits for it
    grammar: GrammarMatcher | None = None
    reasoning_done: bool = True  # False while a reasoning model thinks (constraint not yet applied)
    generator: torch.Generator | None = None
    req_pool_idx: int | None = None
    kv_len: int = 0  # tokens of fill_ids with K/V in the cache
    last_node: TreeNode | None = None  # radix node locked for this request's cached prefix
    cached_tokens: int = 0  # prompt tokens reused from the prefix cache (reported)
    forced_tokens: int = 0  # output tokens appended by jump-forward, without sampling
    forced_tail: int = 0  # how many of the last output tokens were forced (the n-gram drafter skips structural matches)
    finished_reason: FinishReason | None = None
    to_abort: str | None = None  # message of a pending abort
    abort_field: str | None = None  # the request field an admission refusal names (FinishAbort.field)
    # Per output token (only when asked): (logprob, id), top logprobs, hidden states.
    output_token_logprobs: list[tuple[float, int]] = field(default_factory=list)
    output_top_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)
    input_token_logprobs: list[float | None] = field(default_factory=list)
    hidden_states: list[list[float]] = field(default_factory=list)
    routed_experts: list[list[list[int]]] = field(default_factory=list)  # per output token: [moe layer][k]
    routed_expert_weights: list[list[list[float]]] = field(default_factory=list)
    # Monotonic times of the request's way to its first token (RequestTimings reports them).
    arrival_time: float | None = None  # the scheduler took it in
    grammar_ready_time: float | None = None  # its constraint compiled (or none to compile)
    first_scheduled_time: float | None = None  # its first prefill rows entered a batch
    first_token_time: float | None = None  # its first sampled token

    # Output tokens already handed to the detokenizer.
    sent_offset: int = 0
    reported: bool = False  # the final output (with its finish reason) went to the caller
    retractions: int = 0
    spec_k: int | None = None  # this request's current draft length (adapted by speculation)
    spec_record: tuple[float, float] = (0.0, 0.0)  # decayed (accepted, rejected) free drafts (the cost model's estimate)
    # Token ids -> text, set by the scheduler for stop-string checks.
    decode: Callable[[list[int]], str] | None = field(default=None, repr=False)

    @property
    def fill_ids(self) -> list[int]:
        return self.origin_input_ids + self.output_ids

    @property
    def seq_len(self) -> int:
        return len(self.origin_input_ids) + len(self.output_ids)

    @property
    def finished(self) -> bool:
        return self.finished_reason is not None

    @property
    def max_new_tokens(self) -> int:
        limit = self.sampling_params.max_new_tokens
        room = self.context_len - len(self.origin_input_ids)
        return room if limit is None else min(limit, room)

    @property
    def remaining_tokens(self) -> int:
        return self.max_new_tokens - len(self.output_ids)

    def timings(self) -> RequestTimings:
        """Where the time to the first token went, so far (None: that point not reached)."""
        def span(start: float | None, end: float | None) -> float | None:
            return None if start is None or end is None else max(end - start, 0.0)

        return RequestTimings(
            grammar_wait=span(self.arrival_time, self.grammar_ready_time),
            queue_wait=span(self.grammar_ready_time, self.first_scheduled_time),
            prefill_latency=span(self.first_scheduled_time, self.first_token_time),
        )

    @property
    def grammar_applies(self) -> bool:
        """The grammar masks this request's next token (it has one, the thinking is over, and it
        has not ended)."""
        return self.grammar is not None and self.reasoning_done and not self.grammar.is_terminated()

    def check_finished(self, new_tokens: int = 1) -> None:
        """Set ``finished_reason`` if the last ``new_tokens`` output tokens ended the request."""
        if self.finished:
            return
        if self.to_abort is not None:
            self.finished_reason = FinishAbort(self.to_abort, self.abort_field)
            return
        if not self.output_ids:
            if self.max_new_tokens <= 0:
                self.finished_reason = FinishLength(0)
            return
        params = self.sampling_params
        last = self.output_ids[-1]
        stop_ids = set(params.stop_token_ids or ())
        if not params.ignore_eos:
            stop_ids |= self.eos_token_ids
        ended_grammar = self.grammar is not None and self.grammar.is_terminated()
        if last in stop_ids or ended_grammar:
            self.finished_reason = FinishMatchedToken(last)
            return
        if params.stop:
            matched = self._matched_stop_str(new_tokens)
            if matched is not None:
                self.finished_reason = FinishMatchedStr(matched)
                return
        if params.stop_regex:
            matched = self._matched_stop_regex(new_tokens)
            if matched is not None:
                self.finished_reason = FinishMatchedStr(matched)
                return
        if len(self.output_ids) >= self.max_new_tokens:
            self.finished_reason = FinishLength(self.max_new_tokens)

    def _matched_stop_str(self, new_tokens: int) -> str | None:
        tail = self.tail_text(new_tokens)
        if tail is None:
            return None
        for stop in self.sampling_params.stop or ():
            if stop in tail:
                return stop
        return None

    def _matched_stop_regex(self, new_tokens: int) -> str | None:
        """The text a ``stop_regex`` matched in the output's tail (the first pattern that does)."""
        if self.decode is None:
            return None
        tail = self.decode(self.output_ids[-(STOP_REGEX_WINDOW + new_tokens) :])
        for pattern in self.sampling_params.stop_regex or ():
            found = re.search(pattern, tail)
            if found is not None and found.group(0):
                return found.group(0)
        return None

    def tail_text(self, new_tokens: int) -> str | None:
        """Decoded text of the last tokens, long enough to hold any stop string that the last
        ``new_tokens`` tokens could have completed (a stop string of n bytes spans <= n tokens)."""
        if self.decode is None:
            return None
        longest = max(len(s.encode("utf-8")) for s in self.sampling_params.stop or ())
        return self.decode(self.output_ids[-(longest + new_tokens) :])

    def abort(self, message: str, field: str | None = None) -> None:
        self.to_abort = message
        self.abort_field = field
