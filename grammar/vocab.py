"""TokenVocabulary: the exact bytes of every token id, plus special and EOS ids.

Grammars constrain bytes; tokenizers hand out ids. This module is the bridge: for each id, the
byte string the tokenizer emits for it (ByteLevel BPE, SentencePiece metaspace with ``<0xNN>``
byte fallback, added tokens). Special (control) tokens map to ``b""`` and are never allowed by a
grammar; EOS ids are allowed exactly when the grammar accepts.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import tempfile
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Iterable, Sequence


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

    def with_text_tokens(self, texts: dict[int, bytes]) -> "TokenVocabulary":
        """This vocabulary with the special tokens ``texts`` made plain text tokens of those bytes:
        a grammar can then produce them wherever their text fits and the detokenizer shows them
        (a tool-call marker such as ``[TOOL_CALLS]`` that the model writes as one control token).
        EOS ids stay EOS."""
        if not texts:
            return self
        toks = list(self.token_bytes)
        for i, text in texts.items():
            toks[i] = bytes(text)
        kept = {int(i) for i in texts} - self.eos_token_ids
        return TokenVocabulary(tuple(toks), self.eos_token_ids, self.special_token_ids - kept)

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

    @cached_property
    def ids_by_bytes(self) -> dict[bytes, int]:
        """Each spelling's token id (the lowest where several tokens spell the same bytes);
        special tokens spell nothing and are left out. Built on first use."""
        table: dict[bytes, int] = {}
        for i, b in enumerate(self.token_bytes):
            if b:
                table.setdefault(b, i)
        return table

    @classmethod
    def from_tokenizer(
        cls,
        tokenizer: Any,
        *,
        eos_token_ids: Iterable[int] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
    ) -> "TokenVocabulary":
        """The vocabulary of a Hugging Face fast tokenizer (or a bare ``tokenizers.Tokenizer``).

        Token bytes come from the tokenizer's JSON (model vocab, decoder type, added tokens), not
        from decoding ids one by one: ByteLevel BPE maps each character back through the GPT-2
        byte table; SentencePiece-style vocabularies turn the metaspace ``▁`` into a space and
        ``<0xNN>`` byte-fallback pieces into that byte. A ``▁`` that the decoder strips at the very
        start of a text is kept: it is part of the token, the stripping is a detokenizer detail.
        Non-special added tokens are their text; special ones are control tokens (``b""``).

        ``eos_token_ids`` defaults to ``tokenizer.eos_token_id`` plus the chat end-of-turn tokens
        that exist (``<|im_end|>``, ``<|endoftext|>``, ``<|eot_id|>``, ...). The byte table is
        cached on disk under ``cache_dir`` (default ``$FORMCAST_CACHE/vocab`` or
        ``~/.cache/formcast/vocab``), keyed by a hash of the tokenizer JSON.
        """
        backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
        if not hasattr(backend, "to_str"):
            raise TypeError(f"expected a fast tokenizer with a backend_tokenizer, got {type(tokenizer).__name__}")
        content = backend.to_str()
        key = hashlib.sha256(content.encode()).hexdigest()[:32]
        folder = Path(cache_dir) if cache_dir is not None else _vocab_cache_dir()
        table = _load_table(folder / f"{key}.json")
        if table is None:
            table = _byte_table(json.loads(content), backend)
            _save_table(folder / f"{key}.json", *table)
        token_bytes, special = table
        if eos_token_ids is None:
            eos_token_ids = _default_eos_ids(tokenizer, backend, len(token_bytes))
        return cls.from_token_bytes(token_bytes, eos_token_ids, special)


def _fingerprint(token_bytes: Sequence[bytes], eos: frozenset[int], special: frozenset[int]) -> str:
    h = hashlib.sha256()
    for t in token_bytes:
        h.update(len(t).to_bytes(4, "little"))
        h.update(t)
    h.update(repr(sorted(eos)).encode())
    h.update(repr(sorted(special)).encode())
    return h.hexdigest()[:32]


def _vocab_cache_dir() -> Path:
    """``$FORMCAST_CACHE/vocab`` or ``~/.cache/formcast/vocab`` (the engine's caches sit beside it)."""
    root = os.environ.get("FORMCAST_CACHE")
    return (Path(root) if root else Path.home() / ".cache" / "formcast") / "vocab"


# --- tokenizer JSON -> bytes per id ------------------------------------------------------------

# End-of-turn / end-of-text spellings of common chat models; used only if they exist as specials.
_CHAT_EOS_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>", "<|end|>", "<end_of_turn>", "<|eom_id|>")
_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")
_TABLE_VERSION = 1


def gpt2_unicode_to_byte() -> dict[str, int]:
    """Inverse of the GPT-2 byte-to-unicode table: printable bytes stand for themselves, the
    other 68 bytes are shifted to U+0100.. so every byte has a visible character."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {chr(b): b for b in keep}
    shift = 0
    for b in range(256):
        if b not in keep:
            table[chr(256 + shift)] = b
            shift += 1
    return table


def _components(node: Any) -> list[dict]:
    """Flatten a (possibly nested ``Sequence``) decoder / pre-tokenizer JSON node."""
    if not isinstance(node, dict):
        return []
    parts = node.get("decoders") or node.get("pretokenizers")
    if node.get("type") == "Sequence" and parts:
        return [c for p in parts for c in _components(p)]
    return [node]


def _model_vocab(model: dict) -> dict[str, int]:
    vocab = model.get("vocab")
    if isinstance(vocab, dict):  # BPE, WordPiece, WordLevel
        return {str(k): int(v) for k, v in vocab.items()}
    if isinstance(vocab, list):  # Unigram: [[piece, score], ...] in id order
        return {str(p[0]): i for i, p in enumerate(vocab)}
    raise ValueError(f"tokenizer model type {model.get('type')!r} has no readable vocab")


def _piece_decoder(spec: dict) -> Any:
    """A function piece -> bytes matching the tokenizer's decoder, or None if the decoder is of
    a kind this module does not model (the caller then decodes ids one by one)."""
    parts = _components(spec.get("decoder")) + _components(spec.get("pre_tokenizer"))
    kinds = {p.get("type") for p in parts}
    if "ByteLevel" in kinds:
        u2b = gpt2_unicode_to_byte()

        def byte_level(piece: str) -> bytes:
            try:
                return bytes(u2b[c] for c in piece)
            except KeyError:  # as tokenizers does: a piece outside the table is literal text
                return piece.encode()

        return byte_level
    spaces = [p.get("replacement", "\u2581") for p in parts if p.get("type") == "Metaspace"]
    spaces += [p["pattern"]["String"] for p in parts if p.get("type") == "Replace" and p.get("content") == " " and "String" in p.get("pattern", {})]
    fallback = bool(spec["model"].get("byte_fallback")) or "ByteFallback" in kinds
    if not spaces and not fallback and spec.get("decoder") is not None:
        return None

    def sentencepiece(piece: str) -> bytes:
        m = _BYTE_FALLBACK.fullmatch(piece) if fallback else None
        if m:
            return bytes([int(m.group(1), 16)])
        for s in spaces:
            piece = piece.replace(s, " ")
        return piece.encode()

    return sentencepiece


def _byte_table(spec: dict, backend: Any) -> tuple[list[bytes], list[int]]:
    vocab = _model_vocab(spec["model"])
    added = spec.get("added_tokens") or []
    size = max([*vocab.values(), *(int(t["id"]) for t in added), -1]) + 1
    out: list[bytes | None] = [None] * size
    decode_piece = _piece_decoder(spec)
    if decode_piece is None:  # unknown decoder: per-id decode (lossy for partial UTF-8 pieces)
        for piece, i in vocab.items():
            out[i] = backend.decode([i], skip_special_tokens=False).encode()
    else:
        for piece, i in vocab.items():
            out[i] = decode_piece(piece)
    special: list[int] = []
    for tok in added:
        i = int(tok["id"])
        if tok.get("special"):
            special.append(i)
            out[i] = b""
        else:
            # tokenizers runs added tokens through the decoder too; keep that behaviour.
            out[i] = decode_piece(tok["content"]) if decode_piece else tok["content"].encode()
    holes = [i for i, t in enumerate(out) if t is None]  # ids nobody owns can never be produced
    return [t if t is not None else b"" for t in out], sorted(special + holes)


def _default_eos_ids(tokenizer: Any, backend: Any, size: int) -> list[int]:
    ids = set()
    eos = getattr(tokenizer, "eos_token_id", None)
    if isinstance(eos, int):
        ids.add(eos)
    for name in _CHAT_EOS_TOKENS:
        i = backend.token_to_id(name)
        if i is not None and 0 <= i < size:
            ids.add(int(i))
    return sorted(ids)


def _load_table(path: Path) -> tuple[list[bytes], list[int]] | None:
    try:
        data = json.loads(path.read_text())
        if data.get("version") != _TABLE_VERSION:
            return None
        blob = base64.b64decode(data["bytes"])
        out, pos = [], 0
        for n in data["lengths"]:
            out.append(blob[pos : pos + n])
            pos += n
        return out, [int(i) for i in data["special"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None  # missing or corrupt: rebuild


def _save_table(path: Path, token_bytes: list[bytes], special: list[int]) -> None:
    data = {
        "version": _TABLE_VERSION,
        "lengths": [len(t) for t in token_bytes],
        "bytes": base64.b64encode(b"".join(token_bytes)).decode(),
        "special": special,
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".vocab-", dir=path.parent)
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
        os.replace(tmp, path)  # atomic: concurrent readers see the old file or the new one
    except OSError:
        pass  # a read-only cache only costs speed
