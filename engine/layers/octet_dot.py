"""Block products of weight rows stored eight to an octet: one instruction multiplies four activation
codes into eight weight rows at once (LLVM vector IR, numba intrinsics).

``int_dot`` multiplies one weight row by a few activation rows: each block's 32 products land in
eight int32 lanes of *one* output, so every block of every (weight row, activation row) pair pays
its own int-to-float conversion, scale broadcast, float multiply-add and, at the end, a horizontal
sum. Here the weight matrix is repacked at load so that lane r of a 32-byte vector holds four codes
of weight row r (r < 8) and the four codes that every lane multiplies are one int32 of the
activation, broadcast: ``vpdpbusd`` (VNNI) adds four products into each of the eight rows' sums.
Eight such steps cover a 32-element block, lane r then holds row r's exact integer block sum, and
one conversion and one multiply-add by the eight rows' scales finish the block for all eight.

Layout of one octet (eight consecutive weight rows; a matrix's last octet is padded with zero rows),
per block b, ``OCTET_BYTES[format]`` bytes:

- nibbles (Q4_0, Q4_1): four chunks of 32 bytes; byte 4r + k of chunk i holds element 8i + k of
  row r in its low nibble and element 8i + 4 + k in its high one. Unpacking is an ``and`` and a
  shift: 8 vectors, vector j holding elements 4j..4j+3 of every row.
- int8 codes (Q8_0): eight chunks of 32 bytes; byte 4r + k of chunk j holds element 4j + k of row
  r, plus 128 (as an unsigned byte: ``vpdpbusd`` multiplies unsigned by signed).

The activation's codes are in element order, so the four codes of step j are the int32 at byte
4j of the block. The formats' offsets (Q4_0's 8, the 128 above) come out as -offset times the
block's code sum, added once to each block's integer sum before the products (``xt``: the
activation's code sums, one a block): the sum is exact in int32 whatever the instruction.

Per activation row t and block b, the float work is, in every lane: ``acc = fma(float(isum),
wd * xd[t, b], acc)`` (then, for Q4_1, ``acc = fma(wm, xs[t, b], acc)``), blocks in order, one
chain. A row's bits therefore depend only on its own codes and scales: never on how many
activation rows share the call (1 to ``MAX_ROWS``), on the octet or on a thread. VNNI, the AVX2
pair (``pmaddubsw`` + ``pmaddwd``, nibbles only: a biased int8 code times an int8 would saturate
its int16 pairs) and the generic IR all give the same integers, so the same bits.

    octet_rows_q4_0(w, wd, wm, x, xd, xt, xs, blocks, out, out_step, count)   (and _q4_1, _q8_0)

``w``, ``wd`` (float32, eight a block), ``wm`` (Q4_1's minimums, eight a block; any address for the
others): the octet's arrays; ``x`` (int8 codes, 32 a block), ``xd`` (float32 scales), ``xt`` (int32
code sums), ``xs`` (float32, Q8_1's d times the code sum): activation row t's at ``x + t * 32 *
blocks`` and ``+ t * 4 * blocks`` (C-ordered [M, blocks] arrays); ``out``: float32, eight results a
row, row t at ``out + t * out_step`` bytes.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.extending import intrinsic

from . import int_dot

_I8, _I16, _I32, _F32 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.FloatType()
_V32I8, _V16I16, _V8I32, _V8F32 = ir.VectorType(_I8, 32), ir.VectorType(_I16, 16), ir.VectorType(_I32, 8), ir.VectorType(_F32, 8)

OCTET = 8  # weight rows an octet
MAX_ROWS = 4  # activation rows a call: eight unpacked weight vectors plus a chain per row stay in registers
OCTET_BYTES = {"Q4_0": 128, "Q4_1": 128, "Q8_0": 256}
_OFFSETS = {"Q4_0": 8, "Q4_1": 0, "Q8_0": 128}


def _indices(values: list[int]) -> ir.Constant:
    return ir.Constant(ir.VectorType(_I32, len(values)), values)


def _splat(builder: ir.IRBuilder, value: ir.Value, vector: ir.VectorType) -> ir.Value:
    one = builder.insert_element(ir.Constant(vector, None), value, ir.Constant(_I32, 0))
    return builder.shuffle_vector(one, one, _indices([0] * vector.count))


def _quad_sums(builder: ir.IRBuilder, acc: ir.Value, u: ir.Value, s: ir.Value, small: bool) -> ir.Value:
    """acc <8 x i32> plus, in lane i, sum_{j<4} u[4i + j] * s[4i + j] (u unsigned bytes, s signed:
    <32 x i8> each). ``small``: u < 16 (nibbles), where the AVX2 pair cannot saturate."""
    if int_dot._VNNI:
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V8I32, [_V8I32, _V8I32, _V8I32]), "llvm.x86.avx512.vpdpbusd.256")
        return builder.call(fn, [acc, builder.bitcast(u, _V8I32), builder.bitcast(s, _V8I32)])
    if int_dot._AVX2 and small:
        pairs = int_dot._unsigned_signed_pairs(builder, u, s)
        return builder.add(acc, int_dot._pair_sums(builder, pairs))
    # Generic: int16 products summed in pairs (LLVM's pmaddwd pattern), then pairs of pairs.
    halves = []
    for first in (0, 16):
        part = _indices(list(range(first, first + 16)))
        wide_u = builder.zext(builder.shuffle_vector(u, u, part), _V16I16)
        wide_s = builder.sext(builder.shuffle_vector(s, s, part), _V16I16)
        halves.append(int_dot._madd(builder, wide_u, wide_s))
    pairs = builder.shuffle_vector(halves[0], halves[1], _indices(list(range(16))))
    quads = builder.add(
        builder.shuffle_vector(pairs, pairs, _indices(list(range(0, 16, 2)))),
        builder.shuffle_vector(pairs, pairs, _indices(list(range(1, 16, 2)))),
    )  # fmt: skip
    return builder.add(acc, quads)


def _fma(builder: ir.IRBuilder, a: ir.Value, b: ir.Value, c: ir.Value) -> ir.Value:
    """a * b + c rounded once (``llvm.fma``: the same result on every target, unlike fmuladd)."""
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V8F32, [_V8F32] * 3), "llvm.fma.v8f32")
    return builder.call(fn, [a, b, c])


def _octet_rows(builder: ir.IRBuilder, args: list[ir.Value], count: int, fmt: str) -> None:
    w_addr, wd_addr, wm_addr, x_addr, xd_addr, xt_addr, xs_addr, blocks, out_addr, out_step = args
    nibbles, with_min, offset = fmt != "Q8_0", fmt == "Q4_1", _OFFSETS[fmt]
    w = builder.inttoptr(w_addr, _V32I8.as_pointer())
    wd = builder.inttoptr(wd_addr, _V8F32.as_pointer())
    wm = builder.inttoptr(wm_addr, _V8F32.as_pointer())
    x = builder.inttoptr(x_addr, _I32.as_pointer())  # four codes an int32
    xd = builder.inttoptr(xd_addr, _F32.as_pointer())
    xt = builder.inttoptr(xt_addr, _I32.as_pointer())
    xs = builder.inttoptr(xs_addr, _F32.as_pointer())
    zero_f = ir.Constant(_V8F32, [0.0] * 8)
    zero_i = ir.Constant(_V8I32, [0] * 8)
    accs = [cgutils.alloca_once_value(builder, zero_f) for _ in range(count)]
    chunks = 4 if nibbles else 8
    with cgutils.for_range(builder, blocks) as loop:
        b = loop.index
        first = builder.mul(b, ir.Constant(b.type, chunks))
        vectors: list[ir.Value] = []
        for i in range(chunks):
            chunk = builder.load(builder.gep(w, [builder.add(first, ir.Constant(b.type, i))]), align=1)
            if nibbles:
                mask = ir.Constant(_V32I8, [15] * 32)
                vectors += [builder.and_(chunk, mask), builder.and_(builder.lshr(chunk, ir.Constant(_V32I8, [4] * 32)), mask)]
            else:
                vectors.append(chunk)
        w_scale = builder.load(builder.gep(wd, [b]), align=4)
        w_min = builder.load(builder.gep(wm, [b]), align=4) if with_min else None
        for t in range(count):
            row = builder.add(builder.mul(blocks, ir.Constant(b.type, t)), b)  # [t, b] of the [M, blocks] arrays
            if offset:
                correction = builder.mul(builder.load(builder.gep(xt, [row])), ir.Constant(_I32, -offset))
                chains = [_splat(builder, correction, _V8I32), zero_i]
            else:
                chains = [zero_i, zero_i]
            code_base = builder.mul(row, ir.Constant(b.type, 8))
            for j, vector in enumerate(vectors):
                four = builder.load(builder.gep(x, [builder.add(code_base, ir.Constant(b.type, j))]), align=1)
                codes = builder.bitcast(_splat(builder, four, _V8I32), _V32I8)
                chains[j % 2] = _quad_sums(builder, chains[j % 2], vector, codes, nibbles)
            block_sum = builder.sitofp(builder.add(chains[0], chains[1]), _V8F32)
            scale = builder.fmul(w_scale, _splat(builder, builder.load(builder.gep(xd, [row])), _V8F32))
            acc = _fma(builder, block_sum, scale, builder.load(accs[t]))
            if w_min is not None:
                acc = _fma(builder, w_min, _splat(builder, builder.load(builder.gep(xs, [row])), _V8F32), acc)
            builder.store(acc, accs[t])
    for t in range(count):
        address = builder.add(out_addr, builder.mul(out_step, ir.Constant(out_step.type, t)))
        builder.store(builder.load(accs[t]), builder.inttoptr(address, _V8F32.as_pointer()), align=4)


def _by_count(builder: ir.IRBuilder, args: list[ir.Value], fmt: str) -> ir.Value:
    """One branch per row count 1..MAX_ROWS (the count sizes the registers); another does nothing."""
    count = args[-1]
    done = builder.function.append_basic_block("rows.done")
    switch = builder.switch(count, done)
    for n in range(1, MAX_ROWS + 1):
        branch = builder.function.append_basic_block(f"rows.{n}")
        switch.add_case(ir.Constant(count.type, n), branch)
        builder.position_at_end(branch)
        _octet_rows(builder, args[:-1], n, fmt)
        builder.branch(done)
    builder.position_at_end(done)
    return ir.Constant(ir.IntType(64), 0)


_SIG = types.int64(*([types.uintp] * 7), types.intp, types.uintp, types.intp, types.intp)


@intrinsic
def octet_rows_q4_0(typingctx, w, wd, wm, x, xd, xt, xs, blocks, out, out_step, count):  # type: ignore[no-untyped-def]
    return _SIG, lambda context, builder, sig, args: _by_count(builder, list(args), "Q4_0")


@intrinsic
def octet_rows_q4_1(typingctx, w, wd, wm, x, xd, xt, xs, blocks, out, out_step, count):  # type: ignore[no-untyped-def]
    return _SIG, lambda context, builder, sig, args: _by_count(builder, list(args), "Q4_1")


@intrinsic
def octet_rows_q8_0(typingctx, w, wd, wm, x, xd, xt, xs, blocks, out, out_step, count):  # type: ignore[no-untyped-def]
    return _SIG, lambda context, builder, sig, args: _by_count(builder, list(args), "Q8_0")


# --------------------------------------------------------------------------- packing (numpy, at load)


def pack_octets(codes: np.ndarray, fmt: str) -> np.ndarray:
    """Codes [N, K] in element order (nibbles 0..15, or int8) -> uint8 [ceil(N/8), K/32, OCTET_BYTES]
    in the octet layout (rows past N: zero codes)."""
    n, k = codes.shape
    groups = -(-n // OCTET)
    padded = np.zeros((groups * OCTET, k), codes.dtype)
    padded[:n] = codes
    blocks = padded.reshape(groups, OCTET, k // 32, 32)
    if fmt == "Q8_0":  # [g, r, b, j, k] -> [g, b, j, r, k], biased to unsigned
        quads = blocks.reshape(groups, OCTET, k // 32, 8, 4).transpose(0, 2, 3, 1, 4)
        return np.ascontiguousarray((quads.astype(np.int16) + 128).astype(np.uint8)).reshape(groups, k // 32, -1)
    # [g, r, b, i, h, k]: element 8i + 4h + k; byte (i, r, k) = low h=0 | high h=1
    parts = blocks.reshape(groups, OCTET, k // 32, 4, 2, 4).transpose(0, 2, 3, 1, 4, 5).astype(np.uint8)
    return np.ascontiguousarray(parts[..., 0, :] | (parts[..., 1, :] << 4)).reshape(groups, k // 32, -1)


def unpack_octets(packed: np.ndarray, n: int, fmt: str) -> np.ndarray:
    """``pack_octets``' inverse: [N, K] codes (uint8 nibbles, or int8)."""
    groups, blocks, _ = packed.shape
    if fmt == "Q8_0":
        quads = packed.reshape(groups, blocks, 8, OCTET, 4).transpose(0, 3, 1, 2, 4)
        return (quads.astype(np.int16) - 128).astype(np.int8).reshape(groups * OCTET, blocks * 32)[:n]
    parts = packed.reshape(groups, blocks, 4, OCTET, 4)
    both = np.stack([parts & 15, parts >> 4], axis=4)  # [g, b, i, r, h, k]
    return np.ascontiguousarray(both.transpose(0, 3, 1, 2, 4, 5)).reshape(groups * OCTET, blocks * 32)[:n]


def pack_scales(scales: np.ndarray) -> np.ndarray:
    """Per-row block values [N, K/32] -> float32 [ceil(N/8), K/32, 8] (padding rows: 0)."""
    n, blocks = scales.shape
    groups = -(-n // OCTET)
    padded = np.zeros((groups * OCTET, blocks), np.float32)
    padded[:n] = scales
    return np.ascontiguousarray(padded.reshape(groups, OCTET, blocks).transpose(0, 2, 1))


def unpack_scales(packed: np.ndarray, n: int) -> np.ndarray:
    groups, blocks, _ = packed.shape
    return np.ascontiguousarray(packed.transpose(0, 2, 1).reshape(groups * OCTET, blocks)[:n])
