"""Integer dot products of ggml's 32-element blocks, written as LLVM vector IR (numba intrinsics).

numba types integer arithmetic as 64-bit, so a numba loop over int8 codes multiplies in int64
lanes, and the float loops of ``ggml_quants`` spend a conversion, a multiply and an add per element.
Here a block's 32 products are two 16-lane int16 multiplies whose even and odd lanes are added: the
pattern LLVM's x86 backend emits as ``pmaddwd`` (16 multiply-adds an instruction; AArch64 gets
widening multiply-adds). The block sum is exact in int32; one float multiply by the two scales
follows. Nothing in it names a CPU feature: any LLVM target compiles it.

    nibble_k_row_dot(w, x, d, sc, xd, blocks)   Q4_K: 16 bytes a 32-element block in
                                                ``nibble_bytes_of_codes``' layout, a block's scale
                                                d * sc; ``x``: int8 codes in ``NIBBLE_PAIR_ORDER``
    code_row_dot(w, x, wd, xd, blocks)          Q5_K: 32 int8 codes a block
    code16_row_dot(w, x, wd, xd, blocks)        Q6_K: the same with a scale per 16 elements
                                                (``wd`` and ``xd`` hold two a block)

    float_dot(a, b, n)                          sum_i a[i] * b[i] of float32 rows (the minimum terms
                                                of the formats with one)

``w``, ``x`` (the activation's int8 codes, 32 a block), ``wd``,
``xd`` (float32 scales, one a block) are addresses of one row (``arr[n].ctypes.data``). The result is
sum_b (wd[b] * xd[b]) * sum_j w_bj * x_bj, accumulated in eight float lanes by two accumulators
(even and odd blocks: two independent chains) and summed in a fixed pairwise order, with no
fast-math flag. ``*_rows(w, x, x_step, wd, xd, xd_step, blocks, out, count)`` multiply one
weight row by ``count`` activation rows, 2 to ``MAX_GROUP`` (``x + i * x_step`` bytes...),
loading and unpacking each weight block once, and store the results at ``out``: each row runs the very operations it
runs alone, so its bits depend only on its own codes and scales, never on a batch or a thread
(the contract of ``cpu_threads``).

Q4_0, Q4_1 and Q8_0 run ``octet_dot``'s products (eight weight rows at once); its
``_quad_sums`` reuses the instruction choices below.

The nibble format multiplies unsigned 4-bit codes by int8 activation codes: on x86 with AVX2 that is
``pmaddubsw`` (32 byte products summed in pairs into int16) then ``pmaddwd`` by ones (pairs of those
into int32), or one ``vpdpbusd`` (four byte products into each int32 lane) where the CPU has
256-bit VNNI: the same integers. Both are called as LLVM's x86 intrinsics because the generic IR
of that pattern is rewritten by LLVM's middle end into int16 multiplies before instruction
selection could recognise it. Other
targets get the generic IR of the same sums. The activation's codes are stored in
``NIBBLE_PAIR_ORDER`` and the weight's nibbles are packed at load so that they unpack into the
same order (``nibble_bytes_of_codes``), so lane i of a block's eight int32 sums holds elements 2i,
2i+1, 16+2i and 17+2i on every target: the bits do not depend on the instruction set.
"""

from __future__ import annotations

import os

import numpy as np
from llvmlite import binding, ir
from numba import types
from numba.core import config
from numba.core import cgutils
from numba.core.extending import intrinsic

_I8, _I16, _I32, _F32 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.FloatType()
_V16I8, _V16I16, _V16I32 = ir.VectorType(_I8, 16), ir.VectorType(_I16, 16), ir.VectorType(_I32, 16)
_V8I32, _V8F32 = ir.VectorType(_I32, 8), ir.VectorType(_F32, 8)
_V32I8 = ir.VectorType(_I8, 32)

# Position p of a block's int8 activation codes holds element NIBBLE_PAIR_ORDER[p]: the low and
# high nibble of byte k (elements k and 16 + k) sit side by side, as the unpacked weight bytes do.
NIBBLE_PAIR_ORDER = np.array([k + 16 * high for k in range(16) for high in (0, 1)], np.int64)


# The nibble loop's weight bytes: byte b of a block holds element NIBBLE_PAIR_ORDER[b] in its low
# nibble and NIBBLE_PAIR_ORDER[16 + b] in its high one. Unpacking is then the 16 low nibbles
# followed by the 16 high ones (on AVX2: a shift, an insert into the upper half, one mask), and
# the 32 codes come out already in the activation's pair order. The file's layout (element j low,
# j + 16 high) needed a byte interleave of the two halves on top: three more instructions a block.
NIBBLE_LOW_ELEMENTS, NIBBLE_HIGH_ELEMENTS = NIBBLE_PAIR_ORDER[:16].copy(), NIBBLE_PAIR_ORDER[16:].copy()


def nibble_bytes_of_codes(codes: np.ndarray) -> np.ndarray:
    """4-bit codes [..., 32] of blocks in element order -> uint8 [..., 16] in the loops' layout."""
    return np.ascontiguousarray((codes[..., NIBBLE_LOW_ELEMENTS] | (codes[..., NIBBLE_HIGH_ELEMENTS] << 4)).astype(np.uint8))


def nibble_activation_codes(codes: np.ndarray) -> np.ndarray:
    """Activation codes [M, K] in element order -> int8 [M, K] in ``NIBBLE_PAIR_ORDER`` per block."""
    rows, k_dim = codes.shape
    blocks = codes.reshape(rows, k_dim // 32, 32)
    return np.ascontiguousarray(blocks[:, :, NIBBLE_PAIR_ORDER].reshape(rows, k_dim).astype(np.int8))


def code_activation_codes(codes: np.ndarray) -> np.ndarray:
    """Activation codes [M, K] in element order -> int8 [M, K] in the order ``code_row_dot`` and
    ``code_rows`` read (``CODES_IN_PAIR_ORDER``); ``code16_*`` read element order."""
    return nibble_activation_codes(codes) if CODES_IN_PAIR_ORDER else np.ascontiguousarray(codes.astype(np.int8))


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
    integers that ``pmaddubsw`` then ``pmaddwd`` give in two (no saturation is reached: see
    ``_unsigned_signed_pairs``). ``FORMCAST_INT_DOT_VNNI=0`` keeps the AVX2 pair (an A/B switch;
    the bits are the same either way)."""
    if not _AVX2 or os.environ.get("FORMCAST_INT_DOT_VNNI", "1") == "0":
        return False
    features = binding.get_host_cpu_features()
    return bool(features.get("avxvnni", False) or (features.get("avx512vnni", False) and features.get("avx512vl", False)))


_VNNI = _vnni_intrinsics()
# With VNNI the int8-code products (one scale a block: Q8_0, Q5_K) read the activation's codes in
# ``NIBBLE_PAIR_ORDER`` as the nibble products do (``code_activation_codes``), and shuffle each
# weight block into that order in registers (once for all rows); otherwise both in element order.
CODES_IN_PAIR_ORDER = _VNNI


def _indices(values: list[int]) -> ir.Constant:
    return ir.Constant(ir.VectorType(_I32, len(values)), values)


def _splat(builder: ir.IRBuilder, value: ir.Value, vector: ir.VectorType) -> ir.Value:
    one = builder.insert_element(ir.Constant(vector, None), value, ir.Constant(_I32, 0))
    return builder.shuffle_vector(one, one, _indices([0] * vector.count))


def _madd(builder: ir.IRBuilder, a: ir.Value, b: ir.Value) -> ir.Value:
    """<16 x i16> a, b -> <8 x i32>: a[2i] * b[2i] + a[2i + 1] * b[2i + 1]."""
    product = builder.mul(builder.sext(a, _V16I32), builder.sext(b, _V16I32))
    even = builder.shuffle_vector(product, product, _indices(list(range(0, 16, 2))))
    odd = builder.shuffle_vector(product, product, _indices(list(range(1, 16, 2))))
    return builder.add(even, odd)


def _unsigned_signed_pairs(builder: ir.IRBuilder, u: ir.Value, s: ir.Value) -> ir.Value:
    """<32 x i8> unsigned u, signed s -> <16 x i16>: u[2i] * s[2i] + u[2i + 1] * s[2i + 1], saturated
    (never reached here: nibbles times int8 stay within 2 * 15 * 128)."""
    if _AVX2:
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V16I16, [_V32I8, _V32I8]), "llvm.x86.avx2.pmadd.ub.sw")
        return builder.call(fn, [u, s])
    even, odd = _indices(list(range(0, 32, 2))), _indices(list(range(1, 32, 2)))
    sums = builder.add(
        builder.mul(builder.zext(builder.shuffle_vector(u, u, even), _V16I32), builder.sext(builder.shuffle_vector(s, s, even), _V16I32)),
        builder.mul(builder.zext(builder.shuffle_vector(u, u, odd), _V16I32), builder.sext(builder.shuffle_vector(s, s, odd), _V16I32)),
    )  # fmt: skip
    low, high = ir.Constant(_V16I32, [-32768] * 16), ir.Constant(_V16I32, [32767] * 16)
    sums = builder.select(builder.icmp_signed(">", sums, low), sums, low)
    sums = builder.select(builder.icmp_signed("<", sums, high), sums, high)
    return builder.trunc(sums, _V16I16)


def _unsigned_signed_quads(builder: ir.IRBuilder, u: ir.Value, s: ir.Value) -> ir.Value:
    """<32 x i8> unsigned u, signed s -> <8 x i32>: lane i the sum of u[4i + j] * s[4i + j], j < 4
    (``vpdpbusd`` into zeros; only where ``_VNNI``)."""
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V8I32, [_V8I32, _V8I32, _V8I32]), "llvm.x86.avx512.vpdpbusd.256")
    return builder.call(fn, [ir.Constant(_V8I32, [0] * 8), builder.bitcast(u, _V8I32), builder.bitcast(s, _V8I32)])


_BIAS = ir.Constant(_V32I8, [-128] * 32)  # 0x80: xor maps int8 w to the unsigned byte w + 128


def _signed_quads(builder: ir.IRBuilder, biased: ir.Value, s: ir.Value) -> ir.Value:
    """<32 x i8> ``biased`` (int8 codes w plus 128, as unsigned bytes), signed s -> <8 x i32>: lane
    i the sum of w[4i + j] * s[4i + j], j < 4, as (w + 128) . s - 128 . s: exact over the whole
    int8 range of both, where the sign trick (|w| . sign(s, w)) would wrap at s = -128."""
    return builder.sub(_unsigned_signed_quads(builder, biased, s), _unsigned_signed_quads(builder, _BIAS, s))


def _pair_sums(builder: ir.IRBuilder, pairs: ir.Value) -> ir.Value:
    """<16 x i16> -> <8 x i32>: pairs[2i] + pairs[2i + 1]."""
    if _AVX2:
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V8I32, [_V16I16, _V16I16]), "llvm.x86.avx2.pmadd.wd")
        return builder.call(fn, [pairs, ir.Constant(_V16I16, [1] * 16)])
    return _madd(builder, pairs, ir.Constant(_V16I16, [1] * 16))


def _nibble_lanes(builder: ir.IRBuilder, nibbles: ir.Value, x: ir.Value) -> ir.Value:
    """One block: unpacked nibbles <32 x i8> (pair order) times int8 codes <32 x i8> (the same
    order): <8 x i32>, lane i elements 2i, 2i+1, 16+2i, 17+2i."""
    if _VNNI:  # the same int32 lanes (exact sums of the same four products), one instruction
        return _unsigned_signed_quads(builder, nibbles, x)
    return _pair_sums(builder, _unsigned_signed_pairs(builder, nibbles, x))


def _codes(builder: ir.IRBuilder, base: ir.Value, index: ir.Value) -> ir.Value:
    """16 int8 codes at ``base`` + 16 * ``index``, sign-extended to int16."""
    return builder.sext(builder.load(builder.gep(base, [index]), align=1), _V16I16)


def _rows_dot(
    builder: ir.IRBuilder, w_addr: ir.Value, rows: list[tuple[ir.Value, ir.Value]], wd_addr: ir.Value,
    blocks: ir.Value, nibbles: bool, halves: bool, k_scales: ir.Value | None = None,
) -> list[ir.Value]:  # fmt: skip
    """One weight row times activation rows ``rows`` ((codes address, scales address) each): each
    weight block is loaded and unpacked once for all of them, and every row's float operations
    run in the order a row alone gets (no fast-math: its bits are its own). ``nibbles``: Q4_K's
    nibbles (``k_scales`` then given), else int8 codes;
    ``halves``: a scale per 16 elements (two a block). ``k_scales``: the address of Q4_K's 6-bit
    sub-block scales (uint8, one a block); ``wd`` then holds the super-block scale d (one per
    eight blocks), and a block's weight scale is d * scale, as float32 (exact: 11 x 6 bits)."""
    w = builder.inttoptr(w_addr, _V16I8.as_pointer())
    wd = builder.inttoptr(wd_addr, _F32.as_pointer())
    quads = not nibbles and not halves and CODES_IN_PAIR_ORDER  # int8 codes through vpdpbusd
    x_type = _V32I8 if nibbles or quads else _V16I8
    xs = [(builder.inttoptr(x, x_type.as_pointer()), builder.inttoptr(xd, _F32.as_pointer())) for x, xd in rows]
    zero = ir.Constant(_V8F32, [0.0] * 8)
    accs = [(cgutils.alloca_once_value(builder, zero), cgutils.alloca_once_value(builder, zero)) for _ in rows]
    one = ir.Constant(blocks.type, 1)

    sub_scales = builder.inttoptr(k_scales, _I8.as_pointer()) if k_scales is not None else None

    def weight_scale(index: ir.Value) -> ir.Value:
        if sub_scales is None:
            return builder.load(builder.gep(wd, [index]))
        d = builder.load(builder.gep(wd, [builder.ashr(index, ir.Constant(index.type, 3))]))
        return builder.fmul(d, builder.uitofp(builder.load(builder.gep(sub_scales, [index])), _F32))

    def scale(xd: ir.Value, index: ir.Value) -> ir.Value:
        product = builder.fmul(weight_scale(index), builder.load(builder.gep(xd, [index])))
        return _splat(builder, product, _V8F32)

    def eight_weight_scales(first: ir.Value) -> ir.Value:
        """The weight scales of blocks first..first+7 (first a multiple of 8) as one vector."""
        if sub_scales is None:
            return builder.load(builder.bitcast(builder.gep(wd, [first]), _V8F32.as_pointer()), align=4)
        d = builder.load(builder.gep(wd, [builder.ashr(first, ir.Constant(first.type, 3))]))
        codes = builder.load(builder.bitcast(builder.gep(sub_scales, [first]), ir.VectorType(_I8, 8).as_pointer()), align=1)
        return builder.fmul(_splat(builder, d, _V8F32), builder.uitofp(codes, _V8F32))

    def add_block(block: ir.Value, chain: int, lane_scales: list[ir.Value] | None = None) -> None:
        """``lane_scales``: each row's block scale already splat (the 8-block loop), else loaded."""
        two = builder.mul(block, ir.Constant(block.type, 2))
        if nibbles:  # 16 bytes (``nibble_bytes_of_codes``): low nibbles then high ones are the pair order
            packed = builder.load(builder.gep(w, [block]), align=1)
            both = builder.shuffle_vector(packed, builder.lshr(packed, ir.Constant(_V16I8, [4] * 16)), _indices(list(range(32))))
            unpacked = builder.and_(both, ir.Constant(_V32I8, [15] * 32))
            for r, ((x, xd), acc) in enumerate(zip(xs, accs)):
                lanes = _nibble_lanes(builder, unpacked, builder.load(builder.gep(x, [block]), align=1))
                block_scale = scale(xd, block) if lane_scales is None else lane_scales[r]
                block_sum = builder.fmul(builder.sitofp(lanes, _V8F32), block_scale)
                builder.store(builder.fadd(builder.load(acc[chain]), block_sum), acc[chain])
            return
        if quads:  # the weight's codes shuffled into the activation's pair order, plus 128 (unsigned)
            codes = builder.load(builder.gep(builder.bitcast(w, _V32I8.as_pointer()), [block]), align=1)
            biased = builder.xor(builder.shuffle_vector(codes, codes, _indices([int(e) for e in NIBBLE_PAIR_ORDER])), _BIAS)
            for r, ((x, xd), acc) in enumerate(zip(xs, accs)):
                lanes = _signed_quads(builder, biased, builder.load(builder.gep(x, [block]), align=1))
                block_scale = scale(xd, block) if lane_scales is None else lane_scales[r]
                block_sum = builder.fmul(builder.sitofp(lanes, _V8F32), block_scale)
                builder.store(builder.fadd(builder.load(acc[chain]), block_sum), acc[chain])
            return
        w_lo, w_hi = _codes(builder, w, two), _codes(builder, w, builder.add(two, one))
        for r, ((x, xd), acc) in enumerate(zip(xs, accs)):
            lo = _madd(builder, w_lo, _codes(builder, x, two))
            hi = _madd(builder, w_hi, _codes(builder, x, builder.add(two, one)))
            if halves:
                block_sum = builder.fadd(
                    builder.fmul(builder.sitofp(lo, _V8F32), scale(xd, two)),
                    builder.fmul(builder.sitofp(hi, _V8F32), scale(xd, builder.add(two, one))),
                )  # fmt: skip
            else:
                block_scale = scale(xd, block) if lane_scales is None else lane_scales[r]
                block_sum = builder.fmul(builder.sitofp(builder.add(lo, hi), _V8F32), block_scale)
            builder.store(builder.fadd(builder.load(acc[chain]), block_sum), acc[chain])

    # Eight blocks at a time (one scale per block): their weight scales times each row's in one
    # vector multiply, each product then taken from its lane (the same float32 products as one
    # by one, three scalar instructions a block and row fewer). Block b always adds to chain b % 2.
    eight = ir.Constant(blocks.type, 8)
    octets = builder.sdiv(blocks, eight) if not halves else ir.Constant(blocks.type, 0)
    with cgutils.for_range(builder, octets) as loop:
        first = builder.mul(loop.index, eight)
        weights = eight_weight_scales(first)
        products = [builder.fmul(weights, builder.load(builder.bitcast(builder.gep(xd, [first]), _V8F32.as_pointer()), align=4)) for _, xd in xs]
        for k in range(8):
            lane = [builder.shuffle_vector(v, v, _indices([k] * 8)) for v in products]
            add_block(builder.add(first, ir.Constant(blocks.type, k)), k % 2, lane)
    done = builder.mul(octets, eight)
    pairs = builder.sdiv(builder.sub(blocks, done), ir.Constant(blocks.type, 2))
    with cgutils.for_range(builder, pairs) as loop:
        first = builder.add(done, builder.mul(loop.index, ir.Constant(blocks.type, 2)))
        add_block(first, 0)
        add_block(builder.add(first, one), 1)
    with builder.if_then(builder.icmp_signed("==", builder.srem(blocks, ir.Constant(blocks.type, 2)), one)):
        add_block(builder.sub(blocks, one), 0)
    results = []
    for even, odd in accs:
        lanes = builder.fadd(builder.load(even), builder.load(odd))
        four = builder.fadd(builder.shuffle_vector(lanes, lanes, _indices([0, 1, 2, 3])), builder.shuffle_vector(lanes, lanes, _indices([4, 5, 6, 7])))
        two = builder.fadd(builder.shuffle_vector(four, four, _indices([0, 1])), builder.shuffle_vector(four, four, _indices([2, 3])))
        results.append(builder.fadd(builder.extract_element(two, ir.Constant(_I32, 0)), builder.extract_element(two, ir.Constant(_I32, 1))))
    return results


def _one_row(builder: ir.IRBuilder, args: list[ir.Value], halves: bool = False) -> ir.Value:
    w, x, wd, xd, blocks = args
    return _rows_dot(builder, w, [(x, xd)], wd, blocks, False, halves)[0]


def _group_rows(
    builder: ir.IRBuilder, args: list[ir.Value], count: int, nibbles: bool = False, halves: bool = False, k_scales: ir.Value | None = None,
) -> None:  # fmt: skip
    """Rows at x + i * x_step and xd + i * xd_step (bytes), i < ``count``; results stored at ``out``
    (``args``: w, x, x_step, wd, xd, xd_step, blocks, out)."""
    w, x, x_step, wd, xd, xd_step, blocks, out = args
    rows = []
    for i in range(count):
        index = ir.Constant(x_step.type, i)
        rows.append((builder.add(x, builder.mul(x_step, index)), builder.add(xd, builder.mul(xd_step, index))))
    out_p = builder.inttoptr(out, _F32.as_pointer())

    for i, value in enumerate(_rows_dot(builder, w, rows, wd, blocks, nibbles, halves, k_scales)):
        builder.store(value, builder.gep(out_p, [ir.Constant(_I32, i)]))


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


def _one_k_row(builder: ir.IRBuilder, args: list[ir.Value]) -> ir.Value:
    w, x, d, sc, xd, blocks = args
    return _rows_dot(builder, w, [(x, xd)], d, blocks, True, False, sc)[0]


_ONE = (types.uintp, types.uintp, types.uintp, types.uintp, types.intp)
_FOUR = (types.uintp, types.uintp, types.intp, types.uintp, types.uintp, types.intp, types.intp, types.uintp)


@intrinsic
def code_row_dot(typingctx, w, x, wd, xd, blocks):  # type: ignore[no-untyped-def]
    return types.float32(*_ONE), lambda context, builder, sig, args: _one_row(builder, args)


@intrinsic
def code16_row_dot(typingctx, w, x, wd, xd, blocks):  # type: ignore[no-untyped-def]
    return types.float32(*_ONE), lambda context, builder, sig, args: _one_row(builder, args, halves=True)


# Groups of 2 to 4 rows (more rows spill the accumulators, two 8-lane registers a row beside the
# unpacked weight block, out of AVX2's sixteen: groups of five and six measured no faster).
MAX_GROUP = 4


def _switch_rows(builder: ir.IRBuilder, count: ir.Value, group) -> ir.Value:  # type: ignore[no-untyped-def]
    """``group(n)`` (one ``_group_rows``) for ``count`` rows, 2 <= count <= MAX_GROUP, each count
    compiled as its own branch (the row count sizes the registers); another count does nothing."""
    done = builder.function.append_basic_block("rows.done")
    switch = builder.switch(count, done)
    for n in range(2, MAX_GROUP + 1):
        branch = builder.function.append_basic_block(f"rows.{n}")
        switch.add_case(ir.Constant(count.type, n), branch)
        builder.position_at_end(branch)
        group(n)
        builder.branch(done)
    builder.position_at_end(done)
    return ir.Constant(ir.IntType(64), 0)


@intrinsic
def nibble_k_row_dot(typingctx, w, x, d, sc, xd, blocks):  # type: ignore[no-untyped-def]
    """Q4_K: nibbles times activation codes (``NIBBLE_PAIR_ORDER``), a block's weight scale
    ``d`` (float32, one per eight blocks) times ``sc`` (uint8, one a block)."""
    sig = types.float32(types.uintp, types.uintp, types.uintp, types.uintp, types.uintp, types.intp)
    return sig, lambda context, builder, sig, args: _one_k_row(builder, args)


@intrinsic
def nibble_k_rows(typingctx, w, x, x_step, d, sc, xd, xd_step, blocks, out, count):  # type: ignore[no-untyped-def]
    sig = types.int64(types.uintp, types.uintp, types.intp, types.uintp, types.uintp, types.uintp, types.intp, types.intp, types.uintp, types.intp)
    def lower(context, builder, sig, args):  # type: ignore[no-untyped-def]
        w, x, x_step, d, sc, xd, xd_step, blocks, out, count = args
        return _switch_rows(builder, count, lambda n: _group_rows(builder, [w, x, x_step, d, xd, xd_step, blocks, out], n, nibbles=True, k_scales=sc))

    return sig, lower


@intrinsic
def code_rows(typingctx, w, x, x_step, wd, xd, xd_step, blocks, out, count):  # type: ignore[no-untyped-def]
    return types.int64(*_FOUR, types.intp), lambda context, builder, sig, args: _switch_rows(builder, args[8], lambda n: _group_rows(builder, args[:8], n))


@intrinsic
def code16_rows(typingctx, w, x, x_step, wd, xd, xd_step, blocks, out, count):  # type: ignore[no-untyped-def]
    return types.int64(*_FOUR, types.intp), lambda context, builder, sig, args: _switch_rows(builder, args[8], lambda n: _group_rows(builder, args[:8], n, halves=True))


@intrinsic
def float_dot(typingctx, a, b, n):  # type: ignore[no-untyped-def]
    return types.float32(types.uintp, types.uintp, types.intp), lambda context, builder, sig, args: _float_dot(builder, args)
