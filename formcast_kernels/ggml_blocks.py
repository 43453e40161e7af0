"""ggml (GGUF) block-quantized matrices kept quantized on the GPU: the repack and the dispatch.

Contract: ``BlockMatrix.from_gguf(type_name, raw, (N, K))`` takes a tensor's bytes exactly as the
GGUF file stores them (uint8 ``[N, row_bytes]``, ggml's block layout) and repacks them with torch
ops on ``raw``'s device into the layout below; ``dequantize`` then reproduces
``gguf.quants.dequantize`` bit for bit (every product it forms is the one ggml's reference forms,
in float32). ``matmul(x)`` returns ``x.float() @ W.T`` in float32: on CUDA tensors (or any tensor
while Triton's interpreter is on, ``TRITON_INTERPRET=1``) through ``ggml_blocks_triton``'s
kernels, which dequantize in registers; elsewhere through ``dequantize`` and a float32 matmul (the
plainest correct form, and what the kernels are tested against). Imports only torch (triton
lazily, on the kernel path).

GPU layout (every tensor is 2-D, one row per weight row, so ``cat`` and ``take_rows`` are a
``torch.cat`` / ``index_select`` per tensor and never re-encode):

- ``codes``: the low four bits of every code, nibble-packed uint8 ``[N, K/2]`` in ggml's own
  order (a run of ``2*span`` elements is ``span`` bytes: byte ``i`` holds element ``i`` in its low
  nibble and element ``i + span`` in its high one; span 16 for Q4_0/Q4_1/Q5_0/Q5_1, 32 for
  Q4_K/Q5_K, 64 for Q6_K, so the 4-bit formats' bytes are copied unchanged and a kernel loads the
  two matching halves of the activation instead of interleaving). Q8_0: int8 ``[N, K]``.
- ``high``: the bits above the fourth, in natural element order, packed into int32 words
  (``[N, K/32]`` of one bit per element for Q5_x, ``[N, K/16]`` of two bits for Q6_K; bit
  ``(e % per_word) * bits`` of word ``e // per_word``); ``None`` for the other formats.
- ``scales``: per group of ``group`` elements (32; 16 for Q6_K): the fp16 ``d`` for the 32-blocks,
  the 6-bit ``sc`` as uint8 for Q4_K/Q5_K, the int8 scale for Q6_K.
- ``biases``: per group: the fp16 ``m`` of Q4_1/Q5_1, the 6-bit minimum as uint8 of Q4_K/Q5_K;
  ``None`` otherwise.
- ``super_scales`` / ``super_mins``: per 256-element super-block, the K-quants' fp16 ``d`` /
  ``dmin`` (``super_mins`` only for Q4_K/Q5_K).

A weight is ``scale * (code - offset) + bias``, with ``scale = d`` (32-blocks) or
``d_super * sc`` (K-quants, formed in float32 as ggml does), ``offset`` 8 / 16 / 32 for
Q4_0 / Q5_0 / Q6_K, and ``bias = m`` (Q4_1/Q5_1) or ``-(dmin * min)`` (Q4_K/Q5_K).

Bits per weight, this layout against the file: Q4_0 4.5 / 4.5, Q4_1 5.0 / 5.0, Q5_0 5.5 / 5.5,
Q5_1 6.0 / 6.0, Q8_0 8.5 / 8.5, Q4_K 4.625 / 4.5, Q5_K 5.625 / 5.5, Q6_K 6.5625 / 6.5625 (the
K-quants' 6-bit scales and minimums take a byte each: +2.8% and +2.3%).
"""

from __future__ import annotations

import torch

# type -> (elements per block, bytes per block, nibble span (0: one int8 code per byte), high bits
# per code, elements per scale group, code offset, bias kind (0 none, 1 fp16 m per group, 2
# K-quant minimum: -(dmin * min)), scales formed from a per-256 super scale)
FORMATS: dict[str, tuple[int, int, int, int, int, int, int, bool]] = {
    "Q4_0": (32, 18, 16, 0, 32, 8, 0, False),
    "Q4_1": (32, 20, 16, 0, 32, 0, 1, False),
    "Q5_0": (32, 22, 16, 1, 32, 16, 0, False),
    "Q5_1": (32, 24, 16, 1, 32, 0, 1, False),
    "Q8_0": (32, 34, 0, 0, 32, 0, 0, False),
    "Q4_K": (256, 144, 32, 0, 32, 0, 2, True),
    "Q5_K": (256, 176, 32, 1, 32, 0, 2, True),
    "Q6_K": (256, 210, 64, 2, 16, 32, 0, True),
}
SUPER_BLOCK = 256
# Rows repacked at a time: the repack's int64 temporaries of a 128K-row output head would
# otherwise take gigabytes of GPU memory beside the weights.
REPACK_ROWS = 8192


def _interpreting() -> bool:
    """Whether Triton's interpreter is on (the kernels then run on CPU tensors too)."""
    try:
        import triton
    except ImportError:
        return False
    knobs = getattr(triton, "knobs", None)
    return bool(knobs is not None and knobs.runtime.interpret)


def use_kernels(t: torch.Tensor) -> bool:
    """The Triton path for ``t``: CUDA tensors, or any tensor under ``TRITON_INTERPRET=1``."""
    return t.device.type == "cuda" or _interpreting()


def _fp16_at(blocks: torch.Tensor, at: int) -> torch.Tensor:
    """blocks uint8 [N, nb, B] -> the fp16 stored at byte ``at`` of each block, [N, nb]."""
    return blocks[..., at : at + 2].contiguous().view(torch.float16).squeeze(-1)


def _pack_high(bits: torch.Tensor, bits_per_code: int) -> torch.Tensor:
    """bits uint8 [N, K] (each < 2**bits_per_code, natural order) -> int32 words [N, K*bits/32]."""
    per_word = 32 // bits_per_code
    n, k = bits.shape
    grouped = bits.view(n, k // per_word, per_word).to(torch.int64)
    words = torch.zeros(n, k // per_word, dtype=torch.int64, device=bits.device)
    for p in range(per_word):
        words |= grouped[..., p] << (p * bits_per_code)
    # int64 -> int32 keeping the bit pattern (bit 31 becomes the sign), without relying on how a
    # backend narrows out-of-range integers.
    words = torch.where(words >= 2**31, words - 2**32, words)
    return words.to(torch.int32).contiguous()


def _k_scales_mins(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K's 12 bytes of 6-bit scales and minimums, [N, nb, 12] -> two uint8 [N, nb, 8]."""
    low_sc, low_m, tails = packed[..., 0:4], packed[..., 4:8], packed[..., 8:12]
    scales = torch.cat([low_sc & 0x3F, (tails & 0x0F) | ((low_sc >> 2) & 0x30)], dim=-1)
    mins = torch.cat([low_m & 0x3F, (tails >> 4) | ((low_m >> 2) & 0x30)], dim=-1)
    return scales, mins


class BlockMatrix:
    """A [N, K] weight matrix in a ggml block format, repacked for the GPU kernels (layout in the
    module docstring). Immutable by convention: ``cat`` and ``take_rows`` build new matrices."""

    __slots__ = ("type_name", "shape", "codes", "high", "scales", "biases", "super_scales", "super_mins")

    def __init__(
        self,
        type_name: str,
        shape: torch.Size,
        codes: torch.Tensor,
        high: torch.Tensor | None,
        scales: torch.Tensor,
        biases: torch.Tensor | None,
        super_scales: torch.Tensor | None,
        super_mins: torch.Tensor | None,
    ) -> None:
        if type_name not in FORMATS:
            raise ValueError(f"unsupported ggml type {type_name!r}; known: {sorted(FORMATS)}")
        self.type_name = type_name
        self.shape = torch.Size(shape)
        self.codes = codes
        self.high = high
        self.scales = scales
        self.biases = biases
        self.super_scales = super_scales
        self.super_mins = super_mins

    def __repr__(self) -> str:
        return f"BlockMatrix({self.type_name}, shape={tuple(self.shape)}, device={self.device}, nbytes={self.nbytes})"

    # -- construction ---------------------------------------------------------------------------

    @classmethod
    def from_gguf(cls, type_name: str, raw: torch.Tensor, shape: tuple[int, int]) -> BlockMatrix:
        """raw: uint8 tensor [N, row_bytes], the tensor's bytes exactly as stored in the GGUF file
        (ggml layout), on any device; the repack runs with torch ops on raw's device."""
        if type_name not in FORMATS:
            raise ValueError(f"unsupported ggml type {type_name!r}; known: {sorted(FORMATS)}")
        block_elems, block_bytes, _span, high_bits, _group, _offset, bias_kind, _two_level = FORMATS[type_name]
        n, k = int(shape[0]), int(shape[1])
        if raw.dtype != torch.uint8 or raw.dim() != 2:
            raise ValueError(f"raw must be a 2-D uint8 tensor, got {raw.dtype} with shape {tuple(raw.shape)}")
        if k % block_elems:
            raise ValueError(f"{type_name}: K={k} is not a multiple of its block of {block_elems}")
        nb = k // block_elems
        if tuple(raw.shape) != (n, nb * block_bytes):
            raise ValueError(f"{type_name} [{n}, {k}] needs raw bytes [{n}, {nb * block_bytes}], got {tuple(raw.shape)}")
        if n > REPACK_ROWS:  # bounded temporaries: the high-bit unpacking widens codes to 8 bytes each
            return cls.cat([cls.from_gguf(type_name, raw[i : i + REPACK_ROWS], (min(REPACK_ROWS, n - i), k)) for i in range(0, n, REPACK_ROWS)])
        blocks = raw.contiguous().view(n, nb, block_bytes)
        high = biases = super_scales = super_mins = None
        if type_name in ("Q4_0", "Q4_1", "Q5_0", "Q5_1"):
            scales = _fp16_at(blocks, 0)
            codes_at = 2
            if bias_kind == 1:
                biases = _fp16_at(blocks, 2).contiguous()
                codes_at = 4
            if high_bits:
                qh = blocks[..., codes_at : codes_at + 4].to(torch.int64)
                word = qh[..., 0] | (qh[..., 1] << 8) | (qh[..., 2] << 16) | (qh[..., 3] << 24)  # little-endian
                shifts = torch.arange(32, device=raw.device)
                bits = ((word.unsqueeze(-1) >> shifts) & 1).to(torch.uint8)  # [N, nb, 32], element j's fifth bit
                high = _pack_high(bits.view(n, k), 1)
                codes_at += 4
            codes = blocks[..., codes_at : codes_at + 16]
        elif type_name == "Q8_0":
            scales = _fp16_at(blocks, 0)
            codes = blocks[..., 2:34].contiguous().view(torch.int8)
        elif type_name in ("Q4_K", "Q5_K"):
            super_scales = _fp16_at(blocks, 0).contiguous()
            super_mins = _fp16_at(blocks, 2).contiguous()
            scales, biases = _k_scales_mins(blocks[..., 4:16])
            biases = biases.reshape(n, nb * 8).contiguous()
            if type_name == "Q5_K":
                # byte l of the 32 qh bytes holds in bit s the fifth bit of element 32*s + l
                qh = blocks[..., 16:48]
                shifts = torch.arange(8, device=raw.device, dtype=torch.uint8).view(1, 1, 8, 1)
                bits = (qh.unsqueeze(2) >> shifts) & 1  # [N, nb, 8 (s), 32 (l)]
                high = _pack_high(bits.reshape(n, k), 1)
                codes = blocks[..., 48:176]
            else:
                codes = blocks[..., 16:144]
        else:  # Q6_K: ql 128, qh 64, int8 scales 16, fp16 d
            # qh byte 32*h + l holds in bits 2t..2t+1 the top two bits of element 128*h + 32*t + l
            qh = blocks[..., 128:192].reshape(n, nb, 2, 1, 32)
            shifts = torch.tensor([0, 2, 4, 6], device=raw.device, dtype=torch.uint8).view(1, 1, 1, 4, 1)
            bits = (qh >> shifts) & 3  # [N, nb, 2 (h), 4 (t), 32 (l)]
            high = _pack_high(bits.reshape(n, k), 2)
            scales = blocks[..., 192:208].contiguous().view(torch.int8)
            super_scales = _fp16_at(blocks, 208).contiguous()
            codes = blocks[..., 0:128]
        return cls(
            type_name,
            torch.Size((n, k)),
            codes.reshape(n, -1).contiguous(),
            high,
            scales.reshape(n, -1).contiguous(),
            biases,
            super_scales,
            super_mins,
        )

    # -- properties -----------------------------------------------------------------------------

    @property
    def device(self) -> torch.device:
        return self.codes.device

    @property
    def dtype(self) -> torch.dtype:
        """What ``matmul`` and ``dequantize`` return by default."""
        return torch.float32

    def tensors(self) -> list[torch.Tensor | None]:
        """The layout's tensors in a fixed order (None where the format has none)."""
        return [self.codes, self.high, self.scales, self.biases, self.super_scales, self.super_mins]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors() if t is not None)

    # -- reading --------------------------------------------------------------------------------

    def _codes_torch(self) -> torch.Tensor:
        """The unsigned codes (Q8_0: signed) as int32 [N, K], natural order."""
        n, k = self.shape
        _, _, span, high_bits, _, _, _, _ = FORMATS[self.type_name]
        if span == 0:
            return self.codes.to(torch.int32)
        packed = self.codes.view(n, k // (2 * span), 1, span).to(torch.int32)
        codes = torch.cat([packed & 0x0F, packed >> 4], dim=2).view(n, k)
        if high_bits:
            per_word = 32 // high_bits
            shifts = torch.arange(per_word, device=self.device, dtype=torch.int32) * high_bits
            top = (self.high.unsqueeze(-1) >> shifts) & ((1 << high_bits) - 1)
            codes = codes | (top.reshape(n, k) << 4)
        return codes

    def _dequantize_torch(self) -> torch.Tensor:
        n, k = self.shape
        _, _, _, _, group, offset, bias_kind, two_level = FORMATS[self.type_name]
        groups = k // group
        codes = (self._codes_torch() - offset).to(torch.float32).view(n, groups, group)
        scale = self.scales.to(torch.float32)
        if two_level:
            per_super = SUPER_BLOCK // group
            d = self.super_scales.to(torch.float32).repeat_interleave(per_super, dim=1)
            scale = d * scale
        w = scale.unsqueeze(-1) * codes
        if bias_kind == 1:
            w = w + self.biases.to(torch.float32).unsqueeze(-1)
        elif bias_kind == 2:
            dmin = self.super_mins.to(torch.float32).repeat_interleave(SUPER_BLOCK // group, dim=1)
            w = w + (-(dmin * self.biases.to(torch.float32))).unsqueeze(-1)
        return w.view(n, k)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The whole matrix as floats [N, K] (exactly ggml's float32 values, then cast)."""
        if use_kernels(self.codes) and self.shape[0] > 0:
            from .ggml_blocks_triton import dequantize_rows

            return dequantize_rows(self, None, dtype)
        return self._dequantize_torch().to(dtype)

    def embedding(self, ids: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Rows ``ids`` dequantized, [len(ids), K]. On the kernel path ids are not range-checked
        (checking would sync with the host); the torch path raises on a bad id."""
        ids = ids.reshape(-1)
        if use_kernels(self.codes) and ids.numel() > 0:
            from .ggml_blocks_triton import dequantize_rows

            return dequantize_rows(self, ids.to(self.device), dtype)
        return self.take_rows(ids)._dequantize_torch().to(dtype)

    def kernel_args(self) -> tuple[list[torch.Tensor], list[int], dict[str, int]]:
        """The Triton kernels' weight pointers (an unused one points at ``codes`` and is never
        read), their row strides, and the format's compile-time constants."""
        _elems, _bytes, span, high_bits, group, offset, bias_kind, two_level = FORMATS[self.type_name]
        tensors = [self.codes if t is None else t for t in (self.codes, self.high, self.scales, self.biases, self.super_scales, self.super_mins)]
        strides = [
            self.codes.shape[1],
            0 if self.high is None else self.high.shape[1],
            self.scales.shape[1],
            0 if self.super_scales is None else self.super_scales.shape[1],
        ]
        constants = dict(SPAN=span, HIGH_BITS=high_bits, GROUP=group, OFFSET=offset, BIAS_KIND=bias_kind, TWO_LEVEL=two_level)
        return tensors, strides, constants

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x [M, K] any float dtype -> x @ W.T [M, N] in float32 (float32 accumulation)."""
        if x.dim() != 2 or x.shape[1] != self.shape[1]:
            raise ValueError(f"x must be [M, {self.shape[1]}], got {tuple(x.shape)}")
        if not x.is_floating_point():
            raise ValueError(f"x must be floating point, got {x.dtype}")
        if use_kernels(x) and x.shape[0] > 0 and self.shape[0] > 0:
            from .ggml_blocks_triton import block_matmul

            return block_matmul(self, x)
        return x.float() @ self._dequantize_torch().T

    # -- reshaping ------------------------------------------------------------------------------

    @staticmethod
    def cat(parts: list[BlockMatrix]) -> BlockMatrix:
        """Stack along N (same type and K)."""
        if not parts:
            raise ValueError("cat needs at least one BlockMatrix")
        first = parts[0]
        for p in parts[1:]:
            if p.type_name != first.type_name or p.shape[1] != first.shape[1]:
                raise ValueError(f"cat: {p.type_name} [*, {p.shape[1]}] does not stack with {first.type_name} [*, {first.shape[1]}]")
        columns = [[p.tensors()[i] for p in parts] for i in range(6)]
        joined = [None if c[0] is None else torch.cat(c, dim=0) for c in columns]
        rows = sum(p.shape[0] for p in parts)
        return BlockMatrix(first.type_name, torch.Size((rows, first.shape[1])), *joined)

    def take_rows(self, index: torch.Tensor) -> BlockMatrix:
        """The rows ``index`` (reordered, selected or repeated), whole rows copied as they are."""
        index = index.reshape(-1).to(device=self.device, dtype=torch.long)
        taken = [None if t is None else t.index_select(0, index) for t in self.tensors()]
        return BlockMatrix(self.type_name, torch.Size((index.numel(), self.shape[1])), *taken)


__all__ = ["FORMATS", "BlockMatrix", "use_kernels"]
