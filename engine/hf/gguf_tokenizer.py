"""A GGUF file's tokenizer, built from its metadata into a Hugging Face fast tokenizer.

    tokenizer = load_gguf_tokenizer("model.gguf")   # PreTrainedTokenizerFast

Reads ``tokenizer.ggml.*``: the token list, the token types (control tokens become special added
tokens, user-defined ones plain added tokens), BPE merges, the special ids (BOS, EOS, UNK, PAD)
and ``tokenizer.chat_template``. ``tokenizer.ggml.model`` says the kind:

- ``gpt2``: byte-level BPE. ``tokenizer.ggml.pre`` picks how text is split before merging, as
  llama.cpp does: ``PRE_TOKENIZERS`` maps each known name to its split (GPT-2's regex; SmolLM's
  single digits then GPT-2's regex; Llama 3's and Qwen2's patterns, which take digits in runs of
  up to three or one at a time). An unknown name is a ``ModelLoadError``: a silently different
  split would feed the model token sequences it never saw.
- ``llama``: SentencePiece-style BPE (``▁`` for spaces, ``<0xNN>`` byte fallback): the merges
  are derived from the scores (llama.cpp merges the adjacent pair whose result scores highest).

The result is the same object ``AutoTokenizer`` gives for a Hugging Face folder, so the rest of
formcast (``grammar.vocab.TokenVocabulary``, the detokenizer, chat templates) treats both alike.
"""

from __future__ import annotations

import os
from typing import Any

from ..models.config import ModelLoadError

TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6

# Split patterns, written after the published tokenizers of each family.
_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"


def _byte_level(pattern: str | None, digits: bool = False, nfc: bool = False) -> dict[str, Any]:
    return {"pattern": pattern, "digits": digits, "nfc": nfc}


# tokenizer.ggml.pre -> split: pattern=None means GPT-2's own regex (ByteLevel's use_regex).
PRE_TOKENIZERS: dict[str, dict[str, Any]] = {
    "default": _byte_level(None),
    "gpt-2": _byte_level(None),
    "gpt2": _byte_level(None),
    "smollm": _byte_level(None, digits=True),
    "llama-bpe": _byte_level(_LLAMA3),
    "llama3": _byte_level(_LLAMA3),
    "smaug-bpe": _byte_level(_LLAMA3),
    "qwen2": _byte_level(_QWEN2, nfc=True),
}


def load_gguf_tokenizer(path: str | os.PathLike[str], metadata: dict[str, Any] | None = None) -> Any:
    """The tokenizer of the GGUF file at ``path`` (``metadata``: its already-read metadata)."""
    if metadata is None:
        from ..models.gguf_file import GGUFFile

        metadata = GGUFFile.open(path).metadata
    return tokenizer_from_metadata(metadata, source=str(path))


def tokenizer_from_metadata(meta: dict[str, Any], source: str = "<gguf>") -> Any:
    from tokenizers import AddedToken, Tokenizer
    from transformers import PreTrainedTokenizerFast

    kind = meta.get("tokenizer.ggml.model")
    tokens = meta.get("tokenizer.ggml.tokens")
    if not tokens:
        raise ModelLoadError(f"{source}: metadata tokenizer.ggml.tokens is missing (the file carries no tokenizer)")
    tokens = [str(t) for t in tokens]
    types = list(meta.get("tokenizer.ggml.token_type") or [TOKEN_NORMAL] * len(tokens))
    if kind == "gpt2":
        backend = _byte_level_bpe(meta, tokens, source)
    elif kind == "llama":
        backend = _sentencepiece_bpe(meta, tokens, types, source)
    else:
        raise ModelLoadError(f"{source}: tokenizer.ggml.model {kind!r} is not supported (supported: gpt2, llama)")
    added = [
        AddedToken(tok, special=ty == TOKEN_CONTROL, normalized=False)
        for tok, ty in zip(tokens, types)
        if ty in (TOKEN_CONTROL, TOKEN_USER_DEFINED)
    ]
    backend.add_tokens(added)
    assert isinstance(backend, Tokenizer)

    def special(key: str) -> str | None:
        value = meta.get(f"tokenizer.ggml.{key}_token_id")
        return tokens[int(value)] if value is not None and 0 <= int(value) < len(tokens) else None

    options: dict[str, Any] = {
        name: special(key)
        for name, key in (("bos_token", "bos"), ("eos_token", "eos"), ("unk_token", "unknown"), ("pad_token", "padding"))
        if special(key) is not None
    }
    arch = meta.get("general.architecture")
    context = meta.get(f"{arch}.context_length")
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        chat_template=meta.get("tokenizer.chat_template"),
        model_max_length=int(context) if context else 1 << 30,
        **options,
    )
    tokenizer.add_bos_token = bool(meta.get("tokenizer.ggml.add_bos_token", False))
    return tokenizer


def _byte_level_bpe(meta: dict[str, Any], tokens: list[str], source: str) -> Any:
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    pre = str(meta.get("tokenizer.ggml.pre", "default"))
    split = PRE_TOKENIZERS.get(pre)
    if split is None:
        raise ModelLoadError(
            f"{source}: tokenizer.ggml.pre {pre!r} is not supported (supported: {', '.join(sorted(PRE_TOKENIZERS))})"
        )
    merges = [tuple(str(m).split(" ", 1)) for m in meta.get("tokenizer.ggml.merges") or []]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    steps = []
    if split["digits"]:
        steps.append(pre_tokenizers.Digits(individual_digits=True))
    if split["pattern"] is None:
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
    else:
        steps.append(pre_tokenizers.Split(Regex(split["pattern"]), behavior="isolated", invert=False))
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
    backend.pre_tokenizer = pre_tokenizers.Sequence(steps)
    if split["nfc"]:
        backend.normalizer = normalizers.NFC()
    backend.decoder = decoders.ByteLevel()
    return backend


def _sentencepiece_bpe(meta: dict[str, Any], tokens: list[str], types: list[int], source: str) -> Any:
    """llama.cpp's SentencePiece tokenizer merges, at each step, the adjacent pair whose merged
    piece has the highest score: a BPE whose merge ranks follow the merged pieces' scores."""
    from tokenizers import Tokenizer, decoders, models, normalizers

    scores = meta.get("tokenizer.ggml.scores")
    if scores is None:
        raise ModelLoadError(f"{source}: metadata tokenizer.ggml.scores is missing (SentencePiece vocabularies need it)")
    vocab = {tok: i for i, tok in enumerate(tokens)}
    mergeable = [i for i, ty in enumerate(types) if ty == TOKEN_NORMAL]
    merges: list[tuple[float, int, str, str]] = []
    for i in mergeable:
        piece = tokens[i]
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab:
                merges.append((-float(scores[i]), i, left, right))
    merges.sort()
    unk = meta.get("tokenizer.ggml.unknown_token_id")
    backend = Tokenizer(
        models.BPE(
            vocab=vocab, merges=[(a, b) for _, _, a, b in merges], byte_fallback=True, fuse_unk=True,
            unk_token=tokens[int(unk)] if unk is not None else None,
        )
    )  # fmt: skip
    steps = [normalizers.Replace(" ", "▁")]
    if meta.get("tokenizer.ggml.add_space_prefix", True):
        steps.insert(0, normalizers.Prepend("▁"))
    backend.normalizer = normalizers.Sequence(steps)
    dec = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if meta.get("tokenizer.ggml.add_space_prefix", True):
        dec.append(decoders.Strip(" ", 1, 0))
    backend.decoder = decoders.Sequence(dec)
    return backend
