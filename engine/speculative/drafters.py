"""Drafters without a model: prompt lookup (n-grams) and the grammar itself.

* ``NgramDrafter``: finds the longest recent n-gram (``max_n`` down to ``min_n`` tokens) ending
  the sequence that also occurs earlier in prompt + output, and proposes the tokens that followed
  it there. Extraction jobs copy spans of the document, so this is where drafts are cheapest.
* ``GrammarDrafter``: the constraint itself. Where the grammar admits a single continuation it
  drafts that text's canonical tokens; where it admits only a few tokens it drafts the one seen
  most often so far in the request (ties: the longest). Drafts are verified like any other, so
  the output distribution is unchanged; they are simply cheap and often right.
* ``ChainDrafter``: one drafter's proposal extended by the next (``ngram+grammar``).

Every proposal is cut at the first token the request's grammar would refuse (checked on a copy
of its matcher), so drafts are always grammar-valid, and at the request's draft budget. With
jump-forward on, a draft also ends at the first token after which the grammar forces text:
without speculation that text would be appended right there, so drafting past it would change
the output.
"""

from __future__ import annotations

from array import array
from collections import Counter
from dataclasses import dataclass

import numpy as np
import torch

from grammar import GrammarError, GrammarMatcher, unpack_bitmask

from ..managers.req import Req

# At most this many allowed tokens for the grammar drafter to guess among.
MAX_GRAMMAR_CHOICES = 8


@dataclass
class Draft:
    tokens: list[int]
    probs: torch.Tensor | None = None  # [len(tokens), V]: the drafter's distribution; None = point masses


class Drafter:
    """Proposes up to ``budget`` tokens per request (``budget`` may be 0)."""

    name = "none"
    stop_at_forced = True  # set from the engine's jump-forward setting

    def propose(self, reqs: list[Req], budgets: list[int]) -> list[Draft]:
        return [self.propose_one(r, b) if b > 0 else Draft([]) for r, b in zip(reqs, budgets)]

    def propose_one(self, req: Req, budget: int) -> Draft:  # pragma: no cover - overridden
        raise NotImplementedError

    def on_verified(self, req: Req, drafted: int, accepted: int) -> None:
        """Called after verification (draft models trim their cache)."""

    def release(self, req: Req) -> None:
        """The request finished or left the running batch."""


def grammar_valid_prefix(req: Req, tokens: list[int], stop_at_forced: bool) -> tuple[list[int], GrammarMatcher | None]:
    """The longest prefix of ``tokens`` the request's grammar accepts (ending early where it
    forces text, if ``stop_at_forced``), and a matcher copy advanced past it (None when no
    grammar applies)."""
    if req.grammar is None or not req.grammar_applies:
        return tokens, None
    matcher = req.grammar.copy()
    for i, t in enumerate(tokens):
        try:
            ok = matcher.accept_token(t)
        except GrammarError:
            ok = False
        if not ok or matcher.is_terminated() or (stop_at_forced and forces_text(matcher)):
            return tokens[: i + int(ok)], matcher
    return tokens, matcher


def forces_text(matcher: GrammarMatcher) -> bool:
    """The grammar admits exactly one continuation from here (jump-forward would take it)."""
    try:
        return bool(matcher.forced_continuation())
    except GrammarError:
        return False


class NgramDrafter(Drafter):
    name = "ngram"

    def __init__(self, max_n: int = 4, min_n: int = 1) -> None:
        self.max_n, self.min_n = max_n, min_n

    def propose_one(self, req: Req, budget: int) -> Draft:
        ids = req.fill_ids
        packed = array("I", ids).tobytes()
        for n in range(min(self.max_n, len(ids) - 1), self.min_n - 1, -1):
            start = _last_earlier_occurrence(packed, len(ids), n)
            if start is not None:
                follow = ids[start + n : start + n + budget]
                tokens, _ = grammar_valid_prefix(req, follow, self.stop_at_forced)
                if tokens:
                    return Draft(tokens)
        return Draft([])


def _last_earlier_occurrence(packed: bytes, length: int, n: int) -> int | None:
    """Start (in tokens) of the last occurrence of the final ``n`` tokens that ends before the
    final position, so at least one token follows it."""
    width = 4
    suffix = packed[(length - n) * width :]
    end = (length - 1) * width  # the match must end before the last token
    while True:
        pos = packed.rfind(suffix, 0, end)
        if pos < 0:
            return None
        if pos % width == 0:
            return pos // width
        end = pos + len(suffix) - 1


class GrammarDrafter(Drafter):
    name = "grammar"

    def __init__(self, tokenizer, texts) -> None:  # type: ignore[no-untyped-def]
        self.tokenizer = tokenizer
        self.texts = texts

    def propose_one(self, req: Req, budget: int) -> Draft:
        return Draft(self.extend(req, [], budget))

    def extend(self, req: Req, tokens: list[int], budget: int) -> list[int]:
        """``tokens`` (already grammar-valid) continued while the grammar leaves little choice."""
        tokens, matcher = grammar_valid_prefix(req, tokens, self.stop_at_forced)
        if matcher is None or matcher.is_terminated() or (self.stop_at_forced and tokens and forces_text(matcher)):
            return tokens
        out = list(tokens)
        counts: Counter[int] | None = None
        while len(out) < budget:
            forced = self._forced_tokens(matcher, budget - len(out))
            if forced:
                out += forced
                continue
            if counts is None:
                counts = Counter(req.fill_ids)
            choice = self._few_choice(matcher, counts)
            if choice is None or not matcher.accept_token(choice):
                break
            out.append(choice)
            if matcher.is_terminated() or (self.stop_at_forced and forces_text(matcher)):
                break
        return out

    def _forced_tokens(self, matcher: GrammarMatcher, budget: int) -> list[int]:
        try:
            forced = matcher.forced_continuation()
        except GrammarError:
            return []
        if not forced:
            return []
        ids = self.tokenizer.encode(forced.decode("utf-8"), add_special_tokens=False)[:budget]
        if self.texts.token_bytes(ids) != forced[: len(self.texts.token_bytes(ids))]:
            return []
        accepted = []
        for t in ids:
            if not matcher.accept_token(t):
                break
            accepted.append(t)
        return accepted

    def _few_choice(self, matcher: GrammarMatcher, counts: Counter[int]) -> int | None:
        vocab = matcher.compiled.vocab
        try:
            row = matcher.get_next_token_bitmask()
        except GrammarError:
            return None
        allowed = np.flatnonzero(unpack_bitmask(row, vocab.vocab_size))
        allowed = [int(t) for t in allowed if int(t) not in vocab.eos_token_ids]
        if not allowed or len(allowed) > MAX_GRAMMAR_CHOICES:
            return None
        return max(allowed, key=lambda t: (counts.get(t, 0), len(vocab.token_bytes[t])))


class ChainDrafter(Drafter):
    """``first``'s proposal, then extended by the grammar drafter."""

    def __init__(self, first: Drafter, grammar: GrammarDrafter) -> None:
        self.first, self.grammar = first, grammar
        self.name = f"{first.name}+grammar"

    @property  # type: ignore[override]
    def stop_at_forced(self) -> bool:
        return self.grammar.stop_at_forced

    @stop_at_forced.setter
    def stop_at_forced(self, value: bool) -> None:
        self.first.stop_at_forced = self.grammar.stop_at_forced = value

    def propose(self, reqs: list[Req], budgets: list[int]) -> list[Draft]:
        drafts = self.first.propose(reqs, budgets)
        out = []
        for req, budget, draft in zip(reqs, budgets, drafts):
            if budget <= len(draft.tokens):
                out.append(draft)
                continue
            tokens = self.grammar.extend(req, draft.tokens, budget)
            probs = draft.probs
            if probs is not None and len(tokens) > len(draft.tokens):  # grammar drafts are point masses
                extra = torch.zeros(len(tokens) - len(draft.tokens), probs.shape[1], dtype=probs.dtype)
                extra[torch.arange(extra.shape[0]), torch.tensor(tokens[len(draft.tokens) :])] = 1.0
                probs = torch.cat([probs, extra])
            out.append(Draft(tokens, probs))
        return out

    def on_verified(self, req: Req, drafted: int, accepted: int) -> None:
        self.first.on_verified(req, drafted, accepted)

    def release(self, req: Req) -> None:
        self.first.release(req)
