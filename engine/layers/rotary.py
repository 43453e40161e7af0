"""Rotary position embedding with the RoPE scalings of the Llama family: ``default``, ``linear``
(positions divided by a factor), ``llama3`` (long wavelengths scaled, short ones kept, a smooth
blend between) and Phi-3's ``longrope``/``su`` (per-frequency divisors, cos/sin scaled by an
attention factor; the short table, see ``ModelConfig.context_len``). cos/sin are tabulated once for
every position, in float32 as ``transformers`` computes them, so a lookup replaces per-step
trigonometry. A partial rotary (``rotary_dim`` < head_dim, Phi-4 mini) rotates the first
``rotary_dim`` channels of each head and passes the rest through.

``ggml=True`` (GGUF models with ``ModelConfig.ggml_numerics``, unscaled RoPE) tabulates the angles as llama.cpp does instead: position
times theta ** (-2 / dim) raised by repeated float32 multiplication, cos/sin rounded once from
double. transformers' table differs by up to ~1e-5 in the angles, enough to flip the float16
rounding of llama.cpp's attention (``layers.attention``) on some elements."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:  # the layer reads the settings; models/config.py parses them (and imports this)
    from ..models.config import RopeConfig


def rope_inverse_frequencies(rope: RopeConfig, head_dim: int, max_positions: int) -> torch.Tensor:
    shape = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    if rope.type in ("longrope", "su"):
        assert rope.short_factor is not None and len(rope.short_factor) == head_dim // 2, "short_factor per frequency"
        return 1.0 / (torch.tensor(rope.short_factor, dtype=torch.float32) * rope.theta**shape)
    inv_freq = 1.0 / (rope.theta**shape)
    if rope.type == "linear":
        return inv_freq / rope.factor
    if rope.type == "llama3":
        return _llama3_scaled(inv_freq, rope, max_positions)
    return inv_freq


def _llama3_scaled(inv_freq: torch.Tensor, rope: RopeConfig, max_positions: int) -> torch.Tensor:
    old_len = rope.original_max_position_embeddings or max_positions
    low_wavelen = old_len / rope.low_freq_factor
    high_wavelen = old_len / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (old_len / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
    blended = (1 - smooth) * scaled / rope.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, blended, scaled)


class RotaryEmbedding:
    """``apply(x, positions)`` rotates ``x`` [T, heads, head_dim] in place of a copy."""

    def __init__(
        self, rope: RopeConfig, head_dim: int, max_positions: int, dtype: torch.dtype, device: torch.device, ggml: bool = False
    ) -> None:
        """``head_dim``: the rotated channels per head (``rotary_dim`` for a partial rotary);
        ``ggml``: llama.cpp's angles (see the module docstring)."""
        if ggml and rope.type == "default" and rope.attention_factor is None:
            emb = _ggml_angles(rope.theta, head_dim, max_positions).double()
            self.cos = emb.cos().float().to(device=device, dtype=dtype)
            self.sin = emb.sin().float().to(device=device, dtype=dtype)
        else:
            inv_freq = rope_inverse_frequencies(rope, head_dim, max_positions)
            freqs = torch.arange(max_positions, dtype=torch.int64).float()[:, None] * inv_freq[None, :]
            emb = torch.cat((freqs, freqs), dim=-1)
            scale = rope.attention_factor if rope.attention_factor is not None else 1.0
            self.cos = (emb.cos() * scale).to(device=device, dtype=dtype)  # [P, head_dim]
            self.sin = (emb.sin() * scale).to(device=device, dtype=dtype)
        self.half = head_dim // 2
        self.dim = head_dim

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-token tables [T, 1, head_dim], looked up once per forward and shared by every layer."""
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)

    def apply(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.dim:  # partial rotary: the tail channels pass through
            return torch.cat((self.apply(x[..., : self.dim], cos, sin), x[..., self.dim :]), dim=-1)
        x1, x2 = x[..., : self.half], x[..., self.half :]
        rotated = torch.cat((-x2, x1), dim=-1)
        return x * cos + rotated * sin


def _ggml_angles(theta: float, head_dim: int, max_positions: int) -> torch.Tensor:
    """[P, head_dim] float32 angles, each frequency's the previous one's times the ratio."""
    ratio = torch.tensor(float(np.power(np.float32(theta), np.float32(-2.0 / head_dim))), dtype=torch.float32)
    cols = [torch.arange(max_positions, dtype=torch.int64).float()]
    for _ in range(head_dim // 2 - 1):
        cols.append(cols[-1] * ratio)
    angles = torch.stack(cols, dim=1)
    return torch.cat((angles, angles), dim=-1)
