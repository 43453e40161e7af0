"""Weight-only quantization of a Hugging Face checkpoint at load: ``quantization="int8" | "int4"``.

Each dense matrix the forward multiplies (fused q/k/v, o, fused gate/up, down, the output head
and with it a tied embedding) is encoded, row by row in groups of 32 weights, into the ggml
block format of the same width: ``int8`` -> Q8_0 (int8 codes, one fp16 scale a group), ``int4``
-> Q4_0 (4-bit codes, one fp16 scale a group). They become ``layers.ggml_quants.QuantizedWeight``s,
the very objects a GGUF file of those types loads into, so the same kernels multiply them (with
activations quantized per block as llama.cpp does) and the rest of the model does not know.
The encoding is the ``gguf`` package's reference quantizer, so a matrix quantized here is the
matrix llama.cpp's converter would write.

What stays in floating point: norms, biases, routers and the stacked expert tensors of a mixture
of experts (the expert kernel takes float stacks), and any matrix whose rows are not whole
32-weight groups. Weights are 3.8x (int8) and 7.1x (int4) smaller than float32; on the CPU the
forward runs in float32 (the kernels' accumulation type). On a CUDA device the encoded matrices
are ``formcast_kernels.ggml_blocks.BlockMatrix``es (the Triton kernels a GGUF file's weights use
there) and the rest of the model keeps its half-precision dtype.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np
import torch
from torch import nn

from formcast_kernels.ggml_blocks import BlockMatrix

from ..layers.ggml_quants import QK, QuantizedWeight
from ..layers.panel_linear import PanelWeight

SCHEMES = {"int8": "Q8_0", "int4": "Q4_0"}


@dataclass(frozen=True)
class QuantizationReport:
    """What ``quantize_model`` changed: matrices encoded, kept in float, and the bytes before and after."""

    scheme: str
    quantized: tuple[str, ...]
    kept_float: tuple[str, ...]
    float_bytes: int
    quantized_bytes: int


def check_scheme(scheme: str | None) -> str | None:
    if scheme is not None and scheme not in SCHEMES:
        raise ValueError(f"quantization must be one of {', '.join(SCHEMES)} or None, got {scheme!r}")
    return scheme


def quantize_matrix(weight: torch.Tensor, scheme: str) -> QuantizedWeight | BlockMatrix:
    """A float [N, K] matrix (K a multiple of 32) in the scheme's ggml block format, on the
    matrix's device (a GPU's: a ``BlockMatrix`` for the Triton kernels)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    type_name = SCHEMES[scheme]
    n, k = weight.shape
    if k % QK:
        raise ValueError(f"rows of {k} weights are not whole {QK}-weight groups")
    raw = quantize(weight.detach().float().cpu().numpy(), GGMLQuantizationType[type_name])
    if weight.device.type != "cpu":
        return BlockMatrix.from_gguf(type_name, torch.from_numpy(np.ascontiguousarray(raw)).to(weight.device), (n, k))
    return QuantizedWeight.from_gguf(type_name, np.ascontiguousarray(raw), (n, k))


# (module path relative to a decoder layer, attribute) of the dense matrices a layer multiplies.
LAYER_MATRICES = (("self_attn", "qkv_proj"), ("self_attn", "o_proj"), ("mlp", "gate_up_proj"), ("mlp", "down_proj"),
                  ("mlp.shared_expert", "gate_up_proj"), ("mlp.shared_expert", "down_proj"))  # fmt: skip


def matrix_slots(model: nn.Module) -> Iterator[tuple[nn.Module, str, str]]:
    """(owning module, attribute, path) of each dense matrix the forward multiplies: the output
    head first, then every layer's ``LAYER_MATRICES`` that the layer has."""
    yield model, "lm_head", "lm_head"
    for i, layer in enumerate(model.layers):
        for owner_path, name in LAYER_MATRICES:
            try:
                owner = layer.get_submodule(owner_path)
            except AttributeError:
                continue
            if owner is not None:
                yield owner, name, f"layers.{i}.{owner_path}.{name}"


def replace_matrix(owner: nn.Module, name: str, value: object) -> None:
    """Put a matrix kept in another form than a tensor (not a Parameter) on ``owner``."""
    owner._parameters.pop(name, None)
    setattr(owner, name, value)


def quantize_model(model: nn.Module, scheme: str) -> QuantizationReport:
    """Encode ``model``'s dense matrices in place (see the module docstring)."""
    check_scheme(scheme)
    done: list[str] = []
    kept: list[str] = []
    before = after = 0
    encoded: dict[int, QuantizedWeight | BlockMatrix] = {}  # id(tensor) -> its encoding: a tied head is encoded once

    def encode(owner: nn.Module, name: str, path: str) -> None:
        nonlocal before, after
        slot = weight = getattr(owner, name, None)
        if isinstance(weight, PanelWeight):  # a float CPU model's matrix, packed at load
            weight = weight.dense()
        if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
            if isinstance(weight, torch.Tensor):
                kept.append(path)
            return
        if weight.shape[1] % QK:
            kept.append(path)
            return
        if id(slot) not in encoded:
            before += weight.numel() * 4
            encoded[id(slot)] = quantize_matrix(weight, scheme)
            after += encoded[id(slot)].nbytes
        replace_matrix(owner, name, encoded[id(slot)])
        done.append(path)

    tied = model.embed_tokens is model.lm_head
    for owner, name, path in matrix_slots(model):
        encode(owner, name, path)
    if tied:  # the embedding reads rows of the same encoded matrix
        replace_matrix(model, "embed_tokens", model.lm_head)
    for i, layer in enumerate(model.layers):
        if getattr(layer.mlp, "experts", None) is not None or hasattr(layer.mlp, "gate"):
            kept.append(f"layers.{i}.mlp (router and experts)")
    return QuantizationReport(scheme, tuple(done), tuple(kept), before, after)
