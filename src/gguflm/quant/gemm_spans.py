"""The types with ggml's 8 lanes in the interleaved GEMM (``int_gemm``): Q8_0, Q4_0, Q5_0,
IQ4_NL (a 32-value block each); and IQ4_XS (256 values in 32-value spans, each with its
integer scale), whose block is one lane (``KernelType.block_lane``). Lane j of a span sums
values 4j..4j+3; a ``vpdpbusd`` of 8 values of the 8 rows is two such lanes of each row.
Each type: how a block of 8 rows goes into the buffer (``pack_*``), and the
per-activation-row integer lanes of a buffered block (``isums_*``). The values are signed:
the activations come plus 128, and each lane starts from -128 times its weights' (scaled)
sum (``gemm_ir.pack_starts``); the 256-bit GEMM (``gemm_ymm``) packs the 32-value types
without the starts and takes the activations as they are.
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
    qwords,
    row_qwords,
    row_values,
    store,
)
from .kerneltypes import KERNEL_TYPES
from .vector_ir import I8, I16, I32, WIDE, VectorIR, vec

_F8, _F4, _F5 = FORMATS[GGMLType.Q8_0], FORMATS[GGMLType.Q4_0], FORMATS[GGMLType.Q5_0]
_FN, _FX = FORMATS[GGMLType.IQ4_NL], FORMATS[GGMLType.IQ4_XS]
L8 = Layout(576, _F8.type_size, 256, 512, 256)  # no scales: the starts at 256, d at 512
L4 = L8._replace(type_size=_F4.type_size)
L5 = L8._replace(type_size=_F5.type_size)
LN = L8._replace(type_size=_FN.type_size)
LX = layout(GGMLType.IQ4_XS, 8 * 64, 64)  # scales: <16 x i32> per span


def pack_q80(g: VectorIR, rows: list, off, out, starts: bool = True) -> None:  # noqa: ANN001
    """Q8_0 block at ``off`` of the 8 rows into the buffer block ``out``, with each lane's
    start (``starts``; the 256-bit GEMM takes the signed activations, no starts)."""
    bld = g.b
    for j, v in enumerate(qwords(g, rows, bld.add(off, g.c64(_F8["qs"].offset)))):
        store(g, v, out, 64 * j)
    _finish_block(g, rows, off, _F8, out, starts)


def _finish_block(g: VectorIR, rows: list, off, f, out, starts: bool) -> None:  # noqa: ANN001
    """A 32-value block's lane starts (``starts``) and d (format ``f``), once its values
    are in the buffer block ``out``."""
    if starts:
        pack_starts(g, out, isums_q80, 4, L8.extra)
    pack_d(g, rows, off, f["d"].offset, out, L8.d)


def _nibbles(g: VectorIR, rows: list, at) -> list:  # noqa: ANN001
    """Four <64 x i8> of 0..15 from the 16 bytes at ``at`` of each of the 8 rows: vector j
    holds values 8j..8j+7 of each row (row n in bytes 8n..8n+7), value v < 16 the low
    nibble of byte v, value v + 16 its high nibble."""
    bld = g.b
    halves = row_qwords(g, rows, at)
    return [bld.and_(halves[j % 2] if j < 2 else bld.lshr(halves[j % 2], g.splat8(4, 64)),
                     g.splat8(15, 64)) for j in range(4)]


def isums_q80(g: VectorIR, blk, acts: list, starts: list, j: int) -> list:  # noqa: ANN001
    """Per activation row, its <16 x i32> lane vector j: lane 2n + e, weight row n's integer
    dot of values 8j + 4e .. +3 (ggml's lane 2j + e of a 32-value block), from
    ``starts[j]``."""
    w = load(g, blk, 64 * j, vec(I8, 64))
    return [dpbusd(g, starts[j], act(8 * j), w) for act in acts]


def pack_q40(g: VectorIR, rows: list, off, out, starts: bool = True) -> None:  # noqa: ANN001
    """Q4_0 block at ``off`` of the 8 rows into the buffer block ``out`` (as ``pack_q80``),
    the values with their 8 taken off: value j < 16 is the low nibble of ``qs[j]``, value
    j + 16 its high nibble."""
    bld = g.b
    for j, v in enumerate(_nibbles(g, rows, bld.add(off, g.c64(_F4["qs"].offset)))):
        store(g, bld.sub(v, g.splat8(8, 64)), out, 64 * j)
    _finish_block(g, rows, off, _F4, out, starts)


def pack_q50(g: VectorIR, rows: list, off, out, starts: bool = True) -> None:  # noqa: ANN001
    """Q5_0 block at ``off`` of the 8 rows into the buffer block ``out`` (as ``pack_q80``),
    the values with their 16 taken off: value j < 16 is the low nibble of ``qs[j]``, value
    j + 16 its high nibble, bit 4 of value v bit v of ``qh``."""
    bld = g.b
    nibbles = _nibbles(g, rows, bld.add(off, g.c64(_F5["qs"].offset)))
    qh = bld.bitcast(row_values(g, rows, bld.add(off, g.c64(_F5["qh"].offset)), I32),
                     vec(I8, 32))
    bit = ir.Constant(vec(I8, 64), [1 << (i % 8) for i in range(64)])
    zero = g.splat8(0, 64)
    for j in range(4):  # values 8j..8j+7: byte j of each row's qh, one bit per value
        hb = bld.shuffle_vector(qh, qh, ir.Constant(vec(I32, 64),
                                                    [4 * (i // 8) + j for i in range(64)]))
        fifth = bld.select(bld.icmp_unsigned("!=", bld.and_(hb, bit), zero),
                           g.splat8(16, 64), zero)
        store(g, bld.sub(bld.or_(nibbles[j], fifth), g.splat8(16, 64)), out, 64 * j)
    _finish_block(g, rows, off, _F5, out, starts)


def _iq4_values(g: VectorIR, t: GGMLType, rows: list, at, out, first: int) -> None:  # noqa: ANN001
    """32 values of 8 rows, 16 bytes of nibbles at ``at`` of each, into buffer vectors
    ``first``.. ``first + 3`` of ``out``: value j < 16 is type ``t``'s table at the low
    nibble of byte j, value j + 16 at its high nibble, looked up 64 at a time (``vpshufb``,
    the 16 entries in each 128-bit lane)."""
    table = ir.Constant(vec(I8, 64), list(KERNEL_TYPES[t].table) * 4)
    for j, idx in enumerate(_nibbles(g, rows, at)):
        store(g, _lookup(g, table, idx), out, 64 * (first + j))


def _lookup(g: VectorIR, table, idx) -> ir.Value:  # noqa: ANN001
    """<64 x i8> ``vpshufb`` of ``table`` (16 entries in each 128-bit lane) at ``idx``: one
    512-bit instruction with AVX-512, else two 256-bit ones."""
    if WIDE:
        return g.call("llvm.x86.avx512.pshuf.b.512", vec(I8, 64), [table, idx])
    bld, t32 = g.b, vec(I8, 32)
    half_table = ir.Constant(t32, table.constant[:32])  # the same 16 entries a lane
    lo, hi = (g.call("llvm.x86.avx2.pshuf.b", t32, [half_table, bld.shuffle_vector(
        idx, idx, ir.Constant(vec(I32, 32), list(range(32 * h, 32 * h + 32))))])
        for h in range(2))
    return cat(g, lo, hi)


def pack_iq4nl(g: VectorIR, rows: list, off, out, starts: bool = True) -> None:  # noqa: ANN001
    """IQ4_NL block at ``off`` of the 8 rows into the buffer block ``out`` (as
    ``pack_q80``)."""
    _iq4_values(g, GGMLType.IQ4_NL, rows, g.b.add(off, g.c64(_FN["qs"].offset)), out, 0)
    _finish_block(g, rows, off, _FN, out, starts)


def pack_iq4xs(g: VectorIR, rows: list, off, out) -> None:  # noqa: ANN001
    """IQ4_XS block at ``off`` of the 8 rows into the buffer block ``out``: span s's values
    as IQ4_NL's block (vectors 4s..4s+3); its scales (``int_weights._iq4xs_scales``: low 4
    bits nibble s % 2 of ``scales_l[s / 2]``, top 2 bits 2s, 2s + 1 of ``scales_h``; minus
    32) as <16 x i32>, dword i row i // 2's; d; the lane starts."""
    bld = g.b
    for s in range(8):
        at = bld.add(off, g.c64(_FX["qs"].offset + 16 * s))
        _iq4_values(g, GGMLType.IQ4_XS, rows, at, out, 4 * s)
    lo = row_values(g, rows, bld.add(off, g.c64(_FX["scales_l"].offset)), I32)
    hi = bld.zext(row_values(g, rows, bld.add(off, g.c64(_FX["scales_h"].offset)), I16),
                  vec(I32, 8))

    def c8(x: int) -> ir.Constant:
        return ir.Constant(vec(I32, 8), [x] * 8)

    spread = ir.Constant(vec(I32, 16), [i // 2 for i in range(16)])
    for s in range(8):
        low4 = bld.and_(bld.lshr(lo, c8(8 * (s // 2) + 4 * (s % 2))), c8(15))
        top2 = bld.shl(bld.and_(bld.lshr(hi, c8(2 * s)), c8(3)), c8(4))
        sc = bld.sub(bld.or_(low4, top2), c8(32))
        store(g, bld.shuffle_vector(sc, sc, spread), out, LX.scales + 64 * s)
    pack_d(g, rows, off, _FX["d"].offset, out, LX.d)
    pack_starts(g, out, lambda g, b, acts, st, j: isums_iq4xs(g, [b], acts, [st], j)[0], 1,
                LX.extra)


def isums_iq4xs(g: VectorIR, blks: list, acts: list, starts: list, j: int) -> list:  # noqa: ARG001
    """Per buffered block (``starts``: its lane starts), per activation row, its one
    <16 x i32> lane vector (``j`` 0, ``one_lane_isums``): the activations plus 128 times
    the signed values, from the lane starts (``vpmulld`` by the scales: a product of the
    activations plus 128 reaches 2**17, too wide for ``vpdpwssd``'s words)."""
    return one_lane_isums(g, blks, acts, [st[0] for st in starts], LX.scales, False)
