"""Drafters without a model: prompt lookup (n-grams) and the grammar itself.

* ``NgramDrafter``: finds the longest recent n-gram (``max_n`` down to ``min_n`` tokens) ending
  the sequence that also occurs earlier in prompt + output + draft, and proposes the tokens that
  followed it there, ending a copied JSON value with the token that closes it where the copied
  text reaches punctuation; where no match fits the grammar, the layout an earlier output under
  the same constraint wrote after the same tokens, or a long span of the prompt the grammar
  takes (a date). Extraction jobs copy spans of the document, so this is where drafts are
  cheapest.
* ``GrammarDrafter``: the constraint itself. Where the grammar admits a single continuation it
  drafts that text's canonical tokens; where it admits only a few tokens it drafts the one seen
  most often so far in the request (ties: the longest). Drafts are verified like any other, so
  the output distribution is unchanged; they are simply cheap and often right.
* ``ChainDrafter``: one drafter's proposal extended by the next (``ngram+grammar``).

Every proposal is cut at the first token the request's grammar would refuse (checked on a copy
of its matcher), so drafts are always grammar-valid, and at the request's draft budget.

Forced text. Where jump-forward applies, the text a grammar forces is appended without
sampling. A draft runs through it: it carries the very tokens jump-forward would append there
(``jump_forward_tokens``), marked ``forced``, and verification accepts them unconditionally, as
jump-forward would; the positions after them are verified as usual. So a draft crosses keys and
punctuation of a JSON document in one verification, and the output is what it would have been
without speculation. A forced run that does not fit in the draft budget ends the draft before it.
"""

from __future__ import annotations

from array import array
from collections import Counter, OrderedDict, deque
from typing import TYPE_CHECKING

import numpy as np
import torch

from grammar import GrammarError, GrammarMatcher, tokens_allowed, unpack_bitmask

if TYPE_CHECKING:
    from grammar import CompiledGrammar

from ..constrained.jump_forward import forces_text, jump_forward_tokens, jumps_forward
from ..managers.req import Req
from ..managers.schedule_batch import Draft  # a batch datum (the scheduler carries it); imported from here too

# At most this many allowed tokens for the grammar drafter to guess among.
MAX_GRAMMAR_CHOICES = 8
# Forced tokens a draft may carry beyond its budget of free (verified) tokens: they are always
# accepted, so they do not count against the budget, but each still costs a verified position.
MAX_FORCED_EXTRA = 32


def draft_cap(req: Req, budget: int) -> int:
    """Most positions a draft of ``budget`` free tokens may take, forced runs included."""
    room = min(req.remaining_tokens - 1, req.context_len - req.seq_len - 1)
    return max(0, min(room, budget + MAX_FORCED_EXTRA))

__all__ = ["ChainDrafter", "Draft", "Drafter", "DraftState", "GrammarDrafter", "NgramDrafter", "forces_text"]


class Drafter:
    """Proposes up to ``budget`` tokens per request (``budget`` may be 0)."""

    name = "none"
    jump_forward = True  # the engine's jump-forward setting
    # Draft a forced run after free (unverified) tokens of the same draft; if one of those is
    # rejected, every row of the run was computed for nothing.
    forced_after_free = True
    tokenizer = None  # set by ``build_drafter``; needed to draft through forced text
    texts = None

    def propose(self, reqs: list[Req], budgets: list[int]) -> list[Draft]:
        return [self.propose_one(r, b) if b > 0 else Draft([]) for r, b in zip(reqs, budgets)]

    def propose_one(self, req: Req, budget: int) -> Draft:
        state = self.start(req, budget)
        self.run(state)
        return state.draft()

    def run(self, state: DraftState) -> None:
        """Extend ``state`` until the budget is used or no drafter has anything to add,
        drafting forced runs in between."""
        while not state.full and not state.ended:
            if state.at_forced:
                if not state.push_forced():
                    break
                continue
            before = len(state.tokens)
            self.extend(state)
            if len(state.tokens) == before:
                break

    def start(self, req: Req, budget: int) -> DraftState:
        jumps = jumps_forward(req, self.jump_forward) and self.tokenizer is not None
        return DraftState(req, budget, jumps, self.tokenizer, self.texts, self.forced_after_free)

    def extend(self, state: DraftState) -> None:  # pragma: no cover - overridden by model-free drafters
        raise NotImplementedError

    def on_verified(self, req: Req, drafted: int, accepted: int) -> None:
        """Called after verification (draft models trim their cache)."""

    def release(self, req: Req) -> None:
        """The request finished or left the running batch."""


class DraftState:
    """A draft under construction: its tokens, which of them are forced, and a copy of the
    request's matcher advanced past them (None when no grammar applies)."""

    def __init__(self, req: Req, budget: int, jumps: bool, tokenizer, texts, forced_after_free: bool = True) -> None:  # type: ignore[no-untyped-def]
        self.req, self.budget, self.jumps = req, budget, jumps
        self.forced_after_free = forced_after_free  # the drafter's setting (Drafter.forced_after_free)
        self.cap = draft_cap(req, budget)
        self.tokenizer, self.texts = tokenizer, texts
        self.tokens: list[int] = []
        self.forced: list[bool] = []
        self.matcher: GrammarMatcher | None = req.grammar.copy() if req.grammar is not None and req.grammar_applies else None
        self.ended = False  # the grammar terminated, or refused a proposed token's successor

    @property
    def full(self) -> bool:
        return self.room <= 0

    @property
    def room(self) -> int:
        """Free tokens that may still be added."""
        return min(self.budget - self.forced.count(False), self.cap - len(self.tokens))

    @property
    def at_forced(self) -> bool:
        return self.jumps and self.matcher is not None and forces_text(self.matcher)

    def sequence(self) -> list[int]:
        return self.req.fill_ids + self.tokens

    def forced_tail(self) -> int:
        """How many of the sequence's last tokens were forced (drafted forced runs, then the
        request's own jump-forward tokens)."""
        n = 0
        for f in reversed(self.forced):
            if not f:
                return n
            n += 1
        return n + self.req.forced_tail

    def push(self, tokens: list[int]) -> int:
        """Append free tokens up to the budget, stopping at the first the grammar refuses and
        where it starts forcing text; returns how many were appended."""
        n = 0
        for t in tokens[: self.room]:
            if self.matcher is not None:
                try:
                    ok = self.matcher.accept_token(t)
                except GrammarError:
                    ok = False
                if not ok:
                    break
            self.tokens.append(t)
            self.forced.append(False)
            n += 1
            if self.matcher is not None and self.matcher.is_terminated():
                self.ended = True
                break
            if self.at_forced:
                break
        return n

    def push_forced(self) -> bool:
        """Append the forced run jump-forward would append here, if it fits in the budget."""
        assert self.matcher is not None
        if not self.forced_after_free and False in self.forced:
            self.ended = True
            return False
        run = jump_forward_tokens(self.matcher, self.tokenizer, self.texts, self.req.remaining_tokens - len(self.tokens))
        if not run or len(self.tokens) + len(run) > self.cap:
            self.ended = True  # the matcher copy is past a partial run: nothing more to draft
            return False
        self.tokens += run
        self.forced += [True] * len(run)
        if self.matcher.is_terminated():
            self.ended = True
        return True

    def adopt(self, draft: Draft) -> bool:
        """Take over another drafter's grammar-valid proposal; False if the grammar refuses it."""
        for t in draft.tokens:
            if self.matcher is not None and not self.matcher.accept_token(t):
                return False
        self.tokens = list(draft.tokens)
        self.forced = list(draft.forced) if draft.forced else [False] * len(draft.tokens)
        self.ended = self.matcher is not None and self.matcher.is_terminated()
        return True

    def draft(self) -> Draft:
        return Draft(self.tokens, forced=self.forced if any(self.forced) else None)


class NgramDrafter(Drafter):
    """Prompt lookup. ``max_n`` down to ``min_n``: the longest suffix of the sequence found
    earlier wins; at one length, an occurrence whose continuation lies in the prompt (the text
    values are copied from) wins over one in the output (``prefer_prompt``). A suffix made only
    of structure (tokens the grammar forced, and punctuation) says nothing about what follows,
    so with ``skip_structural`` the match must include a token with a letter or digit that was
    not forced: after ``"city":"`` the drafter proposes nothing rather than the previous value,
    and the first sampled character of the value finds it in the document on the next step.
    Both rules are off by default: measured, they gained little with compact JSON and lost with
    free whitespace (fewer drafts: 1.65 against 2.07 tokens a forward on nested extraction);
    ``bench/spec_bench.py``'s ``:prompt`` drafters turn them on, with ``max_n`` 8. See
    BENCHMARKS.md, issue 29.

    ``close_values`` (on by default): a value copied from a document ends where the copy reaches
    punctuation (a comma, a bracket, a full stop before a space) or, for a number, where the
    grammar refuses the copied text; there the drafter proposes the token that ends the value
    (``_closing_token``) instead of copying on. The model writes '","' after a name copied from
    "Maria Lopez, Madrid", which the copy alone never proposes.

    ``grammar_lookup`` (on by default): where no match gives a token the grammar takes, the
    longest span of the prompt that the grammar takes from here, if it has at least
    ``LOOKUP_MIN_TOKENS`` (``_grammar_span``): after ``"joined":"`` the document's date.

    ``history`` (on by default, greedy requests only: a sampled request's draws depend on its
    drafts, and a seeded one must not depend on what ran before it): before the lookup, the
    outputs of earlier requests under the same compiled constraint (``HISTORY_OUTPUTS`` each,
    the most recent first): the longest
    suffix of this output found in one of them, and what followed it there up to the first
    token with a letter or digit: the whitespace and punctuation a model writes between values
    with free JSON whitespace, not another record's values.

    Measured on ``bench/spec_bench.py``'s extraction workloads, ``close_values`` and
    ``grammar_lookup`` together raised output tokens per forward from 2.26 to 2.43 (flat schema)
    and 3.11 to 3.28 (nested), compact JSON, with 1.23 and 1.21 -> 1.24 verified rows per output
    token; ``history``, with free whitespace, 2.11 -> 2.53 (nested), 1.84 -> 2.05 (flat) and
    1.66 -> 1.94 (tool calls), and nothing with compact JSON (BENCHMARKS.md, issue 29)."""

    name = "ngram"

    def __init__(self, max_n: int = 4, min_n: int = 1, *, prefer_prompt: bool = False, skip_structural: bool = False,
                 close_values: bool = True, grammar_lookup: bool = True, history: bool = True) -> None:  # fmt: skip
        self.max_n, self.min_n = max_n, min_n
        self.prefer_prompt, self.skip_structural = prefer_prompt, skip_structural
        self.close_values, self.grammar_lookup = close_values, grammar_lookup
        self._prompts: dict[str, np.ndarray] = {}  # each running request's prompt ids, for the lookup
        self.history = history
        # Finished outputs per compiled constraint (least recently used first), most recent first.
        self._history: OrderedDict[CompiledGrammar, deque[bytes]] = OrderedDict()

    def extend(self, state: DraftState) -> None:
        ids = state.sequence()
        closing = self.close_values and state.matcher is not None
        for start in self.matches(ids, len(state.req.origin_input_ids), state):
            copied = ids[start : start + state.room]
            cut = _value_boundary(copied, state.texts) if closing else None
            end = len(copied) if cut is None else cut
            pushed = state.push(copied[:end]) if end else 0
            if state.full or state.ended or state.at_forced:
                return
            if pushed < end:  # the grammar refused the next copied token
                if not (closing and pushed and _value_boundary(copied[pushed : pushed + 1], state.texts, spaces=True) == 0):
                    if pushed:
                        return
                    continue
            elif cut is None:
                return  # copied all of it
            close = _closing_token(state)
            if (close is not None and state.push([close])) or pushed:
                return
        if self.history and state.matcher is not None and not state.tokens and state.req.sampling_params.is_greedy:
            if self._from_history(state):
                return
        if self.grammar_lookup and state.matcher is not None and not state.tokens:
            prompt = self._prompts.get(state.req.rid)
            if prompt is None:
                prompt = self._prompts[state.req.rid] = np.asarray(state.req.origin_input_ids, dtype=np.int64)
            span = _grammar_span(prompt, state.matcher, state.room)
            if span:
                state.push(span)

    def release(self, req: Req) -> None:
        self._prompts.pop(req.rid, None)
        if self.history and req.grammar is not None and req.finished and req.output_ids and req.to_abort is None:
            compiled = req.grammar.compiled
            outputs = self._history.setdefault(compiled, deque(maxlen=HISTORY_OUTPUTS))
            self._history.move_to_end(compiled)
            outputs.appendleft(array("I", req.output_ids).tobytes())
            while len(self._history) > HISTORY_CONSTRAINTS:
                self._history.popitem(last=False)

    def _from_history(self, state: DraftState) -> bool:
        """Draft from the outputs of earlier requests under the same constraint: the longest
        suffix of this output (``max_n`` tokens down to one) found in one of them, at the
        occurrence that ends nearest this output's length, and the tokens that followed it."""
        assert state.matcher is not None
        outputs = self._history.get(state.matcher.compiled)
        if not outputs:
            return False
        output = state.sequence()[len(state.req.origin_input_ids) :]
        for n in range(min(self.max_n, len(output)), 0, -1):
            suffix = array("I", output[-n:]).tobytes()
            for past in outputs:
                end = _nearest_occurrence_end(past, suffix, len(output))
                if end is not None:
                    following = _layout(array("I", past[end * 4 : (end + state.room) * 4]).tolist(), state.texts)
                    if following and state.push(following):
                        return True
        return False

    def matches(self, ids: list[int], prompt_len: int, state: DraftState | None = None):  # type: ignore[no-untyped-def]
        """Starts of the continuations to try, best first."""
        packed = array("I", ids).tobytes()
        lowest = self.min_n
        if self.skip_structural and state is not None:
            lowest = max(lowest, self._shortest_informative(ids, state))
        tried = set()
        for n in range(min(self.max_n, len(ids) - 1), lowest - 1, -1):
            limits = ([prompt_len] if self.prefer_prompt else []) + [len(ids)]
            for limit in limits:
                start = _last_earlier_occurrence(packed, len(ids), n, limit)
                if start is not None and start + n not in tried:
                    tried.add(start + n)
                    yield start + n

    def _shortest_informative(self, ids: list[int], state: DraftState) -> int:
        """The shortest suffix length that holds a free token with a letter or digit (beyond
        ``max_n``: none does)."""
        texts = state.texts
        if texts is None:
            return self.min_n
        tail = state.forced_tail()
        for n in range(tail + 1, min(self.max_n, len(ids)) + 1):
            if _informative(texts.token_bytes([ids[-n]])):
                return n
        return self.max_n + 1


# Finished outputs kept per constraint for drafting from, and constraints kept (least recent
# dropped first).
HISTORY_OUTPUTS = 16
HISTORY_CONSTRAINTS = 64

# The grammar lookup gives up where the grammar takes more than this share of the prompt's
# tokens where it stands (inside a string: every span would do, and none is evidence).
LOOKUP_MAX_SHARE = 0.25


# ... and proposes only spans of at least this many tokens the grammar takes (up to the longest
# it looks for): a date, an identifier; not a short number, which any digits of the prompt
# would fit (an age drafted from the year of a date).
LOOKUP_MIN_TOKENS = 5
LOOKUP_MAX_TOKENS = 16
LOOKUP_MAX_STARTS = 64


def _grammar_span(prompt: np.ndarray, matcher: GrammarMatcher, room: int) -> list[int]:
    """The first ``room`` tokens of the longest span of the prompt that the grammar takes from
    where it stands (the first such where several are as long), if that span has at least
    ``LOOKUP_MIN_TOKENS``: a date where no n-gram match fits. [] where the grammar takes too
    many of the prompt's tokens to start with. The starts come from the state's cached mask row,
    and at most ``LOOKUP_MAX_STARTS`` are followed, so a long document costs little more."""
    try:
        row = matcher.get_next_token_bitmask()
    except GrammarError:
        return []
    ids = prompt[prompt < row.shape[0] * 32]
    starts = np.flatnonzero(tokens_allowed(row, ids))
    if not len(starts) or len(starts) > LOOKUP_MAX_SHARE * len(ids):
        return []
    best, best_start = LOOKUP_MIN_TOKENS - 1, None
    for i in starts[:LOOKUP_MAX_STARTS].tolist():
        taken = 0
        for token in ids[i : i + LOOKUP_MAX_TOKENS].tolist():
            try:
                ok = matcher.accept_token(token)
            except GrammarError:
                ok = False
            if not ok:
                break
            taken += 1
        if taken:
            matcher.rollback(taken)
        if taken > best:
            best, best_start = taken, i
    return [] if best_start is None else ids[best_start : best_start + min(best, room)].tolist()


# Where copied text meets one of these, a value copied from a document usually ends there.
_BOUNDARY_STARTS = frozenset(b",;()[]{}<>!?|")
_QUOTE = b'"'


def _value_boundary(copied: list[int], texts, spaces: bool = False) -> int | None:  # type: ignore[no-untyped-def]
    """Index of the first token of ``copied`` that starts at punctuation ending a copied value
    (a comma, a bracket, or a full stop followed by a space or nothing; with ``spaces``, a space
    too: where the grammar refused the token, a number was copied); None if there is none."""
    if texts is None:
        return None
    for i, token in enumerate(copied):
        text = texts.token_bytes([token])
        if not text:
            return None
        if text[0] in _BOUNDARY_STARTS or (spaces and text[:1].isspace()):
            return i
        if text[0] == 0x2E:  # "."
            after = text[1:2] or (texts.token_bytes([copied[i + 1]])[:1] if i + 1 < len(copied) else b"")
            if after in (b"", b" ", b"\n"):
                return i
    return None


def _closing_token(state: DraftState) -> int | None:
    """The token that ends the JSON value the draft is in. In a string (the grammar takes a
    quote): the longest token spelling a prefix of the quote and the text the grammar forces
    after it (models write '","' there, not '"' then ',"'). Elsewhere (a number): the same for
    ``,``, ``}`` and ``]``, and where nothing is forced after one of them, for it followed by
    another; among equally long spellings, the one the request has written most often. None
    where the grammar takes none of them."""
    matcher, texts = state.matcher, state.texts
    if matcher is None or texts is None:
        return None
    vocab = texts.vocab
    ids_of = vocab.ids_by_bytes
    spellings: list[bytes] = []
    for closer in _CLOSERS:
        spelling = _with_forced_text(matcher, ids_of.get(closer), second=closer != _QUOTE)
        spellings += spelling
        if spelling and closer == _QUOTE:
            break  # inside a string the other closers are text
    candidates = {ids_of[s[:n]] for s in spellings for n in range(1, min(len(s), 16) + 1) if s[:n] in ids_of}
    if not candidates:
        return None
    written = Counter(state.sequence()[len(state.req.origin_input_ids) :])
    return max(candidates, key=lambda t: (len(vocab.token_bytes[t]), written.get(t, 0), -t))


# What ends a value: a string's quote first; then what follows a number in an array or object.
_CLOSERS = (_QUOTE, b",", b"}", b"]")


def _with_forced_text(matcher: GrammarMatcher, token: int | None, second: bool = False) -> list[bytes]:
    """``token``'s bytes and the text the grammar forces after them (with ``second``, where
    nothing is forced: each closer the grammar takes next, and its forced text); [] if the
    grammar refuses ``token``."""
    if token is None:
        return []
    try:
        if not matcher.accept_token(token):
            return []
    except GrammarError:
        return []
    try:
        spelled = matcher.compiled.vocab.token_bytes[token]
        forced = _forced(matcher)
        if forced or not second:
            return [spelled + forced]
        ids_of = matcher.compiled.vocab.ids_by_bytes
        nexts = [spelled + more for closer in _CLOSERS[1:] for more in _with_forced_text(matcher, ids_of.get(closer))]
        return nexts or [spelled]
    finally:
        matcher.rollback(1)


def _forced(matcher: GrammarMatcher) -> bytes:
    try:
        return matcher.forced_continuation()
    except GrammarError:
        return b""


def _layout(tokens: list[int], texts) -> list[int]:  # type: ignore[no-untyped-def]
    """``tokens`` up to the first with a letter or digit: the layout and punctuation an earlier
    output wrote here, not its values (which are another record's)."""
    if texts is None:
        return tokens
    for i, token in enumerate(tokens):
        if _informative(texts.token_bytes([token])):
            return tokens[:i]
    return tokens


def _nearest_occurrence_end(packed: bytes, suffix: bytes, position: int) -> int | None:
    """End (in tokens) of the occurrence of ``suffix`` in ``packed`` that has at least one token
    after it and ends nearest ``position``; None if there is none."""
    width, best = 4, None
    start = packed.find(suffix)
    while start >= 0:
        end = start + len(suffix)
        if start % width == 0 and end < len(packed):
            tokens = end // width
            if best is None or abs(tokens - position) < abs(best - position):
                best = tokens
            elif tokens > position:
                break  # later ones are farther still
        start = packed.find(suffix, start + 1)
    return best


def _informative(text: bytes) -> bool:
    """A letter or digit (any non-ASCII byte counts: letters of other scripts)."""
    return any(b >= 0x80 or chr(b).isalnum() for b in text)


def _last_earlier_occurrence(packed: bytes, length: int, n: int, limit: int | None = None) -> int | None:
    """Start (in tokens) of the last occurrence of the final ``n`` tokens that ends before
    token ``limit`` (default and at most: the final position), so at least one token follows
    it."""
    width = 4
    suffix = packed[(length - n) * width :]
    end = (min(length, length if limit is None else limit) - 1) * width  # the match must end before the last token
    while True:
        if end < len(suffix):
            return None
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

    def extend(self, state: DraftState) -> None:
        """Continue while the grammar leaves little choice (forced text is drafted as ordinary
        tokens when jump-forward does not apply)."""
        matcher = state.matcher
        if matcher is None:
            return
        counts: Counter[int] | None = None
        while not state.full and not state.ended and not state.at_forced:
            forced = [] if state.jumps else self._forced_tokens(matcher, state.room)
            if forced:
                if not state.push(forced):
                    return
                continue
            if counts is None:
                counts = Counter(state.req.fill_ids)
            choice = self._few_choice(matcher, counts)
            if choice is None or not state.push([choice]):
                return

    def _forced_tokens(self, matcher: GrammarMatcher, budget: int) -> list[int]:
        """Canonical tokens of the forced text (not accepted into ``matcher``)."""
        try:
            forced = matcher.forced_continuation()
        except GrammarError:
            return []
        if not forced:
            return []
        ids = self.tokenizer.encode(forced.decode("utf-8"), add_special_tokens=False)[:budget]
        if self.texts.token_bytes(ids) != forced[: len(self.texts.token_bytes(ids))]:
            return []
        return ids

    def _few_choice(self, matcher: GrammarMatcher, counts: Counter[int]) -> int | None:
        vocab = matcher.compiled.vocab
        try:
            row = matcher.get_next_token_bitmask()
        except GrammarError:
            return None
        allowed = np.flatnonzero(unpack_bitmask(row, vocab.vocab_size))
        if len(allowed) > MAX_GRAMMAR_CHOICES + len(vocab.eos_token_ids):
            return None  # too many even without EOS; inside a string most of the vocabulary (~20 ms to list)
        allowed = [int(t) for t in allowed if int(t) not in vocab.eos_token_ids]
        if not allowed or len(allowed) > MAX_GRAMMAR_CHOICES:
            return None
        return max(allowed, key=lambda t: (counts.get(t, 0), len(vocab.token_bytes[t])))


class ChainDrafter(Drafter):
    """``first``'s proposal, then extended by the grammar drafter. Model-free ``first`` drafters
    take turns with the grammar until the budget is used (n-gram, forced text, n-gram, ...)."""

    def __init__(self, first: Drafter, grammar: GrammarDrafter) -> None:
        self.first, self.grammar = first, grammar
        self.name = f"{first.name}+grammar"
        self.tokenizer, self.texts = grammar.tokenizer, grammar.texts
        first.tokenizer, first.texts = grammar.tokenizer, grammar.texts

    @property  # type: ignore[override]
    def jump_forward(self) -> bool:
        return self.grammar.jump_forward

    @jump_forward.setter
    def jump_forward(self, value: bool) -> None:
        self.first.jump_forward = self.grammar.jump_forward = value

    def extend(self, state: DraftState) -> None:
        self.first.extend(state)
        if not state.full and not state.ended and not state.at_forced:
            self.grammar.extend(state)

    def propose(self, reqs: list[Req], budgets: list[int]) -> list[Draft]:
        if isinstance(self.first, (NgramDrafter, GrammarDrafter)):
            return super().propose(reqs, budgets)
        drafts = self.first.propose(reqs, budgets)  # a draft model: extend its proposals once
        out = []
        for req, budget, draft in zip(reqs, budgets, drafts):
            if budget <= len(draft.tokens):
                out.append(draft)
                continue
            state = self.start(req, budget)
            if not draft.tokens or not state.adopt(draft):
                out.append(draft)
                continue
            self.grammar.run(state)
            tokens = state.tokens
            probs = draft.probs
            if probs is not None and len(tokens) > len(draft.tokens):  # grammar drafts are point masses
                extra = torch.zeros(len(tokens) - len(draft.tokens), probs.shape[1], dtype=probs.dtype, device=probs.device)
                extra[torch.arange(extra.shape[0], device=probs.device), torch.tensor(tokens[len(draft.tokens) :], device=probs.device)] = 1.0
                probs = torch.cat([probs, extra])
            out.append(Draft(tokens, probs, draft.forced))
        return out

    def on_verified(self, req: Req, drafted: int, accepted: int) -> None:
        self.first.on_verified(req, drafted, accepted)

    def release(self, req: Req) -> None:
        self.first.release(req)
