"""Integer tiles: weight rows of a ggml type times 8-bit activation rows, with the float
steps of ggml's x86 ``vec_dot``.

Each weight block is unpacked to small integers (``int_weights``) and multiplied with the
activation integers: an exact integer dot product per block in 8 lanes, converted and
fused into an 8-lane float accumulator times ``d_weight * d_activation``; at the end
ggml's horizontal sum. The types without integer scales have ggml's lanes (lane j sums
values 4j..4j+3 of each 32: ``pmaddubsw`` then ``pmaddwd``), and so does IQ4_XS, whose
values are too wide for anything else (each lane's pair sums times its 32 values' scale);
the K-quants their own, with one scale step per 8 values (``_scaled_dot``), which the
512-bit tiles take two activation rows at a time (but Q2_K, whose mins multiply the
activations' 16-value sums, worked out from the bytes in its block loop). IQ4_XS and Q5_K
(``KernelType.block_lane``) add each block's lanes into one (``_one_lane``) before its
float step: the interleaved GEMM's numbers, which keep one sum a block. Every tile shape
runs the same per-element sequence, so results are batch-invariant.

Decoding (one activation row) runs four weight rows at a time against it (``_emit_quad_loop``;
which four, ``WALKS``): for the types with parity lanes (Q4_K, Q6_K) the four rows' float
steps are one vector step each, Q4_K's four rows' scales, mins and ``d|dmin`` are unpacked
together one block ahead (``int_weights.quad_k_scales``) and its mins' term taken in
integers, and on AVX-512 both types' integer dots run in 512-bit steps
(``_wide_isums_k4``, ``_wide_isums_i8``): the same integers, so the same bits. A few
sequences decoded together (2-3 activation rows, or 5-7 over a big matrix) take those four
rows two activation rows at a time where the type has parity lanes, the weights unpacked
once for both (``_four_rows``).

Each weight type has its own compiled row kernel (``rows_kernel``): its block loop alone,
compiled the first time a model needs the type (``prepare``) and cached on disk. The
products' callers (``products``, the model's blocks and team) reach it through a table of
function addresses (``qmatmul_rows``), so their own machine code holds none of the block
loops: numba links a callee's code into every caller and optimizes it again there, and the
block loops of every type, linked into every caller, were most of a first run's compile
time.
"""

from __future__ import annotations

import ctypes
import threading
from typing import NamedTuple

import llvmlite.binding as llvm
import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from ..gguf.types import GGMLType
from . import jitcache  # noqa: F401 - stamps the cached kernels below (before any njit)
from .int_gemm import GEMM_KINDS, GEMM_MIN_ROWS, gemm_rows
from .int_weights import (
    QuadScales,
    block_scale,
    min_sums,
    min_sums_rows,
    quad_k_scales,
    quad_min_sums,
    quad_words,
    row_bias,
    scale_words,
    signed,
    unpack,
    vnni_offset,
    wide,
)
from .kerneltypes import KERNEL_TYPES, KernelType
from .vector_ir import (
    F32,
    I8,
    I16,
    I32,
    I64,
    SIMD,
    VNNI,
    WIDE,
    VectorIR,
    array_args,
    array_view,
    row_pointer,
    vec,
)

# Bytes ahead of the block in hand at which the tiles prefetch their weight row (and the
# next ones: a tile's rows lie one after another); the hardware's prefetchers alone left
# the tiles waiting on memory.
PREFETCH = 2048
SCALE_RUN = 64  # blocks whose scale products the tiles store before their block loop

ROW_CHUNK = 16  # weight rows per parallel work item (kept hot while all activations pass)
# Activation rows from which a product runs in tiles (1x8, 1x4) over ROW_CHUNK weight rows
# kept hot; fewer stream the weights as when decoding (four sequential streams, each weight
# row used by every activation row while in L1). From 4 rows tiles are faster, except for a
# matrix of STREAM_MIN_BYTES or more at 5-7 rows, whose 1-3 rows past the 1x4 tile would
# take slow 1x1 passes, while one stream per thread keeps up with memory.
BATCH_MIN_ROWS = 4
STREAM_MIN_BYTES = 16 << 20

_NO_BATCH8 = tuple(int(t) for t, k in KERNEL_TYPES.items() if not k.batch8) or (-1,)


class ActRow(NamedTuple):
    """Pointers to one activation row's arrays (``act_quant.ActivationSet``'s)."""

    qa: ir.Value  # i8 values
    da: ir.Value  # f32 block scales
    aux: ir.Value  # f32 Q8_1 block sums or Q8_K 32-sums
    cor: ir.Value  # i32 lane corrections (types with a vnni_offset)
    qu: ir.Value  # i8 values plus 128


class Lanes(NamedTuple):
    """The lanes tiles' extra pointers (one weight row, 4 or 8 activation rows)."""

    da8: ir.Value  # the rows' activation scales side by side (``_lanes8``)
    aux8: ir.Value  # their Q8_1 sums side by side
    acc: ir.Value  # <8 x float> accumulator of Q8_1's m * s_act, lane i row i's
    scratch: ir.Value  # room for SCALE_RUN blocks' 8 scale products


class Tile(NamedTuple):
    """What one tile's block loop accumulates into and reads."""

    rows: list  # weight row pointers
    acts: list[ActRow]
    acc: list  # acc[j][i]: <8 x float> accumulator of weight row j times activation row i
    acc_scalar: list  # acc_scalar[j][i]: float, the offset terms'
    lanes: Lanes | None
    # the wide block loop's <16 x float> accumulators, one per two activation rows
    # (``_emit_wide_block``), moved to ``acc`` after the loop
    pair_acc: list | None = None
    # the decoding tiles' (4 weight rows, 1 or 2 activation rows) accumulators for the
    # types with parity lanes (``_emit_quad_block``): per activation row, <8 x float> of
    # the rows' even and odd lanes side by side, and <4 x float> of their offset terms,
    # moved to ``acc`` and ``acc_scalar`` after the loop; then, for Q4_K, the next block's
    # ``QuadScales`` slots and the block count (``_next_quad_scales``), else None
    quad: tuple | None = None


def _emit_type_loop(g: VectorIR, k: KernelType, t: Tile, nb, shift: str = "") -> None:  # noqa: ANN001
    """The block loop of one weight type over ``nb`` blocks. Each weight block is unpacked
    once per row; each activation span is loaded once and used by every row. The float
    arithmetic is ggml's: ``(d_act * d) * isum``, ``+ m * s_act`` (Q8_1's block sum),
    ``- (d_act * dmin) * sum(min_s * activation 32-sum_s)``.

    With ``t.lanes`` ``d_act * d`` is one vector product for the 8 rows and Q8_1's
    ``m * s_act`` one vector product and sum, lane i doing row i's scalar steps in the same
    order: the same numbers, with 2 vector operations in place of 24 scalar ones per
    block."""
    bld = g.b
    if t.lanes is None and k.parity_lanes and len(t.rows) == 4 and len(t.acts) <= 2:
        _emit_quad_loop(g, k, t, nb, shift)
        return
    if t.lanes is None:
        with cgutils.for_range(bld, nb) as loop:
            _emit_block(g, k, t, loop.index, None, shift)
        if quad_words(k) and not k.parity_lanes:  # _scaled_dot's lanes, put in order once
            for p in (p for row_accs in t.acc for p in row_accs):
                bld.store(g.lanes(bld.load(p), _SCALED_ORDER), p)
        return
    # The scale products d * d_act of a run of blocks, 8 rows a block, are stored first;
    # the block loop then takes each row's with a broadcast load (a load port, no vector
    # ALU) rather than a shuffle out of a register. Two loops, so that LLVM cannot forward
    # the stores into shuffles again.
    assert len(t.rows) == 1, "the 8 stored scale products are one weight row's"
    if shift.startswith("wide"):
        zero16 = ir.Constant(vec(F32, 16), [0.0] * 16)
        t = t._replace(pair_acc=[cgutils.alloca_once_value(bld, zero16)
                                 for _ in range(len(t.acts) // 2)])
    with cgutils.for_range_slice(bld, g.c64(0), nb, g.c64(SCALE_RUN)) as (c0, _):
        run = bld.select(bld.icmp_signed("<", bld.sub(nb, c0), g.c64(SCALE_RUN)),
                         bld.sub(nb, c0), g.c64(SCALE_RUN))
        with cgutils.for_range(bld, run) as loop:
            b = bld.add(c0, loop.index)
            d = block_scale(g, k, t.rows[0], bld.mul(b, g.c64(k.type_size)))
            dd8 = bld.fmul(g.splatf8(d), g.load_v8(t.lanes.da8, b))
            slot = bld.gep(t.lanes.scratch, [bld.mul(loop.index, g.c64(8))])
            bld.store(dd8, bld.bitcast(slot, vec(F32, 8).as_pointer()), align=4)
        with cgutils.for_range(bld, run) as loop:
            slot = bld.gep(t.lanes.scratch, [bld.mul(loop.index, g.c64(8))])
            _emit_block(g, k, t, bld.add(c0, loop.index), slot, shift)
    if t.pair_acc is not None:  # each row's 8 lanes, in _scaled_dot's order
        zero16 = ir.Constant(vec(F32, 16), [0.0] * 16)
        for q, pa in enumerate(t.pair_acc):
            v = bld.load(pa)
            for r in range(2):
                order = [2 * r, 8 + 2 * r] + [16] * 6 if k.parity_lanes else _PAIR_LANES[r]
                bld.store(bld.shuffle_vector(v, zero16, ir.Constant(vec(I32, 8), order)),
                          t.acc[0][2 * q + r])
    if k.offset:  # the offset terms' lanes back to the rows' sums
        accv = bld.load(t.lanes.acc)
        for i in range(len(t.acts)):
            bld.store(bld.extract_element(accv, ir.Constant(I32, i)), t.acc_scalar[0][i])


def _emit_block(g: VectorIR, k: KernelType, t: Tile, b, dd, shift: str) -> None:  # noqa: ANN001
    """Block ``b`` of ``_emit_type_loop``; with ``t.lanes``, ``dd`` points to the block's 8
    stored scale products ``d * d_act``. ``shift`` (types with a ``vnni_offset``, on VNNI)
    skips the sign step with the same integers: "w" the weights plus their offset
    (``int_weights.unpack``), each lane's integer dot started from the activations' ``-offset
    * lane sum`` (``ActRow.cor``); "a" the activations plus 128, unsigned (``ActRow.qu``),
    times the signed weights, each lane started from ``-128 *`` the weights' lane sum, worked
    out once per weight block for all the activation rows (the tiles); "u" (``row_bias``,
    the tiles of one activation row) the weights with their bias left on, unsigned, each
    lane started from ``-bias *`` the activations' lane sum, worked out once per block for
    all the weight rows."""
    if shift.startswith("wide"):
        _emit_wide_block(g, k, t, b, dd, shift)
        return
    qk, ts = k.block_size, k.type_size
    bld = g.b
    _prefetch(g, k, t, b)
    quad = None  # the decoding tile's four rows' scales, unpacked together
    if t.quad is not None and k.scales == "k4":
        quad = _next_quad_scales(g, k, t, b)
    if t.quad is not None and _wide_quad(k):
        per_act = (_wide_isums_k4(g, k, t, b, quad) if quad is not None
                   else _wide_isums_i8(g, k, t, b))
        for i, isums in enumerate(per_act):
            _emit_quad_block(g, k, t, b, isums, g.load_f32(t.acts[i].da, b), quad, i)
        return
    blocks = [unpack(g, k, row, bld.mul(b, g.c64(ts)), shift in ("w", "u"),
                     scales=None if quad is None else quad.row(g, j))
              for j, row in enumerate(t.rows)]
    if t.lanes is None:
        dabs = [g.load_f32(a.da, b) for a in t.acts]
        da8 = None
    else:
        da8 = g.load_v8(t.lanes.da8, b)
        dabs = [bld.extract_element(da8, ir.Constant(I32, i)) for i in range(len(t.acts))]
    abase = bld.mul(b, g.c64(qk))
    a8 = [[g.vload(a.qu if shift == "a" else a.qa, bld.add(abase, g.c64(32 * s)), 32)
           for s in range(qk // 32)] for a in t.acts]
    cor = None
    if shift == "w":  # each span's 8 lanes of -offset * (sum of the lane's 4 activations)
        cbase = bld.mul(b, g.c64(qk // 4))
        cor = [[bld.load(bld.bitcast(g.at(a.cor, bld.add(cbase, g.c64(8 * s))),
                                     vec(I32, 8).as_pointer()), align=4)
                for s in range(qk // 32)] for a in t.acts]
    elif shift == "u":  # each span's 8 lanes of -bias * (sum of the lane's 4 activations)
        zero = ir.Constant(vec(I32, 8), [0] * 8)
        cor = [[bld.sub(zero, g.quad_sums(g.splat8(k.bias, 32), a)) for a in spans]
               for spans in a8]
    if t.quad is not None:  # the decoding tiles of a type with parity lanes
        assert shift in ("", "u"), shift
        for i in range(len(t.acts)):
            isums = [_scaled_dot(g, k, blk, a8[i], cor[i] if shift == "u" else None,
                                 raw=True) for blk in blocks]
            _emit_quad_block(g, k, t, b, isums, dabs[i], quad, i)
        return
    msums = None  # Q2_K: each activation row's min sums for all the weight rows at once
    if t.lanes is None and blocks[0].offset is not None and blocks[0].offset.kind == "dmin16":
        msums = [min_sums_rows(g, [blk.offset for blk in blocks], a.cor, b) for a in t.acts]
    for j, blk in enumerate(blocks):
        if shift == "a":  # each span's 8 lanes of -128 * (sum of the lane's 4 weights)
            zero = ir.Constant(vec(I32, 8), [0] * 8)
            cor = [bld.sub(zero, g.dpbusd(zero, g.splat8(-128, 32), sp.values))
                   for sp in blk.spans]
        for i, act in enumerate(t.acts):
            isum = _integer_dot(g, k, blk, a8[i], cor if shift == "a" else
                                (cor[i] if cor is not None else None), shift,
                                ordered=t.lanes is not None)
            _accumulate(g, t, j, i, act, b, blk, isum, dabs[i], dd,
                        None if msums is None else msums[i][j])
    if t.lanes is not None and k.offset:
        _lanes_offset(g, t, blocks[0].offset, b, da8)


def _emit_quad_loop(g: VectorIR, k: KernelType, t: Tile, nb, shift: str) -> None:  # noqa: ANN001
    """``_emit_type_loop`` of the decoding tiles (4 weight rows, 1 or 2 activation rows) for
    a type with parity lanes: each row's two float lanes (even and odd spans) and offset
    term are one lane of two shared vectors per activation row (``_emit_quad_block``), so
    a block's conversion, scale product, fused multiply-add and offset steps are one vector
    operation each for the four rows instead of one per row, each lane doing the row's
    steps of ``_accumulate``: the same numbers. The weights are unpacked once for both
    activation rows. After the loop each row's lanes go back to its accumulators."""
    bld = g.b
    na = len(t.acts)
    acc8 = [cgutils.alloca_once_value(bld, ir.Constant(vec(F32, 8), [0.0] * 8))
            for _ in range(na)]
    accs4 = [cgutils.alloca_once_value(bld, ir.Constant(vec(F32, 4), [0.0] * 4))
             for _ in range(na)]
    ahead = None
    if k.scales == "k4":  # block 0's scales, then each block unpacks the next one's
        first = quad_k_scales(g, k, t.rows, g.c64(0))
        ahead = (cgutils.alloca_once_value(bld, first.bytes),
                 cgutils.alloca_once_value(bld, first.dd), nb)
    t = t._replace(quad=(acc8, accs4, ahead))
    with cgutils.for_range(bld, nb) as loop:
        _emit_block(g, k, t, loop.index, None, shift)
    zero = ir.Constant(vec(F32, 8), [0.0] * 8)
    for i in range(na):
        accv, offs = bld.load(acc8[i]), bld.load(accs4[i])
        for j in range(4):  # [even, odd, 0, ...]: what _accumulate leaves, the same sums
            order = ir.Constant(vec(I32, 8), [2 * j, 2 * j + 1] + [8] * 6)
            bld.store(bld.shuffle_vector(accv, zero, order), t.acc[j][i])
            bld.store(bld.extract_element(offs, ir.Constant(I32, j)), t.acc_scalar[j][i])


def _next_quad_scales(g: VectorIR, k: KernelType, t: Tile, b) -> QuadScales:  # noqa: ANN001
    """Block ``b``'s four rows' scales (unpacked during block ``b - 1``), and block ``b +
    1``'s unpacked for the next step (the last block's again at the end: no read past the
    rows). Unpacked a block ahead, the scales' chain of loads and shifts runs beside the
    previous block's products instead of holding up this block's (the loop's body is too
    long for the core to reach the next one on its own)."""
    bld = g.b
    qb, qd, nb = t.quad[2]
    now = QuadScales(bld.load(qb), bld.load(qd))
    nxt = bld.add(b, g.c64(1))
    nxt = bld.select(bld.icmp_signed("<", nxt, nb), nxt, bld.sub(nb, g.c64(1)))
    ahead = quad_k_scales(g, k, t.rows, bld.mul(nxt, g.c64(k.type_size)))
    bld.store(ahead.bytes, qb)
    bld.store(ahead.dd, qd)
    return now


def _wide_quad(k: KernelType) -> bool:
    """Whether the decoding tile takes ``k`` 512 bits at a time, on AVX-512: Q4_K (one
    4-bit plane in runs of 32 bytes, 32-value scale groups and a mins' term:
    ``_wide_isums_k4``) and Q6_K (4 low bits in runs of 64 bytes and 2 high bits in runs of
    32, bias 32, signed 16-value scales: ``_wide_isums_i8``)."""
    if not (WIDE and k.parity_lanes):
        return False
    shapes = tuple((p.group, p.width, p.shift) for p in k.planes)
    if k.scales == "k4":
        return shapes == ((32, 4, 0),) and not k.bias and k.block_size // k.groups == 32
    return (k.scales == "i8" and shapes == ((64, 4, 0), (32, 2, 4)) and k.bias == 32
            and k.block_size // k.groups == 16 and bool(row_bias(k)))


def _wide_isums_k4(g: VectorIR, k: KernelType, t: Tile, b, quad: QuadScales) -> list:  # noqa: ANN001
    """Per activation row of the tile, the four rows' raw ``_scaled_dot`` lanes of block
    ``b`` of Q4_K in 512-bit steps: per row, each 64 bytes of nibbles in one load, their low
    nibbles spans 4h and 4h + 2, the high ones 4h + 1 and 4h + 3 (the activations arranged
    to match, once for the four rows); the two vectors' quad sums packed to words and
    multiplied by the scales in one ``pack_madd`` (in 128-bit lane L, words of the spans
    4h + 2 (L // 2) and + 1). Lanes 0, 1 of each 128 bits hold even spans' products and 2,
    3 odd ones', as ``_scaled_dot``'s raw 8 lanes do once the halves are added: exact
    integers, the same sums. Half the instructions of the 256-bit steps; the nibbles and
    scale words unpacked once for every activation row."""
    bld = g.b
    qk, off = k.block_size, bld.mul(b, g.c64(k.type_size))
    qs_at = bld.add(off, g.c64(k.format[k.planes[0].field].offset))
    abase = bld.mul(b, g.c64(qk))

    def act(a: ActRow, h: int, odd: int) -> ir.Value:  # spans 4h + odd and 4h + 2 + odd
        parts = [g.vload(a.qa, bld.add(abase, g.c64(32 * (4 * h + odd + 2 * x))), 32)
                 for x in (0, 1)]
        return bld.shuffle_vector(*parts, ir.Constant(vec(I32, 64), list(range(64))))

    acts = [[[act(a, h, odd) for odd in (0, 1)] for h in range(qk // 128)] for a in t.acts]
    isums = [[] for _ in t.acts]
    for j, row in enumerate(t.rows):
        # the row's scale bytes in every 128-bit lane, then one byte shuffle per 64 bytes
        # (a two-source byte permute from the four rows' vector was slower on Zen 4)
        mine = g.lanes(quad.bytes, [16 * j + i for i in range(16)] * 4)
        sums = [None] * len(t.acts)
        for h in range(qk // 128):
            q = g.vload(row, bld.add(qs_at, g.c64(64 * h)), 64)
            lo = bld.and_(q, g.splat8(15, 64))
            hi = g.byte_bits(q, 4, 4)
            # lane L's words: the scales of spans 4h + 2 (L // 2) and + 1, four each
            ctl = [x for lane in range(4) for s in (0, 1) for _ in range(4)
                   for x in (4 * h + 2 * (lane // 2) + s, -128)]
            words = bld.bitcast(_pshufb512(g, mine, ir.Constant(vec(I8, 64), ctl)),
                                vec(I16, 32))
            for i, a in enumerate(acts):
                sums[i] = g.pack_madd(g.quad_sums(lo, a[h][0]), g.quad_sums(hi, a[h][1]),
                                      words, sums[i])
        for i, isum in enumerate(sums):
            isums[i].append(bld.add(g.lanes(isum, list(range(8))),
                                    g.lanes(isum, list(range(8, 16)))))
    return isums


def _wide_isums_i8(g: VectorIR, k: KernelType, t: Tile, b) -> list:  # noqa: ANN001
    """``_wide_isums_k4`` for Q6_K: per row and 128 values, the 64 bytes of low bits in
    one load (low nibbles spans 4n, 4n + 1; high nibbles 4n + 2, 4n + 3), each half's two
    high bits from the 32 bytes of ``qh`` in both halves, moved by one 64-bit lane shift
    per half (bits within a byte; the mask drops what crossed), against the activations as
    they lie; the values left unsigned (the bias on, ``row_bias``), each lane started from
    ``-32`` times its activations' sum, once for the four rows. Packed with the signed
    16-value scales as words (lane L: spans 4n, 4n + 2, or 4n + 1, 4n + 3 for L >= 2: even
    spans in lanes 0, 1, odd in 2, 3), folded to ``_scaled_dot``'s raw lanes."""
    bld, fmt = g.b, k.format
    off = bld.mul(b, g.c64(k.type_size))
    abase = bld.mul(b, g.c64(k.block_size))
    acts = [[[g.vload(a.qa, bld.add(abase, g.c64(128 * n + 64 * x)), 64) for x in (0, 1)]
             for n in (0, 1)] for a in t.acts]
    zero = ir.Constant(vec(I32, 16), [0] * 16)
    starts = [[[bld.sub(zero, g.quad_sums(g.splat8(k.bias, 64), a)) for a in pair]
               for pair in act] for act in acts]
    q64 = vec(I64, 8)
    shifts = (ir.Constant(q64, [4] * 4 + [2] * 4), ir.Constant(q64, [0] * 4 + [2] * 4))
    isums = [[] for _ in t.acts]
    for row in t.rows:
        sc = bld.sext(g.vload(row, bld.add(off, g.c64(fmt["scales"].offset)), 16),
                      vec(I16, 16))
        rsums = [None] * len(t.acts)
        for n in (0, 1):
            ql = g.vload(row, bld.add(off, g.c64(fmt["ql"].offset + 64 * n)), 64)
            qh = g.vload(row, bld.add(off, g.c64(fmt["qh"].offset + 32 * n)), 32)
            qh = bld.bitcast(g.lanes(qh, list(range(32)) * 2), q64)
            top = [bld.and_(bld.bitcast(op(qh, sh), vec(I8, 64)), g.splat8(0x30, 64))
                   for op, sh in ((bld.shl, shifts[0]), (bld.lshr, shifts[1]))]
            vals = (bld.or_(bld.and_(ql, g.splat8(15, 64)), top[0]),
                    bld.or_(g.byte_bits(ql, 4, 4), top[1]))
            words = g.lanes(sc, [8 * n + lane + 4 * s for lane in range(4) for s in (0, 1)
                                 for _ in range(4)])
            for i in range(len(t.acts)):
                sums = [bld.add(g.quad_sums(v, a), st)
                        for v, a, st in zip(vals, acts[i][n], starts[i][n], strict=True)]
                rsums[i] = g.pack_madd(*sums, words, rsums[i])
        for i, isum in enumerate(rsums):
            isums[i].append(bld.add(g.lanes(isum, [0, 1, 8, 9, 2, 3, 10, 11]),
                                    g.lanes(isum, [4, 5, 12, 13, 6, 7, 14, 15])))
    return isums


def _pshufb512(g: VectorIR, v: ir.Value, ctl: ir.Value) -> ir.Value:
    """``vpshufb`` on <64 x i8> as inline asm: LLVM otherwise merges it with the lane
    broadcast before it into a ``vpermt2b`` (slower on Zen 4, and a constant a row)."""
    v64 = vec(I8, 64)
    return g.b.asm(ir.FunctionType(v64, [v64, v64]), "vpshufb $2, $1, $0", "=v,v,v",
                   [v, ctl], False, "pshufb")


def _quad_pairs(g: VectorIR, vs: list, add) -> ir.Value:  # noqa: ANN001
    """Four rows' <8 x i32 or float> ``_scaled_dot`` lanes -> <8 x .>: row j's even spans'
    sum (its lanes 0, 1, 4, 5) in lane 2 j, its odd spans' (2, 3, 6, 7) in lane 2 j + 1
    (exact integers, or floats holding integers below 2**24: any order)."""
    bld = g.b

    def pick(a, b, idx: list[int]):  # noqa: ANN001, ANN202
        return bld.shuffle_vector(a, b, ir.Constant(vec(I32, 8), idx))

    lo, hi = [0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15]
    halves = [add(pick(vs[r], vs[r + 1], lo), pick(vs[r], vs[r + 1], hi)) for r in (0, 2)]
    return add(pick(*halves, list(range(0, 16, 2))), pick(*halves, list(range(1, 16, 2))))


def _emit_quad_block(g: VectorIR, k: KernelType, t: Tile, b, isums: list, dab,  # noqa: ANN001, PLR0913
                     quad: QuadScales | None, i: int) -> None:
    """Block ``b`` of ``_emit_quad_loop`` for activation row ``i``: ``isums`` the four rows'
    ``_scaled_dot`` lanes before their parity sums, ``dab`` the activation's block scale,
    ``quad`` the rows' scales where they were unpacked together (Q4_K; the types with
    parity lanes and an offset term all have theirs so)."""
    bld = g.b
    acc8, accs4 = t.quad[0][i], t.quad[1][i]
    four = ir.Constant(vec(F32, 4), [0.0] * 4)
    if quad is not None:
        ds = g.lanes(quad.dd, [0, 2, 4, 6])
    else:
        ds = four
        for j, row in enumerate(t.rows):
            d = block_scale(g, k, row, bld.mul(b, g.c64(k.type_size)))
            ds = bld.insert_element(ds, d, ir.Constant(I32, j))
    # lane 2 j + p: fmul(d_j, d_act), the product _accumulate takes
    dd = bld.fmul(g.lanes(ds, [j // 2 for j in range(8)]), g.splatf8(dab))
    f = bld.sitofp(_quad_pairs(g, isums, bld.add), vec(F32, 8))
    bld.store(g.call("llvm.fma.v8f32", vec(F32, 8), [f, dd, bld.load(acc8)]), acc8)
    if not k.offset:
        return
    assert quad is not None, k.type.ggml_name
    # the "dmin" term: - (d_act * dmin) * sum(mins * 32-sums), the sums exact integers
    msum = quad_min_sums(g, quad, t.acts[i].aux, b)
    dmin = g.lanes(quad.dd, [1, 3, 5, 7])
    dab4 = bld.insert_element(four, dab, ir.Constant(I32, 0))
    dab4 = g.lanes(dab4, [0, 0, 0, 0])
    bld.store(bld.fsub(bld.load(accs4), bld.fmul(bld.fmul(dab4, dmin), msum)), accs4)


def _prefetch(g: VectorIR, k: KernelType, t: Tile, b) -> None:  # noqa: ANN001
    """A tile's prefetch of its weight row ``PREFETCH`` bytes ahead of block ``b``."""
    bld = g.b
    if len(t.rows) == 1 and len(t.acts) >= 4:
        pf = g.at(t.rows[0], bld.add(bld.mul(b, g.c64(k.type_size)), g.c64(PREFETCH)))
        g.call("llvm.prefetch.p0", ir.VoidType(), [pf, ir.Constant(I32, 0),
                                                   ir.Constant(I32, 3), ir.Constant(I32, 1)])


# Where lane c = 2k + j of row r (``_scaled_dot``'s order) lies in a row pair's vector
_PAIR_LANES = [[4 * (c // 2) + 2 * r + c % 2 for c in range(8)] for r in range(2)]


def _emit_wide_block(g: VectorIR, k: KernelType, t: Tile, b, dd, shift: str) -> None:  # noqa: ANN001
    """Block ``b`` of a lanes tile of a type with integer scales on AVX-512 (``wide``), two
    activation rows at a time: per 64 values each row's quad sums (``quad_sums``), the two
    rows packed to words and multiplied by the scales in one ``pack_madd`` (the scale is
    the same for both: one weight row), so that one vector holds both rows' 8 lanes of
    ``_scaled_dot`` (lane 4k + 2r + j: row r's lane 2k + j) and one conversion and one
    fused multiply-add take both rows' float steps. ``shift`` "wide": the unsigned weights
    times the activations; "wide_a": the activations plus 128 (``ActRow.qu``, unsigned)
    times the signed weights, each lane started from ``-128 *`` the weights' scaled lane
    sum, worked out once per weight block (no ``vpsignb`` in AVX-512: no sign step)."""
    bld = g.b
    _prefetch(g, k, t, b)
    blk = unpack(g, k, t.rows[0], bld.mul(b, g.c64(k.type_size)), pairs=True)
    scales = [_pair_scales(g, sp) for sp in blk.spans]
    start = None
    if shift == "wide_a":  # -128 times the weights' scaled lane sums, the same steps
        for sp, sc in zip(blk.spans, scales, strict=True):
            c = g.quad_sums(g.splat8(-128, 64), sp.values)
            start = g.pack_madd(c, c, sc, start)
        start = bld.sub(ir.Constant(vec(I32, 16), [0] * 16), start)
    abase = bld.mul(b, g.c64(k.block_size))
    dd8 = bld.load(bld.bitcast(dd, vec(F32, 8).as_pointer()), align=4)
    for q, pacc in enumerate(t.pair_acc):
        acc = start
        for p, (sp, sc) in enumerate(zip(blk.spans, scales, strict=True)):
            at = bld.add(abase, g.c64(64 * p))
            sums = []
            for act in t.acts[2 * q:2 * q + 2]:
                if shift == "wide_a":
                    sums.append(g.quad_sums(g.vload(act.qu, at, 64), sp.values))
                else:
                    sums.append(g.quad_sums(sp.values, g.vload(act.qa, at, 64)))
            acc = g.pack_madd(sums[0], sums[1], sc, acc)
        if k.parity_lanes:  # row r's even spans' sum in lane 2 r, its odd spans' in 8 + 2 r
            acc = _fold_pairs(g, acc)
        elif k.block_lane:  # row r's whole dot in lane 2 r (its lane 0, _PAIR_LANES)
            acc = _one_lane(g, acc, (1, 4, 8), (0, 2))
        # row r's d * d_act in its 8 lanes: the same product _accumulate takes
        spread = g.lanes(dd8, [2 * q + (x // 2) % 2 for x in range(16)])
        f = bld.sitofp(acc, vec(F32, 16))
        bld.store(g.call("llvm.fma.v16f32", vec(F32, 16), [f, spread, bld.load(pacc)]), pacc)
    if k.offset:
        _lanes_offset(g, t, blk.offset, b, g.load_v8(t.lanes.da8, b))


def _pair_scales(g: VectorIR, sp) -> ir.Value:  # noqa: ANN001
    """<32 x i16>: ``pack_madd``'s scales for two activation rows' quad sums of the span
    pair ``sp`` (a ``SpanPair``): in 128-bit lane k, eight times the scale of values
    16k..16k+15 of the pair."""
    idx = [sp.first.first, sp.first.second, sp.second.first, sp.second.second]
    return g.lanes(sp.first.scales, [i for i in idx for _ in range(8)])


def _lanes_offset(g: VectorIR, t: Tile, term, b, da8) -> None:  # noqa: ANN001
    """Block ``b``'s offset term for the lanes tiles' rows at once, lane i doing row i's
    scalar steps of ``_accumulate`` (the same numbers): Q8_1's ``+ m * s_act``, or
    ``- (d_act * dmin) * msum`` with msum the mins times the row's 8 32-sums (integers
    below 2**24 in float: exact in any order; Q2_K's 16 mins and 16-sums, ``min_sums``)."""
    bld = g.b
    accv = bld.load(t.lanes.acc)
    if term.kind == "m":
        prod = bld.fmul(g.splatf8(term.factor), g.load_v8(t.lanes.aux8, b))
        bld.store(bld.fadd(accv, prod), t.lanes.acc)
        return
    msum = None
    if term.kind == "dmin16":  # the rows' sums side by side, 0 past the tile's rows
        msum = ir.Constant(vec(F32, 8), [0.0] * 8)
        for i, act in enumerate(t.acts):
            msum = bld.insert_element(msum, min_sums(g, term, act.cor, b), ir.Constant(I32, i))
    elif WIDE:  # two mins a 512-bit fma (exact, as the products and sums are integers)
        v16 = vec(F32, 16)
        for j in range(0, 8, 2):
            mj = g.lanes(term.mins, [j] * 8 + [j + 1] * 8)
            at = g.at(t.lanes.aux8, bld.mul(bld.add(bld.mul(b, g.c64(8)), g.c64(j)), g.c64(8)))
            a16 = bld.load(bld.bitcast(at, v16.as_pointer()), align=4)
            msum = bld.fmul(mj, a16) if msum is None else g.call(
                "llvm.fma.v16f32", v16, [mj, a16, msum])
        msum = bld.fadd(g.lanes(msum, list(range(8))), g.lanes(msum, list(range(8, 16))))
    for j in range(0 if WIDE or term.kind == "dmin16" else 8):
        mj = g.splatf8(bld.extract_element(term.mins, ir.Constant(I32, j)))
        p = bld.fmul(mj, g.load_v8(t.lanes.aux8, bld.add(bld.mul(b, g.c64(8)), g.c64(j))))
        msum = p if msum is None else bld.fadd(msum, p)
    scale = bld.fmul(da8, g.splatf8(term.factor))
    bld.store(bld.fsub(accv, bld.fmul(scale, msum)), t.lanes.acc)


def _integer_dot(g: VectorIR, k: KernelType, blk, a8: list, cor: list | None,  # noqa: ANN001
                 shift: str, ordered: bool = True) -> ir.Value:
    """<8 x i32>: one weight block's exact integer dot with one activation row's spans
    ``a8``, started from the lane corrections ``cor`` where ``shift`` asks for them
    (``ordered``: see ``_scaled_dot``)."""
    if quad_words(k):
        isum = _scaled_dot(g, k, blk, a8, cor if shift == "u" else None, ordered)
        return _one_lane(g, isum) if k.block_lane else isum
    isum = None
    for s, sp in enumerate(blk.spans):
        if shift == "a":
            start = cor[s] if isum is None else g.b.add(isum, cor[s])
            isum = g.dpbusd(start, a8[s], sp.values)
            continue
        start = isum
        if cor is not None:
            start = cor[s] if isum is None else g.b.add(isum, cor[s])
        isum = g.span_dot(sp.values, sp.magnitudes, a8[s], sp.scales,
                          signed(k) and not shift, start)
    return _one_lane(g, isum) if k.block_lane else isum


def _one_lane(g: VectorIR, v, xors: tuple = (1, 2, 4), keep: tuple = (0,)) -> ir.Value:  # noqa: ANN001
    """``v`` (<n x i32>) with lanes ``keep`` the sums of their lanes over ``xors`` (exact
    integers: any order), the others 0: a ``KernelType.block_lane`` block's whole integer
    dot in one lane (of 8: ``[sum, 0, ..., 0]``), which the float steps then take as any
    lanes (zeros add nothing to the lane sums)."""
    n = v.type.count
    for x in xors:
        v = g.b.add(v, g.lanes(v, [i ^ x for i in range(n)]))
    zero = ir.Constant(vec(I32, n), [0] * n)
    return g.b.shuffle_vector(v, zero, ir.Constant(vec(I32, n),
                                                   [i if i in keep else n for i in range(n)]))


def _scaled_dot(g: VectorIR, k: KernelType, blk, a8: list,  # noqa: ANN001
                starts: list | None = None, ordered: bool = True,
                raw: bool = False) -> ir.Value:
    """<8 x i32>: ``_integer_dot`` of a type with integer scales. Lane c = 2k + j sums,
    over the block's 64-value pairs p, scale times values 64p + 16k + 8j .. +7: the scale
    is applied once per 8 values instead of ggml's once per 4, which lets the 512-bit tiles
    take two activation rows per scale step (``_emit_wide_block``, the same integers). The
    float steps are ggml's; only which products share a lane differs from its vec_dot.
    Here: each span's quad sums (``quad_sums``), spans 2p and 2p + 1 packed to words and
    multiplied by their scales in one ``pack_madd`` (lanes in the order k = 0, 2, 1, 3,
    put back at the end; not ``ordered``: left as they are, for a block loop whose
    accumulators are put in order after it, ``_SCALED_ORDER``: each lane's float steps are
    its own). With ``starts`` (shift "u") the values are unsigned, the bias left on, and
    span s's quad sums start from ``starts[s]``: the same integers. ``raw``: pack_madd's
    lanes as they are, before a parity type's sums (``_quad_pairs`` takes them)."""
    sums = []
    for s, sp in enumerate(blk.spans):
        if starts is not None and VNNI:
            sums.append(g.dpbusd(starts[s], sp.values, a8[s]))
        elif starts is not None:
            sums.append(g.b.add(g.quad_sums(sp.values, a8[s]), starts[s]))
        elif signed(k) and SIMD != "generic":  # the sign moved onto the activations
            a = g.call("llvm.x86.avx2.psign.b", vec(I8, 32), [a8[s], sp.values])
            sums.append(g.quad_sums(sp.magnitudes, a))
        else:
            sums.append(g.quad_sums(sp.values, a8[s], both_signed=signed(k)))
    isum = None
    for x in range(0, len(sums), 2):
        sx, sy = blk.spans[x].scales, blk.spans[x + 1].scales
        idx = [sx.first] * 4 + [sy.first] * 4 + [sx.second] * 4 + [sy.second] * 4
        isum = g.pack_madd(sums[x], sums[x + 1], scale_words(g, sx, idx), isum)
    if raw:
        return isum
    if k.parity_lanes:
        return _parity_sums(g, isum)
    return g.lanes(isum, _SCALED_ORDER) if ordered else isum


# _scaled_dot's lanes from pack_madd's (its own inverse)
_SCALED_ORDER = [0, 1, 4, 5, 2, 3, 6, 7]


def _fold_pairs(g: VectorIR, v) -> ir.Value:  # noqa: ANN001
    """``v`` (<n x i32>, n = 8 or 16) with lane i the sum of lanes i, i ^ 1, i ^ 4 and
    i ^ 5 (exact integers: any order), which gathers ``pack_madd``'s lanes by span parity
    (``KernelType.parity_lanes``): for ``_scaled_dot``'s 8, the even spans' sum in lane 0
    and the odd spans' in lane 2; for the wide block's 16 (rows r = 0, 1), row r's even
    spans' sum in lane 2 r and its odd spans' in lane 8 + 2 r."""
    n = v.type.count
    for x in (1, 4):
        v = g.b.add(v, g.lanes(v, [i ^ x for i in range(n)]))
    return v


def _parity_sums(g: VectorIR, v) -> ir.Value:  # noqa: ANN001
    """<8 x i32> [even, odd, 0, 0, 0, 0, 0, 0]: a block's scaled integer dot split into its
    even and odd 32-value spans, from ``_scaled_dot``'s pack_madd lanes (0, 1, 4, 5: the
    even spans' products; 2, 3, 6, 7: the odd)."""
    zero = ir.Constant(vec(I32, 8), [0] * 8)
    return g.b.shuffle_vector(_fold_pairs(g, v), zero,
                              ir.Constant(vec(I32, 8), [0, 2] + [8] * 6))


def _accumulate(g: VectorIR, t: Tile, j: int, i: int, act: ActRow, b, blk, isum,  # noqa: ANN001, PLR0913
                dab, dd, msum=None) -> None:  # noqa: ANN001
    """Weight row j times activation row i, block ``b``: ``isum`` times the scales into
    ``t.acc[j][i]``, the block's offset term into ``t.acc_scalar[j][i]`` (Q2_K's min sum
    ``msum`` worked out by the caller, ``min_sums_rows``)."""
    bld = g.b
    acc = bld.load(t.acc[j][i])
    if t.lanes is None:
        acc = g.fma8(acc, isum, bld.fmul(blk.d, dab))
    else:  # row i's d * d_act, the same product as fmul(d, dab)
        f = bld.sitofp(isum, vec(F32, 8))
        spread = g.splatf8(bld.load(bld.gep(dd, [g.c64(i)])))
        acc = g.call("llvm.fma.v8f32", vec(F32, 8), [f, spread, acc])
    bld.store(acc, t.acc[j][i])
    term = blk.offset
    if term is None or t.lanes is not None:  # the lanes tiles': ``_lanes_offset``
        return
    accs = bld.load(t.acc_scalar[j][i])
    if term.kind == "m":  # + m * sum(x), Q8_1's stored block sum
        accs = bld.fadd(accs, bld.fmul(term.factor, g.load_f32(act.aux, b)))
    else:
        if term.kind == "dmin16":
            msum = min_sums(g, term, act.cor, b) if msum is None else msum
        else:
            p8 = bld.bitcast(g.at(act.aux, bld.mul(b, g.c64(8))), vec(F32, 8).as_pointer())
            # integers below 2**24 in float: the products and sums are exact
            msum = g.hsum8(bld.fmul(term.mins, bld.load(p8, align=4)))
        accs = bld.fsub(accs, bld.fmul(bld.fmul(dab, term.factor), msum))
    bld.store(accs, t.acc_scalar[j][i])


def _types_for(kind: types.Type) -> list[KernelType]:
    """The block loop a row-dot call site needs: the one type of a literal ``kind`` (each
    type's row kernel is compiled on its own, ``rows_kernel``)."""
    lit = getattr(kind, "literal_value", None)
    if lit is None:
        raise TypeError("rowdot: the weight type must be a compile-time constant")
    k = KERNEL_TYPES.get(GGMLType(lit)) if lit in GGMLType._value2member_map_ else None
    return [] if k is None else [k]


def _emit_types(g: VectorIR, kind, ktypes: list[KernelType], t: Tile, nbytes,  # noqa: ANN001
                shifted_srcs: tuple) -> None:  # noqa: ANN001
    """The switch over ``kind`` to each type's block loop; a type id without one gives NaN,
    never a silent 0 (the jitted entry points refuse such ids before they get here)."""
    bld = g.b
    done = bld.append_basic_block("rowdot.done")
    unknown = bld.append_basic_block("rowdot.unknown")
    sw = bld.switch(bld.sext(kind, I64) if kind.type != I64 else kind, unknown)
    for k in ktypes:
        blk = bld.append_basic_block(f"rowdot.{k.type.ggml_name}")
        sw.add_case(ir.Constant(I64, int(k.type)), blk)
        bld.position_at_end(blk)
        if k.offset == "dmin" and k.groups == 16:  # Q2_K: its mins' 16-sums, or NaN
            rows = cgutils.unpack_tuple(bld, shifted_srcs[0].shape)[0]
            body = bld.append_basic_block(f"rowdot.{k.type.ggml_name}.sums")
            bld.cbranch(bld.icmp_signed("!=", rows, g.c64(0)), body, unknown)
            bld.position_at_end(body)
        nb = bld.udiv(nbytes, g.c64(k.type_size))
        # no sign step (``_emit_block``'s ``shift``): the lanes tiles take the activations
        # plus 128 and each weight block's lane corrections, the rest the weights plus
        # their offset and the activations' lane corrections (a third load per row and
        # block costs the 1x8 tile more than the sign step saves)
        if t.lanes and wide(k) and signed(k):  # "wide_a" where the rows have ``qu``
            have = bld.icmp_signed("!=", cgutils.unpack_tuple(bld, shifted_srcs[1].shape)[0],
                                   g.c64(0))
            with bld.if_else(have) as (shifted, plain):
                with shifted:
                    _emit_type_loop(g, k, t, nb, "wide_a")
                with plain:
                    _emit_type_loop(g, k, t, nb)
        elif t.lanes and wide(k):
            _emit_type_loop(g, k, t, nb, "wide")
        elif t.lanes is None and row_bias(k):
            _emit_type_loop(g, k, t, nb, "u")
        elif vnni_offset(k):
            src, shift = (shifted_srcs[1], "a") if t.lanes else (shifted_srcs[0], "w")
            have = bld.icmp_signed("!=", cgutils.unpack_tuple(bld, src.shape)[0], g.c64(0))
            with bld.if_else(have) as (shifted, plain):
                with shifted:
                    _emit_type_loop(g, k, t, nb, shift)
                with plain:
                    _emit_type_loop(g, k, t, nb)
        else:
            _emit_type_loop(g, k, t, nb)
        bld.branch(done)
    bld.position_at_end(unknown)
    for row_accs in t.acc_scalar:
        for p in row_accs:
            bld.store(ir.Constant(F32, float("nan")), p)
    bld.branch(done)
    bld.position_at_end(done)


def _make_rowdot(nr: int, na: int, lanes: bool = False, quad: bool = False):  # noqa: ANN202 - a numba intrinsic
    """Intrinsic ``rowdot(kind, w (R, row_bytes) u8, r0, rs, qa (n, K) i8, da (n, K/QK) f32,
    aux (n, .) f32, cor (n, K/4) i32 or (0, .), qu (n, K) i8 or (0, .), da8, aux8, tbl, i0,
    out (n, R) f32)``:
    ``out[i0+i, r0+j*rs] = W[r0+j*rs] . x[i0+i]`` for ``j < nr``, ``i < na``. Several rows
    share each activation load and give the CPU independent accumulator chains; ``kind`` (a
    ggml type id, a compile-time constant: each type's row kernel is its own) selects the
    block loop.
    ``da8``/``aux8``: with ``lanes`` (1x8, 1x4), ``_lanes8(da, na)``/``_lanes8(aux, na)``,
    the scales and sums of activation rows i0..i0+na-1 side by side; otherwise unused.
    ``cor``: the activations' lane corrections for the types with a ``vnni_offset``, or no
    rows (then those types take the sign step). ``qu``: the activations plus 128, which the
    lanes tiles use for those types instead, or no rows. Returns the activation rows done:
    ``na``; with ``quad`` (the decoding tile of 4 weight rows and 2 activation rows, which
    only the types with parity lanes have: ``_emit_quad_loop``), 0 for the other types,
    whose code is not emitted (the caller runs its rows in other tiles)."""

    @intrinsic(prefer_literal=True)
    def rowdot(typingctx, kind, w, r0, rs, qa, da, aux, cor, qu, da8, aux8, tbl, i0, out):  # noqa: ANN001, ANN202, ARG001, PLR0913
        sig = types.int64(kind, w, r0, rs, qa, da, aux, cor, qu, da8, aux8, tbl, i0, out)
        ktypes = _types_for(kind)
        done = 0 if quad and not (ktypes and ktypes[0].parity_lanes) else na

        def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
            if done == 0:
                return context.get_constant(types.int64, 0)
            kind_, ws, r0_, rs_, qas, das, auxs, cors, qus, da8s, aux8s, tbls, i0_, outs = (
                array_args(context, builder, signature, args))
            g = VectorIR(builder, tbls.data)
            bld = builder
            ridx = [bld.add(r0_, bld.mul(rs_, g.c64(j))) for j in range(nr)]
            acts = []
            for i in range(na):
                ii = bld.add(i0_, g.c64(i))
                acts.append(ActRow(row_pointer(bld, qas, ii, I8), row_pointer(bld, das, ii, F32),
                                   row_pointer(bld, auxs, ii, F32),
                                   row_pointer(bld, cors, ii, I32),
                                   row_pointer(bld, qus, ii, I8)))
            zero = ir.Constant(vec(F32, 8), [0.0] * 8)
            lane_ptrs = None
            if lanes:
                g8 = bld.sdiv(i0_, g.c64(na))  # the rows' group in _lanes8(., na)
                # one scratch for every type's block loop (each its own would add 2 KB of
                # stack per type and tile)
                lane_ptrs = Lanes(row_pointer(bld, da8s, g8, F32),
                                  row_pointer(bld, aux8s, g8, F32),
                                  cgutils.alloca_once_value(bld, zero),
                                  cgutils.alloca_once(bld, F32, size=g.c64(8 * SCALE_RUN)))
            tile = Tile([row_pointer(bld, ws, ri, I8) for ri in ridx], acts,
                        [[cgutils.alloca_once_value(bld, zero) for _ in range(na)]
                         for _ in range(nr)],
                        [[cgutils.alloca_once_value(bld, ir.Constant(F32, 0.0))
                          for _ in range(na)] for _ in range(nr)], lane_ptrs)
            nbytes = cgutils.unpack_tuple(bld, ws.shape)[1]
            _emit_types(g, kind_, ktypes, tile, nbytes, (cors, qus))
            for j in range(nr):
                for i in range(na):
                    res = bld.fadd(g.hsum8(bld.load(tile.acc[j][i])),
                                   bld.load(tile.acc_scalar[j][i]))
                    g.store_2d(outs, bld.add(i0_, g.c64(i)), ridx[j], res)
            return context.get_constant(types.int64, done)

        return sig, codegen

    return rowdot


# (weight rows, activation rows) per call: 4x1 for token-by-token decoding (4x2 for a few
# sequences decoded together, where the type has parity lanes); for batches 1x8
# (an unpacked block serves 8 activation rows) and 1x4 for 4-7 rows (one weight row at a
# time: on a 262144-row output matrix faster than 2x4, as fast on small ones), except types
# declared batch8=False: 1x4 for all
_rd_4x1 = _make_rowdot(4, 1)
_rd_4x2 = _make_rowdot(4, 2, quad=True)  # the types with parity lanes only (else 0, nothing)
_rd_1x1 = _make_rowdot(1, 1)
_rd_1x8 = _make_rowdot(1, 8, lanes=True)
_rd_1x4 = _make_rowdot(1, 4)
_rd_1x4l = _make_rowdot(1, 4, lanes=True)


@njit(cache=True, nogil=True)
def _lanes8(a, group):  # noqa: ANN001, ANN201
    """a (n, m) f32 -> (n // group, 8 m) f32: each group of ``group`` (<= 8) rows with its
    columns side by side in 8 lanes, ``[g, 8 j + i] = a[group g + i, j]``, the lanes past
    ``group`` 0 (the 1x8 and 1x4 tiles' vector loads of scales and sums)."""
    n, m = a.shape
    out = np.zeros((n // group, 8 * m), np.float32)
    for g in range(n // group):
        for j in range(m):
            for i in range(group):
                out[g, 8 * j + i] = a[group * g + i, j]
    return out


@njit(cache=True, nogil=True, inline="always")
def tiled(n, w):  # noqa: ANN001, ANN201
    """Whether n activation rows times weights ``w`` (R, row_bytes) run in tiles."""
    return n >= 8 or n == BATCH_MIN_ROWS or (
        n > BATCH_MIN_ROWS and w.shape[0] * w.shape[1] < STREAM_MIN_BYTES)


@njit(nogil=True, inline="always")
def _rows_of_type(kind, w, qa, da, aux, cor, qu, tbl, out, r0, r1):  # noqa: ANN001, ANN202
    """The hot loop. W rows r0:r1 (R, row_bytes) u8 @ activations (n, K) -> out[:, r0:r1]
    (n, R) f32, for the weights' (literal) type ``kind``."""
    n = qa.shape[0]
    if tiled(n, w):  # a batch: tiles of ROW_CHUNK rows stay hot while activations pass
        lanes = kind not in _NO_BATCH8
        batch8 = lanes and n >= 8
        da8 = _lanes8(da if batch8 else da[:0], 8)
        aux8 = _lanes8(aux if batch8 else aux[:0], 8)
        lanes4 = lanes and n % 8 >= 4  # rows left for one 1x4 pass
        da4 = _lanes8(da if lanes4 else da[:0], 4)
        aux4 = _lanes8(aux if lanes4 else aux[:0], 4)
        for c0 in range(r0, r1, ROW_CHUNK):
            c1 = min(r1, c0 + ROW_CHUNK)
            i = 0
            if batch8:
                while i + 8 <= n:
                    for r in range(c0, c1):
                        _rd_1x8(kind, w, r, 1, qa, da, aux, cor, qu, da8, aux8, tbl, i, out)
                    i += 8
            while i + 4 <= n:
                if lanes4:
                    for r in range(c0, c1):
                        _rd_1x4l(kind, w, r, 1, qa, da, aux, cor, qu, da4, aux4, tbl, i, out)
                else:
                    for r in range(c0, c1):
                        _rd_1x4(kind, w, r, 1, qa, da, aux, cor, qu, da, aux, tbl, i, out)
                i += 4
            while i < n:
                for r in range(c0, c1):
                    _rd_1x1(kind, w, r, 1, qa, da, aux, cor, qu, da, aux, tbl, i, out)
                i += 1
        return
    slot = WALK_SETTINGS[1] if w.shape[1] >= LONG_ROW_BYTES else WALK_SETTINGS[0]
    _stream_rows(kind, w, qa, da, aux, cor, qu, tbl, out, r0, r1, _setting(slot))


# How decoding walks a range of weight rows (``kernel_settings()[WALK_SETTINGS[c]]``, c = 1
# for rows of LONG_ROW_BYTES or more, chosen by measuring the machine: ``calibrate``).
# Passes of four rows at a stride make each row one sequential stream for the hardware
# prefetchers (adjacent rows make short broken streams: a third of the speed on an AMD Zen
# 4), or the rows run one at a time in order, one stream; which pattern a core's
# prefetchers keep up with differs by CPU and by row length. Every row's number is its own
# (the four-row tile equals each row alone), so the walk never changes a result.
WALKS = ("four streams (the quarters of the rows)",
         "eight streams (two passes over the eighths)",
         "four streams a row out of step (the quarters, each one row later)",
         "one stream (the rows in order, one at a time)")
WALK_SETTINGS = (0, 1)  # kernel_settings() slots: the walk for short rows, for long rows
LONG_ROW_BYTES = 4096  # an FFN's down matrix (n_ff values a row) from about 7000 values


@njit(nogil=True, inline="always")
def _stream_rows(kind, w, qa, da, aux, cor, qu, tbl, out, r0, r1, walk):  # noqa: ANN001, ANN202, PLR0913
    """``_rows_of_type``'s token-by-token loop: rows r0:r1 in passes of four rows (walk
    ``walk`` of WALKS), the activation rows taking turns on those four while they are in
    L1; the rows left over one at a time, in order."""
    n = qa.shape[0]
    done = r0  # rows below this are taken by the passes, and those in ``skip``
    skip = -1
    if walk == 1 and r1 - r0 >= 8:  # passes alternating over eighths 0, 2, 4, 6 and 1, 3, 5, 7
        part = (r1 - r0) // 8
        for k in range(part):
            _four_rows(kind, w, r0 + k, 2 * part, qa, da, aux, cor, qu, tbl, out)
            _four_rows(kind, w, r0 + part + k, 2 * part, qa, da, aux, cor, qu, tbl, out)
        done = r0 + 8 * part
    elif walk == 2 and r1 - r0 >= 8:  # stride q + 1: rows q, 2q + 1, 3q + 2 left over
        q = (r1 - r0 - 3) // 4
        for k in range(q):
            _four_rows(kind, w, r0 + k, q + 1, qa, da, aux, cor, qu, tbl, out)
        done, skip = r0 + 4 * q + 3, q
    elif walk == 3:  # the one-row tile over the rows in order: nothing in passes
        done = r0
    else:
        quarter = (r1 - r0) // 4
        for k in range(quarter):
            _four_rows(kind, w, r0 + k, quarter, qa, da, aux, cor, qu, tbl, out)
        done = r0 + 4 * quarter
    for j in range(3 if skip >= 0 else 0):
        for i in range(n):
            _rd_1x1(kind, w, r0 + j * (skip + 1) + skip, 1, qa, da, aux, cor, qu, da, aux,
                    tbl, i, out)
    for r in range(done, r1):
        for i in range(n):
            _rd_1x1(kind, w, r, 1, qa, da, aux, cor, qu, da, aux, tbl, i, out)


@njit(nogil=True, inline="always")
def _four_rows(kind, w, r, rs, qa, da, aux, cor, qu, tbl, out):  # noqa: ANN001, ANN202
    """Weight rows r, r + rs, r + 2 rs, r + 3 rs times every activation row, while they are
    in L1: two activation rows a tile where the type has that tile (the weights unpacked
    once for both), the others one at a time."""
    n = qa.shape[0]
    i = 0
    while i + 2 <= n:
        if _rd_4x2(kind, w, r, rs, qa, da, aux, cor, qu, da, aux, tbl, i, out) == 0:
            break
        i += 2
    while i < n:
        _rd_4x1(kind, w, r, rs, qa, da, aux, cor, qu, da, aux, tbl, i, out)
        i += 1


# Settings the row kernels read at run time (an array at a symbol their machine code links
# against, as the callers' table of kernels): variants that give the same numbers, chosen
# after the kernels are compiled, so a choice costs no compilation
_SETTINGS_SIZE = 8
_SETTINGS_SYMBOL = "gguflm_kernel_settings"
_SETTINGS = (ctypes.c_int64 * _SETTINGS_SIZE)()
llvm.add_symbol(_SETTINGS_SYMBOL, ctypes.addressof(_SETTINGS))


def kernel_settings() -> ctypes.Array:
    """The row kernels' run-time settings (``WALK_SETTINGS``: indexes into WALKS)."""
    return _SETTINGS


@intrinsic
def _setting(typingctx, i):  # noqa: ANN001, ANN202, ARG001
    """``kernel_settings()[i]`` as the machine code reads it now (a constant ``i``)."""
    sig = types.int64(i)

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        mod = builder.module
        table = mod.globals.get(_SETTINGS_SYMBOL)
        if table is None:
            table = ir.GlobalVariable(mod, ir.ArrayType(I64, _SETTINGS_SIZE), _SETTINGS_SYMBOL)
            table.linkage = "external"
        idx = builder.sext(args[0], I64) if args[0].type != I64 else args[0]
        return builder.load(builder.gep(table, [ir.Constant(I32, 0), idx]))

    return sig, codegen


# -- one compiled row kernel per weight type, reached through a table of addresses ----------

# ``rows_kernel(args)``: args (int64 *) the arrays of ``qmatmul_rows`` as ``_ARG_ARRAYS``
# lays them out (each 2-D one as data, shape 0, shape 1, stride 0, stride 1; bytes), then
# F16_TABLE's data and length, and the row range r0, r1
_ARG_ARRAYS = ("w", "qa", "da", "aux", "cor", "qu", "out")
_ARG_SLOTS = 5 * len(_ARG_ARRAYS) + 4
_ROWS_SIG = types.void(types.CPointer(types.int64))
_TABLE_SIZE = 64  # ggml type ids are below this
_TABLE_SYMBOL = "gguflm_int_rows_kernels"  # what the callers' machine code links against
_TABLE = (ctypes.c_void_p * _TABLE_SIZE)()
llvm.add_symbol(_TABLE_SYMBOL, ctypes.addressof(_TABLE))

_u8_view = array_view(types.uint8, 2)
_i8_view = array_view(types.int8, 2)
_i32_view = array_view(types.int32, 2)
_f32_view = array_view(types.float32, 2)
_f32_vec_view = array_view(types.float32, 1)


@intrinsic
def _call_rows_kernel(typingctx, kind, w, qa, da, aux, cor, qu, tbl, out, r0, r1):  # noqa: ANN001, ANN202, ARG001, PLR0913
    """Type ``kind``'s row kernel on these arguments; False (nothing run) when the type has
    none in the table (no integer kernel, or not ``prepare``d)."""
    sig = types.boolean(kind, w, qa, da, aux, cor, qu, tbl, out, r0, r1)

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        kind_, ws, qas, das, auxs, cors, qus, tbls, outs, r0_, r1_ = array_args(
            context, builder, signature, args)
        slots = cgutils.alloca_once(builder, I64, size=ir.Constant(I64, _ARG_SLOTS))
        values = []
        for a in (ws, qas, das, auxs, cors, qus, outs):
            values += [builder.ptrtoint(a.data, I64), *cgutils.unpack_tuple(builder, a.shape),
                       *cgutils.unpack_tuple(builder, a.strides)]
        values += [builder.ptrtoint(tbls.data, I64), *cgutils.unpack_tuple(builder, tbls.shape),
                   r0_, r1_]
        for i, v in enumerate(values):
            builder.store(v, builder.gep(slots, [ir.Constant(I64, i)]))
        fnty = ir.FunctionType(ir.VoidType(), [I64.as_pointer()])
        mod = builder.module
        table = mod.globals.get(_TABLE_SYMBOL)
        if table is None:
            table = ir.GlobalVariable(mod, ir.ArrayType(I8.as_pointer(), _TABLE_SIZE),
                                      _TABLE_SYMBOL)
            table.linkage = "external"
        idx = builder.sext(kind_, I64) if kind_.type != I64 else kind_
        inside = builder.icmp_unsigned("<", idx, ir.Constant(I64, _TABLE_SIZE))
        found = cgutils.alloca_once_value(builder, cgutils.false_bit)
        with builder.if_then(inside):
            fp = builder.load(builder.gep(table, [ir.Constant(I32, 0), idx]))
            with builder.if_then(cgutils.is_not_null(builder, fp)):
                builder.call(builder.bitcast(fp, fnty.as_pointer()), [slots])
                builder.store(cgutils.true_bit, found)
        return builder.load(found)

    return sig, codegen


@njit(cache=True, nogil=True)
def qmatmul_rows(kind, w, qa, da, aux, cor, qu, tbl, out, r0, r1):  # noqa: ANN001, ANN201
    """W rows r0:r1 (R, row_bytes) u8 of ggml type ``kind`` @ activations (n, K) ->
    out[:, r0:r1] (n, R) f32 (``act_quant.ActivationSet``'s arrays: ``cor`` and ``qu`` may
    have no rows), by the type's row kernel. A type without one (or not ``prepare``d)
    gives NaN, never a silent 0."""
    if kind in GEMM_KINDS and qa.shape[0] >= GEMM_MIN_ROWS:
        r0 = gemm_rows(kind, w, r0, r1, qa, da, aux, cor, qu, tbl, out)  # groups of 8 rows
        if r0 == r1:
            return
    if not _call_rows_kernel(kind, w, qa, da, aux, cor, qu, tbl, out, r0, r1):
        out[:, r0:r1] = np.nan


def _rows_kernel(kind: int):  # noqa: ANN202 - a numba cfunc
    """Type ``kind``'s row kernel: compiled, or loaded from numba's disk cache."""
    from numba.core import sigutils
    from numba.core.ccallback import CFunc

    kind = int(kind)

    def rows_kernel(args):  # noqa: ANN001, ANN202
        _rows_of_type(kind, _u8_view(args[0], (args[1], args[2]), (args[3], args[4])),
                      _i8_view(args[5], (args[6], args[7]), (args[8], args[9])),
                      _f32_view(args[10], (args[11], args[12]), (args[13], args[14])),
                      _f32_view(args[15], (args[16], args[17]), (args[18], args[19])),
                      _i32_view(args[20], (args[21], args[22]), (args[23], args[24])),
                      _i8_view(args[25], (args[26], args[27]), (args[28], args[29])),
                      _f32_vec_view(args[35], (args[36],), (4,)),
                      _f32_view(args[30], (args[31], args[32]), (args[33], args[34])),
                      args[37], args[38])

    # one cache file per type (a shared index would be rewritten by concurrent builds)
    rows_kernel.__qualname__ = f"rows_kernel_{GGMLType(kind).ggml_name}"
    fn = CFunc(rows_kernel, sigutils.normalize_signature(_ROWS_SIG), locals={}, options={})
    fn.enable_caching()
    return fn


_KERNELS: dict[int, object] = {}  # type id -> its compiled row kernel (kept alive here)
_LOCK = threading.Lock()


def prepared(kind: int) -> bool:
    """Whether type ``kind``'s row kernel is in the table."""
    return int(kind) in _KERNELS


def kernel_cached(kind: int) -> bool:
    """Whether type ``kind``'s row kernel is in numba's disk cache (loading it then takes
    milliseconds; compiling it, seconds)."""
    if prepared(kind):
        return True
    try:
        return len(_rows_kernel(kind)._cache._cache_file._load_index()) > 0
    except Exception:  # noqa: BLE001 - numba internals moved: assume not
        return False


def prepare(kinds) -> None:  # noqa: ANN001 - any iterable of ggml type ids
    """Compile (first time) or load each integer-kernel type's row kernel and put it in the
    table ``qmatmul_rows`` calls through; types without one are left to the callers'
    checks."""
    for kind in {int(k) for k in kinds}:
        if kind in _KERNELS or kind not in _KERNEL_IDS:
            continue
        with _LOCK:
            if kind not in _KERNELS:
                fn = _rows_kernel(kind)
                fn.compile()
                _TABLE[kind] = fn.address
                _KERNELS[kind] = fn


_KERNEL_IDS = frozenset(int(t) for t in KERNEL_TYPES)
