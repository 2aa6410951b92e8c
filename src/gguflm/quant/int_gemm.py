"""Q4_K, Q6_K, Q8_0, Q5_0 and IQ4_NL weights times many activation rows: an interleaved
GEMM, 8 weight rows at a time.

A group of 8 weight rows is first unpacked into a buffer (``_pack``): per block, for
each 8 values of the block the 8 rows' values side by side (one 512-bit vector: row n in
bytes 8n..8n+7), and the rows' integer scales (Q4_K's mins), float scales and, for the
signed types, each lane's start (the activations come plus 128, unsigned). Then every
activation row runs over the buffer (``_make_gemm``): 8 bytes of the activation broadcast
to the 8 rows, one ``vpdpbusd`` per 8 values of all 8 weight rows. For the K-quants one
``packssdw`` + ``vpdpwssd`` per two such results applies the rows' integer scales; Q4_K's
values are small enough that the 32 values of a group sum in each row's two words first
(one scale step per 4 ``vpdpbusd``), Q6_K's take one per 2. The 32-value types have no
integer scales: each ``vpdpbusd`` result is two of ggml's lanes of 8 rows, converted and
added as its float steps do. The unpacking is done once for all the activation rows
instead of once per 8 (``int_tiles``' 1x8 tile).

The numbers are those of every other path of these types: for the K-quants
(``KernelType.parity_lanes``), per block, the scaled integer dot of the even and of the odd
32-value spans (exact integers), each its float lane ``+= float(isum) * (d * d_act)``;
Q4_K's mins' term ``-= (d_act * dmin) * sum(min * 32-sum)`` (exact integers in float); at
the end ``(even + odd) + offset term``. For the 32-value types ggml's 8 lanes (values
4j..4j+3 of each block) and its horizontal sum. So a row's product does not depend on
which path ran it (batch invariance). AVX512-VNNI only (``USABLE``); elsewhere the per-row
tiles run.
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from ..gguf.types import GGMLType
from . import jitcache  # noqa: F401 - stamps the cached kernels below (before any njit)
from .formats import FORMATS
from .kerneltypes import KERNEL_TYPES
from .vector_ir import F32, I8, I16, I32, I64, VNNI512, VectorIR, array_args, row_pointer, vec

USABLE = VNNI512
Q4_K, Q6_K, Q8_0, Q5_0, IQ4_NL = (int(GGMLType.Q4_K), int(GGMLType.Q6_K), int(GGMLType.Q8_0),
                                  int(GGMLType.Q5_0), int(GGMLType.IQ4_NL))
# the types it runs, where the declarations' numbers are its own: the K-quants' two lanes
# (``parity_lanes``), the 32-value types' ggml lanes (a constant tuple for numba)
GEMM_KINDS = tuple(t for t, parity in ((Q4_K, True), (Q6_K, True), (Q8_0, False),
                                       (Q5_0, False), (IQ4_NL, False))
                   if USABLE and GGMLType(t) in KERNEL_TYPES
                   and KERNEL_TYPES[GGMLType(t)].parity_lanes == parity) or (-1,)
GROUP = 8  # weight rows unpacked together
GEMM_MIN_ROWS = 8  # activation rows from which a product runs here
_ROWS_AT_ONCE = 4  # activation rows per pass over a block (they share the weight loads)


class _Layout(NamedTuple):
    """Where a block's parts lie in the buffer (byte offsets) and in the weights."""

    block_bytes: int
    type_size: int
    scales: int  # the rows' integer scales, bytes [row][group]
    d: int  # the rows' d, float [row]
    # Q4_K: dmin float [row] then mins float [group][row]; the signed types: <16 x i32>
    # lane starts
    extra: int


def _layout(t: GGMLType, scale_bytes: int, extra_bytes: int) -> _Layout:
    return _Layout(2048 + scale_bytes + 32 + extra_bytes, FORMATS[t].type_size, 2048,
                   2048 + scale_bytes, 2048 + scale_bytes + 32)


_L4 = _layout(GGMLType.Q4_K, 64, 32 + 256)
_L6 = _layout(GGMLType.Q6_K, 128, 64)
_F4, _F6 = FORMATS[GGMLType.Q4_K], FORMATS[GGMLType.Q6_K]


# -- IR helpers ----------------------------------------------------------------------------

def _ptr(g: VectorIR, base, off, t: ir.Type) -> ir.Value:  # noqa: ANN001
    return g.b.bitcast(g.at(base, off if isinstance(off, ir.Value) else g.c64(off)),
                       t.as_pointer())


def _cat(g: VectorIR, a, b) -> ir.Value:  # noqa: ANN001
    """Vectors ``a`` and ``b`` (of one type) side by side."""
    n = 2 * a.type.count
    return g.b.shuffle_vector(a, b, ir.Constant(vec(I32, n), list(range(n))))


def _qwords(g: VectorIR, rows: list, off) -> list:  # noqa: ANN001
    """Four <64 x i8>: vector j holds bytes 8j..8j+7 of the 32 at ``off`` of each of the 8
    rows (row n in bytes 8n..8n+7)."""
    bld = g.b
    q = [bld.load(_ptr(g, r, off, vec(I64, 4)), align=1) for r in rows]
    pairs = [_cat(g, q[2 * m], q[2 * m + 1]) for m in range(4)]
    out = []
    for j in range(4):
        idx = ir.Constant(vec(I32, 4), [j, 4 + j, 8 + j, 12 + j])
        v = _cat(g, bld.shuffle_vector(pairs[0], pairs[1], idx),
                 bld.shuffle_vector(pairs[2], pairs[3], idx))
        out.append(bld.bitcast(v, vec(I8, 64)))
    return out


def _bcast8(g: VectorIR, ptr, off) -> ir.Value:  # noqa: ANN001
    """<64 x i8>: the 8 bytes at ``ptr + off``, 8 times."""
    bld = g.b
    x = bld.load(_ptr(g, ptr, off, I64), align=1)
    v = bld.insert_element(ir.Constant(vec(I64, 8), ir.Undefined), x, ir.Constant(I32, 0))
    v = bld.shuffle_vector(v, v, ir.Constant(vec(I32, 8), [0] * 8))
    return bld.bitcast(v, vec(I8, 64))


def _bcast_at(g: VectorIR, ptr, base, v: int) -> ir.Value:  # noqa: ANN001
    """``_bcast8`` at byte ``base + v``: an activation row's 8 values from value v of a block."""
    return _bcast8(g, ptr, g.b.add(base, g.c64(v)))


def _dpbusd(g: VectorIR, acc, u8, s8) -> ir.Value:  # noqa: ANN001
    v32 = vec(I32, 16)
    return g.call("llvm.x86.avx512.vpdpbusd.512", v32,
                  [acc, g.b.bitcast(u8, v32), g.b.bitcast(s8, v32)])


def _splat(g: VectorIR, x, n: int) -> ir.Value:  # noqa: ANN001
    v = g.b.insert_element(ir.Constant(vec(F32, n), ir.Undefined), x, ir.Constant(I32, 0))
    return g.b.shuffle_vector(v, v, ir.Constant(vec(I32, n), [0] * n))


def _store(g: VectorIR, v, base, off: int) -> None:  # noqa: ANN001
    g.b.store(v, _ptr(g, base, off, v.type), align=1)


def _load(g: VectorIR, base, off: int, t: ir.Type) -> ir.Value:  # noqa: ANN001
    return g.b.load(_ptr(g, base, off, t), align=1)


def _pack_d(g: VectorIR, rows: list, off, field: int, out, at: int) -> None:  # noqa: ANN001
    """The 8 rows' fp16 at byte ``field`` of the block at ``off``, as <8 x float> at ``at``."""
    v = ir.Constant(vec(F32, 8), [0.0] * 8)
    for n, r in enumerate(rows):
        v = g.b.insert_element(v, g.f16(r, g.b.add(off, g.c64(field))), ir.Constant(I32, n))
    _store(g, v, out, at)


# pack_madd's scale words: in 128-bit lane L (weight rows 2L, 2L + 1), each row's two words
# of the even span's group, then of the odd span's; from the buffer's [row][group] bytes
def _scale_index(groups: int, even: int, odd: int) -> list[int]:
    return [groups * (2 * (i // 8) + (i // 2) % 2) + (odd if i % 8 >= 4 else even)
            for i in range(32)]


_EVEN = [0, 1, 4, 5, 8, 9, 12, 13]  # rows 0..7's even-span lanes (4L + t)
_ODD = [2, 3, 6, 7, 10, 11, 14, 15]  # and odd-span lanes (4L + 2 + t)


# -- Q4_K ----------------------------------------------------------------------------------

def _pack_q4k(g: VectorIR, rows: list, off, out) -> None:  # noqa: ANN001
    """Q4_K block at ``off`` of the 8 rows into the buffer block ``out``: value 64p + l is
    the low nibble of byte 32p + l of a row's ``qs``, 64p + 32 + l the high one."""
    bld = g.b
    for p in range(4):
        for j, v in enumerate(_qwords(g, rows, bld.add(off, g.c64(_F4["qs"].offset + 32 * p)))):
            _store(g, bld.and_(v, g.splat8(15, 64)), out, 64 * (8 * p + j))
            _store(g, bld.and_(bld.lshr(v, g.splat8(4, 64)), g.splat8(15, 64)), out,
                   64 * (8 * p + 4 + j))
    sz, mz = _k_scales8(g, rows, bld.add(off, g.c64(_F4["scales"].offset)))
    _store(g, sz, out, _L4.scales)
    mins = bld.shuffle_vector(mz, mz, ir.Constant(  # [group][row]
        vec(I32, 64), [8 * n + s for s in range(8) for n in range(8)]))
    _store(g, bld.uitofp(bld.zext(mins, vec(I32, 64)), vec(F32, 64)), out, _L4.extra + 32)
    _pack_d(g, rows, off, _F4["d"].offset, out, _L4.d)
    _pack_d(g, rows, off, _F4["dmin"].offset, out, _L4.extra)


def _k_scales8(g: VectorIR, rows: list, at) -> tuple[ir.Value, ir.Value]:  # noqa: ANN001
    """The 8 rows' six-bit scales and mins (ggml's get_scale_min_k4) from the 12 bytes at
    ``at`` of each row, as two <64 x i8>, [row][group]: ``int_blocks``' word-wide masks,
    for the 8 rows at once."""
    bld = g.b

    def words(k: int) -> ir.Value:  # word k of each row's 12 bytes
        v = ir.Constant(vec(I32, 8), ir.Undefined)
        for n, r in enumerate(rows):
            x = bld.load(_ptr(g, r, bld.add(at, g.c64(4 * k)), I32), align=1)
            v = bld.insert_element(v, x, ir.Constant(I32, n))
        return v

    def c(x: int) -> ir.Constant:
        return ir.Constant(vec(I32, 8), [x] * 8)

    u0, u1, u2 = words(0), words(1), words(2)
    s_lo, m_lo = bld.and_(u0, c(0x3F3F3F3F)), bld.and_(u1, c(0x3F3F3F3F))
    s_hi = bld.or_(bld.and_(u2, c(0x0F0F0F0F)),
                   bld.shl(bld.and_(bld.lshr(u0, c(6)), c(0x03030303)), c(4)))
    m_hi = bld.or_(bld.and_(bld.lshr(u2, c(4)), c(0x0F0F0F0F)),
                   bld.shl(bld.and_(bld.lshr(u1, c(6)), c(0x03030303)), c(4)))
    side = ir.Constant(vec(I32, 16), [n + 8 * h for n in range(8) for h in range(2)])
    return (bld.bitcast(bld.shuffle_vector(s_lo, s_hi, side), vec(I8, 64)),
            bld.bitcast(bld.shuffle_vector(m_lo, m_hi, side), vec(I8, 64)))


def _isums_q4k(g: VectorIR, blk, acts: list, starts: list) -> list:  # noqa: ANN001, ARG001
    """Per activation row (``acts[a](value)``: its 8 bytes from there, broadcast), one <16 x
    i32>: lane 4L + 2 odd + t, weight row 2L + t's scaled integer dot of the block's even
    (odd = 0) or odd spans (``starts``: none, the values are unsigned)."""
    bld = g.b
    zero = ir.Constant(vec(I32, 16), [0] * 16)
    sz = _load(g, blk, _L4.scales, vec(I8, 64))
    isums = [None] * len(acts)
    for p in range(4):
        idx = ir.Constant(vec(I32, 32), _scale_index(8, 2 * p, 2 * p + 1))
        sc = bld.zext(bld.shuffle_vector(sz, sz, idx), vec(I16, 32))
        even, odd = [zero] * len(acts), [zero] * len(acts)
        for j in range(4):  # each row's two words: 16 values of one group (< 2**15)
            we = _load(g, blk, 64 * (8 * p + j), vec(I8, 64))
            wo = _load(g, blk, 64 * (8 * p + 4 + j), vec(I8, 64))
            for a, act in enumerate(acts):
                even[a] = _dpbusd(g, even[a], we, act(64 * p + 8 * j))
                odd[a] = _dpbusd(g, odd[a], wo, act(64 * p + 32 + 8 * j))
        for a in range(len(acts)):
            isums[a] = g.pack_madd(even[a], odd[a], sc, isums[a])
    return [[v] for v in isums]


def _offset_q4k(g: VectorIR, blk, aux, b, dab, term) -> ir.Value:  # noqa: ANN001
    """Q4_K's mins' term of block ``b`` for one activation row: ``term - (d_act * dmin) *
    sum(min * 32-sum)`` over the 8 weight rows."""
    bld = g.b
    msum = None  # integers below 2**24 in float: exact in any order
    for s in range(8):
        mn = _load(g, blk, _L4.extra + 32 + 32 * s, vec(F32, 8))
        x = _splat(g, g.load_f32(aux, bld.add(bld.mul(b, g.c64(8)), g.c64(s))), 8)
        msum = bld.fmul(mn, x) if msum is None else g.call("llvm.fma.v8f32", vec(F32, 8),
                                                          [mn, x, msum])
    scale = bld.fmul(_splat(g, dab, 8), _load(g, blk, _L4.extra, vec(F32, 8)))
    return bld.fsub(term, bld.fmul(scale, msum))


# -- Q6_K ----------------------------------------------------------------------------------

def _pack_q6k(g: VectorIR, rows: list, off, out) -> None:  # noqa: ANN001
    """Q6_K block at ``off`` of the 8 rows into the buffer block ``out``, the values with
    their 32 taken off (signed). Per 128 values h: value 128h + 32c + l is nibble c // 2 of
    ``ql[64h + 32 (c % 2) + l]`` with bits 2c, 2c + 1 of ``qh[32h + l]`` above it."""
    bld = g.b
    ql, qh = _F6["ql"].offset, _F6["qh"].offset
    for h in range(2):
        lows = [_qwords(g, rows, bld.add(off, g.c64(ql + 64 * h + 32 * m))) for m in range(2)]
        highs = _qwords(g, rows, bld.add(off, g.c64(qh + 32 * h)))
        for c in range(4):
            for j in range(4):
                lo = bld.and_(bld.lshr(lows[c % 2][j], g.splat8(4 * (c // 2), 64)),
                              g.splat8(15, 64))
                hi = bld.shl(bld.and_(bld.lshr(highs[j], g.splat8(2 * c, 64)), g.splat8(3, 64)),
                             g.splat8(4, 64))
                _store(g, bld.sub(bld.or_(lo, hi), g.splat8(32, 64)), out,
                       64 * (16 * h + 4 * c + j))
    for n, r in enumerate(rows):
        _store(g, g.vload(r, bld.add(off, g.c64(_F6["scales"].offset)), 16), out,
               _L6.scales + 16 * n)
    _pack_d(g, rows, off, _F6["d"].offset, out, _L6.d)
    _pack_starts(g, out, _isums_q6k, 1, _L6.extra)


def _isums_q6k(g: VectorIR, blk, acts: list, starts: list) -> list:  # noqa: ANN001
    """``_isums_q4k`` for Q6_K, each row's lanes from ``starts[0]``: the activations plus
    128 (unsigned) times the signed values; each result holds 4 values (< 2**15), so the
    scales apply per two."""
    bld = g.b
    zero = ir.Constant(vec(I32, 16), [0] * 16)
    sz = _cat(g, _load(g, blk, _L6.scales, vec(I8, 64)), _load(g, blk, _L6.scales + 64,
                                                               vec(I8, 64)))
    isums = [starts[0]] * len(acts)
    for p in range(4):
        for half in range(2):  # 16-value groups 4p + half (even span), 4p + 2 + half (odd)
            idx = ir.Constant(vec(I32, 32), _scale_index(16, 4 * p + half, 4 * p + 2 + half))
            sc = bld.sext(bld.shuffle_vector(sz, sz, idx), vec(I16, 32))
            for j in (2 * half, 2 * half + 1):
                we = _load(g, blk, 64 * (8 * p + j), vec(I8, 64))
                wo = _load(g, blk, 64 * (8 * p + 4 + j), vec(I8, 64))
                for a, act in enumerate(acts):
                    even = _dpbusd(g, zero, act(64 * p + 8 * j), we)
                    odd = _dpbusd(g, zero, act(64 * p + 32 + 8 * j), wo)
                    isums[a] = g.pack_madd(even, odd, sc, isums[a])
    return [[v] for v in isums]


# -- Q8_0 ----------------------------------------------------------------------------------

def _pack_q80(g: VectorIR, rows: list, off, out) -> None:  # noqa: ANN001
    """Q8_0 block at ``off`` of the 8 rows into the buffer block ``out``, with each lane's
    start: -128 times the sum of the weights it multiplies (the activations come plus 128)."""
    bld = g.b
    ws = _qwords(g, rows, bld.add(off, g.c64(_F8["qs"].offset)))
    for j, v in enumerate(ws):
        _store(g, v, out, 64 * j)
    _pack_starts(g, out, _isums_q80, 4, _L8.extra)
    _pack_d(g, rows, off, _F8["d"].offset, out, _L8.d)


def _isums_q80(g: VectorIR, blk, acts: list, starts: list) -> list:  # noqa: ANN001
    """Per activation row, 4 <16 x i32>: vector j lane 2n + e, weight row n's integer dot
    of values 8j + 4e .. +3 (ggml's lane 2j + e of a 32-value block), from ``starts[j]``."""
    ws = [_load(g, blk, 64 * j, vec(I8, 64)) for j in range(4)]
    return [[_dpbusd(g, starts[j], act(8 * j), ws[j]) for j in range(4)] for act in acts]


def _pack_q50(g: VectorIR, rows: list, off, out) -> None:  # noqa: ANN001
    """Q5_0 block at ``off`` of the 8 rows into the buffer block ``out`` (as ``_pack_q80``),
    the values with their 16 taken off: value j < 16 is the low nibble of ``qs[j]``, value
    j + 16 its high nibble, bit 4 of value v bit v of ``qh``."""
    bld = g.b
    halves = _row_qwords(g, rows, bld.add(off, g.c64(_F5["qs"].offset)))
    qh = ir.Constant(vec(I32, 8), ir.Undefined)
    for n, r in enumerate(rows):
        word = bld.load(_ptr(g, r, bld.add(off, g.c64(_F5["qh"].offset)), I32), align=1)
        qh = bld.insert_element(qh, word, ir.Constant(I32, n))
    qh = bld.bitcast(qh, vec(I8, 32))
    bit = ir.Constant(vec(I8, 64), [1 << (i % 8) for i in range(64)])
    zero = g.splat8(0, 64)
    for j in range(4):  # values 8j..8j+7: byte j of each row's qh, one bit per value
        hb = bld.shuffle_vector(qh, qh, ir.Constant(vec(I32, 64),
                                                    [4 * (i // 8) + j for i in range(64)]))
        fifth = bld.select(bld.icmp_unsigned("!=", bld.and_(hb, bit), zero),
                           g.splat8(16, 64), zero)
        low = halves[j % 2] if j < 2 else bld.lshr(halves[j % 2], g.splat8(4, 64))
        v = bld.or_(bld.and_(low, g.splat8(15, 64)), fifth)
        _store(g, bld.sub(v, g.splat8(16, 64)), out, 64 * j)
    _pack_starts(g, out, _isums_q80, 4, _L8.extra)
    _pack_d(g, rows, off, _F5["d"].offset, out, _L8.d)


def _row_qwords(g: VectorIR, rows: list, off) -> list:  # noqa: ANN001
    """Two <64 x i8>: vector h holds bytes 8h..8h+7 of the 16 at ``off`` of each of the 8
    rows (row n in bytes 8n..8n+7)."""
    bld = g.b
    qs = [bld.load(_ptr(g, r, off, vec(I64, 2)), align=1) for r in rows]
    qs = [_cat(g, qs[2 * m], qs[2 * m + 1]) for m in range(4)]
    qs = _cat(g, _cat(g, qs[0], qs[1]), _cat(g, qs[2], qs[3]))  # <16 x i64>: row n, 2 qwords
    return [bld.bitcast(bld.shuffle_vector(qs, qs, ir.Constant(
        vec(I32, 8), [2 * n + h for n in range(8)])), vec(I8, 64)) for h in range(2)]


def _pack_iq4nl(g: VectorIR, rows: list, off, out) -> None:  # noqa: ANN001
    """IQ4_NL block at ``off`` of the 8 rows into the buffer block ``out`` (as
    ``_pack_q80``): value j < 16 is ``kvalues_iq4nl`` at the low nibble of ``qs[j]``,
    value j + 16 at its high nibble, looked up 64 at a time (``vpshufb``, the 16 entries
    in each 128-bit lane)."""
    bld = g.b
    halves = _row_qwords(g, rows, bld.add(off, g.c64(_FN["qs"].offset)))
    table = ir.Constant(vec(I8, 64), list(KERNEL_TYPES[GGMLType.IQ4_NL].table) * 4)
    for j in range(4):  # values 8j..8j+7: low nibbles for j < 2, then high ones
        low = halves[j % 2] if j < 2 else bld.lshr(halves[j % 2], g.splat8(4, 64))
        idx = bld.and_(low, g.splat8(15, 64))
        _store(g, g.call("llvm.x86.avx512.pshuf.b.512", vec(I8, 64), [table, idx]), out,
               64 * j)
    _pack_starts(g, out, _isums_q80, 4, _L8.extra)
    _pack_d(g, rows, off, _FN["d"].offset, out, _L8.d)


def _pack_starts(g: VectorIR, out, isums, count: int, at: int) -> None:  # noqa: ANN001
    """The signed types' lane starts, ``count`` <16 x i32> at ``at`` of the buffer block
    ``out``: the activations come plus 128 (unsigned), so each lane starts from -128 times
    the sum its weights make, the same steps (``isums``) with every activation byte 1."""
    ones = g.splat8(1, 64)
    zero = ir.Constant(vec(I32, 16), [0] * 16)
    for j, v in enumerate(isums(g, out, [lambda _v: ones], [zero] * count)[0]):
        _store(g, g.b.mul(v, ir.Constant(vec(I32, 16), [-128] * 16)), out, at + 64 * j)


# -- the kernels -----------------------------------------------------------------------------

class _Spec(NamedTuple):
    """How the GEMM runs one weight type."""

    layout: _Layout
    pack: object  # (g, rows, off, out): one block of 8 rows into the buffer
    isums: object  # (g, blk, acts, start) -> per activation row, its <16 x i32> lanes
    values: int  # values per block
    starts: int  # <16 x i32> lane starts per block in the buffer's ``extra`` (0: none)
    d16: list[int]  # weight row of float lane i
    even: list[int]  # rows 0..7's even lanes, then odd lanes, of the summed float lanes
    odd: list[int]
    offset: object = None  # (g, blk, aux, b, dab, term) -> term: an offset term (Q4_K's)


_F8, _F5, _FN = FORMATS[GGMLType.Q8_0], FORMATS[GGMLType.Q5_0], FORMATS[GGMLType.IQ4_NL]
_L8 = _Layout(544, _F8.type_size, 256, 512, 256)
_PAIRED = ([2 * (i // 4) + i % 2 for i in range(16)], _EVEN, _ODD)  # pack_madd's lanes
_PLAIN = ([i // 2 for i in range(16)], list(range(0, 16, 2)), list(range(1, 16, 2)))
_TYPES = {Q4_K: _Spec(_L4, _pack_q4k, _isums_q4k, 256, 0, *_PAIRED, _offset_q4k),
          Q6_K: _Spec(_L6, _pack_q6k, _isums_q6k, 256, 1, *_PAIRED),
          Q8_0: _Spec(_L8, _pack_q80, _isums_q80, 32, 4, *_PLAIN),
          Q5_0: _Spec(_L8._replace(type_size=_F5.type_size), _pack_q50, _isums_q80, 32, 4,
                      *_PLAIN),
          IQ4_NL: _Spec(_L8._replace(type_size=_FN.type_size), _pack_iq4nl, _isums_q80, 32, 4,
                        *_PLAIN)}


def _switch(g: VectorIR, kind, emit) -> None:  # noqa: ANN001
    """``emit(spec)`` for the type ``kind`` (an i64) names, one IR case per type of
    ``_TYPES``; an id without one does nothing (``gemm_rows`` takes only GEMM_KINDS)."""
    bld = g.b
    done = bld.append_basic_block("gemm.done")
    sw = bld.switch(kind, done)
    for t, spec in _TYPES.items():
        case = bld.append_basic_block(f"gemm.{t}")
        sw.add_case(ir.Constant(I64, t), case)
        bld.position_at_end(case)
        emit(spec)
        bld.branch(done)
    bld.position_at_end(done)


@intrinsic
def _pack(typingctx, kind, w, r0, tbl, buf):  # noqa: ANN001, ANN202, ARG001
    """``_pack(kind, w (R, row_bytes) u8, r0, tbl, buf (nb, block_bytes) u8)``: weight rows
    r0..r0+7 of ``w`` (of type ``kind``) into ``buf``, every block."""
    sig = types.int64(kind, w, r0, tbl, buf)

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        kind_, ws, r0_, tbls, bufs = array_args(context, builder, signature, args)
        g = VectorIR(builder, tbls.data)
        rows = [row_pointer(builder, ws, builder.add(r0_, g.c64(n)), I8) for n in range(GROUP)]
        nb = cgutils.unpack_tuple(builder, bufs.shape)[0]

        def emit(spec: _Spec) -> None:
            with cgutils.for_range(builder, nb) as loop:
                spec.pack(g, rows, builder.mul(loop.index, g.c64(spec.layout.type_size)),
                          row_pointer(builder, bufs, loop.index, I8))

        _switch(g, kind_, emit)
        return context.get_constant(types.int64, 0)

    return sig, codegen


def _block_starts(g: VectorIR, spec: _Spec, blk) -> list:  # noqa: ANN001
    """The block's lane starts ``spec.isums`` takes (<16 x i32> each; none for Q4_K)."""
    return [_load(g, blk, spec.layout.extra + 64 * j, vec(I32, 16))
            for j in range(spec.starts)]


def _row_sums(g: VectorIR, spec: _Spec, accs: list, term) -> ir.Value:  # noqa: ANN001
    """<8 x float>: the 8 weight rows' results from one activation row's float lanes, in
    ggml's horizontal-sum order (vectors i and i + half first, then the even and odd
    lanes), plus the offset term."""
    bld = g.b
    vs = [bld.load(x) for x in accs]
    while len(vs) > 1:
        half = len(vs) // 2
        vs = [bld.fadd(vs[i], vs[i + half]) for i in range(half)]
    lanes = [bld.shuffle_vector(vs[0], vs[0], ir.Constant(vec(I32, 8), x))
             for x in (spec.even, spec.odd)]
    return bld.fadd(bld.fadd(*lanes), term)


def _emit_gemm(g: VectorIR, spec: _Spec, bufs, qas, das, auxs, i0, outs, c0,  # noqa: ANN001, PLR0913
               na: int) -> None:
    """``_make_gemm``'s loop over the blocks for one weight type."""
    bld = g.b
    ii = [bld.add(i0, g.c64(a)) for a in range(na)]
    qp = [row_pointer(bld, qas, i, I8) for i in ii]
    dp = [row_pointer(bld, das, i, F32) for i in ii]
    xp = [row_pointer(bld, auxs, i, F32) for i in ii]
    zero = ir.Constant(vec(F32, 16), [0.0] * 16)
    facc = [[cgutils.alloca_once_value(bld, zero) for _ in range(max(1, spec.starts))]
            for _ in range(na)]
    term = [cgutils.alloca_once_value(bld, ir.Constant(vec(F32, 8), [0.0] * 8))
            for _ in range(na)]
    with cgutils.for_range(bld, cgutils.unpack_tuple(bld, bufs.shape)[0]) as loop:
        b = loop.index
        blk = row_pointer(bld, bufs, b, I8)
        base = bld.mul(b, g.c64(spec.values))
        acts = [partial(_bcast_at, g, q, base) for q in qp]
        isums = spec.isums(g, blk, acts, _block_starts(g, spec, blk))
        dw8 = _load(g, blk, spec.layout.d, vec(F32, 8))
        dw16 = bld.shuffle_vector(dw8, dw8, ir.Constant(vec(I32, 16), spec.d16))
        for a in range(na):
            dab = g.load_f32(dp[a], b)
            dd = bld.fmul(dw16, _splat(g, dab, 16))  # d * d_act, as every path
            for v, acc in zip(isums[a], facc[a], strict=True):
                f = bld.sitofp(v, vec(F32, 16))
                bld.store(g.call("llvm.fma.v16f32", vec(F32, 16), [f, dd, bld.load(acc)]),
                          acc)
            if spec.offset is not None:
                bld.store(spec.offset(g, blk, xp[a], b, dab, bld.load(term[a])), term[a])
    for a in range(na):
        res = _row_sums(g, spec, facc[a], bld.load(term[a]))
        for n in range(GROUP):
            g.store_2d(outs, ii[a], bld.add(c0, g.c64(n)),
                       bld.extract_element(res, ir.Constant(I32, n)))


def _make_gemm(na: int):  # noqa: ANN202 - a numba intrinsic
    """Intrinsic ``gemm(kind, buf, qa, da, aux, i0, out, c0)``: ``out[i0 + a, c0 + n]`` for
    ``a < na``, ``n < 8``: the buffered weight rows of type ``kind`` (``_pack``) times
    activation rows ``qa`` (Q8_K or Q8_0; for Q6_K, Q8_0, Q5_0, IQ4_NL the bytes plus 128,
    ``ActivationSet.qu``)."""

    @intrinsic
    def gemm(typingctx, kind, buf, qa, da, aux, i0, out, c0):  # noqa: ANN001, ANN202, ARG001, PLR0913
        sig = types.int64(kind, buf, qa, da, aux, i0, out, c0)

        def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
            kind_, *arrays = array_args(context, builder, signature, args)
            g = VectorIR(builder, None)
            _switch(g, kind_, lambda spec: _emit_gemm(g, spec, *arrays, na))
            return context.get_constant(types.int64, 0)

        return sig, codegen

    return gemm


_gemm_n, _gemm_1 = _make_gemm(_ROWS_AT_ONCE), _make_gemm(1)
# each type's buffer block and weight block, by type id (constant arrays for numba)
_BLOCK_BYTES = np.zeros(64, np.int64)
_TYPE_SIZE = np.ones(64, np.int64)
for _t, _spec in _TYPES.items():
    _BLOCK_BYTES[_t], _TYPE_SIZE[_t] = _spec.layout.block_bytes, _spec.layout.type_size


@njit(cache=True, nogil=True)
def gemm_rows(kind, w, r0, r1, qa, da, aux, qu, tbl, out):  # noqa: ANN001, ANN201
    """The hot loop. Weight rows r0:r1 of ``w`` (R, row_bytes) u8 of type ``kind`` (one of
    GEMM_KINDS) @ activations (n, K) of its type (Q6_K, Q8_0, Q5_0, IQ4_NL: ``qu``, the bytes plus
    128) -> out[:, r0:r1] (n, R) f32, in groups of 8 rows; returns the first row of the
    last 1-7 it leaves to the caller (r0 when it runs none: ``qu`` without rows)."""
    n = qa.shape[0]
    acts = qa if kind == Q4_K else qu
    if acts.shape[0] != n:
        return r0
    buf = np.empty((w.shape[1] // _TYPE_SIZE[kind], _BLOCK_BYTES[kind]), np.uint8)
    c = r0
    while c + GROUP <= r1:
        _pack(kind, w, c, tbl, buf)
        i = 0
        while i + _ROWS_AT_ONCE <= n:
            _gemm_n(kind, buf, acts, da, aux, i, out, c)
            i += _ROWS_AT_ONCE
        while i < n:
            _gemm_1(kind, buf, acts, da, aux, i, out, c)
            i += 1
        c += GROUP
    return c
