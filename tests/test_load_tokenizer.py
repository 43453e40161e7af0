"""``engine.entrypoints.engine.load_tokenizer``: a folder that names the plain fast tokenizer class
loads it directly (issue 25: AutoTokenizer's class resolution imports seconds of transformers),
and the tokenizer is the one AutoTokenizer gives; any other folder still goes through AutoTokenizer."""

from __future__ import annotations

import json
import shutil

import pytest

from engine.entrypoints.engine import _declares_fast_tokenizer, load_tokenizer

TEXTS = ["Give me a JSON record about Marie Curie.", 'héllo 2025 {"a": [1, 2.5e-3]}\n\t<|im_end|>', "  ωμέγα 😀 x"]


@pytest.fixture(scope="module")
def folder():
    from engine.hf.model_files import default_model_dir

    return default_model_dir()


def _fingerprint(tok) -> tuple:
    chat = tok.apply_chat_template([{"role": "user", "content": TEXTS[0]}], add_generation_prompt=True, tokenize=False)
    return (type(tok).__name__, [tok.encode(t) for t in TEXTS], tok.decode(list(range(0, 400, 7))), chat,
            tok.eos_token_id, tok.bos_token_id, tok.pad_token_id, tok.unk_token_id, len(tok),
            sorted(tok.get_added_vocab().items()), tok.all_special_tokens, tok.model_max_length)


def test_embedded_model_folder_loads_directly_and_equals_autotokenizer(folder):
    from transformers import AutoTokenizer

    assert _declares_fast_tokenizer(folder)
    assert _fingerprint(load_tokenizer(folder)) == _fingerprint(AutoTokenizer.from_pretrained(str(folder), local_files_only=True))


def test_other_folders_go_through_autotokenizer(folder, tmp_path):
    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    cases = {
        "remote_code": dict(config, auto_map={"AutoTokenizer": ["tok.MyTokenizer", None]}),
        "other_class": dict(config, tokenizer_class="LlamaTokenizer"),
        "no_class": {k: v for k, v in config.items() if k != "tokenizer_class"},
    }
    for name, cfg in cases.items():
        (tmp_path / name).mkdir()
        shutil.copy(folder / "tokenizer.json", tmp_path / name / "tokenizer.json")
        (tmp_path / name / "tokenizer_config.json").write_text(json.dumps(cfg), encoding="utf-8")
        assert not _declares_fast_tokenizer(tmp_path / name), name
    (tmp_path / "no_json").mkdir()
    (tmp_path / "no_json" / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    assert not _declares_fast_tokenizer(tmp_path / "no_json")
    assert not _declares_fast_tokenizer(tmp_path / "missing")
