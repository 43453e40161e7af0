"""exp of a float32 as plain arithmetic that LLVM vectorizes: ``exp32``, for the compiled loops.

numba lowers ``math.exp`` to a call of the C library's ``expf``, one element at a time: no loop
around it vectorizes. In a SmolLM2 decode step that call was more than half of the attention
kernel's time (one ``exp`` a key and query head, in the softmax) and most of the SwiGLU loop's
(one a hidden unit), and both grow with every extra row a verification or a prefill adds.

``exp32`` is written out so that a loop calling it (``inline="always"``) vectorizes whole:

- in float64: x = n ln2 + r with n = round(x log2 e), |r| <= ln2 / 2;
- exp(r) by its Taylor series to degree 9 in Horner form (relative error about 1e-11);
- times 2**n, built from n's bits as a float64 (``_double_from_bits``), rounded once to float32.

The float64 value is so close to the exact exp that its rounding to float32 is the correctly
rounded result except within about 1e-11 of a halfway point: the same float32 as the C library's
``expf`` (itself within half an ulp and a hair) in all but about 10 in a million arguments
(``tests/test_vector_exp.py``). A first version in float32 arithmetic was within 1.2 ulp but
differed from ``expf`` on one argument in ten, enough to move a few of the llama.cpp agreement
test's greedy continuations. Every operation is IEEE, in a fixed order, so a value's bits depend
only on x, never on the lane it runs in, the loop around it or the rows in a batch. Overflow
gives +inf, underflow float32's subnormals and then 0, NaN stays NaN.
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core.extending import intrinsic

_LOG2E = 1.4426950408889634
_LN2 = 0.6931471805599453
_LOW, _HIGH = -104.0, 89.0  # e**-104 rounds to float32 0 and e**89 to +inf: past them, the same
_HALF = 0.5
# 1 / k! for k = 9 .. 2: the series' remainder on |r| <= ln2 / 2 is under 1e-11, relative
_SERIES = tuple(1.0 / math.factorial(k) for k in range(9, 1, -1))
_C9, _C8, _C7, _C6, _C5, _C4, _C3, _C2 = _SERIES


@intrinsic
def _double_from_bits(typingctx, bits):  # type: ignore[no-untyped-def]
    """The float64 whose IEEE bits are the int64 ``bits`` (a bitcast, which vectorizes)."""
    if not isinstance(bits, types.Integer) or bits.bitwidth != 64:
        return None

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        return builder.bitcast(args[0], ir.DoubleType())

    return types.float64(bits), codegen


@njit(inline="always", boundscheck=False)
def exp32(x):  # pragma: no cover - compiled
    """e ** x of a float32 ``x`` as a float32 (see the module's docstring)."""
    wide = np.float64(x)
    clamped = wide if wide > _LOW else _LOW
    clamped = clamped if clamped < _HIGH else _HIGH
    n = np.floor(clamped * _LOG2E + _HALF)
    r = clamped - n * _LN2
    p = _C9
    p = p * r + _C8
    p = p * r + _C7
    p = p * r + _C6
    p = p * r + _C5
    p = p * r + _C4
    p = p * r + _C3
    p = p * r + _C2
    p = p * r + 1.0
    p = p * r + 1.0
    scale = _double_from_bits((np.int64(n) + 1023) << 52)  # 2**n: n + 1023 in the exponent field
    result = np.float32(p * scale)
    return x if x != x else result  # NaN in, NaN out
