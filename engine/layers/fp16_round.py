"""Rounding a float32 to the nearest float16 value inside compiled loops, without torch.

``round_half`` is shared by the GGUF block kernels (llama.cpp keeps activation scales as fp16) and
the decode-attention kernel (its llama.cpp-precision variant rounds probabilities to fp16). It
lives alone so that the child process compiling an attention kernel imports numpy and numba only,
not torch (a second of every kernel compile on a cold cache).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic


@intrinsic
def _float_bits(typingctx, x):  # type: ignore[no-untyped-def]
    """The IEEE bits of a float32, as a uint32 (a register move: no array round trip)."""
    return types.uint32(types.float32), lambda context, builder, sig, args: builder.bitcast(args[0], ir.IntType(32))


@intrinsic
def _bits_float(typingctx, bits):  # type: ignore[no-untyped-def]
    """The float32 whose IEEE bits are ``bits``."""
    return types.float32(types.uint32), lambda context, builder, sig, args: builder.bitcast(args[0], ir.FloatType())


@njit(inline="always", nogil=True, cache=True)
def round_half(x):  # pragma: no cover - compiled
    """``x`` rounded to the nearest fp16 value (ties to even), returned as float32."""
    ax = abs(x)
    if ax == 0.0 or ax != ax:
        return np.float32(x)
    if ax >= 65520.0:
        return np.float32(np.inf) if x > 0 else np.float32(-np.inf)
    if ax < 6.103515625e-05:  # subnormal fp16: multiples of 2**-24
        return np.float32(np.rint(x * 16777216.0) / 16777216.0)
    bits = _float_bits(np.float32(x))
    # keep 10 mantissa bits of 23: round the low 13 bits to even
    low = bits & np.uint32(0x1FFF)
    bits = bits & np.uint32(0xFFFFE000)
    half = np.uint32(0x1000)
    if low > half or (low == half and (bits & np.uint32(0x2000)) != 0):
        bits = bits + np.uint32(0x2000)
    return _bits_float(np.uint32(bits))
