"""Jump-forward: the text a grammar forces, appended as tokens without sampling.

Where the constraint admits exactly one continuation (a key, a closing brace, a literal),
sampling it token by token would waste forward passes. The forced bytes are tokenized
canonically and appended at once. The output step and the speculative drafters both use
``jump_forward_tokens``, so a draft that runs through forced text carries exactly the tokens
that jump-forward would have appended there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from grammar import GrammarError, GrammarMatcher

if TYPE_CHECKING:
    from ..managers.detokenizer import TokenTexts
    from ..managers.req import Req


def forces_text(matcher: GrammarMatcher) -> bool:
    """The grammar admits exactly one continuation from here."""
    try:
        return bool(matcher.forced_continuation())
    except GrammarError:
        return False


def jumps_forward(req: Req, enabled: bool) -> bool:
    """Jump-forward applies to ``req``: every reported token must have been sampled when it
    asked for logprobs, hidden states or routed experts."""
    return (
        enabled and req.grammar is not None and req.grammar_applies
        and not req.return_logprob and not req.return_hidden_states and not req.return_routed_experts
    )  # fmt: skip


def jump_forward_tokens(matcher: GrammarMatcher, tokenizer: Any, texts: TokenTexts, budget: int) -> list[int]:
    """The forced text's canonical tokens (at most ``budget``), accepted into ``matcher``.

    Empty when nothing is forced or when the tokenizer does not give the forced bytes back
    (it normalizes them): only sampled tokens are safe there.
    """
    try:
        forced = matcher.forced_continuation()
    except GrammarError:
        return []
    if not forced or budget <= 0:
        return []
    ids = tokenizer.encode(forced.decode("utf-8"), add_special_tokens=False)
    if texts.token_bytes(ids) != forced:
        return []
    accepted: list[int] = []
    for token in ids[:budget]:
        if not matcher.accept_token(token):
            break
        accepted.append(token)
    return accepted
