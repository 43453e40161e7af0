"""OpenAI request body -> ``SamplingParams``: the one place the server's protocol meets sampling.

``to_sampling_params`` takes a chat or completions body (a plain dict, as the client sent it
after pydantic's type checks) and returns normalized, verified ``SamplingParams``. What it maps:

* fields copied as-is (``temperature``, ``top_p``, ``n``, ``stop``, ``seed`` -> ``sampling_seed``,
  the SGLang / vLLM extensions ``top_k``, ``min_p``, ``min_tokens``, ``regex``, ``ebnf``,
  ``choice``, ``stop_regex``, ``max_reasoning_tokens``, ...);
* ``max_completion_tokens`` (chat) wins over ``max_tokens``; absent -> no limit (``None``).
  OpenAI refuses 0; so does this mapping, except on completions with ``echo`` (prompt scoring);
* ``logprobs``: chat sends a bool plus ``top_logprobs``; completions an int N (top-N);
* ``logit_bias``: token id (a string in JSON) -> bias in [-100, 100];
* ``response_format``: ``json_schema`` -> ``json_schema`` = its ``schema`` (``strict`` kept in
  ``json_schema_strict``); ``json_object`` -> ``{"type": "object"}``; ``text`` -> nothing;
  ``structural_tag`` (SGLang) -> ``structural_tag`` = the object;
* ``tools`` + ``tool_choice``: ``required`` and a named function constrain the whole output
  (``tool_calls.forced_call_schema``); ``auto`` is the chat layer's (a structural tag at the
  call syntax's trigger), ``none`` adds nothing.

Errors are ``InvalidSamplingParams`` naming the request field (``api_errors`` turns them into 400s).
"""

from __future__ import annotations

from typing import Any

from ..sampling_params import InvalidSamplingParams, SamplingParams
from .tool_calls import forced_call_schema

__all__ = ["to_sampling_params"]

# Request fields copied as-is (API name -> SamplingParams name); includes the SGLang/vLLM
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
    "stop_regex": "stop_regex",
    "choice": "choice",
    "ignore_eos": "ignore_eos",
    "skip_special_tokens": "skip_special_tokens",
    "no_stop_trim": "no_stop_trim",
    "regex": "regex",
    "ebnf": "ebnf",
    "json_schema": "json_schema",
    "json_schema_draft": "json_schema_draft",
    "json_schema_formats": "json_schema_formats",
    "json_property_order": "json_property_order",
    "json_whitespace": "json_whitespace",
    "structural_tag": "structural_tag",
    "grammar_compile_timeout": "grammar_compile_timeout",
    "return_hidden_states": "return_hidden_states",
    "max_reasoning_tokens": "max_reasoning_tokens",
    "return_routed_experts": "return_routed_experts",
    "return_routed_expert_weights": "return_routed_expert_weights",
}


def to_sampling_params(request: dict[str, Any]) -> SamplingParams:
    """Map an OpenAI chat/completions request body onto a normalized, verified ``SamplingParams``."""
    params = SamplingParams(max_new_tokens=None)
    for src, dst in _DIRECT_FIELDS.items():
        if request.get(src) is not None:
            setattr(params, dst, request[src])
    _map_max_tokens(request, params)
    _map_logprobs(request, params)
    _map_logit_bias(request.get("logit_bias"), params)
    _map_response_format(request.get("response_format"), params)
    tools, choice = request.get("tools"), request.get("tool_choice")
    if choice not in (None, "none", "auto"):
        if params.grammar is not None:
            raise InvalidSamplingParams("tool_choice", f"cannot be combined with a {params.grammar[0]} constraint")
        params.json_schema = forced_call_schema(choice, tools, request.get("parallel_tool_calls") is not False)
    params.normalize()
    params.verify()
    return params


def _map_max_tokens(request: dict[str, Any], params: SamplingParams) -> None:
    name = "max_completion_tokens" if request.get("max_completion_tokens") is not None else "max_tokens"
    limit = request.get(name)
    if limit is None:
        return
    scoring = bool(request.get("echo")) and "prompt" in request  # completions: score the prompt only
    if isinstance(limit, int) and not isinstance(limit, bool) and limit < (0 if scoring else 1):
        # Named max_new_tokens like SamplingParams' own check (api_errors shows it as max_tokens).
        note = "" if scoring else "; 0 only on completions with echo, to score the prompt"
        raise InvalidSamplingParams("max_new_tokens", f"must be an integer >= 1, got {name}={limit!r}{note}")
    params.max_new_tokens = limit


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


def _map_logit_bias(bias: Any, params: SamplingParams) -> None:
    if not bias:
        return
    out: dict[int, float] = {}
    for key, value in bias.items():
        try:
            token = int(key)
        except (TypeError, ValueError):
            raise InvalidSamplingParams("logit_bias", f"keys must be token ids, got {key!r}") from None
        out[token] = value
    params.logit_bias = out


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
