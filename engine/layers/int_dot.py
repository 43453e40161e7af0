"""Integer multiply-adds of int8 and 4-bit codes in LLVM vector IR: the instruction choices the
block products share (``quad_sums``, called by ``octet_dot``), and ``float_dot``.

numba types integer arithmetic as 64-bit, so a numba loop over int8 codes multiplies in int64
lanes. The block products are written as LLVM IR instead, through numba intrinsics, and reach for
x86's integer multiply-adds where the host has them:

- ``vpdpbusd`` (256-bit VNNI: AVX512-VNNI with VL, or AVX-VNNI): four unsigned-by-signed byte
  products summed into each int32 lane, one instruction (``_VNNI``);
- ``pmaddubsw`` then ``pmaddwd`` by ones (AVX2): the same sums in two, through int16 pairs that
  saturate, so only for unsigned codes below 128 times int8 (``_AVX2``);
- otherwise generic IR of the same sums (int16 products added in pairs: LLVM's ``pmaddwd``
  pattern, AArch64's widening multiply-adds). Any LLVM target compiles it.

The x86 forms are called as LLVM's intrinsics because the generic IR of those patterns is
rewritten by LLVM's middle end into int16 multiplies before instruction selection could recognise
it. Every choice gives the same exact integers, so the same bits.

    float_dot(a, b, n)    sum_i a[i] * b[i] of float32 rows (Q5_1's minimum terms), eight lanes
                          then a scalar tail, summed in a fixed order, with no fast-math flag
"""

from __future__ import annotations

import os

from llvmlite import binding, ir
from numba import types
from numba.core import cgutils, config
from numba.core.extending import intrinsic

_I8, _I16, _I32, _F32 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.FloatType()
_V16I16, _V16I32 = ir.VectorType(_I16, 16), ir.VectorType(_I32, 16)
_V8I32, _V8F32 = ir.VectorType(_I32, 8), ir.VectorType(_F32, 8)
_V32I8 = ir.VectorType(_I8, 32)


def _avx2_intrinsics() -> bool:
    """Whether numba compiles for this host and the host has AVX2 (a portable build, through
    NUMBA_CPU_NAME, must not call an x86 intrinsic)."""
    if config.CPU_NAME not in (None, "host"):
        return False
    return bool(binding.get_host_cpu_features().get("avx2", False))


_AVX2 = _avx2_intrinsics()


def _vnni_intrinsics() -> bool:
    """Whether the host also has 256-bit VNNI (AVX512-VNNI with VL, or AVX-VNNI): ``vpdpbusd``
    sums four unsigned-by-signed byte products into each int32 lane in one instruction, the
    integers that ``pmaddubsw`` then ``pmaddwd`` give in two (``quad_sums``). ``FORMCAST_INT_DOT_VNNI=0`` keeps the AVX2 pair (an A/B switch;
    the bits are the same either way)."""
    if not _AVX2 or os.environ.get("FORMCAST_INT_DOT_VNNI", "1") == "0":
        return False
    features = binding.get_host_cpu_features()
    return bool(features.get("avxvnni", False) or (features.get("avx512vnni", False) and features.get("avx512vl", False)))


_VNNI = _vnni_intrinsics()


def _indices(values: list[int]) -> ir.Constant:
    return ir.Constant(ir.VectorType(_I32, len(values)), values)


def _madd(builder: ir.IRBuilder, a: ir.Value, b: ir.Value) -> ir.Value:
    """<16 x i16> a, b -> <8 x i32>: a[2i] * b[2i] + a[2i + 1] * b[2i + 1]."""
    product = builder.mul(builder.sext(a, _V16I32), builder.sext(b, _V16I32))
    even = builder.shuffle_vector(product, product, _indices(list(range(0, 16, 2))))
    odd = builder.shuffle_vector(product, product, _indices(list(range(1, 16, 2))))
    return builder.add(even, odd)


def _call(builder: ir.IRBuilder, name: str, result: ir.Type, args: list[ir.Value]) -> ir.Value:
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(result, [a.type for a in args]), name)
    return builder.call(fn, args)


def quad_sums(builder: ir.IRBuilder, acc: ir.Value, u: ir.Value, s: ir.Value, small: bool) -> ir.Value:
    """acc <8 x i32> plus, in lane i, sum_{j<4} u[4i + j] * s[4i + j] (u unsigned bytes, s int8:
    <32 x i8> each). ``small``: u < 128, where the AVX2 pair's int16 pairs (2 * 127 * 128 at
    most) cannot saturate."""
    if _VNNI:
        return _call(builder, "llvm.x86.avx512.vpdpbusd.256", _V8I32, [acc, builder.bitcast(u, _V8I32), builder.bitcast(s, _V8I32)])
    if _AVX2 and small:
        pairs = _call(builder, "llvm.x86.avx2.pmadd.ub.sw", _V16I16, [u, s])
        return builder.add(acc, _call(builder, "llvm.x86.avx2.pmadd.wd", _V8I32, [pairs, ir.Constant(_V16I16, [1] * 16)]))
    halves = []  # generic: int16 products summed in pairs, then pairs of pairs
    for first in (0, 16):
        part = _indices(list(range(first, first + 16)))
        wide_u = builder.zext(builder.shuffle_vector(u, u, part), _V16I16)
        wide_s = builder.sext(builder.shuffle_vector(s, s, part), _V16I16)
        halves.append(_madd(builder, wide_u, wide_s))
    pairs = builder.shuffle_vector(halves[0], halves[1], _indices(list(range(16))))
    quads = builder.add(
        builder.shuffle_vector(pairs, pairs, _indices(list(range(0, 16, 2)))),
        builder.shuffle_vector(pairs, pairs, _indices(list(range(1, 16, 2)))),
    )  # fmt: skip
    return builder.add(acc, quads)


def _float_dot(builder: ir.IRBuilder, args: list[ir.Value]) -> ir.Value:
    """Eight float lanes of products, then a scalar tail, summed in a fixed order: the same bits
    in every build (a numba loop vectorizes such a sum only under fast-math, whose reassociation
    may differ between a loop compiled alone and one inlined into a parallel region)."""
    a_addr, b_addr, n = args
    lanes_a = builder.inttoptr(a_addr, _V8F32.as_pointer())
    lanes_b = builder.inttoptr(b_addr, _V8F32.as_pointer())
    acc = cgutils.alloca_once_value(builder, ir.Constant(_V8F32, [0.0] * 8))
    eight = ir.Constant(n.type, 8)
    with cgutils.for_range(builder, builder.sdiv(n, eight)) as loop:
        a = builder.load(builder.gep(lanes_a, [loop.index]), align=4)
        b = builder.load(builder.gep(lanes_b, [loop.index]), align=4)
        builder.store(builder.fadd(builder.load(acc), builder.fmul(a, b)), acc)
    lanes = builder.load(acc)
    four = builder.fadd(builder.shuffle_vector(lanes, lanes, _indices([0, 1, 2, 3])), builder.shuffle_vector(lanes, lanes, _indices([4, 5, 6, 7])))
    two = builder.fadd(builder.shuffle_vector(four, four, _indices([0, 1])), builder.shuffle_vector(four, four, _indices([2, 3])))
    total = cgutils.alloca_once_value(builder, builder.fadd(builder.extract_element(two, ir.Constant(_I32, 0)), builder.extract_element(two, ir.Constant(_I32, 1))))
    scalar_a = builder.inttoptr(a_addr, _F32.as_pointer())
    scalar_b = builder.inttoptr(b_addr, _F32.as_pointer())
    done = builder.mul(builder.sdiv(n, eight), eight)
    with cgutils.for_range(builder, builder.sub(n, done)) as loop:
        i = builder.add(done, loop.index)
        product = builder.fmul(builder.load(builder.gep(scalar_a, [i])), builder.load(builder.gep(scalar_b, [i])))
        builder.store(builder.fadd(builder.load(total), product), total)
    return builder.load(total)


@intrinsic
def float_dot(typingctx, a, b, n):  # type: ignore[no-untyped-def]
    return types.float32(types.uintp, types.uintp, types.intp), lambda context, builder, sig, args: _float_dot(builder, args)
