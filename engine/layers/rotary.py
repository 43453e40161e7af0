"""Rotary position embedding with the RoPE scalings of the Llama family: ``default``, ``linear``
(positions divided by a factor), ``llama3`` (long wavelengths scaled, short ones kept, a smooth
blend between) and Phi-3's ``longrope``/``su`` (per-frequency divisors, cos/sin scaled by an
attention factor). cos/sin are tabulated once for every position, in float32 as ``transformers``
computes them, so a lookup replaces per-step trigonometry.

LongRoPE with distinct short and long factors has two tables, and the choice is made as
transformers' rotary makes it in one forward call: by the sequence's length after that forward
(its largest position + 1). A row whose length stays within ``original_max_position_embeddings``
rotates every token of the forward with the short factors; a row that ends past it rotates every
token of the forward (those below the boundary too) with the long ones. The choice is per row, not
per batch (transformers takes the batch's largest position), so a request's logits do not depend on
its batch neighbours. What this shares with transformers' ``forward(past_key_values=...)`` and not
with the uncached model: the keys of earlier forwards stay in the KV cache (and the prefix cache)
rotated with the table of the forward that wrote them. transformers' ``generate`` drops its cache
once, when the sequence first grows past the boundary, and recomputes it with the long factors;
formcast keeps it, so a request that crosses the boundary while decoding attends to short-rotated
keys of its earlier positions (as a chunked prefill across the boundary does in both). For the same
reason a forward's length matters near the boundary: a speculative verification whose drafts reach
past it rotates all its positions with the long factors, where one-token decode steps would have
used the short ones below it, so greedy speculation is token-identical to plain decoding only
away from the boundary. A partial rotary (``rotary_dim`` < head_dim, Phi-4 mini) rotates the first
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

from . import row_ops

if TYPE_CHECKING:  # the layer reads the settings; models/config.py parses them (and imports this)
    from ..models.config import RopeConfig


def rope_inverse_frequencies(rope: RopeConfig, head_dim: int, max_positions: int, long: bool = False) -> torch.Tensor:
    """``long``: LongRoPE's long factors instead of the short ones."""
    shape = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    if rope.type in ("longrope", "su"):
        factors = rope.long_factor if long else rope.short_factor
        assert factors is not None and len(factors) == head_dim // 2, "LongRoPE factors: one per frequency"
        return 1.0 / (torch.tensor(factors, dtype=torch.float32) * rope.theta**shape)
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
        # LongRoPE with two factor sets: rows longer than switch_at read the long table.
        self.switch_at: int | None = None
        self.cos_long: torch.Tensor | None = None
        self.sin_long: torch.Tensor | None = None
        if ggml and rope.type == "default" and rope.attention_factor is None:
            emb = _ggml_angles(rope.theta, head_dim, max_positions).double()
            self.cos = emb.cos().float().to(device=device, dtype=dtype)
            self.sin = emb.sin().float().to(device=device, dtype=dtype)
        else:
            original = rope.original_max_position_embeddings
            two_tables = rope.type in ("longrope", "su") and rope.long_factor != rope.short_factor and original
            if two_tables and original < max_positions:
                assert original is not None
                self.switch_at = original
                # the short table serves rows of at most `original` tokens: positions below it
                self.cos_long, self.sin_long = _tables(rope, head_dim, max_positions, dtype, device, long=True)
                max_positions = original
            self.cos, self.sin = _tables(rope, head_dim, max_positions, dtype, device, long=False)  # [P, head_dim]
        self.half = head_dim // 2
        self.dim = head_dim
        self.row_kernel = False  # quantized models: the compiled loop of ``row_ops``

    def cos_sin(
        self, positions: torch.Tensor, seq_lens: list[int] | None = None, extend_lens: list[int] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-token tables [T, 1, head_dim], looked up once per forward and shared by every layer.
        ``seq_lens`` / ``extend_lens`` (per row: length after the forward, tokens in it) choose
        LongRoPE's table per row (see the module docstring); without them every row is short."""
        if self.switch_at is None or seq_lens is None or all(n <= self.switch_at for n in seq_lens):
            return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)
        assert self.cos_long is not None and self.sin_long is not None and extend_lens is not None
        if all(n > self.switch_at for n in seq_lens):
            return self.cos_long[positions].unsqueeze(1), self.sin_long[positions].unsqueeze(1)
        long_rows = torch.tensor([n > self.switch_at for n in seq_lens], device=positions.device)
        long = torch.repeat_interleave(long_rows, torch.tensor(extend_lens, device=positions.device))[:, None]
        short_pos = positions.clamp(max=self.switch_at - 1)  # short rows never go past it
        cos = torch.where(long, self.cos_long[positions], self.cos[short_pos])
        sin = torch.where(long, self.sin_long[positions], self.sin[short_pos])
        return cos.unsqueeze(1), sin.unsqueeze(1)

    def apply(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.dim:  # partial rotary: the tail channels pass through
            return torch.cat((self.apply(x[..., : self.dim], cos, sin), x[..., self.dim :]), dim=-1)
        if self.row_kernel and x.dtype == torch.float32:
            return row_ops.rotary(x, cos, sin)
        x1, x2 = x[..., : self.half], x[..., self.half :]
        rotated = torch.cat((-x2, x1), dim=-1)
        return x * cos + rotated * sin


def _tables(
    rope: RopeConfig, head_dim: int, positions: int, dtype: torch.dtype, device: torch.device, long: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [positions, head_dim], times LongRoPE's attention factor where it has one."""
    inv_freq = rope_inverse_frequencies(rope, head_dim, positions, long=long)
    freqs = torch.arange(positions, dtype=torch.int64).float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    scale = rope.attention_factor if rope.attention_factor is not None else 1.0
    return (emb.cos() * scale).to(device=device, dtype=dtype), (emb.sin() * scale).to(device=device, dtype=dtype)


def _ggml_angles(theta: float, head_dim: int, max_positions: int) -> torch.Tensor:
    """[P, head_dim] float32 angles, each frequency's the previous one's times the ratio."""
    ratio = torch.tensor(float(np.power(np.float32(theta), np.float32(-2.0 / head_dim))), dtype=torch.float32)
    cols = [torch.arange(max_positions, dtype=torch.int64).float()]
    for _ in range(head_dim // 2 - 1):
        cols.append(cols[-1] * ratio)
    angles = torch.stack(cols, dim=1)
    return torch.cat((angles, angles), dim=-1)
