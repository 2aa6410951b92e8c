"""The K-quants in the interleaved GEMM (``int_gemm``): Q4_K and Q6_K with their two parity
lanes (``KernelType.parity_lanes``), Q5_K with one (``KernelType.block_lane``), Q3_K and
Q2_K with the per-row tiles' 8 lanes (``int_tiles._scaled_dot``: lane c sums, over the
block's 64-value pairs, scale times values 8c..8c+7 of the pair). Each type: how a block
of 8 rows goes into the buffer (``_pack_*``), and the per-activation-row integer lanes of
a buffered block (``_isums_*``).
"""

from __future__ import annotations

from llvmlite import ir

from ..gguf.types import GGMLType
from .formats import FORMATS
from .gemm_ir import (
    Layout,
    cat,
    dpbusd,
    layout,
    load,
    one_lane_isums,
    pack_d,
    pack_starts,
    ptr,
    qwords,
    row_values,
    scale_index,
    splat,
    store,
)
from .vector_ir import F32, I8, I16, I32, VectorIR, vec

L4 = layout(GGMLType.Q4_K, 64, 32 + 128)  # dmin, then the mins as words
L5 = layout(GGMLType.Q5_K, 8 * 64, 32 + 128)  # the scales <16 x i32> a span, then as L4
L6 = layout(GGMLType.Q6_K, 128, 64)
L3 = layout(GGMLType.Q3_K, 0, 4 * 64)  # the scales are in the values
L2 = layout(GGMLType.Q2_K, 0, 32 + 256)  # dmin, then the mins as words (``pack_q2k``)
_F4, _F5, _F6 = FORMATS[GGMLType.Q4_K], FORMATS[GGMLType.Q5_K], FORMATS[GGMLType.Q6_K]
_F3, _F2 = FORMATS[GGMLType.Q3_K], FORMATS[GGMLType.Q2_K]
_ZERO16 = ir.Constant(vec(I32, 16), [0] * 16)


def _c8(x: int) -> ir.Constant:
    return ir.Constant(vec(I32, 8), [x] * 8)


# -- Q4_K ----------------------------------------------------------------------------------

def pack_q4k(g: VectorIR, rows: list, off, out) -> None:  # noqa: ANN001
    """Q4_K block at ``off`` of the 8 rows into the buffer block ``out``: value 64p + l is
    the low nibble of byte 32p + l of a row's ``qs``, 64p + 32 + l the high one."""
    _pack_k4_values(g, rows, off, _F4, out)
    sz, mz = _k_scales8(g, rows, g.b.add(off, g.c64(_F4["scales"].offset)))
    store(g, sz, out, L4.scales)
    _pack_k4_mins(g, rows, off, _F4, mz, out, L4)


def _pack_k4_values(g: VectorIR, rows: list, off, f, out) -> None:  # noqa: ANN001
    """Q4_K's or Q5_K's (format ``f``) values of the block at ``off`` of the 8 rows into
    buffer vectors 0..31 (span s in 4s..4s+3): value 64p + l is the low nibble of byte
    32p + l of a row's ``qs``, 64p + 32 + l the high one; Q5_K's (a ``qh`` field) with bit
    2p, resp. 2p + 1, of ``qh[l]`` as its fifth."""
    bld = g.b
    m15, one = g.splat8(15, 64), g.splat8(1, 64)
    qh = [x.offset for x in f.fields if x.name == "qh"]
    hs = qwords(g, rows, bld.add(off, g.c64(qh[0]))) if qh else None
    for p in range(4):
        qs = qwords(g, rows, bld.add(off, g.c64(f["qs"].offset + 32 * p)))
        for j, v in enumerate(qs):
            nibs = (bld.and_(v, m15), bld.and_(bld.lshr(v, g.splat8(4, 64)), m15))
            for e, nib in enumerate(nibs):
                if hs is not None:
                    fifth = bld.and_(bld.lshr(hs[j], g.splat8(2 * p + e, 64)), one)
                    nib = bld.or_(nib, bld.shl(fifth, g.splat8(4, 64)))
                store(g, nib, out, 64 * (8 * p + 4 * e + j))


def _pack_k4_mins(g: VectorIR, rows: list, off, f, mz, out, lay: Layout) -> None:  # noqa: ANN001, PLR0913
    """Q4_K's and Q5_K's d, dmin and mins (``mz``, bytes [row][group]) into the buffer
    block ``out``: the mins as words, vector h holding in dword i row i // 2's mins of
    groups 4h + 2 (i % 2) and the next (``offset_k4``)."""
    bld = g.b
    for h in range(2):
        idx = [8 * (i // 2) + 4 * h + 2 * (i % 2) + t for i in range(16) for t in range(2)]
        store(g, bld.zext(bld.shuffle_vector(mz, mz, ir.Constant(vec(I32, 32), idx)),
                          vec(I16, 32)), out, lay.extra + 32 + 64 * h)
    pack_d(g, rows, off, f["d"].offset, out, lay.d)
    pack_d(g, rows, off, f["dmin"].offset, out, lay.extra)


def _k_scales8(g: VectorIR, rows: list, at) -> tuple[ir.Value, ir.Value]:  # noqa: ANN001
    """The 8 rows' six-bit scales and mins (ggml's get_scale_min_k4) from the 12 bytes at
    ``at`` of each row, as two <64 x i8>, [row][group]: ``int_weights``' word-wide masks,
    for the 8 rows at once."""
    bld = g.b
    u0, u1, u2 = (row_values(g, rows, bld.add(at, g.c64(4 * k)), I32) for k in range(3))
    s_lo, m_lo = bld.and_(u0, _c8(0x3F3F3F3F)), bld.and_(u1, _c8(0x3F3F3F3F))
    s_hi = bld.or_(bld.and_(u2, _c8(0x0F0F0F0F)),
                   bld.shl(bld.and_(bld.lshr(u0, _c8(6)), _c8(0x03030303)), _c8(4)))
    m_hi = bld.or_(bld.and_(bld.lshr(u2, _c8(4)), _c8(0x0F0F0F0F)),
                   bld.shl(bld.and_(bld.lshr(u1, _c8(6)), _c8(0x03030303)), _c8(4)))
    side = ir.Constant(vec(I32, 16), [n + 8 * h for n in range(8) for h in range(2)])
    return (bld.bitcast(bld.shuffle_vector(s_lo, s_hi, side), vec(I8, 64)),
            bld.bitcast(bld.shuffle_vector(m_lo, m_hi, side), vec(I8, 64)))


def isums_q4k(g: VectorIR, blk, acts: list, starts: list, j: int) -> list:  # noqa: ANN001, ARG001
    """Per activation row (``acts[a](value)``: its 8 bytes from there, broadcast), its one
    <16 x i32> (``j`` 0): lane 4L + 2 odd + t, weight row 2L + t's scaled integer dot of
    the block's even (odd = 0) or odd spans (``starts``: none, the values are unsigned)."""
    bld = g.b
    sz = load(g, blk, L4.scales, vec(I8, 64))
    isums = [None] * len(acts)
    for p in range(4):
        idx = ir.Constant(vec(I32, 32), scale_index(8, 2 * p, 2 * p + 1))
        sc = bld.zext(bld.shuffle_vector(sz, sz, idx), vec(I16, 32))
        even, odd = [_ZERO16] * len(acts), [_ZERO16] * len(acts)
        for q in range(4):  # each row's two words: 16 values of one group (< 2**15)
            we = load(g, blk, 64 * (8 * p + q), vec(I8, 64))
            wo = load(g, blk, 64 * (8 * p + 4 + q), vec(I8, 64))
            for a, act in enumerate(acts):
                even[a] = dpbusd(g, even[a], we, act(64 * p + 8 * q))
                odd[a] = dpbusd(g, odd[a], wo, act(64 * p + 32 + 8 * q))
        for a in range(len(acts)):
            isums[a] = g.pack_madd(even[a], odd[a], sc, isums[a])
    return isums


def offset_k4(g: VectorIR, blk, act, b, dab, term, lay: Layout = L4) -> ir.Value:  # noqa: ANN001, PLR0913
    """Q4_K's (``lay`` L4) or Q5_K's (L5) mins' term of block ``b`` for one activation row:
    ``term - (d_act * dmin) * sum(min * 32-sum)`` over the 8 weight rows (``_mins_term``
    over the row's 32-value sums, 8 words a block)."""
    return _mins_term(g, blk, act, b, dab, term, lay, 2)


def _mins_term(g: VectorIR, blk, act, b, dab, term, lay: Layout, vectors: int) -> ir.Value:  # noqa: ANN001, PLR0913
    """``term - (d_act * dmin) * msum`` over the 8 weight rows, msum the mins times the
    activation row's sums (``act.sums``, 4 ``vectors`` words a block), an exact integer
    (``vpdpwssd`` of the mins' words at ``lay.extra + 32`` and the sums as words, 4 at a
    time broadcast): the float sum of the other paths, which is exact too."""
    bld = g.b
    acc = None
    for k in range(vectors):
        x = bld.load(ptr(g, act.sums, bld.add(bld.mul(b, g.c64(8 * vectors)), g.c64(8 * k)),
                         ir.IntType(64)), align=1)
        x = bld.insert_element(ir.Constant(vec(ir.IntType(64), 8), ir.Undefined), x,
                               ir.Constant(I32, 0))
        x = bld.shuffle_vector(x, x, ir.Constant(vec(I32, 8), [0] * 8))
        mins = load(g, blk, lay.extra + 32 + 64 * k, vec(I16, 32))
        acc = g.dpwssd512(acc, mins, bld.bitcast(x, vec(I16, 32)))
    lanes = [bld.shuffle_vector(acc, acc, ir.Constant(vec(I32, 8), list(range(e, 16, 2))))
             for e in range(2)]
    msum = bld.sitofp(bld.add(*lanes), vec(F32, 8))
    scale = bld.fmul(splat(g, dab, 8), load(g, blk, lay.extra, vec(F32, 8)))
    return bld.fsub(term, bld.fmul(scale, msum))


# -- Q5_K ----------------------------------------------------------------------------------

def pack_q5k(g: VectorIR, rows: list, off, out) -> None:  # noqa: ANN001
    """Q5_K block at ``off`` of the 8 rows into the buffer block ``out``: value 64p + l is
    Q4_K's with bit 2p of ``qh[l]`` as its fifth, 64p + 32 + l with bit 2p + 1; the scales
    per span as <16 x i32> (dword 2n + e row n's), the mins, d and dmin as Q4_K's."""
    bld = g.b
    _pack_k4_values(g, rows, off, _F5, out)
    sz, mz = _k_scales8(g, rows, bld.add(off, g.c64(_F5["scales"].offset)))
    sz32 = bld.zext(sz, vec(I32, 64))
    for s in range(8):  # dword 2n + e: row n's scale s
        store(g, bld.shuffle_vector(sz32, sz32, ir.Constant(vec(I32, 16), [
            8 * (i // 2) + s for i in range(16)])), out, L5.scales + 64 * s)
    _pack_k4_mins(g, rows, off, _F5, mz, out, L5)


def isums_q5k(g: VectorIR, blks: list, acts: list, starts: list, j: int) -> list:  # noqa: ARG001
    """Per buffered block, per activation row, its one <16 x i32> (``j`` 0,
    ``one_lane_isums``): the unsigned values times the activations, no starts."""
    return one_lane_isums(g, blks, acts, [_ZERO16] * len(blks), L5.scales, True)


# -- Q6_K ----------------------------------------------------------------------------------

def pack_q6k(g: VectorIR, rows: list, off, out, starts: bool = True) -> None:  # noqa: ANN001
    """Q6_K block at ``off`` of the 8 rows into the buffer block ``out``, the values with
    their 32 taken off (signed). Per 128 values h: value 128h + 32c + l is nibble c // 2 of
    ``ql[64h + 32 (c % 2) + l]`` with bits 2c, 2c + 1 of ``qh[32h + l]`` above it. The
    lane starts too, unless not ``starts`` (the 256-bit variant's, ``gemm_ymm``)."""
    bld = g.b
    ql, qh = _F6["ql"].offset, _F6["qh"].offset
    for h in range(2):
        lows = [qwords(g, rows, bld.add(off, g.c64(ql + 64 * h + 32 * m))) for m in range(2)]
        highs = qwords(g, rows, bld.add(off, g.c64(qh + 32 * h)))
        for c in range(4):
            for j in range(4):
                lo = bld.and_(bld.lshr(lows[c % 2][j], g.splat8(4 * (c // 2), 64)),
                              g.splat8(15, 64))
                hi = bld.shl(bld.and_(bld.lshr(highs[j], g.splat8(2 * c, 64)), g.splat8(3, 64)),
                             g.splat8(4, 64))
                store(g, bld.sub(bld.or_(lo, hi), g.splat8(32, 64)), out,
                      64 * (16 * h + 4 * c + j))
    for n, r in enumerate(rows):
        store(g, g.vload(r, bld.add(off, g.c64(_F6["scales"].offset)), 16), out,
              L6.scales + 16 * n)
    pack_d(g, rows, off, _F6["d"].offset, out, L6.d)
    if starts:
        pack_starts(g, out, isums_q6k, 1, L6.extra)


def _scales16(g: VectorIR, blk, at: int) -> ir.Value:  # noqa: ANN001
    """<128 x i8>: the 8 rows' 16 scales at ``at`` of the buffer block, [row][group]."""
    return cat(g, load(g, blk, at, vec(I8, 64)), load(g, blk, at + 64, vec(I8, 64)))


def isums_q6k(g: VectorIR, blk, acts: list, starts: list, j: int) -> list:  # noqa: ANN001, ARG001
    """``isums_q4k`` for Q6_K, each row's lanes from ``starts[0]``: the activations plus
    128 (unsigned) times the signed values; each result holds 4 values (< 2**15), so the
    scales apply per two."""
    bld = g.b
    sz = _scales16(g, blk, L6.scales)
    isums = [starts[0]] * len(acts)
    for p in range(4):
        for half in range(2):  # 16-value groups 4p + half (even span), 4p + 2 + half (odd)
            idx = ir.Constant(vec(I32, 32), scale_index(16, 4 * p + half, 4 * p + 2 + half))
            sc = bld.sext(bld.shuffle_vector(sz, sz, idx), vec(I16, 32))
            for q in (2 * half, 2 * half + 1):
                we = load(g, blk, 64 * (8 * p + q), vec(I8, 64))
                wo = load(g, blk, 64 * (8 * p + 4 + q), vec(I8, 64))
                for a, act in enumerate(acts):
                    even = dpbusd(g, _ZERO16, act(64 * p + 8 * q), we)
                    odd = dpbusd(g, _ZERO16, act(64 * p + 32 + 8 * q), wo)
                    isums[a] = g.pack_madd(even, odd, sc, isums[a])
    return isums


# -- Q3_K and Q2_K: 2-bit planes, 16-value groups, the tiles' 8 lanes ----------------------
#
# A value times its 16-value group's scale fits a byte (Q3_K's negated: -(q sc) in
# [-128, 124]; Q2_K's q sc in [0, 45]), so the buffer holds the scaled values and each
# lane's 4-value dots accumulate over the block's four 64-value pairs in one register
# (one ``vpdpbusd`` per 8 values of the 8 rows, no scale step); the two dwords of a row
# that make one tile lane are added once per block. The lanes are the same integers.

def _row_scales(grp: int) -> ir.Constant:
    """Shuffle indexes: row n's scale of group ``grp`` in bytes 8n..8n+7 ([row][group])."""
    return ir.Constant(vec(I32, 64), [16 * (i // 8) + grp for i in range(64)])


def _pack_2bit(g: VectorIR, rows: list, off, out, field: int, scales, top=None) -> None:  # noqa: ANN001, PLR0913
    """The 256 values of a Q2_K/Q3_K block at ``off`` of the 8 rows into the buffer, each
    times its group's scale (``scales`` <128 x i8> [row][group]): per 128 values h, value
    128h + 32c + l is bits 2c, 2c + 1 of byte 32h + l of the plane at ``field``;
    ``top(h, c, j)`` (Q3_K) gives what to OR in and subtract for values 128h + 32c + 8j..
    of the 8 rows (<64 x i8>, or None)."""
    bld = g.b
    for h in range(2):
        lows = qwords(g, rows, bld.add(off, g.c64(field + 32 * h)))
        for c in range(4):
            for j in range(4):
                v = bld.and_(bld.lshr(lows[j], g.splat8(2 * c, 64)), g.splat8(3, 64))
                if top is not None:
                    hi, bias = top(h, c, j)
                    v = bld.sub(bld.or_(v, hi), bias)
                grp = 8 * h + 2 * c + j // 2
                sc = bld.shuffle_vector(scales, scales, _row_scales(grp))
                store(g, bld.mul(v, sc), out, 64 * (16 * h + 4 * c + j))


def pack_q3k(g: VectorIR, rows: list, off, out) -> None:  # noqa: ANN001
    """Q3_K block at ``off`` of the 8 rows into the buffer block ``out``: the 2-bit values
    with bit 4h + c of ``hmask[l]`` as their bit 2, minus 4 (signed), times minus their
    six-bit scale minus 32 (so in a byte); d negated (the lanes come negated); the lane
    starts."""
    bld = g.b
    hq = qwords(g, rows, bld.add(off, g.c64(_F3["hmask"].offset)))

    def top(h: int, c: int, j: int) -> tuple:
        bit = bld.and_(bld.lshr(hq[j], g.splat8(4 * h + c, 64)), g.splat8(1, 64))
        return bld.shl(bit, g.splat8(2, 64)), g.splat8(4, 64)

    at = bld.add(off, g.c64(_F3["scales"].offset))
    u0, u1, u2 = (row_values(g, rows, bld.add(at, g.c64(4 * k)), I32) for k in range(3))
    parts = [bld.or_(bld.and_(bld.lshr(u, _c8(4 * (i // 2))), _c8(0x0F0F0F0F)),
                     bld.shl(bld.and_(bld.lshr(u2, _c8(2 * i)), _c8(0x03030303)), _c8(4)))
             for i, u in enumerate((u0, u1, u0, u1))]  # int_weights._q3_scales, 8 rows
    sc = bld.shuffle_vector(cat(g, parts[0], parts[1]), cat(g, parts[2], parts[3]),
                            ir.Constant(vec(I32, 32), [n + 8 * i for n in range(8)
                                                       for i in range(4)]))
    neg = bld.sub(g.splat8(32, 128), bld.bitcast(sc, vec(I8, 128)))  # -(scale - 32)
    _pack_2bit(g, rows, off, out, _F3["qs"].offset, neg, top)
    pack_d(g, rows, off, _F3["d"].offset, out, L3.d)
    store(g, bld.fneg(load(g, out, L3.d, vec(F32, 8))), out, L3.d)
    pack_starts(g, out, isums_q3k, 4, L3.extra)


def pack_q2k(g: VectorIR, rows: list, off, out) -> None:  # noqa: ANN001
    """Q2_K block at ``off`` of the 8 rows into the buffer block ``out``: the 2-bit values
    times their nibble scales; d; dmin; the nibble mins as words, vector k holding in
    dword i row i // 2's mins of groups 4k + 2 (i % 2) and the next (``offset_q2k``)."""
    bld = g.b
    raw = [g.vload(r, bld.add(off, g.c64(_F2["scales"].offset)), 16) for r in rows]
    raw = cat(g, cat(g, cat(g, raw[0], raw[1]), cat(g, raw[2], raw[3])),
              cat(g, cat(g, raw[4], raw[5]), cat(g, raw[6], raw[7])))  # <128 x i8>
    _pack_2bit(g, rows, off, out, _F2["qs"].offset, bld.and_(raw, g.splat8(15, 128)))
    mins = bld.lshr(raw, g.splat8(4, 128))
    for k in range(4):
        idx = [16 * (i // 2) + 4 * k + 2 * (i % 2) + t for i in range(16) for t in range(2)]
        words = bld.zext(bld.shuffle_vector(mins, mins, ir.Constant(vec(I32, 32), idx)),
                         vec(I16, 32))
        store(g, words, out, L2.extra + 32 + 64 * k)
    pack_d(g, rows, off, _F2["d"].offset, out, L2.d)
    pack_d(g, rows, off, _F2["dmin"].offset, out, L2.extra)


# output dword 4L + 2e + t (``PAIRED``: weight row r = 2L + t, tile lane 2m + e) from the
# dwords 2r, 2r + 1 of accumulator e (indexes into the two side by side)
_HALVES = [ir.Constant(vec(I32, 16), [16 * ((o // 2) % 2) + 2 * (2 * (o // 4) + o % 2) + k
                                      for o in range(16)]) for k in range(2)]


def _isums_2bit(g: VectorIR, blk, acts: list, starts: list, m: int, signed: bool) -> list:  # noqa: ANN001, PLR0913
    """Per activation row, its <16 x i32> lane vector m: lane 4L + 2e + t, weight row 2L + t's
    tile lane c = 2m + e (values 64p + 8c.. of each 64-value pair p, times their 16-value
    group's scale, in the buffer's values), plus ``starts[m]`` (Q3_K: the negated scaled
    values times the activations plus 128, so the lanes come negated) or not (Q2_K: the
    unsigned scaled values times the activations)."""
    bld = g.b
    accs = [[_ZERO16, _ZERO16] for _ in acts]
    for p in range(4):
        for e in range(2):
            w = load(g, blk, 64 * (8 * p + 2 * m + e), vec(I8, 64))
            for a, act in enumerate(acts):
                x = act(64 * p + 16 * m + 8 * e)
                accs[a][e] = (dpbusd(g, accs[a][e], x, w) if signed else
                              dpbusd(g, accs[a][e], w, x))
    isums = []
    for a in range(len(acts)):
        lane = bld.add(*(bld.shuffle_vector(*accs[a], idx) for idx in _HALVES))
        isums.append(bld.add(lane, starts[m]) if starts else lane)
    return isums


def isums_q3k(g: VectorIR, blk, acts: list, starts: list, m: int) -> list:  # noqa: ANN001
    return _isums_2bit(g, blk, acts, starts, m, True)


def isums_q2k(g: VectorIR, blk, acts: list, starts: list, m: int) -> list:  # noqa: ANN001
    return _isums_2bit(g, blk, acts, starts, m, False)


def offset_q2k(g: VectorIR, blk, act, b, dab, term) -> ir.Value:  # noqa: ANN001
    """Q2_K's mins' term of block ``b`` for one activation row: ``term - (d_act * dmin) *
    sum(min * 16-sum)`` over the 8 weight rows (``_mins_term`` over the row's 16-value
    sums, 16 words a block)."""
    return _mins_term(g, blk, act, b, dab, term, L2, 4)
