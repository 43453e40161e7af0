"""Block products of weight rows stored eight to an octet: one instruction multiplies four activation
codes into eight weight rows at once (LLVM vector IR, numba intrinsics).

Multiplying one weight row by an activation row puts a block's products in eight int32 lanes of
*one* output, so every block of every (weight row, activation row) pair pays its own
int-to-float conversion, scale broadcast, float multiply-add and, at the end, a horizontal sum.
Here the weight matrix is repacked at load so that lane r of a 32-byte vector holds four codes of
weight row r (r < 8), and the four codes that every lane multiplies are one int32 of the
activation, broadcast: ``vpdpbusd`` (VNNI; ``int_dot.quad_sums``) adds four products into each of
the eight rows' sums. ``block / 4`` such steps cover a block; lane r then holds row r's exact
integer block sum, and one conversion and one multiply-add by the eight rows' scales finish the
block for all eight rows. llama.cpp repacks Q4_0 for its x86 kernels on the same idea.

Layout of one octet (eight consecutive weight rows; a matrix's last octet is padded with zero
rows), per block, ``OctetFormat.block_bytes``:

- nibbles (Q4_0, Q4_1, Q4_K): chunks of 32 bytes; byte 4r + k of chunk i holds element 8i + k of
  row r in its low nibble and element 8i + 4 + k in its high one. Unpacking is an ``and`` and a
  shift: vector j then holds elements 4j..4j+3 of every row.
- one code a byte (Q8_0, Q5_K, Q6_K): byte 4r + k of chunk j holds element 4j + k of row r, plus
  the format's ``bias`` (Q8_0's int8 codes stored as unsigned bytes: ``vpdpbusd`` multiplies
  unsigned by signed).

The activation's codes are in element order, so the four codes of step j are the int32 at byte
4j of the block. A format's ``offset`` (Q4_0's 8, Q6_K's 32, Q8_0's bias) comes out as -offset
times the block's activation code sum (``xt``), the start of each block's integer sum: exact in
int32 whatever the instruction.

Per activation row t and block b, the float work is, in every lane (weight row):
``acc = fma(float(isum), wd * xd[t, b], acc)``, then for the formats with a minimum
``acc = fma(wm, xs[t, b], acc)``, blocks in order, one chain. The K-quants' ``wd`` and ``wm`` are
their super-block's d and dmin times the block's sub-scale and min (float32 products, as the
format defines them). A row's bits therefore depend only on its own codes and scales: never on
how many activation rows share the call (1 to ``MAX_ROWS``), on the octet or on a thread, nor on
the instruction ``int_dot.quad_sums`` picks.

    octet_rows_q4_0(w, wd, wm, sc, mn, x, xd, xt, xs, blocks, out, out_step, count)
    (and _q4_1, _q8_0, _q4_k, _q5_k, _q6_k)

``w`` (``block_bytes`` a block), ``wd`` / ``wm`` (half-precision bit patterns as uint16, eight a
block, or a super-block for the K-quants: the file's own fp16 scales, widened exactly in the loop
by ``_half_to_float``; widened to float32 at load they took 2 bytes more a block and row, 11% of
a Q4_0 matrix, 20% of Q4_1's, and a decode step of a large model reads nothing else), ``sc`` / ``mn`` (the K-quants' sub-scales and mins, eight bytes a block): the octet's
arrays; those a format has not are never read. ``x`` (int8 codes), ``xd`` (float32 scale a
block), ``xt`` (int32 code sum a block), ``xs`` (float32 a block: Q8_1's d times the code sum for
Q4_1, minus the block's value sum for the K-quants): activation row t's at ``x + t * block *
blocks`` and ``+ t * 4 * blocks`` (C-ordered [M, blocks] arrays); ``out``: float32, eight results
a row, row t at ``out + t * out_step`` bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.extending import intrinsic

from . import int_dot

_I8, _I16, _I32, _F32 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.FloatType()
_V32I8, _V8I16, _V8I32, _V8F32 = ir.VectorType(_I8, 32), ir.VectorType(_I16, 8), ir.VectorType(_I32, 8), ir.VectorType(_F32, 8)

OCTET = 8  # weight rows an octet
# Activation rows a call. Each extra row reuses the eight unpacked weight vectors of a block; with
# more rows than registers LLVM spills some (cheap L1 reloads) instead of a second pass re-reading
# and re-unpacking the weights. Eight rather than four cover a verification of up to seven drafts
# in one pass: 5 to 8 rows took 8-18% less time with AVX-512 registers and 5-10% less compiled
# for Haswell (AVX2, 16 registers); 1 to 4 rows, and the bits, did not change (BENCHMARKS.md).
MAX_ROWS = 8


@dataclass(frozen=True)
class OctetFormat:
    """How one ggml format sits in octets and how its blocks are summed and scaled.

    ``nibbles``: 4-bit codes, two an octet byte (else one code a byte); ``block``: elements a
    scale (32, or Q6_K's 16); ``bias``: added to a code to store it (Q8_0's int8 codes become
    unsigned bytes); ``offset``: subtracted from every stored code to get its value (as -offset
    times the activation block's code sum); ``super_blocks``: blocks a super-block for the K-quants, whose weight scale is
    ``d`` (float32, one a super-block) times a 6-bit or int8 sub-scale (one a block), else 0
    (a float32 scale a block); ``signed_scales``: the sub-scales are int8 (Q6_K); ``minimum``:
    a term ``wm * xs`` a block (Q4_1: ``wm`` a float32 a block; the K-quants: ``dmin`` a
    super-block times a 6-bit min a block; ``xs`` then carries the activation's negated block sum)."""

    name: str
    nibbles: bool
    block: int
    offset: int
    bias: int
    super_blocks: int
    signed_scales: bool
    minimum: bool

    @property
    def block_bytes(self) -> int:
        """Octet bytes a block: eight rows' codes."""
        return OCTET * self.block // (2 if self.nibbles else 1)


FORMATS = {
    f.name: f
    for f in (
        OctetFormat("Q4_0", True, 32, 8, 0, 0, False, False),
        OctetFormat("Q4_1", True, 32, 0, 0, 0, False, True),
        OctetFormat("Q8_0", False, 32, 128, 128, 0, False, False),
        OctetFormat("Q4_K", True, 32, 0, 0, 8, False, True),
        OctetFormat("Q5_K", False, 32, 0, 0, 8, False, True),
        OctetFormat("Q6_K", False, 16, 32, 0, 16, True, False),
    )
}


def _const(like: ir.Type, value: int | float) -> ir.Constant:
    """``value`` in every lane of ``like`` (a vector type) or as a scalar of it."""
    if isinstance(like, ir.VectorType):
        return ir.Constant(like, [value] * like.count)
    return ir.Constant(like, value)


def _half_to_float(builder: ir.IRBuilder, bits: ir.Value) -> ir.Value:
    """IEEE half-precision bit patterns (i16, scalar or vector) -> float32, exactly, in integer and
    float IR that any target compiles (no F16C instruction, no libcall, no subnormal flush):
    normal numbers rebias their exponent, zeros and subnormals are their mantissa times 2**-24,
    infinities and NaNs keep their payload."""
    i16 = bits.type
    i32 = ir.VectorType(_I32, i16.count) if isinstance(i16, ir.VectorType) else _I32
    f32 = ir.VectorType(_F32, i16.count) if isinstance(i16, ir.VectorType) else _F32
    h = builder.zext(bits, i32)
    sign = builder.shl(builder.and_(h, _const(i32, 0x8000)), _const(i32, 16))
    exponent = builder.and_(builder.lshr(h, _const(i32, 10)), _const(i32, 0x1F))
    mantissa = builder.and_(h, _const(i32, 0x3FF))
    normal = builder.or_(builder.shl(builder.add(exponent, _const(i32, 112)), _const(i32, 23)), builder.shl(mantissa, _const(i32, 13)))
    special = builder.or_(_const(i32, 0x7F800000), builder.shl(mantissa, _const(i32, 13)))
    small = builder.bitcast(builder.fmul(builder.uitofp(mantissa, f32), _const(f32, 2.0**-24)), i32)  # exact: < 2**10 times a power of two
    magnitude = builder.select(
        builder.icmp_unsigned("==", exponent, _const(i32, 0)), small,
        builder.select(builder.icmp_unsigned("==", exponent, _const(i32, 0x1F)), special, normal),
    )  # fmt: skip
    return builder.bitcast(builder.or_(sign, magnitude), f32)


@intrinsic
def half_to_float(typingctx, bits):  # type: ignore[no-untyped-def]
    """A half-precision scale's bit pattern (uint16) as the float32 it stands for (numba's CPU
    target has no float16 type): ``_half_to_float``."""
    if not isinstance(bits, types.Integer) or bits.bitwidth != 16:
        return None

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        return _half_to_float(builder, args[0])

    return types.float32(bits), codegen


def _splat(builder: ir.IRBuilder, value: ir.Value, vector: ir.VectorType) -> ir.Value:
    one = builder.insert_element(ir.Constant(vector, None), value, ir.Constant(_I32, 0))
    return builder.shuffle_vector(one, one, int_dot._indices([0] * vector.count))


def _fma(builder: ir.IRBuilder, a: ir.Value, b: ir.Value, c: ir.Value) -> ir.Value:
    """a * b + c rounded once (``llvm.fma``: the same result on every target, unlike fmuladd)."""
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V8F32, [_V8F32] * 3), "llvm.fma.v8f32")
    return builder.call(fn, [a, b, c])


def _octet_rows(builder: ir.IRBuilder, args: list[ir.Value], count: int, fmt: OctetFormat) -> None:
    w_addr, wd_addr, wm_addr, sc_addr, mn_addr, x_addr, xd_addr, xt_addr, xs_addr, blocks, out_addr, out_step = args
    w = builder.inttoptr(w_addr, _V32I8.as_pointer())
    wd = builder.inttoptr(wd_addr, _V8I16.as_pointer())  # half-precision bit patterns, as in the file
    wm = builder.inttoptr(wm_addr, _V8I16.as_pointer())
    sub_type = ir.VectorType(_I8, OCTET).as_pointer()
    sc, mn = builder.inttoptr(sc_addr, sub_type), builder.inttoptr(mn_addr, sub_type)
    x = builder.inttoptr(x_addr, _I32.as_pointer())  # four codes an int32
    xd = builder.inttoptr(xd_addr, _F32.as_pointer())
    xt = builder.inttoptr(xt_addr, _I32.as_pointer())
    xs = builder.inttoptr(xs_addr, _F32.as_pointer())
    zero_f = ir.Constant(_V8F32, [0.0] * 8)
    zero_i = ir.Constant(_V8I32, [0] * 8)
    accs = [cgutils.alloca_once_value(builder, zero_f) for _ in range(count)]
    chunks = fmt.block_bytes // 32
    quads = fmt.block // 4  # int32 activation words a block
    with cgutils.for_range(builder, blocks) as loop:
        b = loop.index
        first = builder.mul(b, ir.Constant(b.type, chunks))
        vectors: list[ir.Value] = []
        for i in range(chunks):
            chunk = builder.load(builder.gep(w, [builder.add(first, ir.Constant(b.type, i))]), align=1)
            if fmt.nibbles:
                mask = ir.Constant(_V32I8, [15] * 32)
                vectors += [builder.and_(chunk, mask), builder.and_(builder.lshr(chunk, ir.Constant(_V32I8, [4] * 32)), mask)]
            else:
                vectors.append(chunk)
        if fmt.super_blocks:  # d (and dmin) of the block's super-block times its 6-bit / int8 sub-scales
            sup = builder.sdiv(b, ir.Constant(b.type, fmt.super_blocks))
            to_float = builder.sitofp if fmt.signed_scales else builder.uitofp
            w_scale = builder.fmul(_half_to_float(builder, builder.load(builder.gep(wd, [sup]), align=2)), to_float(builder.load(builder.gep(sc, [b]), align=1), _V8F32))
            w_min = builder.fmul(_half_to_float(builder, builder.load(builder.gep(wm, [sup]), align=2)), builder.uitofp(builder.load(builder.gep(mn, [b]), align=1), _V8F32)) if fmt.minimum else None
        else:
            w_scale = _half_to_float(builder, builder.load(builder.gep(wd, [b]), align=2))
            w_min = _half_to_float(builder, builder.load(builder.gep(wm, [b]), align=2)) if fmt.minimum else None
        for t in range(count):
            row = builder.add(builder.mul(blocks, ir.Constant(b.type, t)), b)  # [t, b] of the [M, blocks] arrays
            if fmt.offset:
                correction = builder.mul(builder.load(builder.gep(xt, [row])), ir.Constant(_I32, -fmt.offset))
                chains = [_splat(builder, correction, _V8I32), zero_i]
            else:
                chains = [zero_i, zero_i]
            code_base = builder.mul(row, ir.Constant(b.type, quads))
            for j, vector in enumerate(vectors):
                four = builder.load(builder.gep(x, [builder.add(code_base, ir.Constant(b.type, j))]), align=1)
                codes = builder.bitcast(_splat(builder, four, _V8I32), _V32I8)
                chains[j % 2] = int_dot.quad_sums(builder, chains[j % 2], vector, codes, fmt.bias == 0)
            block_sum = builder.sitofp(builder.add(chains[0], chains[1]), _V8F32)
            scale = builder.fmul(w_scale, _splat(builder, builder.load(builder.gep(xd, [row])), _V8F32))
            acc = _fma(builder, block_sum, scale, builder.load(accs[t]))
            if w_min is not None:
                acc = _fma(builder, w_min, _splat(builder, builder.load(builder.gep(xs, [row])), _V8F32), acc)
            builder.store(acc, accs[t])
    for t in range(count):
        address = builder.add(out_addr, builder.mul(out_step, ir.Constant(out_step.type, t)))
        builder.store(builder.load(accs[t]), builder.inttoptr(address, _V8F32.as_pointer()), align=4)


def _by_count(builder: ir.IRBuilder, args: list[ir.Value], fmt: OctetFormat) -> ir.Value:
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


_SIG = types.int64(*([types.uintp] * 9), types.intp, types.uintp, types.intp, types.intp)


def _octet_intrinsic(name: str):  # type: ignore[no-untyped-def]
    fmt = FORMATS[name]

    def octet_rows(typingctx, w, wd, wm, sc, mn, x, xd, xt, xs, blocks, out, out_step, count):  # type: ignore[no-untyped-def]
        return _SIG, lambda context, builder, sig, args: _by_count(builder, list(args), fmt)

    octet_rows.__name__ = f"octet_rows_{name.lower()}"
    return intrinsic(octet_rows)


octet_rows_q4_0 = _octet_intrinsic("Q4_0")
octet_rows_q4_1 = _octet_intrinsic("Q4_1")
octet_rows_q8_0 = _octet_intrinsic("Q8_0")
octet_rows_q4_k = _octet_intrinsic("Q4_K")
octet_rows_q5_k = _octet_intrinsic("Q5_K")
octet_rows_q6_k = _octet_intrinsic("Q6_K")


# --------------------------------------------------------------------------- packing (numpy, at load)


def pack_octets(codes: np.ndarray, fmt: str) -> np.ndarray:
    """Codes [N, K] in element order (unsigned, or Q8_0's int8) -> uint8 [ceil(N/8), K/block,
    block_bytes] in the octet layout (rows past N: zero codes)."""
    spec = FORMATS[fmt]
    n, k = codes.shape
    groups, blocks = -(-n // OCTET), k // spec.block
    padded = np.zeros((groups * OCTET, k), np.int16)
    padded[:n] = codes
    padded[:n] += spec.bias
    if not spec.nibbles:  # [g, r, b, j, k] -> [g, b, j, r, k]: chunk j lane r holds elements 4j..4j+3
        quads = padded.reshape(groups, OCTET, blocks, spec.block // 4, 4).transpose(0, 2, 3, 1, 4)
        return np.ascontiguousarray(quads.astype(np.uint8)).reshape(groups, blocks, -1)
    # [g, r, b, i, h, k]: element 8i + 4h + k; byte (i, r, k) = low h=0 | high h=1
    parts = padded.reshape(groups, OCTET, blocks, spec.block // 8, 2, 4).transpose(0, 2, 3, 1, 4, 5).astype(np.uint8)
    return np.ascontiguousarray(parts[..., 0, :] | (parts[..., 1, :] << 4)).reshape(groups, blocks, -1)


def unpack_octets(packed: np.ndarray, n: int, fmt: str) -> np.ndarray:
    """``pack_octets``' inverse: [N, K] codes (uint8, or int8 for Q8_0)."""
    spec = FORMATS[fmt]
    groups, blocks, _ = packed.shape
    if not spec.nibbles:
        quads = packed.reshape(groups, blocks, spec.block // 4, OCTET, 4).transpose(0, 3, 1, 2, 4)
        codes = quads.reshape(groups * OCTET, blocks * spec.block)[:n]
        return (codes.astype(np.int16) - spec.bias).astype(np.int8) if spec.bias else np.ascontiguousarray(codes)
    parts = packed.reshape(groups, blocks, spec.block // 8, OCTET, 4)
    both = np.stack([parts & 15, parts >> 4], axis=4)  # [g, b, i, r, h, k]
    return np.ascontiguousarray(both.transpose(0, 3, 1, 2, 4, 5)).reshape(groups * OCTET, blocks * spec.block)[:n]


def pack_lanes(values: np.ndarray) -> np.ndarray:
    """Per-row values [N, X] (a scale or sub-scale a block or super-block) -> [ceil(N/8), X, 8],
    the octet's eight rows side by side (padding rows: 0); the dtype is kept."""
    n, columns = values.shape
    groups = -(-n // OCTET)
    padded = np.zeros((groups * OCTET, columns), values.dtype)
    padded[:n] = values
    return np.ascontiguousarray(padded.reshape(groups, OCTET, columns).transpose(0, 2, 1))


def unpack_lanes(packed: np.ndarray, n: int) -> np.ndarray:
    groups, columns, _ = packed.shape
    return np.ascontiguousarray(packed.transpose(0, 2, 1).reshape(groups * OCTET, columns)[:n])
