"""Rotary position embedding with the RoPE scalings of the Llama family: ``default``, ``linear``
(positions divided by a factor) and ``llama3`` (long wavelengths scaled, short ones kept, a smooth
blend between). cos/sin are tabulated once for every position, in float32 as ``transformers``
computes them, so a lookup replaces per-step trigonometry."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # the layer reads the settings; models/config.py parses them (and imports this)
    from ..models.config import RopeConfig


def rope_inverse_frequencies(rope: RopeConfig, head_dim: int, max_positions: int) -> torch.Tensor:
    inv_freq = 1.0 / (rope.theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
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

    def __init__(self, rope: RopeConfig, head_dim: int, max_positions: int, dtype: torch.dtype, device: torch.device) -> None:
        inv_freq = rope_inverse_frequencies(rope, head_dim, max_positions)
        freqs = torch.arange(max_positions, dtype=torch.int64).float()[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos = emb.cos().to(device=device, dtype=dtype)  # [P, head_dim]
        self.sin = emb.sin().to(device=device, dtype=dtype)
        self.half = head_dim // 2

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-token tables [T, 1, head_dim], looked up once per forward and shared by every layer."""
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)

    def apply(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x1, x2 = x[..., : self.half], x[..., self.half :]
        rotated = torch.cat((-x2, x1), dim=-1)
        return x * cos + rotated * sin
