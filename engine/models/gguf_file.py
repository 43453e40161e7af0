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

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .config import ModelConfig, ModelLoadError

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


class GGUFFile:
    def __init__(self, path: Path, reader: Any) -> None:
        self.path = path
        self._reader = reader
        self.metadata: dict[str, Any] = {}
        for key, field in reader.fields.items():
            if key.startswith("GGUF."):
                continue
            self.metadata[key] = field.contents()
        self.tensors: dict[str, GGUFTensor] = {}
        for t in reader.tensors:
            shape = tuple(int(d) for d in reversed([int(x) for x in t.shape]))
            self.tensors[t.name] = GGUFTensor(t.name, t.tensor_type.name, shape, t.data)
        self.architecture_name = str(self.metadata.get("general.architecture", ""))

    @classmethod
    def open(cls, path: str | os.PathLike[str], supported_types: frozenset[str] | None = None) -> GGUFFile:
        """Open and check ``path``; ``supported_types``: the ggml type names the caller can run."""
        p = Path(path)
        if not p.is_file():
            raise ModelLoadError(f"{p} does not exist")
        size = p.stat().st_size
        with open(p, "rb") as f:
            head = f.read(8)
        if head[:4] != GGUF_MAGIC:
            raise ModelLoadError(f"{p}: not a GGUF file (magic {head[:4]!r}, expected {GGUF_MAGIC!r})")
        import gguf

        try:
            reader = gguf.GGUFReader(str(p), "r")
        except Exception as exc:  # the reader raises ValueError / IndexError / KeyError on bad bytes
            raise ModelLoadError(f"{p}: corrupt or truncated GGUF ({type(exc).__name__}: {exc})") from None
        gf = cls(p, reader)
        for raw in reader.tensors:
            name, kind = raw.name, raw.tensor_type.name
            end = int(raw.data_offset) + int(raw.n_bytes)
            if end > size:
                raise ModelLoadError(f"{p}: tensor {name!r} ({kind}) ends at byte {end}, past the end of the file ({size} bytes): truncated")
            if supported_types is not None and kind not in supported_types:
                raise ModelLoadError(
                    f"{p}: tensor {name!r} has type {kind}, which formcast cannot run (supported: {', '.join(sorted(supported_types))})"
                )
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
        head_dim = self.get("attention.key_length") or self.get("rope.dimension_count") or hidden // heads
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
        return ModelConfig.from_dict(self.config_dict())
