"""The embedded SmolLM2-135M-Instruct: converted once from the GGUF, loaded offline."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from engine.hf import model_files  # noqa: E402
from engine.hf.model_files import _publish, default_model_dir, is_complete_model_dir, load_model_and_tokenizer  # noqa: E402

PROMPT = [{"role": "user", "content": "What is 2+2? Answer in one word."}]


@pytest.fixture(scope="module")
def model_dir():
    return default_model_dir()


@pytest.fixture(scope="module")
def converted(model_dir):
    return load_model_and_tokenizer(model_dir)


def test_folder_layout(model_dir):
    assert is_complete_model_dir(model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    assert config["model_type"] == "llama" and config["num_hidden_layers"] == 30
    assert config["hidden_size"] == 576 and config["vocab_size"] == 49152 and config["tie_word_embeddings"]
    assert "quantization_config" not in config
    assert json.loads((model_dir / "generation_config.json").read_text())["eos_token_id"] == 2
    assert json.loads((model_dir / "special_tokens_map.json").read_text())["eos_token"] == "<|im_end|>"


def test_second_call_does_not_reconvert(model_dir, monkeypatch):
    before = (model_dir / "model.safetensors").stat().st_mtime_ns

    def boom(*a, **k):
        raise AssertionError("reconverted although the folder is complete")

    monkeypatch.setattr(model_files, "convert_gguf", boom)
    assert default_model_dir() == model_dir
    assert (model_dir / "model.safetensors").stat().st_mtime_ns == before


def test_tokenizer_splits_digits_and_renders_chat(converted, smollm2_tokenizer):
    _, tok = converted
    for t in (tok, smollm2_tokenizer):
        assert len(t.encode("12345", add_special_tokens=False)) == 5
        assert t.eos_token_id == 2 and t.convert_ids_to_tokens(2) == "<|im_end|>"
        text = t.apply_chat_template(PROMPT, tokenize=False, add_generation_prompt=True)
        assert text.startswith("<|im_start|>system\n") and "<|im_start|>user\nWhat is 2+2?" in text
        assert text.endswith("<|im_start|>assistant\n")


def test_tied_embeddings_and_fp32(converted):
    model, _ = converted
    assert model.dtype == torch.float32
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_weights_equal_dequantized_gguf(model_dir):
    """Spot-check tensors against the GGUF dequantized by the ``gguf`` package itself
    (tensors transformers does not permute: the q/k projections are checked by the slow test)."""
    gguf = pytest.importorskip("gguf")
    from safetensors import safe_open

    names = {
        "blk.3.ffn_down.weight": "model.layers.3.mlp.down_proj.weight",
        "blk.3.attn_v.weight": "model.layers.3.self_attn.v_proj.weight",
        "output_norm.weight": "model.norm.weight",
    }
    reader = gguf.GGUFReader(str(model_files.gguf_path()))
    with safe_open(str(model_dir / "model.safetensors"), "np") as f:
        assert len(list(f.keys())) == 272  # 30 layers x 9 + embeddings + final norm; lm_head is tied
        checked = 0
        for t in reader.tensors:
            if t.name in names:
                ours = f.get_tensor(names[t.name])
                ref = gguf.quants.dequantize(t.data, t.tensor_type).reshape(ours.shape)
                assert (ref == ours).all(), t.name
                checked += 1
    assert checked == len(names)


@pytest.mark.slow
def test_same_greedy_tokens_as_gguf_model(converted):
    """The reference: transformers' own GGUF loader (dequantizes to fp32). Same weights -> same
    logits and the same greedy continuation."""
    from transformers import AutoModelForCausalLM

    model, tok = converted
    gguf = model_files.gguf_path()
    reference = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32).eval()
    ids = tok.apply_chat_template(PROMPT, add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, reference(ids).logits, rtol=0, atol=1e-5)
        kwargs = dict(max_new_tokens=8, do_sample=False, pad_token_id=2)
        ours = model.generate(ids, **kwargs)
        theirs = reference.generate(ids, **kwargs)
    assert ours.tolist() == theirs.tolist()
    assert ours.shape[1] > ids.shape[1]


def test_publish_keeps_the_winner_of_a_race(tmp_path):
    def folder(name: str, complete: bool):
        d = tmp_path / name
        d.mkdir()
        for f in model_files._REQUIRED_FILES:
            (d / f).write_text(name)
        if complete:
            (d / model_files._COMPLETE_MARKER).write_text(model_files._LAYOUT_VERSION)
        return d

    target = tmp_path / "model"
    _publish(folder("first", True), target)
    assert (target / "config.json").read_text() == "first"
    loser = folder("second", True)
    _publish(loser, target)  # another process finished first: no error, theirs is kept
    assert (target / "config.json").read_text() == "first" and loser.exists()

    stale = tmp_path / "stale"
    folder("stale", False).rename(stale)
    _publish(folder("fresh", True), stale)  # an incomplete folder is replaced
    assert (stale / "config.json").read_text() == "fresh" and is_complete_model_dir(stale)


def test_missing_folder_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_model_and_tokenizer(tmp_path / "nope")


def test_conversion_flow_with_a_fake_converter(tmp_path, monkeypatch):
    """default_model_dir in a fresh cache: converts once into a temp folder, publishes, reuses."""
    calls = []

    def fake_convert(gguf, out_dir):
        calls.append(out_dir)
        assert out_dir.parent == tmp_path and out_dir.name.startswith(".")  # a temp sibling
        for f in model_files._REQUIRED_FILES:
            (out_dir / f).write_text("{}")
        (out_dir / model_files._COMPLETE_MARKER).write_text(model_files._LAYOUT_VERSION)

    monkeypatch.setattr(model_files, "convert_gguf", fake_convert)
    first = default_model_dir(cache_dir=tmp_path)
    assert first == tmp_path / model_files.MODEL_NAME and is_complete_model_dir(first)
    assert default_model_dir(cache_dir=tmp_path) == first and len(calls) == 1
    assert not calls[0].exists()  # the temp folder was renamed into place
    (first / model_files._COMPLETE_MARKER).write_text("0")  # an older layout is rebuilt
    assert default_model_dir(cache_dir=tmp_path) == first and len(calls) == 2
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")) == [model_files.MODEL_NAME]


def test_the_conversion_parses_a_file_once_and_restores_gguf(tmp_path):
    """Inside the conversion one path gives one parsed reader (transformers asks three times)
    and one tensor-name table per architecture; outside it ``gguf`` is what it was."""
    gguf = pytest.importorskip("gguf")
    import numpy as np

    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_tensor("output_norm.weight", np.arange(4, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    real_reader, real_name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    with model_files._gguf_parsed_once():
        first = gguf.GGUFReader(path)
        assert gguf.GGUFReader(str(path)) is first
        assert [t.name for t in first.tensors] == ["output_norm.weight"]
        assert first.tensors[0].data.tolist() == [0.0, 1.0, 2.0, 3.0]
        table = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 1)
        assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 1) is table
        assert table.get_name("model.norm") == "output_norm"
    assert gguf.GGUFReader is real_reader and gguf.get_tensor_name_map is real_name_map
    assert gguf.GGUFReader(path) is not first
