"""A GGUF file, opened and checked: metadata, tensors (as the bytes of their encoding), the
architecture it declares mapped to the same ``ModelConfig`` a Hugging Face ``config.json`` gives.

    gf = GGUFFile.open("model.gguf")      # ModelLoadError if the file is not a GGUF formcast can run
    cfg = gf.model_config()                 # ModelConfig, as from config.json
    t = gf.tensor("blk.0.attn_q.weight")    # GGUFTensor: ggml type, shape [N, K], raw bytes

Every check happens in ``open``: the magic and version, every tensor's type (one formcast has a
kernel for), that each tensor's bytes lie inside the file, and the architecture. A failure is a
``ModelLoadError`` naming the file, and the tensor and type where one is at fault; the memory map is
dropped with the reader, so nothing half-loaded stays.

``GGUF_ARCHITECTURES`` maps ``general.architecture`` to how its metadata and tensors read; other
model families register theirs there (``register_gguf_architecture``).
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from .config import ModelConfig, ModelLoadError
from .gguf_families import family_config

GGUF_MAGIC = b"GGUF"


@dataclass(frozen=True)
class GGUFArchitecture:
    """How one GGUF ``general.architecture`` maps onto formcast's model classes.

    ``hf_architecture``: the ``config.json`` architecture whose ModelConfig it builds.
    ``rope_interleaved``: llama.cpp rotates adjacent pairs (its ``NORM`` RoPE); the converter
    permuted the q/k rows of such models, and the loader puts them back in Hugging Face order
    (rotate-half), which is what ``layers.rotary`` computes.
    """

    hf_architecture: str
    rope_interleaved: bool
    qkv_bias_always: bool = False


GGUF_ARCHITECTURES: dict[str, GGUFArchitecture] = {
    "llama": GGUFArchitecture("LlamaForCausalLM", rope_interleaved=True),
    "qwen2": GGUFArchitecture("Qwen2ForCausalLM", rope_interleaved=False, qkv_bias_always=True),
    # the families of models.gguf_families (which reads their metadata); llama with experts is Mixtral
    "qwen3": GGUFArchitecture("Qwen3ForCausalLM", rope_interleaved=False),
    "qwen2moe": GGUFArchitecture("Qwen2MoeForCausalLM", rope_interleaved=False, qkv_bias_always=True),
    "qwen3moe": GGUFArchitecture("Qwen3MoeForCausalLM", rope_interleaved=False),
    "gemma2": GGUFArchitecture("Gemma2ForCausalLM", rope_interleaved=False),
    "gemma3": GGUFArchitecture("Gemma3ForCausalLM", rope_interleaved=False),
    "phi3": GGUFArchitecture("Phi3ForCausalLM", rope_interleaved=False),
    "olmoe": GGUFArchitecture("OlmoeForCausalLM", rope_interleaved=False),
}


def register_gguf_architecture(name: str, arch: GGUFArchitecture) -> None:
    GGUF_ARCHITECTURES[name] = arch


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    ggml_type: str  # gguf.GGMLQuantizationType name: "Q4_1", "F32", ...
    shape: tuple[int, ...]  # torch order: [N, K] for a matrix (ggml's ne reversed)
    data: np.ndarray  # the file's bytes (a memory-map view): [N, row_bytes] uint8, or float32/float16 values


def is_gguf_file(path: str | os.PathLike[str]) -> bool:
    p = Path(path)
    if not p.is_file():
        return False
    with open(p, "rb") as f:
        return f.read(4) == GGUF_MAGIC


# The metadata of the last files opened, by (path, size, modification time): a load reads the
# file's config, tokenizer and tensors through three opens, and parsing a 49k-token vocabulary
# and its merges takes about 0.4 s each time. Callers treat ``metadata`` as read-only.
_PARSED: dict[tuple[str, int, int], tuple[dict[str, Any], list[tuple[str, tuple[int, ...], int, int]], int]] = {}
_PARSED_FILES = 4


class GGUFFile:
    def __init__(self, path: Path, metadata: dict[str, Any], tensors: dict[str, GGUFTensor], buffer: np.memmap | None = None) -> None:
        self.path = path
        self.metadata = metadata
        self.tensors = tensors
        self.architecture_name = str(metadata.get("general.architecture", ""))
        self._buffer = buffer  # the whole file, memory-mapped: every tensor's ``data`` is a view of it

    def release(self, tensor: GGUFTensor) -> None:
        """Hand ``tensor``'s pages of the file mapping back to the kernel once the loader holds its
        own copy of them: read pages of a mapped file count in the process's resident memory, so
        a load that kept them would peak at the file's size plus the weights' (1.4 GB for a
        0.55 GB file). The mapping stays valid: a later read of those bytes faults them in again."""
        mapping = getattr(self._buffer, "_mmap", None)
        if mapping is None or not hasattr(mmap, "MADV_DONTNEED") or tensor.data.nbytes == 0:
            return
        start = tensor.data.ctypes.data - self._buffer.ctypes.data
        if not 0 <= start < len(self._buffer):
            return
        first = start - start % mmap.PAGESIZE
        try:
            mapping.madvise(mmap.MADV_DONTNEED, first, start + tensor.data.nbytes - first)
        except (OSError, ValueError):  # advice only: the bytes stay resident
            pass

    @classmethod
    def open(cls, path: str | os.PathLike[str], supported_types: frozenset[str] | None = None) -> GGUFFile:
        """Open and check ``path``; ``supported_types``: the ggml type names the caller can run."""
        p = Path(path)
        if not p.is_file():
            raise ModelLoadError(f"{p} does not exist")
        with open(p, "rb") as f:
            magic = f.read(4)
        if magic != GGUF_MAGIC:
            raise ModelLoadError(f"{p}: not a GGUF file (it starts with {magic!r}, not {GGUF_MAGIC!r})")
        buf = np.memmap(p, dtype=np.uint8, mode="r")
        stat = p.stat()
        key = (str(p.resolve()), stat.st_size, stat.st_mtime_ns)
        parsed = _PARSED.get(key)
        if parsed is None:
            parser = _Parser(p, buf)
            try:
                metadata, infos = parser.parse()
            except (_Truncated, struct.error, UnicodeDecodeError, ValueError, OverflowError) as exc:
                raise ModelLoadError(f"{p}: corrupt or truncated GGUF ({exc or type(exc).__name__} at byte {parser.pos})") from None
            align = int(metadata.get("general.alignment", 32))
            parsed = (metadata, infos, -(-parser.pos // align) * align)
            if len(_PARSED) >= _PARSED_FILES:
                _PARSED.pop(next(iter(_PARSED)))
            _PARSED[key] = parsed
        metadata, infos, data_start = parsed
        tensors: dict[str, GGUFTensor] = {}
        for name, dims, type_id, offset in infos:
            tensors[name] = _tensor(p, buf, name, dims, type_id, data_start + offset, supported_types)
        gf = cls(p, metadata, tensors, buf)
        gf.arch  # noqa: B018 - checks the architecture now
        return gf

    @property
    def arch(self) -> GGUFArchitecture:
        arch = GGUF_ARCHITECTURES.get(self.architecture_name)
        if arch is None:
            raise ModelLoadError(
                f"{self.path}: general.architecture {self.architecture_name!r} is not supported "
                f"(supported: {', '.join(sorted(GGUF_ARCHITECTURES))})"
            )
        return arch

    def tensor(self, name: str) -> GGUFTensor:
        t = self.tensors.get(name)
        if t is None:
            raise ModelLoadError(f"{self.path}: tensor {name!r} is missing")
        return t

    def get(self, key: str, default: Any = None) -> Any:
        """An architecture-scoped metadata value: ``get("block_count")`` reads ``llama.block_count``."""
        return self.metadata.get(f"{self.architecture_name}.{key}", default)

    def _required(self, key: str) -> Any:
        value = self.get(key)
        if value is None:
            raise ModelLoadError(f"{self.path}: metadata {self.architecture_name}.{key} is missing")
        return value

    def config_dict(self) -> dict[str, Any]:
        """The ``config.json`` equivalent of this file's metadata."""
        arch = self.arch
        heads = int(self._required("attention.head_count"))
        hidden = int(self._required("embedding_length"))
        kv_heads = self.get("attention.head_count_kv", heads)
        if isinstance(kv_heads, list):  # per-layer counts: formcast's blocks share one
            if len(set(kv_heads)) != 1:
                raise ModelLoadError(f"{self.path}: per-layer attention.head_count_kv {kv_heads} is not supported")
            kv_heads = kv_heads[0]
        # llama.cpp: the head width is attention.key_length, else hidden / heads; rope.dimension_count
        # is the rotated part of it (models.gguf_families reads a partial rotary where a family has one)
        head_dim = self.get("attention.key_length") or hidden // heads
        vocab = self.get("vocab_size") or len(self.metadata.get("tokenizer.ggml.tokens") or []) or self.tensor("token_embd.weight").shape[0]
        cfg: dict[str, Any] = {
            "architectures": [arch.hf_architecture],
            "vocab_size": int(vocab),
            "hidden_size": hidden,
            "intermediate_size": int(self._required("feed_forward_length")),
            "num_hidden_layers": int(self._required("block_count")),
            "num_attention_heads": heads,
            "num_key_value_heads": int(kv_heads),
            "head_dim": int(head_dim),
            "rms_norm_eps": float(self.get("attention.layer_norm_rms_epsilon", 1e-6)),
            "max_position_embeddings": int(self.get("context_length", 2048)),
            "rope_theta": float(self.get("rope.freq_base", 10000.0)),
            "tie_word_embeddings": "output.weight" not in self.tensors,
            "attention_bias": "blk.0.attn_q.bias" in self.tensors and not arch.qkv_bias_always,
            "eos_token_id": self.eos_token_ids(),
            "torch_dtype": "float32",
        }
        if "rope_freqs.weight" in self.tensors:
            raise ModelLoadError(f"{self.path}: tensor 'rope_freqs.weight' (per-frequency RoPE factors) is not supported")
        scaling = self.get("rope.scaling.type")
        factor = self.get("rope.scaling.factor") or self.get("rope.scale_linear")
        if scaling in (None, "none") and factor and float(factor) != 1.0:
            scaling = "linear"
        if scaling not in (None, "none"):
            if scaling != "linear":
                raise ModelLoadError(f"{self.path}: rope.scaling.type {scaling!r} is not supported (supported: linear)")
            cfg["rope_scaling"] = {"rope_type": "linear", "factor": float(factor or 1.0)}
        if self.get("attention.sliding_window"):
            cfg["sliding_window"] = int(self.get("attention.sliding_window"))
            cfg["use_sliding_window"] = True
        family_config(self, cfg)
        return cfg

    def eos_token_ids(self) -> list[int]:
        """The ids that end a generation: EOS, end of turn and end of message, in that order."""
        ids: list[int] = []
        for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
            value = self.metadata.get(key)
            if value is not None and int(value) not in ids:
                ids.append(int(value))
        return ids

    def model_config(self) -> ModelConfig:
        # Off by default: it moves the logits ~1e-3 away from the same weights run as an HF folder,
        # and has not yet shown more greedy agreement with llama.cpp on SmolLM2 (BENCHMARKS.md).
        ggml = os.environ.get(GGML_NUMERICS_ENV, "") not in ("", "0")
        return replace(ModelConfig.from_dict(self.config_dict()), ggml_numerics=ggml)


# --------------------------------------------------------------------------- the binary format
# The gguf package's reader builds a Python object per array element (tens of seconds for a
# 49k-token vocabulary on a loaded machine); this parser reads numeric arrays as numpy views and
# strings in one pass.

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_NUMPY = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32, 6: np.float32, 7: np.bool_,
          10: np.uint64, 11: np.int64, 12: np.float64}  # fmt: skip
_STRING, _ARRAY = 8, 9


GGML_NUMERICS_ENV = "FORMCAST_GGML_NUMERICS"


class _Truncated(Exception):
    pass


class _Parser:
    def __init__(self, path: Path, buf: np.ndarray) -> None:
        self.path, self.buf, self.pos = path, buf, 0
        self.raw = memoryview(buf)

    def _take(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.buf):
            raise _Truncated(f"needs {n} bytes past the end of the file ({len(self.buf)} bytes)")
        view = self.raw[self.pos : self.pos + n]
        self.pos += n
        return view

    def _scalar(self, fmt: str) -> Any:
        return struct.unpack(fmt, self._take(struct.calcsize(fmt)))[0]

    def _string(self) -> str:
        return bytes(self._take(self._scalar("<Q"))).decode("utf-8")

    def _strings(self, count: int) -> list[str]:
        """``count`` strings (a vocabulary, its merges): ``_string``'s work without its calls."""
        raw, pos, end, out = self.raw, self.pos, len(self.buf), []
        for _ in range(count):
            if pos + 8 > end:
                raise _Truncated(f"needs 8 bytes past the end of the file ({end} bytes)")
            n = int.from_bytes(raw[pos : pos + 8], "little")
            pos += 8
            if pos + n > end:
                raise _Truncated(f"needs {n} bytes past the end of the file ({end} bytes)")
            out.append(str(raw[pos : pos + n], "utf-8"))
            pos += n
        self.pos = pos
        return out

    def _value(self, kind: int) -> Any:
        if kind == 6:  # float32: its shortest decimal (1e-05, not 9.999999747378752e-06), as config.json has it
            return float(str(np.float32(self._scalar("<f"))))
        if kind in _SCALARS:
            return self._scalar(_SCALARS[kind])
        if kind == _STRING:
            return self._string()
        if kind == _ARRAY:
            inner, count = self._scalar("<I"), self._scalar("<Q")
            if inner in _NUMPY:
                dt = np.dtype(_NUMPY[inner])
                return np.frombuffer(self._take(count * dt.itemsize), dtype=dt).tolist()
            if inner == _STRING:
                return self._strings(count)
            return [self._value(inner) for _ in range(count)]
        raise ValueError(f"unknown metadata value type {kind}")

    def parse(self) -> tuple[dict[str, Any], list[tuple[str, tuple[int, ...], int, int]]]:
        if bytes(self._take(4)) != GGUF_MAGIC:
            raise ValueError("bad magic")
        version = self._scalar("<I")
        if version not in (2, 3):
            raise ValueError(f"GGUF version {version} is not supported (2 or 3)")
        n_tensors, n_kv = self._scalar("<Q"), self._scalar("<Q")
        metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = self._string()
            metadata[key] = self._value(self._scalar("<I"))
        infos = []
        for _ in range(n_tensors):
            name = self._string()
            n_dims = self._scalar("<I")
            if n_dims > 4:
                raise ValueError(f"tensor {name!r} has {n_dims} dimensions")
            dims = tuple(self._scalar("<Q") for _ in range(n_dims))
            infos.append((name, dims, self._scalar("<I"), self._scalar("<Q")))
        return metadata, infos


def _tensor(path: Path, buf: np.ndarray, name: str, dims: tuple[int, ...], type_id: int, start: int,
            supported: frozenset[str] | None) -> GGUFTensor:  # fmt: skip
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        kind = GGMLQuantizationType(type_id)
    except ValueError:
        raise ModelLoadError(f"{path}: tensor {name!r} has unknown ggml type id {type_id}") from None
    if supported is not None and kind.name not in supported:
        raise ModelLoadError(
            f"{path}: tensor {name!r} has type {kind.name}, which formcast cannot run (supported: {', '.join(sorted(supported))})"
        )
    block, type_size = GGML_QUANT_SIZES[kind]
    shape = tuple(reversed(dims))  # torch order
    if not shape or shape[-1] % block:
        raise ModelLoadError(f"{path}: tensor {name!r} ({kind.name}) has rows of {shape[-1] if shape else 0} elements, not whole {block}-element blocks")
    rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
    row_bytes = shape[-1] // block * type_size
    end = start + rows * row_bytes
    if end > len(buf):
        raise ModelLoadError(
            f"{path}: tensor {name!r} ({kind.name}) ends at byte {end}, past the end of the file ({len(buf)} bytes): truncated"
        )
    raw = buf[start:end]
    if kind.name in ("F32", "F16"):
        data = raw.view(np.float32 if kind.name == "F32" else np.float16).reshape(shape)
    else:
        data = raw.reshape(shape[:-1] + (row_bytes,)) if len(shape) > 1 else raw.reshape(1, row_bytes)
    return GGUFTensor(name, kind.name, shape, data)
