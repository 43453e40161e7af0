"""The fewest output tokens a constraint allows, checked against ``max_new_tokens`` at admission.

A budget below the shortest valid output can only end in a cut document (finish ``length``), so
the request is refused before it runs. Wired into the CLI (exit status 2, naming the minimum);
the server and the scheduler do not call it yet: with it, a request with a JSON object schema
hung in the server (not understood yet; suspected contention on the compiled grammar's lock). The grammar knows the shortest completion in bytes from its
start (``CompiledGrammar.shortest_completion``); its length in tokens is that text as the model's
tokenizer encodes it (jump-forward appends forced text the same way). A grammar with no
completion at all is refused outright.
"""

from __future__ import annotations

import weakref
from typing import Any

from grammar import CompiledGrammar

from ..sampling_params import InvalidSamplingParams, SamplingParams

_MIN_TOKENS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def min_output_tokens(compiled: CompiledGrammar, tokenizer: Any) -> int | None:
    """Tokens of the shortest output ``compiled`` accepts (None: it accepts no output)."""
    cached = _MIN_TOKENS.get(compiled)
    if cached is not None:
        return cached if cached >= 0 else None
    try:
        text = compiled.shortest_completion(compiled.initial_state)
    except ValueError:  # no accepting configuration is reachable
        _MIN_TOKENS[compiled] = -1
        return None
    need = len(tokenizer.encode(text.decode("utf-8", errors="replace"), add_special_tokens=False)) if text else 0
    _MIN_TOKENS[compiled] = need
    return need


def check_output_budget(compiled: CompiledGrammar | None, params: SamplingParams, tokenizer: Any) -> None:
    """Raise ``InvalidSamplingParams`` when no output of the constraint fits ``max_new_tokens``."""
    if compiled is None:
        return
    spec = params.grammar
    kind = spec[0] if spec is not None else "grammar"
    need = min_output_tokens(compiled, tokenizer)
    if need is None:
        raise InvalidSamplingParams(kind, "the constraint admits no complete output")
    limit = params.max_new_tokens
    if limit is not None and need > limit:
        raise InvalidSamplingParams(
            "max_new_tokens",
            f"{limit} is below the {need} tokens of the shortest output the {kind} constraint allows; "
            f"allow at least {need}",
        )
