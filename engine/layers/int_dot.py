"""Integer dot products of ggml's 32-element blocks, written as LLVM vector IR (numba intrinsics).

numba types integer arithmetic as 64-bit, so a numba loop over int8 codes multiplies in int64
lanes, and the float loops of ``ggml_quants`` spend a conversion, a multiply and an add per element.
Here a block's 32 products are two 16-lane int16 multiplies whose even and odd lanes are added: the
pattern LLVM's x86 backend emits as ``pmaddwd`` (16 multiply-adds an instruction; AArch64 gets
widening multiply-adds). The block sum is exact in int32; one float multiply by the two scales
follows. Nothing in it names a CPU feature: any LLVM target compiles it.

    nibble_row_dot(w, x, wd, xd, blocks, off)   Q4_0 (off 8) / Q4_1 (off 0): 16 bytes a block,
                                                element j in the low nibble of byte j, j + 16 in its high one
    code_row_dot(w, x, wd, xd, blocks)          Q8_0, Q4_K, Q5_K: 32 int8 codes a block
    code16_row_dot(w, x, wd, xd, blocks)        Q6_K: the same with a scale per 16 elements
                                                (``wd`` and ``xd`` hold two a block)

    float_dot(a, b, n)                          sum_i a[i] * b[i] of float32 rows (the minimum terms
                                                of the formats with one)

``w``, ``x`` (the activation's codes as int16, 32 a block), ``wd``, ``xd`` (float32 scales, one a
block) are addresses of one row (``arr[n].ctypes.data``). The result is
sum_b (wd[b] * xd[b]) * sum_j w_bj * x_bj, accumulated in eight float lanes by two accumulators
(even and odd blocks: two independent chains) and summed in a fixed pairwise order, with no
fast-math flag. ``*_rows(w, x, x_step, wd, xd, xd_step, blocks, out, count[, off])`` multiply one
weight row by ``count`` activation rows, 2 to ``MAX_GROUP`` (``x + i * x_step`` bytes...),
loading and unpacking each weight block once, and store the results at ``out``: each row runs the very operations it
runs alone, so its bits depend only on its own codes and scales, never on a batch or a thread
(the contract of ``cpu_threads``).
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.extending import intrinsic

_I8, _I16, _I32, _F32 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.FloatType()
_V16I8, _V16I16, _V16I32 = ir.VectorType(_I8, 16), ir.VectorType(_I16, 16), ir.VectorType(_I32, 16)
_V8I32, _V8F32 = ir.VectorType(_I32, 8), ir.VectorType(_F32, 8)


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


def _codes(builder: ir.IRBuilder, base: ir.Value, index: ir.Value) -> ir.Value:
    """16 int8 codes at ``base`` + 16 * ``index``, sign-extended to int16."""
    return builder.sext(builder.load(builder.gep(base, [index]), align=1), _V16I16)


def _wide_codes(builder: ir.IRBuilder, base: ir.Value, index: ir.Value) -> ir.Value:
    """16 int16 codes at ``base`` + 16 * ``index``."""
    return builder.load(builder.gep(base, [index]), align=2)


def _rows_dot(
    builder: ir.IRBuilder, w_addr: ir.Value, rows: list[tuple[ir.Value, ir.Value]], wd_addr: ir.Value,
    blocks: ir.Value, off: ir.Value | None, halves: bool,
) -> list[ir.Value]:  # fmt: skip
    """One weight row times activation rows ``rows`` ((codes address, scales address) each): each
    weight block is loaded and unpacked once for all of them, and every row's float operations
    run in the order a row alone gets (no fast-math: its bits are its own). ``off``: the nibble
    formats' offset, None for int8 codes; ``halves``: a scale per 16 elements (two a block)."""
    w = builder.inttoptr(w_addr, _V16I8.as_pointer())
    wd = builder.inttoptr(wd_addr, _F32.as_pointer())
    xs = [(builder.inttoptr(x, _V16I16.as_pointer()), builder.inttoptr(xd, _F32.as_pointer())) for x, xd in rows]
    zero = ir.Constant(_V8F32, [0.0] * 8)
    accs = [(cgutils.alloca_once_value(builder, zero), cgutils.alloca_once_value(builder, zero)) for _ in rows]
    one = ir.Constant(blocks.type, 1)

    def scale(xd: ir.Value, index: ir.Value) -> ir.Value:
        product = builder.fmul(builder.load(builder.gep(wd, [index])), builder.load(builder.gep(xd, [index])))
        return _splat(builder, product, _V8F32)

    def add_block(block: ir.Value, chain: int) -> None:
        two = builder.mul(block, ir.Constant(block.type, 2))
        if off is None:  # int8 weight codes
            w_lo, w_hi = _codes(builder, w, two), _codes(builder, w, builder.add(two, one))
        else:  # 16 bytes of nibbles
            packed = builder.zext(builder.load(builder.gep(w, [block]), align=1), _V16I16)
            w_lo = builder.sub(builder.and_(packed, ir.Constant(_V16I16, [15] * 16)), off)
            w_hi = builder.sub(builder.lshr(packed, ir.Constant(_V16I16, [4] * 16)), off)
        for (x, xd), acc in zip(xs, accs):
            lo = _madd(builder, w_lo, _wide_codes(builder, x, two))
            hi = _madd(builder, w_hi, _wide_codes(builder, x, builder.add(two, one)))
            if halves:
                block_sum = builder.fadd(
                    builder.fmul(builder.sitofp(lo, _V8F32), scale(xd, two)),
                    builder.fmul(builder.sitofp(hi, _V8F32), scale(xd, builder.add(two, one))),
                )  # fmt: skip
            else:
                block_sum = builder.fmul(builder.sitofp(builder.add(lo, hi), _V8F32), scale(xd, block))
            builder.store(builder.fadd(builder.load(acc[chain]), block_sum), acc[chain])

    pairs = builder.sdiv(blocks, ir.Constant(blocks.type, 2))
    with cgutils.for_range(builder, pairs) as loop:
        first = builder.mul(loop.index, ir.Constant(blocks.type, 2))
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


def _one_row(builder: ir.IRBuilder, args: list[ir.Value], nibbles: bool = False, halves: bool = False) -> ir.Value:
    w, x, wd, xd, blocks = args[:5]
    off = _splat(builder, builder.trunc(args[5], _I16), _V16I16) if nibbles else None
    return _rows_dot(builder, w, [(x, xd)], wd, blocks, off, halves)[0]


def _group_rows(builder: ir.IRBuilder, args: list[ir.Value], count: int, nibbles: bool = False, halves: bool = False) -> ir.Value:
    """Rows at x + i * x_step and xd + i * xd_step (bytes), i < ``count``; results stored at ``out``."""
    w, x, x_step, wd, xd, xd_step, blocks, out = args[:8]
    off = _splat(builder, builder.trunc(args[8], _I16), _V16I16) if nibbles else None
    rows = []
    for i in range(count):
        index = ir.Constant(x_step.type, i)
        rows.append((builder.add(x, builder.mul(x_step, index)), builder.add(xd, builder.mul(xd_step, index))))
    results = _rows_dot(builder, w, rows, wd, blocks, off, halves)
    out_p = builder.inttoptr(out, _F32.as_pointer())
    for i, value in enumerate(results):
        builder.store(value, builder.gep(out_p, [ir.Constant(_I32, i)]))
    return ir.Constant(ir.IntType(64), 0)


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


_ONE = (types.uintp, types.uintp, types.uintp, types.uintp, types.intp)
_FOUR = (types.uintp, types.uintp, types.intp, types.uintp, types.uintp, types.intp, types.intp, types.uintp)


@intrinsic
def nibble_row_dot(typingctx, w, x, wd, xd, blocks, off):  # type: ignore[no-untyped-def]
    return types.float32(*_ONE, types.intp), lambda context, builder, sig, args: _one_row(builder, args, nibbles=True)


@intrinsic
def code_row_dot(typingctx, w, x, wd, xd, blocks):  # type: ignore[no-untyped-def]
    return types.float32(*_ONE), lambda context, builder, sig, args: _one_row(builder, args)


@intrinsic
def code16_row_dot(typingctx, w, x, wd, xd, blocks):  # type: ignore[no-untyped-def]
    return types.float32(*_ONE), lambda context, builder, sig, args: _one_row(builder, args, halves=True)


# Groups of 2 to 4 rows (more rows spill the accumulators, two 8-lane registers a row beside the
# unpacked weight block, out of AVX2's sixteen: groups of five and six measured no faster).
MAX_GROUP = 4


def _switch_rows(builder: ir.IRBuilder, args: list[ir.Value], nibbles: bool, halves: bool) -> ir.Value:
    """``_group_rows`` of ``count`` (args[8]) rows, 2 <= count <= MAX_GROUP, each count compiled
    as its own branch (the row count sizes the registers); another count does nothing."""
    count = args[8]
    rest = args[:8] + args[9:]  # the nibble offset, where there is one, follows the count
    done = builder.function.append_basic_block("rows.done")
    switch = builder.switch(count, done)
    for n in range(2, MAX_GROUP + 1):
        branch = builder.function.append_basic_block(f"rows.{n}")
        switch.add_case(ir.Constant(count.type, n), branch)
        builder.position_at_end(branch)
        _group_rows(builder, rest, n, nibbles, halves)
        builder.branch(done)
    builder.position_at_end(done)
    return ir.Constant(ir.IntType(64), 0)


@intrinsic
def nibble_rows(typingctx, w, x, x_step, wd, xd, xd_step, blocks, out, count, off):  # type: ignore[no-untyped-def]
    return types.int64(*_FOUR, types.intp, types.intp), lambda context, builder, sig, args: _switch_rows(builder, args, True, False)


@intrinsic
def code_rows(typingctx, w, x, x_step, wd, xd, xd_step, blocks, out, count):  # type: ignore[no-untyped-def]
    return types.int64(*_FOUR, types.intp), lambda context, builder, sig, args: _switch_rows(builder, args, False, False)


@intrinsic
def code16_rows(typingctx, w, x, x_step, wd, xd, xd_step, blocks, out, count):  # type: ignore[no-untyped-def]
    return types.int64(*_FOUR, types.intp), lambda context, builder, sig, args: _switch_rows(builder, args, False, True)


@intrinsic
def float_dot(typingctx, a, b, n):  # type: ignore[no-untyped-def]
    return types.float32(types.uintp, types.uintp, types.intp), lambda context, builder, sig, args: _float_dot(builder, args)
