"""What travels between the Engine, the Scheduler and the detokenizer.

* ``BatchTokenIDOutput``: one scheduler step's results for the requests that report this step
  (streaming ones with new tokens, and every request that finished): new token ids, finish
  reasons, logprobs and hidden states of those tokens, token counts.
* ``BatchStrOutput``: the same after incremental detokenization, with the text delta of each
  request (never splitting a UTF-8 character, stop strings removed).
* ``RequestTimings``: on a request's last output, where its time to the first token went.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .finish_reason import FinishReason


@dataclass(frozen=True)
class RequestTimings:
    """Seconds from a request's arrival at the scheduler to its first sampled token, in three
    consecutive spans (None: not reached). ``grammar_wait``: its constraint compiling (a few µs
    when cached or unconstrained); ``queue_wait``: then waiting for room in a batch;
    ``prefill_latency``: from its first prompt rows in a batch to its first sampled token (every
    chunk of a long prompt, and the rows of other requests those steps carried)."""

    grammar_wait: float | None = None
    queue_wait: float | None = None
    prefill_latency: float | None = None


@dataclass
class ReqStepOutput:
    rid: str
    new_token_ids: list[int]
    finished_reason: FinishReason | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    skip_special_tokens: bool = True
    stop_strings: tuple[str, ...] = ()
    no_stop_trim: bool = False  # keep a matched stop string in the text
    output_token_logprobs: list[tuple[float, int]] | None = None  # for new_token_ids
    output_top_logprobs: list[list[tuple[float, int]]] | None = None
    input_token_logprobs: list[tuple[float | None, int]] | None = None  # sent once
    hidden_states: list[list[float]] | None = None
    routed_experts: list[list[list[int]]] | None = None  # for new_token_ids: [moe layer][k] expert ids
    routed_expert_weights: list[list[list[float]]] | None = None
    forced_tokens: int = 0  # of completion_tokens, appended by jump-forward
    timings: RequestTimings | None = None  # on a request's last output


@dataclass
class BatchTokenIDOutput:
    outputs: list[ReqStepOutput] = field(default_factory=list)


@dataclass
class ReqStrOutput:
    step: ReqStepOutput
    text_delta: str


@dataclass
class BatchStrOutput:
    outputs: list[ReqStrOutput] = field(default_factory=list)
