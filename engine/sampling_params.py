"""Per-request sampling parameters: validation and normalization.

``SamplingParams`` holds what a user may ask of one request. Grammar fields (``json_schema``,
``regex``, ``ebnf``, ``structural_tag``) are only stored and checked for mutual exclusion here;
compiling them is the grammar layer's job. ``verify()`` raises ``InvalidSamplingParams`` (a
``ValueError``) naming the field and its allowed range.

Conventions:
* ``temperature == 0`` means greedy (argmax); the sampler treats such rows without randomness.
  ``normalize`` turns a positive temperature below ``MIN_TEMPERATURE`` into 0: dividing float32
  logits by it would overflow to inf and sample NaN, and the distribution is a point mass anyway.
* ``top_k == -1`` (or ``None`` before ``normalize``) disables top-k; ``top_k == 0`` is an error.
* ``max_new_tokens is None`` means "until a stop condition or the context limit".
* ``logprobs_mode``: ``"processed"`` (default) reports logprobs of the distribution actually
  sampled from -- after penalties, the grammar mask (masked tokens are ``-inf``), temperature and
  top-k/top-p/min-p truncation -- as SGLang and vLLM do; ``"raw"`` reports ``log_softmax`` of the
  model's logits before any processing.

Mapping a protocol's request (OpenAI's ``response_format``, ``tool_choice``, ...) onto these
fields is the front end's job: ``engine.entrypoints.openai_mapping``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from .errors import InvalidSamplingParams  # defined with the other field errors; imported from here too

__all__ = ["InvalidSamplingParams", "SamplingParams", "GRAMMAR_FIELDS", "MIN_TEMPERATURE", "JSON_WHITESPACE"]

GRAMMAR_FIELDS = ("json_schema", "regex", "ebnf", "structural_tag", "choice")
# Output tokens (beyond the newest) whose text a stop_regex is searched in at each step.
STOP_REGEX_WINDOW = 64
# json_whitespace -> the JSON grammar's layout (grammar.compile_json_schema's ``whitespace``).
JSON_WHITESPACE = {"any": "flexible", "compact": "compact", "pretty": 2}
_MAX_SEED = 2**63 - 1
# Below this, a positive temperature is greedy: logits / T stays finite in float32 down to about
# 1e-37, but far above that the softmax is already a point mass on the argmax.
MIN_TEMPERATURE = 1e-5


@dataclass
class SamplingParams:
    """What one request asks of the sampler and the stop checks."""

    max_new_tokens: int | None = 128
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = -1
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    # Regular expressions (Python ``re``) that end the request when the output's tail matches
    # one, searched in the text of the last STOP_REGEX_WINDOW tokens; the match is cut from the
    # text like a stop string (kept with no_stop_trim). Streamed text is not held back for them.
    stop_regex: str | list[str] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    # Keep the matched stop string at the end of the text (it is cut by default).
    no_stop_trim: bool = False
    n: int = 1
    # Token id -> value added to its logit before the grammar mask (so a bias never lets a
    # token through that the constraint forbids); values in [-100, 100], as OpenAI's.
    logit_bias: dict[int, float] | None = None
    json_schema: str | dict[str, Any] | bool | None = None
    # OpenAI "strict" flag of response_format.json_schema; the grammar compiler may pick the strict style.
    json_schema_strict: bool = False
    # The draft of a json_schema without "$schema" ("draft-04", "draft-06", "draft-07", "2019-09",
    # "2020-12"; None: formcast's default, 2020-12 rules plus the older spellings), and whether
    # "format" is asserted ("assert", the default: right for generation) or an annotation.
    json_schema_draft: str | None = None
    json_schema_formats: str = "assert"
    # Named properties in the schema's order ("declared", what generation wants) or in every
    # order ("any", a validator's reading; objects of at most 6 named keys, larger ones declared).
    json_property_order: Literal["declared", "any"] = "declared"
    # Whitespace a json_schema output may hold: "any" (the grammar's bounded flexible whitespace),
    # "compact" (none: {"a":1,"b":[2]}) or "pretty" (exactly json.dumps(indent=2)). With
    # "compact" / "pretty" every separator is forced text: jump-forward and speculative drafts
    # append it without the model choosing among spaces and newlines.
    json_whitespace: Literal["any", "compact", "pretty"] = "any"
    regex: str | None = None
    ebnf: str | None = None
    structural_tag: str | dict[str, Any] | None = None
    # The output is exactly one of these strings (a constraint like the others).
    choice: list[str] | None = None
    # Seconds the grammar compiler may spend on this request's constraint; capped by the engine's
    # budget (EngineArgs.grammar_compile_timeout), so a client can ask for less, never more.
    grammar_compile_timeout: float | None = None
    sampling_seed: int | None = None
    logprobs: bool = False
    top_logprobs_num: int = 0
    logprobs_mode: Literal["processed", "raw"] = "processed"
    return_hidden_states: bool = False
    # Reasoning models (EngineArgs.reasoning_end): the most tokens the reasoning may take; then
    # the engine appends the end tag itself and the answer (constrained, if asked) follows. The
    # reasoning is also closed early enough to leave max_new_tokens room for the shortest answer
    # the constraint allows. None: no budget of its own.
    max_reasoning_tokens: int | None = None
    # Mixture-of-experts models: per generated token, the experts each MoE layer chose at the
    # position that produced it (and, with ``return_routed_expert_weights``, their weights).
    return_routed_experts: bool = False
    return_routed_expert_weights: bool = False
    # Filled by normalize(tokenizer): longest stop string in tokens, for stop-string hold-back.
    stop_str_max_len: int = field(default=0, compare=False)

    @property
    def is_greedy(self) -> bool:
        """Argmax decoding (temperature 0, or below ``MIN_TEMPERATURE``, or top_k 1)."""
        return self.temperature < MIN_TEMPERATURE or self.top_k == 1

    @property
    def grammar(self) -> tuple[str, Any] | None:
        """``(kind, source)`` of the one grammar constraint, or None."""
        for name in GRAMMAR_FIELDS:
            value = getattr(self, name)
            if value is not None:
                return name, value
        return None

    def normalize(self, tokenizer: Any = None) -> SamplingParams:
        """Canonical forms in place (stop -> list, top_k None -> -1, ...); returns self.

        With a tokenizer (anything with ``encode(text, add_special_tokens=False)``), also records
        ``stop_str_max_len``, the longest stop string in tokens; without one, its UTF-8 length in
        bytes (an upper bound for byte-level vocabularies).
        """
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        elif self.stop is None:
            self.stop = []
        else:
            self.stop = list(self.stop)
        self.stop_token_ids = [] if self.stop_token_ids is None else list(self.stop_token_ids)
        if isinstance(self.stop_regex, str):
            self.stop_regex = [self.stop_regex]
        elif self.stop_regex is not None:
            self.stop_regex = list(self.stop_regex) or None
        if self.top_k is None:
            self.top_k = -1
        if isinstance(self.temperature, (int, float)) and 0.0 < self.temperature < MIN_TEMPERATURE:
            self.temperature = 0.0
        if self.top_logprobs_num and not self.logprobs:
            self.logprobs = True  # asking for top-N implies logprobs
        if tokenizer is not None and self.stop:
            self.stop_str_max_len = max(_token_len(tokenizer, s) for s in self.stop)
        else:
            self.stop_str_max_len = max((len(s.encode("utf-8")) for s in self.stop), default=0)
        return self

    def verify(self, vocab_size: int | None = None) -> None:
        """Raise ``InvalidSamplingParams`` naming the first field out of range."""
        _check_number("temperature", self.temperature, lo=0.0, desc="a finite number >= 0")
        _check_number("top_p", self.top_p, lo=0.0, hi=1.0, lo_open=True, desc="in (0, 1]")
        _check_number("min_p", self.min_p, lo=0.0, hi=1.0, desc="in [0, 1]")
        _check_number("frequency_penalty", self.frequency_penalty, lo=-2.0, hi=2.0, desc="in [-2, 2]")
        _check_number("presence_penalty", self.presence_penalty, lo=-2.0, hi=2.0, desc="in [-2, 2]")
        _check_number("repetition_penalty", self.repetition_penalty, lo=0.0, lo_open=True, desc="> 0")
        top_k = -1 if self.top_k is None else self.top_k
        if not _is_int(top_k) or (top_k < 1 and top_k != -1):
            raise InvalidSamplingParams("top_k", f"must be -1 (disabled) or >= 1, got {self.top_k!r}")
        if self.max_new_tokens is not None and (not _is_int(self.max_new_tokens) or self.max_new_tokens < 0):
            raise InvalidSamplingParams("max_new_tokens", f"must be an integer >= 0, got {self.max_new_tokens!r}")
        if not _is_int(self.min_new_tokens) or self.min_new_tokens < 0:
            raise InvalidSamplingParams("min_new_tokens", f"must be an integer >= 0, got {self.min_new_tokens!r}")
        if self.max_new_tokens is not None and self.min_new_tokens > self.max_new_tokens:
            raise InvalidSamplingParams(
                "min_new_tokens", f"{self.min_new_tokens} exceeds max_new_tokens={self.max_new_tokens}"
            )
        if self.max_reasoning_tokens is not None and (not _is_int(self.max_reasoning_tokens) or self.max_reasoning_tokens < 0):
            raise InvalidSamplingParams("max_reasoning_tokens", f"must be an integer >= 0, got {self.max_reasoning_tokens!r}")
        if not _is_int(self.n) or self.n < 1:
            raise InvalidSamplingParams("n", f"must be an integer >= 1, got {self.n!r}")
        self._verify_lists(vocab_size)
        self._verify_logit_bias(vocab_size)
        self._verify_grammar()
        self._verify_logprobs(vocab_size)
        if self.sampling_seed is not None and (not _is_int(self.sampling_seed) or not 0 <= self.sampling_seed <= _MAX_SEED):
            raise InvalidSamplingParams("sampling_seed", f"must be an integer in [0, 2**63), got {self.sampling_seed!r}")

    def _verify_lists(self, vocab_size: int | None) -> None:
        stops = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        for s in stops:
            if not isinstance(s, str) or not s:
                raise InvalidSamplingParams("stop", f"entries must be non-empty strings, got {s!r}")
        patterns = [self.stop_regex] if isinstance(self.stop_regex, str) else (self.stop_regex or [])
        for p in patterns:
            if not isinstance(p, str) or not p:
                raise InvalidSamplingParams("stop_regex", f"entries must be non-empty strings, got {p!r}")
            try:
                compiled = re.compile(p)
            except re.error as exc:
                raise InvalidSamplingParams("stop_regex", f"{p!r} is not a valid regular expression: {exc}") from None
            if compiled.fullmatch(""):
                raise InvalidSamplingParams("stop_regex", f"{p!r} matches the empty string (it would stop at once)")
        for t in self.stop_token_ids or []:
            if not _is_int(t) or t < 0 or (vocab_size is not None and t >= vocab_size):
                bound = f"[0, {vocab_size})" if vocab_size is not None else ">= 0"
                raise InvalidSamplingParams("stop_token_ids", f"ids must be integers in {bound}, got {t!r}")

    def _verify_logit_bias(self, vocab_size: int | None) -> None:
        if self.logit_bias is None:
            return
        if not isinstance(self.logit_bias, dict):
            raise InvalidSamplingParams("logit_bias", f"must map token ids to numbers, got {type(self.logit_bias).__name__}")
        for token, value in self.logit_bias.items():
            if not _is_int(token) or token < 0 or (vocab_size is not None and token >= vocab_size):
                bound = f"[0, {vocab_size})" if vocab_size is not None else ">= 0"
                raise InvalidSamplingParams("logit_bias", f"token ids must be integers in {bound}, got {token!r}")
            _check_number("logit_bias", value, lo=-100.0, hi=100.0, desc=f"in [-100, 100] (token {token})")

    def _verify_grammar(self) -> None:
        given = [name for name in GRAMMAR_FIELDS if getattr(self, name) is not None]
        if len(given) > 1:
            raise InvalidSamplingParams(given[1], f"only one of {', '.join(GRAMMAR_FIELDS)} may be set, got {given}")
        if self.json_schema is not None and not isinstance(self.json_schema, (str, dict, bool)):
            raise InvalidSamplingParams("json_schema", "must be a JSON string, an object or a boolean")
        from grammar.json_schema.drafts import DRAFT_NAMES, FORMAT_MODES, draft_named

        try:
            draft_named(self.json_schema_draft)
        except ValueError:
            raise InvalidSamplingParams("json_schema_draft", f"must be one of {', '.join(DRAFT_NAMES)} or null, got {self.json_schema_draft!r}") from None
        if self.json_schema_formats not in FORMAT_MODES:
            raise InvalidSamplingParams("json_schema_formats", f"must be 'assert' or 'annotate', got {self.json_schema_formats!r}")
        if self.json_property_order not in ("declared", "any"):
            raise InvalidSamplingParams("json_property_order", f"must be 'declared' or 'any', got {self.json_property_order!r}")
        for name in ("regex", "ebnf"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise InvalidSamplingParams(name, f"must be a string, got {type(value).__name__}")
        if self.choice is not None and (
            not isinstance(self.choice, (list, tuple)) or not self.choice or not all(isinstance(c, str) for c in self.choice)
        ):
            raise InvalidSamplingParams("choice", f"must be a non-empty list of strings, got {self.choice!r}")
        if self.structural_tag is not None and not isinstance(self.structural_tag, (str, dict)):
            raise InvalidSamplingParams("structural_tag", "must be a JSON string or an object")
        if not isinstance(self.json_whitespace, str) or self.json_whitespace not in JSON_WHITESPACE:
            raise InvalidSamplingParams("json_whitespace", f"must be one of {', '.join(map(repr, JSON_WHITESPACE))}, got {self.json_whitespace!r}")
        if self.json_whitespace != "any" and self.json_schema is None:
            kind = given[0] if given else "no constraint"
            raise InvalidSamplingParams("json_whitespace", f"applies to json_schema only, got {self.json_whitespace!r} with {kind}")
        if self.grammar_compile_timeout is not None:
            _check_number("grammar_compile_timeout", self.grammar_compile_timeout, lo=0.0, lo_open=True, desc="> 0 seconds")

    def _verify_logprobs(self, vocab_size: int | None) -> None:
        if not _is_int(self.top_logprobs_num) or self.top_logprobs_num < 0:
            raise InvalidSamplingParams("top_logprobs_num", f"must be an integer >= 0, got {self.top_logprobs_num!r}")
        if vocab_size is not None and self.top_logprobs_num > vocab_size:
            raise InvalidSamplingParams("top_logprobs_num", f"{self.top_logprobs_num} exceeds vocab_size={vocab_size}")
        if self.logprobs_mode not in ("processed", "raw"):
            raise InvalidSamplingParams("logprobs_mode", f"must be 'processed' or 'raw', got {self.logprobs_mode!r}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_number(
    name: str, value: Any, *, lo: float | None = None, hi: float | None = None, lo_open: bool = False, desc: str
) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok and lo is not None:
        ok = value > lo if lo_open else value >= lo
    if ok and hi is not None:
        ok = value <= hi
    if not ok:
        raise InvalidSamplingParams(name, f"must be {desc}, got {value!r}")


def _token_len(tokenizer: Any, text: str) -> int:
    ids = tokenizer.encode(text, add_special_tokens=False)
    return len(ids)
