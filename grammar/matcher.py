"""GrammarMatcher: the per-request cursor over a shared :class:`CompiledGrammar`.

It is a stack of automaton states, one per accepted token, so ``rollback(n)`` (speculative
decoding) is a pop and ``copy()`` is cheap. Masks come from the compiled grammar's per-state
cache; the matcher only copies a row into the caller's bitmask. A grammar with a text check
(``text_check``: JSON Schema's ``uniqueItems``) adds a parallel stack of immutable check
states, popped and copied with the automaton states. The check may add marks to the text the
automaton reads (a duplicate item), so the automaton decides which branches survive them; the
matcher clears the tokens whose marked text the automaton refuses, and the check's reserved
tokens.
"""

from __future__ import annotations

import numpy as np

from .automaton import DEAD
from .compiler import CompiledGrammar


class GrammarMatcher:
    """Per-request state: accept tokens, fill bitmask rows, roll back, look ahead."""

    def __init__(self, compiled: CompiledGrammar, *, max_rollback_tokens: int | None = None) -> None:
        self.compiled = compiled
        self.max_rollback_tokens = max_rollback_tokens
        self._states: list[int] = [compiled.initial_state]
        self._check = compiled.check
        self._checks: list = [self._check.start()] if self._check is not None else []
        self._terminated = False
        self._terminated_at: int | None = None  # history length when EOS was accepted

    # ------------------------------------------------------------------ state
    @property
    def state(self) -> int:
        return self._states[-1]

    @property
    def num_accepted_tokens(self) -> int:
        return len(self._states) - 1

    def is_terminated(self) -> bool:
        """True once an EOS token has been accepted."""
        return self._terminated

    def can_terminate(self) -> bool:
        """True when the text so far is a complete match (EOS would be accepted)."""
        return not self._terminated and self.compiled.is_accepting(self.state)

    def reset(self) -> None:
        self._states = [self.compiled.initial_state]
        self._checks = [self._check.start()] if self._check is not None else []
        self._terminated = False
        self._terminated_at = None

    def copy(self) -> "GrammarMatcher":
        other = GrammarMatcher.__new__(GrammarMatcher)
        other.compiled = self.compiled
        other.max_rollback_tokens = self.max_rollback_tokens
        other._states = list(self._states)
        other._check, other._checks = self._check, list(self._checks)
        other._terminated = self._terminated
        other._terminated_at = self._terminated_at
        return other

    # ------------------------------------------------------------------ advancing
    def accept_token(self, token_id: int) -> bool:
        """Advance by one token; a rejected token leaves the state unchanged and returns False."""
        if self._terminated:
            return False
        token_id = int(token_id)
        if token_id in self.compiled.eos_token_ids:
            if not self.compiled.is_accepting(self.state):
                return False
            self._push(self.state, self._checks[-1] if self._check is not None else None)
            self._terminated = True
            self._terminated_at = len(self._states)
            return True
        if self._check is not None:
            return self._push_checked(self.compiled.vocab.token_bytes[token_id], token_id)
        nxt = self.compiled.next_state(self.state, token_id)
        if nxt == DEAD:
            return False
        return self._push(nxt, None)

    def accept_bytes(self, data: bytes | str) -> bool:
        """Advance by raw bytes (counted as one step for rollback); all or nothing."""
        if self._terminated:
            return False
        if isinstance(data, str):
            data = data.encode("utf-8")
        if self._check is not None:
            return self._push_checked(data, None)
        nxt = self.compiled.step_bytes(self.state, data)
        if nxt == DEAD:
            return False
        return self._push(nxt, None)

    def _push_checked(self, data: bytes, token_id: int | None) -> bool:
        """The automaton reads the text with the check's marks. Marks are optional wherever the
        grammar allows them, so text it refuses unmarked it refuses marked: the check only ever
        scans text the grammar accepts."""
        compiled = self.compiled
        nxt = compiled.next_state(self.state, token_id) if token_id is not None else compiled.step_bytes(self.state, data)
        if nxt == DEAD:
            return False
        fed = self._check.feed(self._checks[-1], data)
        if fed is None:
            return False
        check_state, marked = fed
        if len(marked) != len(data):
            nxt = compiled.step_bytes(self.state, marked)
            if nxt == DEAD:
                return False
        return self._push(nxt, check_state)

    def _push(self, state: int, check_state) -> bool:
        if self._check is not None:
            self._checks.append(check_state)
        self._states.append(state)
        limit = self.max_rollback_tokens
        if limit is not None and len(self._states) > limit + 1:
            del self._states[0]
            del self._checks[:1]
        return True

    def rollback(self, num_tokens: int) -> None:
        """Undo the last ``num_tokens`` accepted tokens (EOS included)."""
        if num_tokens < 0 or num_tokens > len(self._states) - 1:
            raise ValueError(f"cannot roll back {num_tokens} tokens; {len(self._states) - 1} available")
        if num_tokens:
            del self._states[-num_tokens:]
            del self._checks[len(self._states):]
        if self._terminated and len(self._states) < (self._terminated_at or 0):
            self._terminated = False
            self._terminated_at = None

    # ------------------------------------------------------------------ masks
    def fill_next_token_bitmask(
        self, bitmask: np.ndarray, index: int = 0, *, remaining_tokens: int | None = None
    ) -> None:
        """Write the allowed-token row into ``bitmask[index]`` (an int32 numpy array, or the
        ``.numpy()`` view of a torch CPU tensor). Words beyond the vocabulary are zeroed.
        With ``remaining_tokens`` (tokens left in the caller's budget, EOS included), only tokens
        after which a complete document still fits are allowed."""
        target = bitmask[index]
        if self._terminated:
            target[:] = 0
            return
        compiled = self.compiled
        if remaining_tokens is None:
            row = compiled.token_mask(self.state)
        else:
            row = compiled.budgeted_token_mask(self.state, remaining_tokens)
        width = len(row)
        target[:width] = row
        if self._check is not None:
            self._ban(target)
        if target.shape[0] > width:
            target[width:] = 0

    def _ban(self, target: np.ndarray) -> None:
        """Clear the bits of the tokens the text check bans."""
        from .bitmask import allowed_token_ids

        vocab = self.compiled.vocab
        _clear(target, self._check.reserved(vocab.token_bytes))
        state = self._checks[-1]
        if not self._check.may_ban(state):
            return
        compiled, here = self.compiled, self.state

        def alive(marked: bytes) -> bool:
            return compiled.step_bytes(here, marked) != DEAD

        _clear(target, self._check.banned(state, vocab.token_bytes, allowed_token_ids(target, vocab.vocab_size), alive))

    def get_next_token_bitmask(self) -> np.ndarray:
        """A fresh copy of the current row."""
        row = self.compiled.token_mask(self.state).copy()
        if self._check is not None and not self._terminated:
            self._ban(row)
        return row

    # ------------------------------------------------------------------ look-ahead
    def forced_continuation(self) -> bytes:
        """Bytes the grammar admits as the only way forward from here (jump-forward decoding);
        stops where there is a choice or where the input may end."""
        if self._terminated:
            return b""
        return self._checked(_complete_utf8_prefix(self.compiled.forced_bytes(self.state)))

    def _checked(self, data: bytes) -> bytes:
        """The longest prefix of forced ``data`` the text check accepts."""
        while data and not self._admits(data):
            data = _complete_utf8_prefix(data[:-1])
        return data

    def _admits(self, data: bytes) -> bool:
        if self._check is None:
            return True
        fed = self._check.feed(self._checks[-1], data)
        return fed is not None and (len(fed[1]) == len(data) or self.compiled.step_bytes(self.state, fed[1]) != DEAD)

    def shortest_completion(self) -> bytes:
        """One shortest byte string that completes the match from here (b"" if complete)."""
        if self._terminated:
            return b""
        return self.compiled.shortest_completion(self.state)


def _clear(target: np.ndarray, token_ids: np.ndarray) -> None:
    for t in token_ids.tolist():
        if (t >> 5) < target.shape[0]:
            target[t >> 5] &= np.int32(np.uint32(~(1 << (t & 31)) & 0xFFFFFFFF).view(np.int32))


def _complete_utf8_prefix(data: bytes) -> bytes:
    """``data`` without a trailing incomplete UTF-8 sequence (callers re-tokenize whole text)."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 != 0x80:  # a lead byte or ASCII: is its sequence complete?
            need = 1 if byte < 0x80 else 2 if byte >> 5 == 0b110 else 3 if byte >> 4 == 0b1110 else 4
            return data if need <= back else data[:-back]
    return data
