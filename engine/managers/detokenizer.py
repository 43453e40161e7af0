"""Incremental detokenization: token ids -> text deltas that never split a UTF-8 character.

Text is built from the exact bytes of each token (the grammar's ``TokenVocabulary``), through
an incremental UTF-8 decoder: a character whose bytes span several tokens appears once all its
bytes are there, so deltas concatenate to the final text by construction. Special tokens are
dropped (``skip_special_tokens``) or rendered as their text.

Stop strings: the scheduler decides that a request stopped; here the text is cut at the first
occurrence of the matched string (after it, with ``no_stop_trim``) after what was already shown (a stop string cannot start in
shown text: that text was followed by at least ``len - 1`` held-back characters), and while a request with stop strings is still running, the
last ``len(longest stop) - 1`` characters are held back, so a stream never shows the start of a
stop string that the next token completes.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass, field
from typing import Any

from grammar import TokenVocabulary

from .finish_reason import FinishMatchedStr
from .io_struct import BatchStrOutput, BatchTokenIDOutput, ReqStepOutput, ReqStrOutput


class TokenTexts:
    """Bytes and display text of token ids, for one vocabulary."""

    def __init__(self, vocab: TokenVocabulary, tokenizer: Any = None) -> None:
        self.vocab = vocab
        self.special_text: dict[int, bytes] = {}
        if tokenizer is not None:
            for i in vocab.special_token_ids:
                piece = tokenizer.convert_ids_to_tokens(int(i))
                self.special_text[i] = (piece or "").encode("utf-8")

    def token_bytes(self, ids: list[int], skip_special_tokens: bool = True) -> bytes:
        table = self.vocab.token_bytes
        if skip_special_tokens or not self.special_text:
            return b"".join(table[i] for i in ids if 0 <= i < len(table))
        return b"".join(self.special_text.get(i, table[i] if 0 <= i < len(table) else b"") for i in ids)

    def text(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.token_bytes(ids, skip_special_tokens).decode("utf-8", errors="replace")

    def token_text(self, token_id: int) -> str:
        """One token shown on its own (logprob listings): specials by name."""
        if token_id in self.special_text:
            return self.special_text[token_id].decode("utf-8", errors="replace")
        return self.text([token_id])


@dataclass
class IncrementalDetokenizer:
    texts: TokenTexts
    skip_special_tokens: bool = True
    stop_strings: tuple[str, ...] = ()
    no_stop_trim: bool = False
    text: str = ""  # everything decoded so far
    emitted: int = 0  # characters of ``text`` already handed out
    _decoder: Any = field(default_factory=lambda: codecs.getincrementaldecoder("utf-8")("replace"))

    def feed(self, ids: list[int], finished_reason: Any = None) -> str:
        """The next text delta after ``ids`` (the request's new tokens)."""
        self.text += self._decoder.decode(self.texts.token_bytes(ids, self.skip_special_tokens))
        if finished_reason is not None:
            self.text += self._decoder.decode(b"", final=True)
            if isinstance(finished_reason, FinishMatchedStr):
                cut = self.text.find(finished_reason.matched, self.emitted)
                if cut >= 0:  # no_stop_trim keeps the stop string, never what followed it
                    self.text = self.text[: cut + (len(finished_reason.matched) if self.no_stop_trim else 0)]
            end = len(self.text)
        else:
            hold = max((len(s) for s in self.stop_strings), default=1) - 1
            end = max(self.emitted, len(self.text) - hold)
        delta = self.text[self.emitted : end]
        self.emitted = end
        return delta


class Detokenizer:
    """Per-request incremental state; ``process`` turns one step's ids into text deltas."""

    def __init__(self, texts: TokenTexts) -> None:
        self.texts = texts
        self._states: dict[str, IncrementalDetokenizer] = {}

    def process(self, batch: BatchTokenIDOutput) -> BatchStrOutput:
        out = BatchStrOutput()
        for step in batch.outputs:
            state = self._state(step)
            delta = state.feed(step.new_token_ids, step.finished_reason)
            if step.finished_reason is not None:
                self._states.pop(step.rid, None)
            out.outputs.append(ReqStrOutput(step, delta))
        return out

    def _state(self, step: ReqStepOutput) -> IncrementalDetokenizer:
        state = self._states.get(step.rid)
        if state is None:
            state = IncrementalDetokenizer(self.texts, step.skip_special_tokens, step.stop_strings, step.no_stop_trim)
            self._states[step.rid] = state
        return state
