"""Rounding a float32 to the nearest float16 value inside compiled loops, without torch.

``round_half`` is shared by the GGUF block kernels (llama.cpp keeps activation scales as fp16) and
the decode-attention kernel (its llama.cpp-precision variant rounds probabilities to fp16). It
lives alone so that the child process compiling an attention kernel imports numpy and numba only,
not torch (a second of every kernel compile on a cold cache).
"""

from __future__ import annotations

import numpy as np
from numba import njit


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
    bits = np.array([x], dtype=np.float32).view(np.uint32)[0]
    # keep 10 mantissa bits of 23: round the low 13 bits to even
    low = bits & np.uint32(0x1FFF)
    bits = bits & np.uint32(0xFFFFE000)
    half = np.uint32(0x1000)
    if low > half or (low == half and (bits & np.uint32(0x2000)) != 0):
        bits = bits + np.uint32(0x2000)
    return np.array([bits], dtype=np.uint32).view(np.float32)[0]
