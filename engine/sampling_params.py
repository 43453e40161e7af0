"""Per-request sampling parameters: validation, normalization, and the OpenAI request mapping.

``SamplingParams`` holds what a user may ask of one request. Grammar fields (``json_schema``,
``regex``, ``ebnf``, ``structural_tag``) are only stored and checked for mutual exclusion here;
compiling them is the grammar layer's job. ``verify()`` raises ``InvalidSamplingParams`` (a
``ValueError``) naming the field and its allowed range.

Conventions:
* ``temperature == 0`` means greedy (argmax); the sampler treats such rows without randomness.
* ``top_k == -1`` (or ``None`` before ``normalize``) disables top-k; ``top_k == 0`` is an error.
* ``max_new_tokens is None`` means "until a stop condition or the context limit".
* ``logprobs_mode``: ``"processed"`` (default) reports logprobs of the distribution actually
  sampled from -- after penalties, the grammar mask (masked tokens are ``-inf``), temperature and
  top-k/top-p/min-p truncation -- as SGLang and vLLM do; ``"raw"`` reports ``log_softmax`` of the
  model's logits before any processing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["InvalidSamplingParams", "SamplingParams", "to_sampling_params", "GRAMMAR_FIELDS", "JSON_WHITESPACE"]

GRAMMAR_FIELDS = ("json_schema", "regex", "ebnf", "structural_tag")
# json_whitespace -> the JSON grammar's layout (grammar.compile_json_schema's ``whitespace``).
JSON_WHITESPACE = {"any": "flexible", "compact": "compact", "pretty": 2}
_MAX_SEED = 2**63 - 1


class InvalidSamplingParams(ValueError):
    """A sampling parameter out of range; ``field`` names it."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name


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
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    n: int = 1
    json_schema: str | dict[str, Any] | bool | None = None
    # OpenAI "strict" flag of response_format.json_schema; the grammar compiler may pick the strict style.
    json_schema_strict: bool = False
    # Whitespace a json_schema output may hold: "any" (the grammar's bounded flexible whitespace),
    # "compact" (none: {"a":1,"b":[2]}) or "pretty" (exactly json.dumps(indent=2)). With
    # "compact" / "pretty" every separator is forced text: jump-forward and speculative drafts
    # append it without the model choosing among spaces and newlines.
    json_whitespace: Literal["any", "compact", "pretty"] = "any"
    regex: str | None = None
    ebnf: str | None = None
    structural_tag: str | dict[str, Any] | None = None
    # Seconds the grammar compiler may spend on this request's constraint; capped by the engine's
    # budget (EngineArgs.grammar_compile_timeout), so a client can ask for less, never more.
    grammar_compile_timeout: float | None = None
    sampling_seed: int | None = None
    logprobs: bool = False
    top_logprobs_num: int = 0
    logprobs_mode: Literal["processed", "raw"] = "processed"
    return_hidden_states: bool = False
    # Filled by normalize(tokenizer): longest stop string in tokens, for stop-string hold-back.
    stop_str_max_len: int = field(default=0, compare=False)

    @property
    def is_greedy(self) -> bool:
        """Argmax decoding (temperature 0 or top_k 1)."""
        return self.temperature == 0.0 or self.top_k == 1

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
        if self.top_k is None:
            self.top_k = -1
        if self.top_logprobs_num and not self.logprobs:
            self.logprobs = True  # asking for top-N implies logprobs
        if tokenizer is not None and self.stop:
            self.stop_str_max_len = max(_token_len(tokenizer, s) for s in self.stop)
        else:
            self.stop_str_max_len = max((len(s.encode("utf-8")) for s in self.stop), default=0)
        return self

    def verify(self, vocab_size: int | None = None) -> None:
        """Raise ``InvalidSamplingParams`` naming the first field out of range."""
        _check_number("temperature", self.temperature, lo=0.0, desc=">= 0")
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
        if not _is_int(self.n) or self.n < 1:
            raise InvalidSamplingParams("n", f"must be an integer >= 1, got {self.n!r}")
        self._verify_lists(vocab_size)
        self._verify_grammar()
        self._verify_logprobs(vocab_size)
        if self.sampling_seed is not None and (not _is_int(self.sampling_seed) or not 0 <= self.sampling_seed <= _MAX_SEED):
            raise InvalidSamplingParams("sampling_seed", f"must be an integer in [0, 2**63), got {self.sampling_seed!r}")

    def _verify_lists(self, vocab_size: int | None) -> None:
        stops = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        for s in stops:
            if not isinstance(s, str) or not s:
                raise InvalidSamplingParams("stop", f"entries must be non-empty strings, got {s!r}")
        for t in self.stop_token_ids or []:
            if not _is_int(t) or t < 0 or (vocab_size is not None and t >= vocab_size):
                bound = f"[0, {vocab_size})" if vocab_size is not None else ">= 0"
                raise InvalidSamplingParams("stop_token_ids", f"ids must be integers in {bound}, got {t!r}")

    def _verify_grammar(self) -> None:
        given = [name for name in GRAMMAR_FIELDS if getattr(self, name) is not None]
        if len(given) > 1:
            raise InvalidSamplingParams(given[1], f"only one of {', '.join(GRAMMAR_FIELDS)} may be set, got {given}")
        if self.json_schema is not None and not isinstance(self.json_schema, (str, dict, bool)):
            raise InvalidSamplingParams("json_schema", "must be a JSON string, an object or a boolean")
        for name in ("regex", "ebnf"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise InvalidSamplingParams(name, f"must be a string, got {type(value).__name__}")
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
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)
    if ok and lo is not None:
        ok = value > lo if lo_open else value >= lo
    if ok and hi is not None:
        ok = value <= hi
    if not ok:
        raise InvalidSamplingParams(name, f"must be {desc}, got {value!r}")


def _token_len(tokenizer: Any, text: str) -> int:
    ids = tokenizer.encode(text, add_special_tokens=False)
    return len(ids)


# --- OpenAI request mapping -------------------------------------------------------------------

# Request fields copied as-is (OpenAI name -> SamplingParams name); includes the SGLang/vLLM
# extensions that OpenAI-compatible servers accept.
_DIRECT_FIELDS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "n": "n",
    "stop": "stop",
    "seed": "sampling_seed",
    "frequency_penalty": "frequency_penalty",
    "presence_penalty": "presence_penalty",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "min_tokens": "min_new_tokens",
    "stop_token_ids": "stop_token_ids",
    "ignore_eos": "ignore_eos",
    "skip_special_tokens": "skip_special_tokens",
    "spaces_between_special_tokens": "spaces_between_special_tokens",
    "regex": "regex",
    "ebnf": "ebnf",
    "json_schema": "json_schema",
    "structural_tag": "structural_tag",
    "grammar_compile_timeout": "grammar_compile_timeout",
    "return_hidden_states": "return_hidden_states",
}


def to_sampling_params(request: dict[str, Any]) -> SamplingParams:
    """Map an OpenAI chat/completions request body onto a normalized, verified ``SamplingParams``.

    * ``max_completion_tokens`` (chat) wins over ``max_tokens``; absent -> no limit (``None``).
    * ``logprobs``: chat sends a bool plus ``top_logprobs``; completions sends an int N (top-N).
    * ``response_format``: ``json_schema`` -> ``json_schema`` = its ``schema`` (``strict`` is kept in
      ``json_schema_strict``); ``json_object`` -> ``{"type": "object"}``; ``text`` -> nothing;
      ``structural_tag`` (SGLang extension) -> ``structural_tag`` = the whole object.
    * ``tool_choice`` with ``tools``: ``"none"``/``"auto"``/absent add no constraint (a free choice
      between text and a call depends on the chat template's call syntax, which is the chat
      layer's concern); ``"required"`` constrains the output to a JSON array of at least one
      ``{"name": <tool name>, "arguments": <that tool's parameters>}`` (exactly one when
      ``parallel_tool_calls`` is false); a named function
      (``{"type": "function", "function": {"name": N}}``) constrains the output to N's
      ``parameters`` schema (the arguments object), as vLLM does.
    """
    params = SamplingParams(max_new_tokens=None)
    for src, dst in _DIRECT_FIELDS.items():
        if request.get(src) is not None:
            setattr(params, dst, request[src])
    limit = request.get("max_completion_tokens", request.get("max_tokens"))
    if limit is not None:
        params.max_new_tokens = limit
    _map_logprobs(request, params)
    _map_response_format(request.get("response_format"), params)
    parallel = request.get("parallel_tool_calls")
    tool_schema = _tool_choice_schema(request.get("tool_choice"), request.get("tools"), parallel is not False)
    if tool_schema is not None:
        if params.grammar is not None:
            raise InvalidSamplingParams("tool_choice", f"cannot be combined with a {params.grammar[0]} constraint")
        params.json_schema = tool_schema
    params.normalize()
    params.verify()
    return params


def _map_logprobs(request: dict[str, Any], params: SamplingParams) -> None:
    logprobs = request.get("logprobs")
    if isinstance(logprobs, bool):  # chat: bool + top_logprobs
        params.logprobs = logprobs
        top = request.get("top_logprobs")
        if top is not None:
            if not logprobs:
                raise InvalidSamplingParams("top_logprobs", "requires logprobs=true")
            params.top_logprobs_num = top
    elif logprobs is not None:  # completions: int N = number of top logprobs
        params.logprobs = True
        params.top_logprobs_num = logprobs


def _map_response_format(fmt: Any, params: SamplingParams) -> None:
    if fmt is None:
        return
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return
    if params.grammar is not None:
        raise InvalidSamplingParams("response_format", f"cannot be combined with {params.grammar[0]}")
    if kind == "json_object":
        params.json_schema = {"type": "object"}
    elif kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict) or "schema" not in spec:
            raise InvalidSamplingParams("response_format.json_schema", "must be an object with a 'schema'")
        params.json_schema = spec["schema"]
        params.json_schema_strict = bool(spec.get("strict", False))
    elif kind == "structural_tag":
        params.structural_tag = {k: v for k, v in fmt.items() if k != "type"}
    else:
        raise InvalidSamplingParams("response_format.type", f"must be text, json_object, json_schema or structural_tag, got {kind!r}")


def _tool_choice_schema(choice: Any, tools: Any, parallel: bool = True) -> dict[str, Any] | None:
    if choice is None or choice in ("none", "auto"):
        return None
    if not tools:
        raise InvalidSamplingParams("tool_choice", "requires a non-empty 'tools' list")
    functions = {}
    for tool in tools:
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or "name" not in fn:
            raise InvalidSamplingParams("tools", f"each tool needs a function with a name, got {tool!r}")
        functions[fn["name"]] = fn.get("parameters") or {"type": "object"}
    if choice == "required":
        calls = [
            {
                "type": "object",
                "properties": {"name": {"const": name}, "arguments": schema},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for name, schema in functions.items()
        ]
        array = {"type": "array", "minItems": 1, "items": calls[0] if len(calls) == 1 else {"anyOf": calls}}
        return array if parallel else {**array, "maxItems": 1}
    if isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        if name not in functions:
            raise InvalidSamplingParams("tool_choice", f"names unknown function {name!r}")
        return functions[name]
    raise InvalidSamplingParams("tool_choice", f"must be none, auto, required or a named function, got {choice!r}")
