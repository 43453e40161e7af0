"""ggml's block formats on the CPU: weights kept in their encoding, dot products as the format defines them.

``QuantizedWeight.from_gguf(type_name, raw)`` takes a GGUF tensor's bytes [N, row_bytes] and keeps
them block by block in arrays a compiled loop reads directly (each fp16 scale widened to float32
once at load, so the loop does no half-float conversion):

| type | block | kept as | activation quantized to |
| --- | ---: | --- | --- |
| Q4_0 / Q4_1 | 32 | nibbles [N, K/32, 16], d (and m) | Q8_0 / Q8_1 |
| Q5_0 / Q5_1 | 32 | nibbles, the fifth bits as uint32, d (and m) | Q8_0 / Q8_1 |
| Q8_0 | 32 | int8 [N, K/32, 32], d | Q8_0 |
| Q4_K / Q5_K / Q6_K | 256 | int8 codes [N, K], integer sub-block scales (and mins), d, dmin | Q8_K |

A linear layer on a few activation rows (decode, speculative verification, mixed batches) first
quantizes each row the way llama.cpp does for that format (8-bit blocks with an fp16 scale, plus
the block sum for the formats with a minimum: Q8_1; 256-element blocks with a float32 scale and
16-element sums for the K-quants: Q8_K), then multiplies integer codes by integer codes per block
and scales the block's integer sum once: the result is the format's own dot product, which is why
greedy outputs agree with llama.cpp's, and it reads each weight block once for all the rows.
Beyond ``MAX_QUANT_ROWS`` rows (long prefills) the weight is dequantized to float32 and multiplied
by the same quantized activations (as floats) in torch's GEMM, whose blocking wins there; a row
gets the same numbers whichever path its batch takes, up to float summation order.

Output rows are split across numba's threads (``prange``) and every loop releases the GIL.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from numba import njit, prange

MAX_QUANT_ROWS = 32  # activation rows up to which the integer dot-product loop runs
_ROWS_PER_TASK = 16  # output rows per parallel task
QK = 32
QK_K = 256

BLOCK_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")
K_TYPES = ("Q4_K", "Q5_K", "Q6_K")
QUANT_TYPES = BLOCK_TYPES + K_TYPES
_Q8_1_TYPES = ("Q4_1", "Q5_1")  # the formats with a minimum: activations carry their block sums


def _f16(raw: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(raw).view(np.float16).astype(np.float32)[..., 0]


# --------------------------------------------------------------------------- activation quantizers


@njit(inline="always", nogil=True, cache=True)
def _round_half(x):  # pragma: no cover - compiled
    """``x`` rounded to the nearest fp16 value (ties to even), returned as float32."""
    ax = abs(x)
    if ax == 0.0 or ax != ax:
        return np.float32(x)
    if ax >= 65520.0:
        return np.float32(np.inf) if x > 0 else np.float32(-np.inf)
    if ax < 6.103515625e-05:  # subnormal fp16: multiples of 2**-24
        return np.float32(np.rint(x * 16777216.0) / 16777216.0)
    bits = np.array([x], dtype=np.float32).view(np.uint32)[0]
    # keep 10 mantissa bits of 23: round the low 13 bits to even
    low = bits & np.uint32(0x1FFF)
    bits = bits & np.uint32(0xFFFFE000)
    half = np.uint32(0x1000)
    if low > half or (low == half and (bits & np.uint32(0x2000)) != 0):
        bits = bits + np.uint32(0x2000)
    return np.array([bits], dtype=np.uint32).view(np.float32)[0]


@njit(nogil=True, cache=True, boundscheck=False)
def quantize_q8_0(x, xq, xd, xs):  # pragma: no cover - compiled
    """Rows of ``x`` [M, K] into 32-element blocks: codes ``xq`` [M, K] int8, fp16-rounded scales
    ``xd`` [M, K/32], and ``xs`` = fp16(d * sum of codes) (Q8_1's block sum; ignored by Q8_0)."""
    m_rows, k_dim = x.shape
    for r in range(m_rows):
        for b in range(k_dim // 32):
            amax = np.float32(0.0)
            for j in range(32):
                amax = max(amax, abs(x[r, b * 32 + j]))
            d = amax / np.float32(127.0)
            inv = np.float32(127.0) / amax if amax != 0.0 else np.float32(0.0)
            total = 0
            for j in range(32):
                q = np.int32(np.rint(x[r, b * 32 + j] * inv))
                xq[r, b * 32 + j] = q
                total += q
            xd[r, b] = _round_half(d)
            xs[r, b] = _round_half(d * np.float32(total))


@njit(nogil=True, cache=True, boundscheck=False)
def quantize_q8_k(x, xq, xd, xbs):  # pragma: no cover - compiled
    """Rows of ``x`` [M, K] into Q8_K: 256-element blocks scaled by -127 / (the signed value of
    largest magnitude), float32 scale ``xd`` [M, K/256], 16-element sums ``xbs`` [M, K/16]."""
    m_rows, k_dim = x.shape
    for r in range(m_rows):
        for b in range(k_dim // 256):
            amax = np.float32(0.0)
            vmax = np.float32(0.0)
            for j in range(256):
                v = x[r, b * 256 + j]
                if abs(v) > amax:
                    amax = abs(v)
                    vmax = v
            if amax == 0.0:
                xd[r, b] = 0.0
                for j in range(256):
                    xq[r, b * 256 + j] = 0
                for g in range(16):
                    xbs[r, b * 16 + g] = 0
                continue
            iscale = np.float32(-127.0) / vmax
            for g in range(16):
                total = 0
                for j in range(16):
                    q = min(127, np.int32(np.rint(iscale * x[r, b * 256 + g * 16 + j])))
                    xq[r, b * 256 + g * 16 + j] = q
                    total += q
                xbs[r, b * 16 + g] = total
            xd[r, b] = np.float32(1.0) / iscale


# --------------------------------------------------------------------------- dot-product loops
# One loop per block family; ``kind`` selects the code unpacking (a compile-time-cheap branch
# hoisted out of the inner loop by LLVM since it does not change inside it).


@njit(parallel=True, fastmath=True, nogil=True, cache=True, boundscheck=False)
def _mm_nibbles(kind, qs, qh, wd, wm, xq, xd, xs, out):  # pragma: no cover - compiled
    """Q4_0 (kind 0), Q4_1 (1), Q5_0 (2), Q5_1 (3): out[r, n] = sum over blocks of the block's
    integer dot product times d_w * d_x (+ m_w * s_x for the formats with a minimum)."""
    n_out, nb = wd.shape
    m_rows = xq.shape[0]
    for task in prange((n_out + _ROWS_PER_TASK - 1) // _ROWS_PER_TASK):
        for n in range(task * _ROWS_PER_TASK, min(n_out, task * _ROWS_PER_TASK + _ROWS_PER_TASK)):
            for r in range(m_rows):
                acc = np.float32(0.0)
                for b in range(nb):
                    base = b * 32
                    isum = np.int32(0)
                    if kind <= 1:
                        off = 8 if kind == 0 else 0
                        for j in range(16):
                            v = np.int32(qs[n, b, j])
                            isum += ((v & 15) - off) * np.int32(xq[r, base + j]) + ((v >> 4) - off) * np.int32(xq[r, base + j + 16])
                    else:
                        off = 16 if kind == 2 else 0
                        h = qh[n, b]
                        for j in range(16):
                            v = np.int32(qs[n, b, j])
                            lo = (v & 15) | np.int32(((h >> j) & 1) << 4)
                            hi = (v >> 4) | np.int32(((h >> (j + 16)) & 1) << 4)
                            isum += (lo - off) * np.int32(xq[r, base + j]) + (hi - off) * np.int32(xq[r, base + j + 16])
                    acc += wd[n, b] * xd[r, b] * np.float32(isum)
                    if kind == 1 or kind == 3:
                        acc += wm[n, b] * xs[r, b]
                out[r, n] = acc


@njit(parallel=True, fastmath=True, nogil=True, cache=True, boundscheck=False)
def _mm_q8_0(qs, wd, xq, xd, out):  # pragma: no cover - compiled
    n_out, nb = wd.shape
    m_rows = xq.shape[0]
    for task in prange((n_out + _ROWS_PER_TASK - 1) // _ROWS_PER_TASK):
        for n in range(task * _ROWS_PER_TASK, min(n_out, task * _ROWS_PER_TASK + _ROWS_PER_TASK)):
            for r in range(m_rows):
                acc = np.float32(0.0)
                for b in range(nb):
                    isum = np.int32(0)
                    for j in range(32):
                        isum += np.int32(qs[n, b, j]) * np.int32(xq[r, b * 32 + j])
                    acc += wd[n, b] * xd[r, b] * np.float32(isum)
                out[r, n] = acc


@njit(parallel=True, fastmath=True, nogil=True, cache=True, boundscheck=False)
def _mm_k(q, sc, mn, wd, wdmin, group, xq, xd, xbs, out):  # pragma: no cover - compiled
    """K-quants: per 256-block, d_x * (d_w * sum_g sc_g * isum_g - dmin_w * sum_g mn_g * xsum_g),
    with ``group`` elements per sub-block (32 for Q4_K / Q5_K, 16 for Q6_K, whose codes are
    centred and have no minimum)."""
    n_out, nsb = wd.shape
    m_rows = xq.shape[0]
    per = 256 // group
    sums_per = group // 16
    for task in prange((n_out + _ROWS_PER_TASK - 1) // _ROWS_PER_TASK):
        for n in range(task * _ROWS_PER_TASK, min(n_out, task * _ROWS_PER_TASK + _ROWS_PER_TASK)):
            for r in range(m_rows):
                acc = np.float32(0.0)
                for b in range(nsb):
                    sumi = np.int32(0)
                    summ = np.int32(0)
                    for g in range(per):
                        base = b * 256 + g * group
                        isum = np.int32(0)
                        for j in range(group):
                            isum += np.int32(q[n, base + j]) * np.int32(xq[r, base + j])
                        sumi += np.int32(sc[n, b * per + g]) * isum
                        bs = np.int32(0)
                        for s in range(sums_per):
                            bs += xbs[r, (base >> 4) + s]
                        summ += np.int32(mn[n, b * per + g]) * bs
                    acc += xd[r, b] * (wd[n, b] * np.float32(sumi) - wdmin[n, b] * np.float32(summ))
                out[r, n] = acc


# --------------------------------------------------------------------------- dequantization


@njit(parallel=True, nogil=True, cache=True, boundscheck=False)
def _dequant_nibbles(kind, qs, qh, wd, wm, rows, out):  # pragma: no cover - compiled
    nb = wd.shape[1]
    for i in prange(rows.shape[0]):
        n = rows[i]
        for b in range(nb):
            d = wd[n, b]
            m = wm[n, b]
            h = qh[n, b]
            for j in range(16):
                v = np.int32(qs[n, b, j])
                lo = v & 15
                hi = v >> 4
                if kind >= 2:
                    lo |= np.int32(((h >> j) & 1) << 4)
                    hi |= np.int32(((h >> (j + 16)) & 1) << 4)
                if kind == 0:
                    out[i, b * 32 + j] = np.float32(lo - 8) * d
                    out[i, b * 32 + j + 16] = np.float32(hi - 8) * d
                elif kind == 2:
                    out[i, b * 32 + j] = np.float32(lo - 16) * d
                    out[i, b * 32 + j + 16] = np.float32(hi - 16) * d
                else:
                    out[i, b * 32 + j] = np.float32(lo) * d + m
                    out[i, b * 32 + j + 16] = np.float32(hi) * d + m


@njit(parallel=True, nogil=True, cache=True, boundscheck=False)
def _dequant_q8_0(qs, wd, rows, out):  # pragma: no cover - compiled
    nb = wd.shape[1]
    for i in prange(rows.shape[0]):
        n = rows[i]
        for b in range(nb):
            for j in range(32):
                out[i, b * 32 + j] = np.float32(qs[n, b, j]) * wd[n, b]


@njit(parallel=True, nogil=True, cache=True, boundscheck=False)
def _dequant_k(q, sc, mn, wd, wdmin, group, rows, out):  # pragma: no cover - compiled
    k_dim = q.shape[1]
    for i in prange(rows.shape[0]):
        n = rows[i]
        for e in range(k_dim):
            g = e // group
            b = e // 256
            out[i, e] = wd[n, b] * np.float32(sc[n, g]) * np.float32(q[n, e]) - wdmin[n, b] * np.float32(mn[n, g])


# --------------------------------------------------------------------------- unpacking GGUF blocks


def _k_scales_mins(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K: 8 six-bit scales and 8 six-bit mins packed in 12 bytes -> [.., 8] each."""
    s = scales.astype(np.int32)
    sc = np.empty(s.shape[:-1] + (8,), np.int32)
    mn = np.empty_like(sc)
    sc[..., :4] = s[..., 0:4] & 63
    mn[..., :4] = s[..., 4:8] & 63
    sc[..., 4:] = (s[..., 8:12] & 0xF) | ((s[..., 0:4] >> 6) << 4)
    mn[..., 4:] = (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)
    return sc, mn


def _unpack_k(type_name: str, blocks: np.ndarray) -> dict[str, np.ndarray]:
    """[N, nsb, bytes] K-quant super-blocks -> int8 codes [N, K], sub-block scales/mins, d, dmin."""
    n, nsb, _ = blocks.shape
    if type_name in ("Q4_K", "Q5_K"):
        d, dmin = _f16(blocks[..., 0:2]), _f16(blocks[..., 2:4])
        sc, mn = _k_scales_mins(blocks[..., 4:16])
        qs = blocks[..., 16:144] if type_name == "Q4_K" else blocks[..., 48:176]
        qs = qs.reshape(n, nsb, 4, 32).astype(np.int32)
        codes = np.stack([qs & 15, qs >> 4], axis=3)  # [n, nsb, 4 chunks, lo/hi, 32]
        if type_name == "Q5_K":
            qh = blocks[..., 16:48].astype(np.int32)  # [n, nsb, 32]
            shifts = np.arange(8).reshape(4, 2)  # chunk c, half h -> bit 2c + h
            high = (qh[:, :, None, None, :] >> shifts[None, None, :, :, None]) & 1
            codes = codes | (high << 4)
        q = codes.reshape(n, nsb * 256).astype(np.int8)
        return {"q": q, "sc": sc.reshape(n, nsb * 8), "mn": mn.reshape(n, nsb * 8), "d": d, "dmin": dmin, "group": 32}
    # Q6_K: ql[128], qh[64], scales int8[16], d
    ql = blocks[..., 0:128].reshape(n, nsb, 2, 64).astype(np.int32)
    qh = blocks[..., 128:192].reshape(n, nsb, 2, 32).astype(np.int32)
    scales = np.ascontiguousarray(blocks[..., 192:208]).view(np.int8).astype(np.int32)
    d = _f16(blocks[..., 208:210])
    lo = ql[..., :32] & 15, ql[..., 32:] & 15, ql[..., :32] >> 4, ql[..., 32:] >> 4
    codes = np.stack([lo[i] | (((qh >> (2 * i)) & 3) << 4) for i in range(4)], axis=3) - 32  # [n, nsb, half, 4, 32]
    q = codes.reshape(n, nsb * 256).astype(np.int8)
    return {"q": q, "sc": scales.reshape(n, nsb * 16), "mn": np.zeros((n, nsb * 16), np.int32), "d": d,
            "dmin": np.zeros_like(d), "group": 16}  # fmt: skip


class QuantizedWeight:
    """A [N, K] weight matrix in a ggml block format; ``linear`` and ``embedding`` use it as is.

    Looks enough like a weight tensor for the model code around it (``shape``, ``dtype`` of the
    results, ``device``). ``cat`` stacks matrices of one format along N (fused q/k/v, gate/up).
    """

    def __init__(self, type_name: str, shape: tuple[int, int], arrays: dict[str, np.ndarray]) -> None:
        self.type_name = type_name
        self.shape = torch.Size(shape)
        self.arrays = arrays
        self.dtype = torch.float32  # what it computes in
        self.device = torch.device("cpu")

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays.values() if isinstance(a, np.ndarray))

    @classmethod
    def from_gguf(cls, type_name: str, raw: np.ndarray, shape: tuple[int, int]) -> QuantizedWeight:
        """``raw``: the tensor's bytes [N, row_bytes] as stored in the file."""
        n, k = shape
        if type_name in K_TYPES:
            if k % QK_K:
                raise ValueError(f"{type_name} rows of {k} elements are not whole 256-element blocks")
            blocks = raw.reshape(n, k // QK_K, -1)
            return cls(type_name, shape, _unpack_k(type_name, blocks))
        if type_name not in BLOCK_TYPES:
            raise ValueError(f"no kernel for type {type_name}")
        blocks = raw.reshape(n, k // QK, -1)
        arrays: dict[str, np.ndarray] = {"d": _f16(blocks[..., 0:2])}
        if type_name == "Q8_0":
            arrays["qs"] = np.ascontiguousarray(blocks[..., 2:34]).view(np.int8)
            return cls(type_name, shape, arrays)
        start = 2
        if type_name in _Q8_1_TYPES:
            arrays["m"] = _f16(blocks[..., 2:4])
            start = 4
        else:
            arrays["m"] = np.zeros_like(arrays["d"])
        if type_name in ("Q5_0", "Q5_1"):
            arrays["qh"] = np.ascontiguousarray(blocks[..., start : start + 4]).view(np.uint32)[..., 0]
            start += 4
        else:
            arrays["qh"] = np.zeros(arrays["d"].shape, np.uint32)
        arrays["qs"] = np.ascontiguousarray(blocks[..., start : start + 16])
        return cls(type_name, shape, arrays)

    @staticmethod
    def cat(parts: list[QuantizedWeight]) -> QuantizedWeight:
        kinds = {p.type_name for p in parts}
        assert len(kinds) == 1, f"cannot fuse weights of types {sorted(kinds)}"
        first = parts[0]
        arrays = {}
        for key, value in first.arrays.items():
            arrays[key] = value if key == "group" else np.concatenate([p.arrays[key] for p in parts])
        return QuantizedWeight(first.type_name, (sum(p.shape[0] for p in parts), first.shape[1]), arrays)

    def take_rows(self, index: np.ndarray) -> QuantizedWeight:
        """The matrix with its rows reordered / selected (each row is whole blocks, so no re-encoding)."""
        arrays = {k: (v if k == "group" else np.ascontiguousarray(v[index])) for k, v in self.arrays.items()}
        return QuantizedWeight(self.type_name, (len(index), self.shape[1]), arrays)

    # ------------------------------------------------------------------ compute
    def dequantize_rows(self, rows: np.ndarray) -> np.ndarray:
        a = self.arrays
        out = np.empty((rows.shape[0], self.shape[1]), np.float32)
        rows = np.ascontiguousarray(rows, dtype=np.int64)
        if self.type_name == "Q8_0":
            _dequant_q8_0(a["qs"], a["d"], rows, out)
        elif self.type_name in K_TYPES:
            _dequant_k(a["q"], a["sc"], a["mn"], a["d"], a["dmin"], a["group"], rows, out)
        else:
            _dequant_nibbles(BLOCK_TYPES.index(self.type_name), a["qs"], a["qh"], a["d"], a["m"], rows, out)
        return out

    def dequantize(self) -> torch.Tensor:
        return torch.from_numpy(self.dequantize_rows(np.arange(self.shape[0])))

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x [M, K] float -> x @ W.T [M, N] float32."""
        m_rows = x.shape[0]
        x32 = x.float().contiguous().numpy()
        k_dim = self.shape[1]
        xq = np.empty((m_rows, k_dim), np.int8)
        a = self.arrays
        block = QK_K if self.type_name in K_TYPES else QK
        xd = np.empty((m_rows, k_dim // block), np.float32)
        if self.type_name in K_TYPES:
            xbs = np.empty((m_rows, k_dim // 16), np.int32)
            quantize_q8_k(x32, xq, xd, xbs)
        else:
            xs = np.empty_like(xd)
            quantize_q8_0(x32, xq, xd, xs)
        if m_rows > MAX_QUANT_ROWS:
            # The same quantized activations, multiplied in float by torch's GEMM: a row's result
            # does not depend on which path its batch took (up to float summation order).
            x_deq = (xq.reshape(m_rows, -1, block) * xd[..., None]).reshape(m_rows, k_dim)
            return F.linear(torch.from_numpy(x_deq), self.dequantize())
        out = np.empty((m_rows, self.shape[0]), np.float32)
        if self.type_name in K_TYPES:
            _mm_k(a["q"], a["sc"], a["mn"], a["d"], a["dmin"], a["group"], xq, xd, xbs, out)
        else:
            if self.type_name == "Q8_0":
                _mm_q8_0(a["qs"], a["d"], xq, xd, out)
            else:
                _mm_nibbles(BLOCK_TYPES.index(self.type_name), a["qs"], a["qh"], a["d"], a["m"], xq, xd, xs, out)
        return torch.from_numpy(out)

    def embedding(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(self.dequantize_rows(ids.cpu().numpy().astype(np.int64)))


class StackedWeight:
    """Matrices of different encodings stacked along N (a fused q/k/v whose v is another type):
    each part multiplies on its own and the outputs are concatenated."""

    def __init__(self, parts: list) -> None:  # type: ignore[type-arg]
        self.parts = parts
        self.shape = torch.Size((sum(p.shape[0] for p in parts), parts[0].shape[1]))
        self.dtype = torch.float32
        self.device = torch.device("cpu")

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        outs = [p.matmul(x) if isinstance(p, QuantizedWeight) else _float_linear(x, p) for p in self.parts]
        return torch.cat(outs, dim=-1)


def _float_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    from .cpu_linear import linear

    return linear(x.float(), w).float()


def is_quantized(weight: object) -> bool:
    return isinstance(weight, (QuantizedWeight, StackedWeight))


def embedding(ids: torch.Tensor, weight: torch.Tensor | QuantizedWeight) -> torch.Tensor:
    """Rows ``ids`` of an embedding matrix, dequantized when it is kept in a block format."""
    if isinstance(weight, QuantizedWeight):
        return weight.embedding(ids)
    return F.embedding(ids, weight)
