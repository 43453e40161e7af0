"""Model path -> ``LlamaForCausalLM`` on a device, in a dtype: one interface for every format.

``load_model`` / ``load_config`` take a Hugging Face folder (below) or a GGUF file (handed to
``models.gguf_loader``, which keeps quantized weights in their encoding).

A Hugging Face folder holds ``config.json`` and one or more ``*.safetensors`` files (sharded
checkpoints list their shards in ``model.safetensors.index.json``). Each tensor is read once,
converted to the target dtype and placed into the fused layout of ``models.llama``; a tensor the
architecture needs but the checkpoint lacks is a ``ModelLoadError`` naming it. Checkpoints that
store projections fused already (Phi-3's ``qkv_proj`` and ``gate_up_proj``, stacked experts) are
taken as they are; per-expert tensors (``experts.{e}.gate_proj`` / Mixtral's ``w1 w3 w2``) are
stacked. Gemma's norms scale by (1 + w): the loader stores 1 + w, so one RMSNorm serves all.

``dtype="auto"`` keeps the dtype the checkpoint declares (``torch_dtype`` / ``dtype`` in
config.json) where the device runs it fast (``auto_dtype``): on GPUs half precision (bfloat16
where supported); on the CPU a float32 checkpoint stays float32, a bfloat16 one runs in bfloat16
when a quick matrix-vector timing at load shows it clearly faster than float32 (decode is bound by
reading weights, and half the bytes pays only where the CPU converts bfloat16 cheaply), else in
float32, and a float16 one runs in float32. GGUF files compute in float32 (their weights stay in
the file's encoding).
"""

from __future__ import annotations

import functools
import json
import time
from pathlib import Path
from typing import Iterator

import torch
from torch import nn

from ..layers.rotary import RotaryEmbedding
from .config import ModelConfig, ModelLoadError
from .llama import LlamaForCausalLM

# config -> model class; every supported architecture runs on the one decoder of models.llama. A
# loader for another format builds the same ModelConfig and calls ``model_class(cfg)(cfg)``.
MODEL_CLASSES: dict[str, type[nn.Module]] = {}


def model_class(cfg: ModelConfig) -> type[nn.Module]:
    return MODEL_CLASSES.get(cfg.architecture, LlamaForCausalLM)

_DTYPES = {
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
}  # fmt: skip
# bfloat16 must beat float32 by this factor in the load-time timing to be chosen on the CPU.
AUTO_BF16_MIN_SPEEDUP = 1.3


def resolve_dtype(
    dtype: str | torch.dtype, device: torch.device, quantized: bool = False, declared: str | None = None
) -> torch.dtype:
    """``quantized``: the weights stay in ggml block formats, whose CPU kernels compute in
    float32, so ``"auto"`` is float32 there (on a GPU the Triton kernels take half-precision
    activations: ``auto_dtype``). ``declared``: the checkpoint's ``torch_dtype`` / ``dtype``,
    which ``"auto"`` keeps where the device runs it fast (``auto_dtype``)."""
    if quantized and dtype == "auto" and device.type == "cpu":
        return torch.float32
    if isinstance(dtype, torch.dtype):
        if dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise ValueError(f"dtype must be float32, bfloat16 or float16, got {dtype}")
        return dtype
    if dtype == "auto":
        return auto_dtype(declared, device)
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of auto, {', '.join(_DTYPES)}; got {dtype!r}")
    return _DTYPES[dtype]


def auto_dtype(declared: str | None, device: torch.device) -> torch.dtype:
    """The checkpoint's dtype where the device runs it fast, else the nearest one it does.

    CUDA: bfloat16 checkpoints run in bfloat16 (float16 where the GPU lacks it), float16 ones in
    float16, float32 and undeclared ones in bfloat16 / float16 (GPUs multiply half precision
    many times faster). CPU: float32 checkpoints stay float32 (no timing probe at all); bfloat16
    and undeclared ones run in bfloat16 only where the load-time probe shows it clearly faster,
    else in float32; float16 ones run in float32: torch's CPU matmuls widen float16 element by
    element (slower than float32 on CPUs without native float16 arithmetic), and widening is
    exact, where narrowing to bfloat16 would drop three mantissa bits of every weight.
    """
    want = _DTYPES.get(str(declared).removeprefix("torch.")) if declared else None
    if device.type == "cuda":
        if want == torch.float16:
            return torch.float16
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if want in (torch.float32, torch.float16):
        return torch.float32
    return torch.bfloat16 if cpu_bf16_speedup() >= AUTO_BF16_MIN_SPEEDUP else torch.float32


@functools.lru_cache(maxsize=1)
def cpu_bf16_speedup() -> float:
    """float32 time / bfloat16 time of matrix-vector products over 96 MB of float32 weights (six
    layer-sized matrices, more than a CPU's last-level cache, read in turn as a decode step reads
    its layers). A single small matrix would sit in cache and favour float32 (measured)."""
    weights32 = [torch.randn(2048, 2048) for _ in range(6)]
    weights16 = [w.bfloat16() for w in weights32]
    x32 = torch.randn(1, 2048)
    x16 = x32.bfloat16()

    def best(x: torch.Tensor, ws: list[torch.Tensor]) -> float:
        times = []
        for _ in range(5):
            start = time.perf_counter()
            for w in ws:
                torch.nn.functional.linear(x, w)
            times.append(time.perf_counter() - start)
        return min(times)

    with torch.inference_mode():
        best(x16, weights16)  # first bf16 call initializes the kernel library
        return best(x32, weights32) / best(x16, weights16)


def is_gguf(path: str | Path) -> bool:
    from .gguf_file import is_gguf_file

    return is_gguf_file(path)


def load_config(path: str | Path) -> ModelConfig:
    """The ``ModelConfig`` of a model folder or GGUF file (``ModelLoadError`` if it has none)."""
    path = Path(path)
    if path.is_file():
        from .gguf_loader import open_gguf

        return open_gguf(path).model_config()
    if not path.is_dir():
        raise FileNotFoundError(f"model path {path} does not exist (a Hugging Face folder or a .gguf file)")
    return ModelConfig.from_folder(path)


def load_model(folder: str | Path, dtype: torch.dtype, device: torch.device, quantization: str | None = None) -> LlamaForCausalLM:
    """``quantization``: ``"int8"`` / ``"int4"`` encode a folder's dense matrices at load
    (``models.weight_quantization``); a GGUF file is quantized already and takes none."""
    folder = Path(folder)
    if quantization is not None:
        from .weight_quantization import check_scheme

        try:
            check_scheme(quantization)
        except ValueError as exc:
            raise ModelLoadError(str(exc)) from None
        if folder.is_file():
            raise ModelLoadError(f"{folder}: a GGUF file keeps its own encoding; quantization={quantization!r} applies to Hugging Face folders")
        if device.type == "cpu" and dtype != torch.float32:
            raise ModelLoadError(f"quantization={quantization!r} computes in float32 on the CPU (dtype {dtype} requested)")
    if folder.is_file():
        from .gguf_loader import load_gguf_model

        model = load_gguf_model(folder, dtype, device)
    else:
        model = _load_folder(folder, dtype, device)
    if quantization is not None:
        from .weight_quantization import quantize_model

        quantize_model(model, quantization)
    if device.type == "cpu":  # the dense matrices left in float, in the CPU product's layout
        from .weight_panels import pack_model

        pack_model(model)
    return model


def _load_folder(folder: Path, dtype: torch.dtype, device: torch.device) -> LlamaForCausalLM:
    cfg = ModelConfig.from_folder(folder)
    with torch.device("meta"):
        model = model_class(cfg)(cfg)
    tensors = _TensorSource(folder)
    put = lambda module, name, t: setattr(module, name, nn.Parameter(t.to(device, dtype), requires_grad=False))  # noqa: E731
    put(model, "embed_tokens", tensors.get("model.embed_tokens.weight"))
    put(model.norm, "weight", _norm(cfg, tensors.get("model.norm.weight")))
    for i, layer in enumerate(model.layers):
        _load_layer(layer, cfg, tensors, f"model.layers.{i}.", put)
    if cfg.tie_word_embeddings:
        model.lm_head = model.embed_tokens
    else:
        put(model, "lm_head", tensors.get("lm_head.weight"))
    attach_rotary(model, cfg, dtype, device)
    return model.eval()


def attach_rotary(model: LlamaForCausalLM, cfg: ModelConfig, dtype: torch.dtype, device: torch.device) -> None:
    """The RoPE tables of ``cfg`` on ``model`` (every format's loader calls this once)."""
    rotary_dim = cfg.rotary_dim or cfg.head_dim
    ggml = cfg.ggml_numerics  # llama.cpp's way of building the angles (opt-in, GGUF files)
    model.rotary = RotaryEmbedding(cfg.rope, rotary_dim, cfg.context_len, dtype, device, ggml=ggml)
    if cfg.local_rope is not None and cfg.local_rope != cfg.rope:
        model.rotary_local = RotaryEmbedding(cfg.local_rope, rotary_dim, cfg.context_len, dtype, device, ggml=ggml)


def _norm(cfg: ModelConfig, weight: torch.Tensor) -> torch.Tensor:
    """A norm weight as ``layers.layernorm.RMSNorm`` multiplies by it: Gemma's 1 + w in float32."""
    return weight.float() + 1.0 if cfg.norm_plus_one else weight


def _load_layer(layer: nn.Module, cfg: ModelConfig, tensors: _TensorSource, prefix: str, put) -> None:  # type: ignore[no-untyped-def]
    attn, mlp = layer.self_attn, layer.mlp
    cat = lambda *names: torch.cat([tensors.get(prefix + n) for n in names])  # noqa: E731
    if tensors.has(prefix + "self_attn.qkv_proj.weight"):  # Phi-3
        put(attn, "qkv_proj", tensors.get(prefix + "self_attn.qkv_proj.weight"))
    else:
        put(attn, "qkv_proj", cat("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"))
    if cfg.qkv_bias:
        put(attn, "qkv_bias", cat("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"))
    put(attn, "o_proj", tensors.get(prefix + "self_attn.o_proj.weight"))
    if cfg.o_bias:
        put(attn, "o_bias", tensors.get(prefix + "self_attn.o_proj.bias"))
    if cfg.qk_norm is not None:
        put(attn.q_norm, "weight", _norm(cfg, tensors.get(prefix + "self_attn.q_norm.weight")))
        put(attn.k_norm, "weight", _norm(cfg, tensors.get(prefix + "self_attn.k_norm.weight")))
    if hasattr(mlp, "experts"):
        _load_experts(mlp, cfg, tensors, prefix, put)
    else:
        _load_mlp(mlp, cfg, tensors, prefix + "mlp.", put)
    norms = ["input_layernorm", "post_attention_layernorm"]
    if cfg.sandwich_norm:
        norms += ["pre_feedforward_layernorm", "post_feedforward_layernorm"]
    for name in norms:
        put(getattr(layer, name), "weight", _norm(cfg, tensors.get(prefix + name + ".weight")))


def _load_mlp(mlp: nn.Module, cfg: ModelConfig, tensors: _TensorSource, prefix: str, put) -> None:  # type: ignore[no-untyped-def]
    cat = lambda *names: torch.cat([tensors.get(prefix + n) for n in names])  # noqa: E731
    if tensors.has(prefix + "gate_up_proj.weight"):  # Phi-3
        put(mlp, "gate_up_proj", tensors.get(prefix + "gate_up_proj.weight"))
    else:
        put(mlp, "gate_up_proj", cat("gate_proj.weight", "up_proj.weight"))
    put(mlp, "down_proj", tensors.get(prefix + "down_proj.weight"))
    if cfg.mlp_bias:
        put(mlp, "gate_up_bias", cat("gate_proj.bias", "up_proj.bias"))
        put(mlp, "down_bias", tensors.get(prefix + "down_proj.bias"))


def _load_experts(block: nn.Module, cfg: ModelConfig, tensors: _TensorSource, prefix: str, put) -> None:  # type: ignore[no-untyped-def]
    assert cfg.moe is not None
    mixtral = tensors.has(prefix + "block_sparse_moe.gate.weight")
    base = prefix + ("block_sparse_moe." if mixtral else "mlp.")
    put(block, "gate", tensors.get(base + "gate.weight"))
    if tensors.has(base + "experts.gate_up_proj"):  # stacked already (transformers 5's own layout)
        put(block, "gate_up_proj", tensors.get(base + "experts.gate_up_proj"))
        put(block, "down_proj", tensors.get(base + "experts.down_proj"))
    else:
        gate, up, down = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
        experts = range(cfg.moe.num_experts)
        get = lambda e, name: tensors.get(f"{base}experts.{e}.{name}.weight")  # noqa: E731
        put(block, "gate_up_proj", torch.stack([torch.cat([get(e, gate), get(e, up)]) for e in experts]))
        put(block, "down_proj", torch.stack([get(e, down) for e in experts]))
    if block.shared_expert is not None:
        _load_mlp(block.shared_expert, cfg, tensors, base + "shared_expert.", put)
        put(block, "shared_expert_gate", tensors.get(base + "shared_expert_gate.weight"))


class _TensorSource:
    """Tensor name -> tensor, across the folder's safetensors shards, opened lazily."""

    def __init__(self, folder: Path) -> None:
        from safetensors import safe_open

        self._open = safe_open
        self.folder = folder
        self._where: dict[str, Path] = {}
        self._handles: dict[Path, object] = {}
        for shard in self._shards():
            with safe_open(str(shard), framework="pt") as f:
                for name in f.keys():
                    self._where[name] = shard
        if not self._where:
            raise ModelLoadError(f"{folder}: no *.safetensors weights found")

    def _shards(self) -> Iterator[Path]:
        index = self.folder / "model.safetensors.index.json"
        if index.is_file():
            weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map", {})
            for name in sorted(set(weight_map.values())):
                path = self.folder / name
                if not path.is_file():
                    raise ModelLoadError(f"{index} lists shard {name}, which does not exist")
                yield path
            return
        yield from sorted(self.folder.glob("*.safetensors"))

    def has(self, name: str) -> bool:
        return name in self._where

    def get(self, name: str) -> torch.Tensor:
        path = self._where.get(name)
        if path is None:
            raise ModelLoadError(f"{self.folder}: tensor {name!r} is missing from the checkpoint")
        handle = self._handles.get(path)
        if handle is None:
            handle = self._handles[path] = self._open(str(path), framework="pt")
        return handle.get_tensor(name)  # type: ignore[attr-defined]
