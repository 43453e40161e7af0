"""The fewest output tokens a constraint allows, checked against ``max_new_tokens`` at admission.

A budget below the shortest valid output can only end in a cut document (finish ``length``), so
the request is refused before it runs: the CLI exits with status 2, the server answers 400 and the
Engine's scheduler finishes the request with ``abort``, each naming the minimum. The grammar knows
the shortest completion in bytes from its start (``CompiledGrammar.shortest_completion``); its
length in tokens is that text as the model's tokenizer encodes it (jump-forward appends forced
text the same way). A grammar with no completion at all is refused outright.

Thread safety: the distance walk expands the grammar's lazy automaton and the count runs the
tokenizer, and a compiled grammar is shared by every request with the same constraint (the mask
worker expands the same automaton during a forward). So the count is taken once, by the grammar
backend's worker right after the compile and before the grammar is handed to anyone
(``record_min_output_tokens``); the server (on its event loop) and the scheduler only read it
(``check_output_budget`` without a tokenizer). Computed while the grammar was in use -- from the
event loop, a second thread racing the mask worker -- it made requests hang.
"""

from __future__ import annotations

import weakref
from typing import Any

from grammar import CompiledGrammar

from ..sampling_params import InvalidSamplingParams, SamplingParams

_MIN_TOKENS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


_UNKNOWN = object()


def record_min_output_tokens(compiled: CompiledGrammar, tokenizer: Any) -> None:
    """Take the count now (the grammar backend's worker, before the grammar is shared)."""
    min_output_tokens(compiled, tokenizer)


def min_output_tokens(compiled: CompiledGrammar, tokenizer: Any = None) -> Any:
    """Tokens of the shortest output ``compiled`` accepts (None: it accepts no output). Without
    a tokenizer, only a count taken before is returned (``_UNKNOWN`` if there is none)."""
    cached = _MIN_TOKENS.get(compiled)
    if cached is not None:
        return cached if cached >= 0 else None
    if tokenizer is None:
        return _UNKNOWN
    try:
        text = compiled.shortest_completion(compiled.initial_state)
    except ValueError:  # no accepting configuration is reachable
        _MIN_TOKENS[compiled] = -1
        return None
    need = len(tokenizer.encode(text.decode("utf-8", errors="replace"), add_special_tokens=False)) if text else 0
    _MIN_TOKENS[compiled] = need
    return need


def check_output_budget(compiled: CompiledGrammar | None, params: SamplingParams, tokenizer: Any = None) -> None:
    """Raise ``InvalidSamplingParams`` when no output of the constraint fits ``max_new_tokens``.
    Without a tokenizer only a count recorded at compile time is used (none: no check)."""
    if compiled is None:
        return
    spec = params.grammar
    kind = spec[0] if spec is not None else "grammar"
    need = min_output_tokens(compiled, tokenizer)
    if need is _UNKNOWN:
        return
    if need is None:
        raise InvalidSamplingParams(kind, "the constraint admits no complete output")
    limit = params.max_new_tokens
    if limit is not None and need > limit:
        raise InvalidSamplingParams(
            "max_new_tokens",
            f"{limit} is below the {need} tokens of the shortest output the {kind} constraint allows; "
            f"allow at least {need}",
        )
