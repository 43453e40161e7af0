"""Tokenizers built from GGUF metadata (engine.hf.gguf_tokenizer) against the published ones.

- The embedded SmolLM2 GGUF's tokenizer equals the SmolLM2 tokenizer the rest of the suite uses
  (built by transformers' converter with the digit split restored): token ids over a varied
  corpus, the vocabulary's bytes (``grammar.vocab.TokenVocabulary``), specials and chat template.
- Qwen2's split pattern: metadata built from Qwen2's vocabulary and merges with
  ``tokenizer.ggml.pre = "qwen2"`` tokenizes like Qwen2's own tokenizer.
- SentencePiece (``tokenizer.ggml.model = "llama"``): a small vocabulary against a direct
  transcription of llama.cpp's algorithm (merge the adjacent pair whose result scores highest).
- Unknown tokenizer kinds and pre-tokenizers are refused by name.
"""

from __future__ import annotations

import random

import pytest

from engine.hf.gguf_tokenizer import load_gguf_tokenizer, tokenizer_from_metadata
from engine.models.config import ModelLoadError

CORPUS = [
    "Hello world!",
    "The year 2024 had 366 days; 3.14159 is pi, 1,000,000 is a million.",
    "  leading spaces and trailing   \n\n\ttabs\r\n",
    "Ünïcödé façade — naïve café, 日本語のテキスト, Ελληνικά, עברית, emoji 🤖🎉👍🏽",
    '{"name": "Marie Curie", "born": 1867, "fields": ["physics", "chemistry"]}',
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nhi<|im_end|>",
    "def f(x):\n    return x ** 2  # comment\n\nprint(f(12))",
    "I'm, you're, they'll, we've, she'd, it's DON'T SHOUT",
    "x" * 50 + "1234567890" * 3,
    "mixed123abc456def 0x1F 1e-9 -42 +7 ½ ⅓ ①②",
]


def _random_texts(n: int) -> list[str]:
    rng = random.Random(0)
    alphabet = "abc XYZ 0123456789 .,;:!?'\"-_\n\t{}[]()<>/\\|é日🤖"
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 60))) for _ in range(n)]


@pytest.fixture(scope="module")
def smollm2_gguf_tokenizer():
    from engine.hf.model_files import gguf_path

    return load_gguf_tokenizer(gguf_path())


def test_smollm2_gguf_tokenizer_equals_the_reference(smollm2_gguf_tokenizer, smollm2_tokenizer):
    g, h = smollm2_gguf_tokenizer, smollm2_tokenizer
    for text in CORPUS + _random_texts(200):
        assert g.encode(text) == h.encode(text), text
        ids = h.encode(text)
        assert g.decode(ids) == h.decode(ids)
    assert len(g) == len(h)
    for name in ("bos_token", "eos_token", "unk_token", "pad_token"):
        assert getattr(g, name) == getattr(h, name), name
    chat = [{"role": "user", "content": "Give me 3 numbers"}, {"role": "assistant", "content": "1, 2, 3"}]
    assert g.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == h.apply_chat_template(
        chat, tokenize=False, add_generation_prompt=True
    )


def test_smollm2_gguf_vocabulary_bytes_equal(smollm2_gguf_tokenizer, smollm2_vocab):
    from grammar.vocab import TokenVocabulary

    vocab = TokenVocabulary.from_tokenizer(smollm2_gguf_tokenizer)
    assert list(vocab.token_bytes) == list(smollm2_vocab.token_bytes)
    assert vocab.eos_token_ids == smollm2_vocab.eos_token_ids
    assert vocab.special_token_ids == smollm2_vocab.special_token_ids
    assert vocab.fingerprint == smollm2_vocab.fingerprint


def _qwen_metadata(tokenizer) -> dict:
    import json

    data = json.loads(tokenizer.backend_tokenizer.to_str())
    vocab = data["model"]["vocab"]
    tokens = [None] * (max(vocab.values()) + 1 + len(data["added_tokens"]))
    for tok, i in vocab.items():
        tokens[i] = tok
    types = [1] * len(tokens)
    for added in data["added_tokens"]:
        tokens[added["id"]] = added["content"]
        types[added["id"]] = 3
    merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": merges,
            "tokenizer.ggml.eos_token_id": tokenizer.convert_tokens_to_ids("<|im_end|>")}  # fmt: skip


def test_qwen2_pattern_tokenizes_like_qwen2(qwen2_tokenizer):
    g = tokenizer_from_metadata(_qwen_metadata(qwen2_tokenizer))
    for text in CORPUS + _random_texts(100):
        assert g.encode(text) == qwen2_tokenizer.encode(text), text


def _spm_reference(text: str, vocab: dict[str, int], scores: list[float]) -> list[int]:
    """llama.cpp's SentencePiece tokenization: start from characters, repeatedly merge the
    adjacent pair whose concatenation is a token with the highest score (leftmost on ties);
    characters not in the vocabulary become their UTF-8 byte tokens."""
    pieces = list("▁" + text.replace(" ", "▁"))
    while True:
        best = None
        for i in range(len(pieces) - 1):
            merged = pieces[i] + pieces[i + 1]
            if merged in vocab and (best is None or scores[vocab[merged]] > scores[vocab[best[1]]]):
                best = (i, merged)
        if best is None:
            break
        i, merged = best
        pieces[i : i + 2] = [merged]
    ids = []
    for p in pieces:
        if p in vocab:
            ids.append(vocab[p])
        else:
            ids.extend(vocab[f"<0x{b:02X}>"] for b in p.encode())
    return ids


def test_sentencepiece_vocabulary_merges_by_score():
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    words = ["▁", "a", "b", "c", "d", "e", "l", "h", "o", "r", "w", "▁h", "he", "ll", "lo", "▁he", "llo", "▁hello",
             "▁w", "or", "▁wor", "ld", "▁world", "ab", "bc", "abc", "▁a", "▁ab", "cd", "de", "▁c"]  # fmt: skip
    rng = random.Random(1)
    scores = [0.0] * len(tokens) + [-float(i) + rng.random() * 0.5 for i in range(len(words))]
    tokens += words
    types += [1] * len(words)
    meta = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.scores": scores, "tokenizer.ggml.unknown_token_id": 0, "tokenizer.ggml.bos_token_id": 1,
            "tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.add_space_prefix": True}  # fmt: skip
    tok = tokenizer_from_metadata(meta)
    vocab = {t: i for i, t in enumerate(tokens)}
    for text in ["hello world", "abcd abc", "held low", "cab dab é", "hello  world", "worldhello"]:
        assert tok.encode(text, add_special_tokens=False) == _spm_reference(text, vocab, scores), text
        assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


def test_unknown_tokenizers_are_refused():
    base = {"tokenizer.ggml.tokens": ["a", "b"], "tokenizer.ggml.merges": []}
    with pytest.raises(ModelLoadError, match="tokenizer.ggml.pre 'mystery' is not supported"):
        tokenizer_from_metadata({**base, "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "mystery"}, "x.gguf")
    with pytest.raises(ModelLoadError, match="x.gguf: tokenizer.ggml.model 'rwkv' is not supported"):
        tokenizer_from_metadata({**base, "tokenizer.ggml.model": "rwkv"}, "x.gguf")
    with pytest.raises(ModelLoadError, match="tokenizer.ggml.tokens is missing"):
        tokenizer_from_metadata({"tokenizer.ggml.model": "gpt2"}, "x.gguf")
