"""Q4_K weights times many activation rows: an interleaved GEMM, 8 weight rows at a time.

A group of 8 weight rows is first unpacked into a buffer (``_emit_pack``): per block, for
each 8 values of the block the 8 rows' values side by side (one 512-bit vector: row n in
bytes 8n..8n+7), their integer scales and mins, and their float scales. Then every
activation row runs over the buffer (``_emit_gemm``): 8 bytes of the activation broadcast
to the 8 rows, one ``vpdpbusd`` per 8 values for all 8 weight rows; the 32 values of a
group sum in each row's two words before one ``packssdw`` and one ``vpdpwssd`` apply the
scales to two groups at once. That is 1.25 vector operations per 64 products where the
per-row tiles (``int_tiles``) need about 3, and the unpacking is done once for all the
activation rows instead of once per 8.

The numbers are those of every other Q4_K path (``KernelType.parity_lanes``): per block,
the scaled integer dot of the even and of the odd 32-value groups (exact integers), each
its float lane ``+= float(isum) * (d * d_act)``; the mins' term ``-= (d_act * dmin) *
sum(min * 32-sum)`` (exact integers in float); at the end ``(even + odd) + mins' term``.
So a row's product does not depend on which path ran it (batch invariance). AVX512-VNNI
only (``USABLE``); elsewhere the per-row tiles run.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from ..gguf.types import GGMLType
from . import jitcache  # noqa: F401 - stamps the cached kernels below (before any njit)
from .int_blocks import k_scales
from .kerneltypes import KERNEL_TYPES
from .vector_ir import F32, I8, I16, I32, I64, VNNI512, VectorIR, array_args, row_pointer, vec

USABLE = VNNI512
GEMM_KINDS = (int(GGMLType.Q4_K),) if USABLE else (-1,)  # a constant tuple for numba
GROUP = 8  # weight rows unpacked together
GEMM_MIN_ROWS = 8  # activation rows from which a product runs here
_ROWS_AT_ONCE = 4  # activation rows per pass over a block (they share the weight loads)

_Q4K = KERNEL_TYPES[GGMLType.Q4_K]
_QS = _Q4K.format["qs"].offset
_SCALES = _Q4K.format["scales"].offset
_D, _DMIN = _Q4K.format["d"].offset, _Q4K.format["dmin"].offset
_TYPE_SIZE = _Q4K.type_size
# the buffer's block: values [8-value group g][row n][8], scales [row n][group s] (bytes),
# mins [group s][row n] (float), d [row n], dmin [row n] (float)
_W, _SZ, _MN, _DW, _DM = 0, 2048, 2112, 2368, 2400
BLOCK_BYTES = 2432


def _ptr(g: VectorIR, base, off, t: ir.Type) -> ir.Value:  # noqa: ANN001
    return g.b.bitcast(g.at(base, off), t.as_pointer())


def _cat(g: VectorIR, a, b) -> ir.Value:  # noqa: ANN001
    """Vectors ``a`` and ``b`` (of one type) side by side."""
    n = 2 * a.type.count
    return g.b.shuffle_vector(a, b, ir.Constant(vec(I32, n), list(range(n))))


def _emit_pack_values(g: VectorIR, rows: list, off, out) -> None:  # noqa: ANN001
    """The 8 rows' 256 values of the block at byte ``off`` into ``out[_W:]``: 32 vectors,
    vector g holding values 8g..8g+7 of each row (value 64p + l is the low nibble of byte
    32p + l of the row's ``qs``, value 64p + 32 + l the high one)."""
    bld = g.b
    v4 = vec(I64, 4)
    for p in range(4):
        q = [bld.load(_ptr(g, r, bld.add(off, g.c64(_QS + 32 * p)), v4), align=1) for r in rows]
        pairs = [_cat(g, q[2 * m], q[2 * m + 1]) for m in range(4)]
        for j in range(4):
            idx = ir.Constant(vec(I32, 4), [j, 4 + j, 8 + j, 12 + j])
            lo4 = bld.shuffle_vector(pairs[0], pairs[1], idx)
            hi4 = bld.shuffle_vector(pairs[2], pairs[3], idx)
            v = bld.bitcast(_cat(g, lo4, hi4), vec(I8, 64))
            low = bld.and_(v, g.splat8(15, 64))
            high = bld.and_(bld.lshr(v, g.splat8(4, 64)), g.splat8(15, 64))
            bld.store(low, _ptr(g, out, g.c64(_W + 64 * (8 * p + j)), vec(I8, 64)), align=1)
            bld.store(high, _ptr(g, out, g.c64(_W + 64 * (8 * p + 4 + j)), vec(I8, 64)), align=1)


def _emit_pack_scales(g: VectorIR, rows: list, off, out) -> None:  # noqa: ANN001
    """The 8 rows' scales (bytes, [row][group]), mins (float, [group][row]), d and dmin of
    the block at byte ``off`` into ``out``."""
    bld = g.b
    sm = [k_scales(g, r, bld.add(off, g.c64(_SCALES))) for r in rows]  # scales 0-7, mins 8-15
    cat = [_cat(g, sm[2 * m], sm[2 * m + 1]) for m in range(4)]
    cat = [_cat(g, cat[0], cat[1]), _cat(g, cat[2], cat[3])]
    sz = bld.shuffle_vector(cat[0], cat[1], ir.Constant(
        vec(I32, 64), [16 * n + s for n in range(8) for s in range(8)]))
    bld.store(sz, _ptr(g, out, g.c64(_SZ), vec(I8, 64)), align=1)
    mins = bld.shuffle_vector(cat[0], cat[1], ir.Constant(
        vec(I32, 64), [16 * n + 8 + s for s in range(8) for n in range(8)]))
    mf = bld.uitofp(bld.zext(mins, vec(I32, 64)), vec(F32, 64))
    bld.store(mf, _ptr(g, out, g.c64(_MN), vec(F32, 64)), align=4)
    for at, field in ((_DW, _D), (_DM, _DMIN)):
        v = ir.Constant(vec(F32, 8), [0.0] * 8)
        for n, r in enumerate(rows):
            v = bld.insert_element(v, g.f16(r, bld.add(off, g.c64(field))), ir.Constant(I32, n))
        bld.store(v, _ptr(g, out, g.c64(at), vec(F32, 8)), align=4)


@intrinsic
def _pack(typingctx, w, r0, tbl, buf):  # noqa: ANN001, ANN202, ARG001
    """``_pack(w (R, row_bytes) u8, r0, tbl, buf (nb, BLOCK_BYTES) u8)``: weight rows
    r0..r0+7 of ``w`` into ``buf`` (the layout above), every block."""
    sig = types.int64(w, r0, tbl, buf)

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        ws, r0_, tbls, bufs = array_args(context, builder, signature, args)
        g = VectorIR(builder, tbls.data)
        rows = [row_pointer(builder, ws, builder.add(r0_, g.c64(n)), I8) for n in range(GROUP)]
        nb = cgutils.unpack_tuple(builder, bufs.shape)[0]
        with cgutils.for_range(builder, nb) as loop:
            off = builder.mul(loop.index, g.c64(_TYPE_SIZE))
            out = row_pointer(builder, bufs, loop.index, I8)
            _emit_pack_values(g, rows, off, out)
            _emit_pack_scales(g, rows, off, out)
        return context.get_constant(types.int64, 0)

    return sig, codegen


# _emit_gemm: pack_madd's scale words for groups 2p, 2p + 1 from the buffer's [row][group]
# bytes: in 128-bit lane L (rows 2L, 2L + 1) each row's two words of group 2p, then of 2p + 1
_SCALE_IDX = [[8 * (2 * (i // 8) + (i // 2) % 2) + 2 * p + (i % 8) // 4 for i in range(32)]
              for p in range(4)]
_D16 = [2 * (i // 4) + i % 2 for i in range(16)]  # row of float lane i (4L + 2 odd + t)
_EVEN = [0, 1, 4, 5, 8, 9, 12, 13]  # rows 0..7's even-group lanes
_ODD = [2, 3, 6, 7, 10, 11, 14, 15]


def _bcast8(g: VectorIR, ptr, off) -> ir.Value:  # noqa: ANN001
    """<64 x i8>: the 8 bytes at ``ptr + off``, 8 times."""
    bld = g.b
    x = bld.load(_ptr(g, ptr, off, I64), align=1)
    v = bld.insert_element(ir.Constant(vec(I64, 8), ir.Undefined), x, ir.Constant(I32, 0))
    v = bld.shuffle_vector(v, v, ir.Constant(vec(I32, 8), [0] * 8))
    return bld.bitcast(v, vec(I8, 64))


def _dpbusd(g: VectorIR, acc, u8, s8) -> ir.Value:  # noqa: ANN001
    v32 = vec(I32, 16)
    return g.call("llvm.x86.avx512.vpdpbusd.512", v32,
                  [acc, g.b.bitcast(u8, v32), g.b.bitcast(s8, v32)])


def _emit_block_isums(g: VectorIR, blk, qas: list, abase) -> list:  # noqa: ANN001
    """<16 x i32> per activation row: lane 4L + 2 odd + t, row 2L + t's scaled integer dot
    of the block's even (odd = 0) or odd 32-value groups, the block at ``blk`` in the
    buffer and at value ``abase`` in the activation rows ``qas``."""
    bld = g.b
    zero = ir.Constant(vec(I32, 16), [0] * 16)
    sz = bld.load(_ptr(g, blk, g.c64(_SZ), vec(I8, 64)), align=1)
    isums = [None] * len(qas)
    for p in range(4):
        sc = bld.zext(bld.shuffle_vector(sz, sz, ir.Constant(vec(I32, 32), _SCALE_IDX[p])),
                      vec(I16, 32))
        even, odd = [zero] * len(qas), [zero] * len(qas)
        for j in range(4):
            we = bld.load(_ptr(g, blk, g.c64(_W + 64 * (8 * p + j)), vec(I8, 64)), align=1)
            wo = bld.load(_ptr(g, blk, g.c64(_W + 64 * (8 * p + 4 + j)), vec(I8, 64)), align=1)
            for a, qa in enumerate(qas):
                at = bld.add(abase, g.c64(64 * p + 8 * j))
                even[a] = _dpbusd(g, even[a], we, _bcast8(g, qa, at))
                odd[a] = _dpbusd(g, odd[a], wo, _bcast8(g, qa, bld.add(at, g.c64(32))))
        for a in range(len(qas)):  # each word pair: one row's 16 values of one group
            isums[a] = g.pack_madd(even[a], odd[a], sc, isums[a])
    return isums


def _splat(g: VectorIR, x, n: int) -> ir.Value:  # noqa: ANN001
    v = g.b.insert_element(ir.Constant(vec(F32, n), ir.Undefined), x, ir.Constant(I32, 0))
    return g.b.shuffle_vector(v, v, ir.Constant(vec(I32, n), [0] * n))


def _make_gemm(na: int):  # noqa: ANN202 - a numba intrinsic
    """Intrinsic ``gemm(buf, qa, da, aux, i0, out, c0)``: ``out[i0 + a, c0 + n]`` for
    ``a < na``, ``n < 8``: buffered weight rows (``_pack``) times Q8_K activation rows."""

    @intrinsic
    def gemm(typingctx, buf, qa, da, aux, i0, out, c0):  # noqa: ANN001, ANN202, ARG001, PLR0913
        sig = types.int64(buf, qa, da, aux, i0, out, c0)

        def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
            bufs, qas, das, auxs, i0_, outs, c0_ = array_args(context, builder, signature, args)
            g = VectorIR(builder, None)
            bld = builder
            ii = [bld.add(i0_, g.c64(a)) for a in range(na)]
            qp = [row_pointer(bld, qas, i, I8) for i in ii]
            dp = [row_pointer(bld, das, i, F32) for i in ii]
            xp = [row_pointer(bld, auxs, i, F32) for i in ii]
            facc = [cgutils.alloca_once_value(bld, ir.Constant(vec(F32, 16), [0.0] * 16))
                    for _ in range(na)]
            mterm = [cgutils.alloca_once_value(bld, ir.Constant(vec(F32, 8), [0.0] * 8))
                     for _ in range(na)]
            nb = cgutils.unpack_tuple(bld, bufs.shape)[0]
            with cgutils.for_range(bld, nb) as loop:
                b = loop.index
                blk = row_pointer(bld, bufs, b, I8)
                isums = _emit_block_isums(g, blk, qp, bld.mul(b, g.c64(256)))
                dw8 = bld.load(_ptr(g, blk, g.c64(_DW), vec(F32, 8)), align=4)
                dm8 = bld.load(_ptr(g, blk, g.c64(_DM), vec(F32, 8)), align=4)
                dw16 = bld.shuffle_vector(dw8, dw8, ir.Constant(vec(I32, 16), _D16))
                for a in range(na):
                    dab = g.load_f32(dp[a], b)
                    f = bld.sitofp(isums[a], vec(F32, 16))
                    dd = bld.fmul(dw16, _splat(g, dab, 16))  # d * d_act, as every path
                    bld.store(g.call("llvm.fma.v16f32", vec(F32, 16),
                                     [f, dd, bld.load(facc[a])]), facc[a])
                    msum = None  # integers below 2**24 in float: exact in any order
                    for s in range(8):
                        mn = bld.load(_ptr(g, blk, g.c64(_MN + 32 * s), vec(F32, 8)), align=4)
                        aux = _splat(g, g.load_f32(xp[a], bld.add(bld.mul(b, g.c64(8)),
                                                                  g.c64(s))), 8)
                        msum = bld.fmul(mn, aux) if msum is None else g.call(
                            "llvm.fma.v8f32", vec(F32, 8), [mn, aux, msum])
                    scale = bld.fmul(_splat(g, dab, 8), dm8)
                    bld.store(bld.fsub(bld.load(mterm[a]), bld.fmul(scale, msum)), mterm[a])
            for a in range(na):
                v = bld.load(facc[a])
                even = bld.shuffle_vector(v, v, ir.Constant(vec(I32, 8), _EVEN))
                odd = bld.shuffle_vector(v, v, ir.Constant(vec(I32, 8), _ODD))
                res = bld.fadd(bld.fadd(even, odd), bld.load(mterm[a]))
                for n in range(GROUP):
                    g.store_2d(outs, ii[a], bld.add(c0_, g.c64(n)),
                               bld.extract_element(res, ir.Constant(I32, n)))
            return context.get_constant(types.int64, 0)

        return sig, codegen

    return gemm


_gemm_n = _make_gemm(_ROWS_AT_ONCE)
_gemm_1 = _make_gemm(1)


@njit(cache=True, nogil=True)
def gemm_rows(w, r0, r1, qa, da, aux, tbl, out):  # noqa: ANN001, ANN201
    """The hot loop. Q4_K weight rows r0:r1 of ``w`` (R, row_bytes) u8 @ Q8_K activations
    (n, K) -> out[:, r0:r1] (n, R) f32, in groups of 8 rows; returns the first row of the
    last 1-7 it leaves to the caller (r1 when none)."""
    n = qa.shape[0]
    buf = np.empty((w.shape[1] // _TYPE_SIZE, BLOCK_BYTES), np.uint8)
    c = r0
    while c + GROUP <= r1:
        _pack(w, c, tbl, buf)
        i = 0
        while i + _ROWS_AT_ONCE <= n:
            _gemm_n(buf, qa, da, aux, i, out, c)
            i += _ROWS_AT_ONCE
        while i < n:
            _gemm_1(buf, qa, da, aux, i, out, c)
            i += 1
        c += GROUP
    return c
