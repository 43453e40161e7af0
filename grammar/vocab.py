"""TokenVocabulary: the exact bytes of every token id, plus special and EOS ids.

Grammars constrain bytes; tokenizers hand out ids. This module is the bridge: for each id, the
byte string the tokenizer emits for it (ByteLevel BPE, SentencePiece metaspace with ``<0xNN>``
byte fallback, added tokens). Special (control) tokens map to ``b""`` and are never allowed by a
grammar; EOS ids are allowed exactly when the grammar accepts.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Iterable, Sequence


@dataclass(frozen=True, eq=False)
class TokenVocabulary:
    token_bytes: tuple[bytes, ...]
    eos_token_ids: frozenset[int]
    special_token_ids: frozenset[int] = frozenset()
    fingerprint: str = field(default="")

    def __post_init__(self) -> None:
        if not self.fingerprint:
            object.__setattr__(self, "fingerprint", _fingerprint(self.token_bytes, self.eos_token_ids, self.special_token_ids))

    @property
    def vocab_size(self) -> int:
        return len(self.token_bytes)

    def __len__(self) -> int:
        return len(self.token_bytes)

    @classmethod
    def from_token_bytes(
        cls,
        token_bytes: Sequence[bytes],
        eos_token_ids: Iterable[int],
        special_token_ids: Iterable[int] = (),
    ) -> "TokenVocabulary":
        eos = frozenset(int(i) for i in eos_token_ids)
        special = frozenset(int(i) for i in special_token_ids) | eos
        toks = tuple(b"" if i in special else bytes(t) for i, t in enumerate(token_bytes))
        return cls(toks, eos, special)

    @classmethod
    def byte_level(cls, extra_tokens: Sequence[bytes | str] = ()) -> "TokenVocabulary":
        """A toy vocabulary for unit tests: ids 0..255 are single bytes, then ``extra_tokens``,
        then one EOS token."""
        toks = [bytes([b]) for b in range(256)]
        toks += [t.encode() if isinstance(t, str) else bytes(t) for t in extra_tokens]
        eos = len(toks)
        toks.append(b"")
        return cls.from_token_bytes(toks, [eos])

    def decode_bytes(self, token_ids: Iterable[int]) -> bytes:
        return b"".join(self.token_bytes[i] for i in token_ids)


def _fingerprint(token_bytes: Sequence[bytes], eos: frozenset[int], special: frozenset[int]) -> str:
    h = hashlib.sha256()
    for t in token_bytes:
        h.update(len(t).to_bytes(4, "little"))
        h.update(t)
    h.update(repr(sorted(eos)).encode())
    h.update(repr(sorted(special)).encode())
    return h.hexdigest()[:32]
