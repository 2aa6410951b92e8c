"""Weights times many activation rows: an interleaved GEMM, 8 weight rows at a time, for
Q4_K, Q6_K, Q5_K, Q3_K, Q2_K (``gemm_kquants``), Q8_0, Q4_0, Q5_0, IQ4_NL and IQ4_XS
(``gemm_spans``).

A group of 8 weight rows is first unpacked into a buffer (``_pack``): per block, for
each 8 values of the block the 8 rows' values side by side (one 512-bit vector: row n in
bytes 8n..8n+7), and the rows' integer scales (Q4_K's and Q2_K's mins), float scales and,
for the signed types, each lane's start (the activations come plus 128, unsigned). Then
every activation row runs over the buffer (``_make_gemm``): 8 bytes of the activation
broadcast to the 8 rows, one ``vpdpbusd`` per 8 values of all 8 weight rows. For Q4_K
and Q6_K one ``packssdw`` + ``vpdpwssd`` per two such results applies the rows' integer
scales; Q4_K's values are small enough that the 32 values of a group sum in each row's
two words first (one scale step per 4 ``vpdpbusd``), Q6_K's take one per 2. Q3_K's and
Q2_K's values times their scales fit a byte: the buffer holds them scaled, and a lane's
dots accumulate over the whole block with no scale step. The
32-value types have no integer scales: each ``vpdpbusd`` result is two of ggml's lanes of
8 rows, converted and added as its float steps do. IQ4_XS and Q5_K keep one lane a block
(``KernelType.block_lane``): a span's 4 ``vpdpbusd`` go into one sum, multiplied by the
span's scales once (``vpmulld``: their scaled values are too wide for bytes, their sums
for words), and each row's two halves are added at the end of the block; their passes take
two groups (16 weight rows), each activation broadcast feeding both groups' ``vpdpbusd``s
(one load per two, where one group's pass is bound by its loads). Q4_K's and
Q5_K's mins' term is an exact integer sum (``vpdpwssd`` of the mins and the activations'
32-value sums as words), as Q2_K's over 16-value sums. The unpacking is done once for all
the activation rows instead of once per 8 (``int_tiles``' 1x8 tile).

The numbers are those of every other path of these types: for Q4_K and Q6_K
(``KernelType.parity_lanes``), per block, the scaled integer dot of the even and of the
odd 32-value spans (exact integers), each its float lane ``+= float(isum) * (d * d_act)``;
Q4_K's mins' term ``-= (d_act * dmin) * sum(min * 32-sum)`` (exact integers in float); at
the end ``(even + odd) + offset term``. For Q3_K and Q2_K the tiles' 8 lanes
(``int_tiles._scaled_dot``: lane c the scaled dot of values 8c..8c+7 of each 64), Q2_K's
mins' term over 16-value sums; for the 32-value types ggml's 8 lanes (values 4j..4j+3 of
each 32); for IQ4_XS and Q5_K the block's whole scaled integer dot in one lane; then
ggml's horizontal sum. So a row's product does not depend on
which path ran it (batch invariance).

Three builds. With AVX512-VNNI (``WIDE_GEMM``): all of these types, as above. Without it,
on any x86 with AVX2 (``USABLE``): Q4_K, Q6_K, Q8_0, Q4_0, Q5_0 and IQ4_NL in 256-bit steps
(``gemm_ymm``: each 64-byte vector as two halves of 4 rows). AVX2: ``pmaddubsw`` (its pair
sums saturate at int16; Q4_K's unsigned nibbles times the activations, and Q6_K's signed
values times the activations plus 128, stay within it), a scale group's words added, then
``pmaddwd`` by the scales and one ``phaddd`` a block. AVX-VNNI: Q4_K the 512-bit steps on
halves (256-bit ``vpdpbusd``), Q6_K as on AVX2 (fewer scale steps). The 32-value types
take ggml's own steps on the signed activations (the weights' signs moved to them,
``pmaddubsw`` of the magnitudes and ``pmaddwd`` by 1, or ``vpdpbusd``). The same integers
per lane, so the same bits. The other types, and CPUs without AVX2, keep the per-row tiles
(``GEMM_KINDS``).
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
from . import gemm_kquants as kq
from . import gemm_spans as sp
from . import gemm_ymm as ym
from . import jitcache  # noqa: F401 - stamps the cached kernels below (before any njit)
from .gemm_ir import GROUP, PAIRED, PLAIN, ActRow, Layout, bcast_at, load, splat
from .kerneltypes import KERNEL_TYPES
from .vector_ir import (
    F32,
    I8,
    I32,
    I64,
    SIMD,
    VNNI512,
    VectorIR,
    array_args,
    row_pointer,
    vec,
)

USABLE = SIMD != "generic"  # x86 with AVX2 at least
WIDE_GEMM = VNNI512  # the 512-bit GEMM; else the 256-bit one (``gemm_ymm``'s types)
T = GGMLType
Q4_K, Q6_K, Q3_K, Q2_K = int(T.Q4_K), int(T.Q6_K), int(T.Q3_K), int(T.Q2_K)
Q5_K = int(T.Q5_K)
Q8_0, Q4_0, Q5_0 = int(T.Q8_0), int(T.Q4_0), int(T.Q5_0)
IQ4_NL, IQ4_XS = int(T.IQ4_NL), int(T.IQ4_XS)
# the types it runs, where the declarations' lanes are the ones it computes: Q4_K's and
# Q6_K's two (``parity_lanes``), Q5_K's and IQ4_XS's one (``block_lane``), the others' 8
# (a constant tuple for numba)
_LANES = (("parity", (Q4_K, Q6_K)), ("block", (Q5_K, IQ4_XS)),
          ("", (Q3_K, Q2_K, Q8_0, Q4_0, Q5_0, IQ4_NL)))


def _declared_lanes(t: int) -> str | None:
    k = KERNEL_TYPES.get(GGMLType(t))
    return None if k is None else "parity" if k.parity_lanes else "block" if k.block_lane else ""


GEMM_KINDS = tuple(t for lanes, kinds in _LANES for t in kinds
                   if USABLE and (WIDE_GEMM or t in ym.TYPES) and _declared_lanes(t) == lanes
                   ) or (-1,)
# the unsigned types multiply the activations themselves, and so do the 256-bit build's
# 32-value types (the sign step, ``gemm_ymm.SIGNED_ACTS``); the others the activations plus
# 128 (``ActivationSet.qu``, which ``act_quant`` makes for these types' batches)
_QA_KINDS = (Q4_K, Q5_K, Q2_K) + (() if WIDE_GEMM else ym.SIGNED_ACTS)
PLUS_128_KINDS = tuple(t for t in GEMM_KINDS if t not in _QA_KINDS) or (-1,)
SUMS16_KINDS = (Q2_K,)  # whose mins multiply the activations' 16-value sums (``cor``)
SUMS32_KINDS = (Q4_K, Q5_K)  # and their 32-value sums (``aux``)
_MINS_KINDS = SUMS16_KINDS + SUMS32_KINDS
GEMM_MIN_ROWS = 8  # activation rows from which a product runs here
_ROWS_AT_ONCE = 4  # activation rows per pass over a block (they share the weight loads)


# -- the kernels -----------------------------------------------------------------------------

class _Spec(NamedTuple):
    """How the GEMM runs one weight type."""

    layout: Layout
    pack: object  # (g, rows, off, out): one block of 8 rows into the buffer
    # (g, blk, acts, starts, j) -> per activation row, its <16 x i32> lane vector j
    isums: object
    values: int  # values per block
    lanes: int  # <16 x i32> lane vectors per activation row (its float accumulators)
    starts: int  # <16 x i32> lane starts per block in the buffer's ``extra`` (0: none)
    d16: list[int]  # weight row of float lane i
    even: list[int]  # rows 0..7's even lanes, then odd lanes, of the summed float lanes
    odd: list[int]
    offset: object = None  # (g, blk, act, b, dab, term) -> term: the mins' term
    # weight groups a pass can take (``isums`` then takes lists of blocks and their starts
    # and gives a list of results per block): 2 share each activation broadcast between
    # two groups' ``vpdpbusd``s, where the loads bound the loop
    groups: int = 1


_TYPES = {Q4_K: _Spec(kq.L4, kq.pack_q4k, kq.isums_q4k, 256, 1, 0, *PAIRED, kq.offset_k4),
          Q6_K: _Spec(kq.L6, kq.pack_q6k, kq.isums_q6k, 256, 1, 1, *PAIRED),
          Q5_K: _Spec(kq.L5, kq.pack_q5k, kq.isums_q5k, 256, 1, 0, *PLAIN,
                      partial(kq.offset_k4, lay=kq.L5), 2),
          Q3_K: _Spec(kq.L3, kq.pack_q3k, kq.isums_q3k, 256, 4, 4, *PAIRED),
          Q2_K: _Spec(kq.L2, kq.pack_q2k, kq.isums_q2k, 256, 4, 0, *PAIRED, kq.offset_q2k),
          Q8_0: _Spec(sp.L8, sp.pack_q80, sp.isums_q80, 32, 4, 4, *PLAIN),
          Q4_0: _Spec(sp.L4, sp.pack_q40, sp.isums_q80, 32, 4, 4, *PLAIN),
          Q5_0: _Spec(sp.L5, sp.pack_q50, sp.isums_q80, 32, 4, 4, *PLAIN),
          IQ4_NL: _Spec(sp.LN, sp.pack_iq4nl, sp.isums_q80, 32, 4, 4, *PLAIN),
          IQ4_XS: _Spec(sp.LX, sp.pack_iq4xs, sp.isums_iq4xs, 256, 1, 1, *PLAIN, None, 2)}
if not WIDE_GEMM:  # the same lanes (so offsets and sums), 256-bit steps and buffer
    for _t, _fields in ym.TYPES.items():
        _TYPES[_t] = _TYPES[_t]._replace(**_fields)
_ACT_BYTES = 64 if WIDE_GEMM else 32  # an activation row's 8 bytes, broadcast to this


def _switch(g: VectorIR, kind, emit, groups: int = 1) -> None:  # noqa: ANN001
    """``emit(spec)`` for the type ``kind`` (an i64) names, one IR case per type of
    GEMM_KINDS whose pass takes ``groups`` weight groups (``_Spec.groups``); an id without
    one does nothing (``gemm_rows`` takes only GEMM_KINDS)."""
    bld = g.b
    done = bld.append_basic_block("gemm.done")
    sw = bld.switch(kind, done)
    for t, spec in _TYPES.items():
        if t not in GEMM_KINDS or groups > spec.groups:  # not on this CPU (its 512-bit
            continue  # steps need AVX512-VNNI), or its pass takes fewer groups
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
    """The block's lane starts ``spec.isums`` takes (<16 x i32> each; none if unsigned)."""
    return [load(g, blk, spec.layout.extra + 64 * j, vec(I32, 16))
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


def _emit_gemm(g: VectorIR, spec: _Spec, bufs, qas, das, auxs, sums, i0, outs, c0,  # noqa: ANN001, PLR0913
               na: int, groups: int) -> None:
    """``_make_gemm``'s loop over the blocks for one weight type: ``groups`` buffered groups
    of 8 weight rows (``bufs``' rows ``k nb + b``: group k's block b) times ``na``
    activation rows."""
    bld = g.b
    nb = bld.sdiv(cgutils.unpack_tuple(bld, bufs.shape)[0], g.c64(groups))
    ii = [bld.add(i0, g.c64(a)) for a in range(na)]
    qp = [row_pointer(bld, qas, i, I8) for i in ii]
    dp = [row_pointer(bld, das, i, F32) for i in ii]
    rows = [ActRow(row_pointer(bld, auxs, i, F32), row_pointer(bld, sums, i, I8)) for i in ii]
    zero = ir.Constant(vec(F32, 16), [0.0] * 16)
    facc = [[[cgutils.alloca_once_value(bld, zero) for _ in range(spec.lanes)]
             for _ in range(na)] for _ in range(groups)]
    term = [[cgutils.alloca_once_value(bld, ir.Constant(vec(F32, 8), [0.0] * 8))
             for _ in range(na)] for _ in range(groups)]
    with cgutils.for_range(bld, nb) as loop:
        b = loop.index
        blks = [row_pointer(bld, bufs, bld.add(b, bld.mul(nb, g.c64(k))), I8)
                for k in range(groups)]
        acts = [partial(bcast_at, g, q, bld.mul(b, g.c64(spec.values)), n=_ACT_BYTES)
                for q in qp]
        das = [g.load_f32(p, b) for p in dp]
        _emit_block(g, spec, blks, acts, das, facc)
        for k, blk in enumerate(blks):
            for a in range(na):
                if spec.offset is not None:
                    bld.store(spec.offset(g, blk, rows[a], b, das[a], bld.load(term[k][a])),
                              term[k][a])
    for k in range(groups):
        for a in range(na):
            res = _row_sums(g, spec, facc[k][a], bld.load(term[k][a]))
            for n in range(GROUP):
                g.store_2d(outs, ii[a], bld.add(c0, g.c64(GROUP * k + n)),
                           bld.extract_element(res, ir.Constant(I32, n)))


def _emit_block(g: VectorIR, spec: _Spec, blks: list, acts: list, das: list,  # noqa: PLR0913
                facc: list) -> None:
    """One block of each buffered group into its float lanes ``facc[k][a][j]``: per lane
    vector j, ``float(isum) * (d * d_act)`` added (fma) for each group k and activation
    row a (``das``: the rows' d_act)."""
    bld = g.b
    starts = [_block_starts(g, spec, blk) for blk in blks]

    def scales() -> list:  # d * d_act, as every path
        out = []
        for blk in blks:
            dw8 = load(g, blk, spec.layout.d, vec(F32, 8))
            dw16 = bld.shuffle_vector(dw8, dw8, ir.Constant(vec(I32, 16), spec.d16))
            out.append([bld.fmul(dw16, splat(g, da, 16)) for da in das])
        return out

    # (after the integer steps where they would be held in registers over too many: the
    # 256-bit variant's, and more than one group's)
    dd = scales() if WIDE_GEMM and len(blks) == 1 else None
    for j in range(spec.lanes):  # one lane vector at a time: few registers live
        vs = (spec.isums(g, blks, acts, starts, j) if spec.groups > 1
              else [spec.isums(g, blks[0], acts, starts[0], j)])
        dd = dd or scales()
        for k, row in enumerate(vs):
            for a, v in enumerate(row):
                f = bld.sitofp(v, vec(F32, 16))
                bld.store(g.call("llvm.fma.v16f32", vec(F32, 16), [f, dd[k][a],
                                                                   bld.load(facc[k][a][j])]),
                          facc[k][a][j])


def _make_gemm(na: int, groups: int = 1):  # noqa: ANN202 - a numba intrinsic
    """Intrinsic ``gemm(kind, buf, qa, da, aux, sums, i0, out, c0)``: ``out[i0 + a, c0 +
    n]`` for ``a < na``, ``n < 8 groups``: the ``groups`` buffered groups of 8 weight rows
    of type ``kind`` (``_pack``; group k in ``buf``'s rows k nb..(k + 1) nb - 1) times
    activation rows ``qa`` (Q8_K or Q8_0; the bytes plus 128, ``ActivationSet.qu``, for
    PLUS_128_KINDS), ``sums`` their i16 sums the mins multiply (``_sums_words``; else
    unread). Types whose pass takes fewer groups (``_Spec.groups``) are not compiled in."""

    @intrinsic
    def gemm(typingctx, kind, buf, qa, da, aux, sums, i0, out, c0):  # noqa: ANN001, ANN202, ARG001, PLR0913
        sig = types.int64(kind, buf, qa, da, aux, sums, i0, out, c0)

        def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
            kind_, *arrays = array_args(context, builder, signature, args)
            g = VectorIR(builder, None)
            _switch(g, kind_, lambda spec: _emit_gemm(g, spec, *arrays, na, groups),
                    groups)
            return context.get_constant(types.int64, 0)

        return sig, codegen

    return gemm


_gemm_n, _gemm_1 = _make_gemm(_ROWS_AT_ONCE), _make_gemm(1)
_gemm_n2, _gemm_12 = _make_gemm(_ROWS_AT_ONCE, 2), _make_gemm(1, 2)
PAIR_KINDS = tuple(t for t in GEMM_KINDS if t in _TYPES and _TYPES[t].groups > 1) or (-1,)
# each type's buffer block and weight block, by type id (constant arrays for numba)
_BLOCK_BYTES = np.zeros(64, np.int64)
_TYPE_SIZE = np.ones(64, np.int64)
for _t, _spec in _TYPES.items():
    _BLOCK_BYTES[_t], _TYPE_SIZE[_t] = _spec.layout.block_bytes, _spec.layout.type_size


@njit(cache=True, nogil=True)
def _words(src, n):  # noqa: ANN001, ANN202
    """``src`` (n, m) integers (int32, or exact in float32) as int16; no rows if not n."""
    if src.shape[0] != n:
        return np.empty((0, 1), np.int16)
    out = np.empty(src.shape, np.int16)
    for i in range(n):
        for j in range(src.shape[1]):
            out[i, j] = np.int16(src[i, j])
    return out


@njit(cache=True, nogil=True)
def _sums_words(kind, aux, cor, n):  # noqa: ANN001, ANN202
    """The activations' sums a type's mins multiply, as int16 (at most 32 * 127), what
    ``vpdpwssd`` takes: Q2_K's 16-value sums (``cor`` of the Q8_K set), Q4_K's and Q5_K's
    32-value sums (``aux``); no rows for the other types or without them."""
    if kind in SUMS16_KINDS:
        return _words(cor, n)
    if kind in SUMS32_KINDS:
        return _words(aux, n)
    return np.empty((0, 1), np.int16)


@njit(cache=True, nogil=True)
def _aligned_blocks(n, size):  # noqa: ANN001, ANN202
    """An (n, size) uint8 buffer whose data starts on a cache line (numba's arrays start
    on 32 bytes at times): with ``size`` a multiple of 64, every block's vectors do."""
    raw = np.empty(n * size + 64, np.uint8)
    off = (64 - raw.ctypes.data % 64) % 64
    return raw[off:off + n * size].reshape((n, size))


@njit(cache=True, nogil=True)
def gemm_rows(kind, w, r0, r1, qa, da, aux, cor, qu, tbl, out):  # noqa: ANN001, ANN201
    """The hot loop. Weight rows r0:r1 of ``w`` (R, row_bytes) u8 of type ``kind`` (one of
    GEMM_KINDS) @ activations (n, K) of its type (``ActivationSet``'s arrays: PLUS_128_KINDS
    take ``qu``, the bytes plus 128; Q2_K ``cor``, the 16-value sums) -> out[:, r0:r1] (n,
    R) f32, in groups of 8 rows; returns the first row of the last 1-7 it leaves to the
    caller (r0 when it runs none: ``qu`` or ``cor`` without rows)."""
    n = qa.shape[0]
    acts = qa if kind in _QA_KINDS else qu
    sums = _sums_words(kind, aux, cor, n)
    if acts.shape[0] != n or (kind in _MINS_KINDS and sums.shape[0] != n):
        return r0
    nb = w.shape[1] // _TYPE_SIZE[kind]
    buf = _aligned_blocks((2 if kind in PAIR_KINDS else 1) * nb, _BLOCK_BYTES[kind])
    c = r0
    while kind in PAIR_KINDS and c + 2 * GROUP <= r1:
        _pack(kind, w, c, tbl, buf[:nb])
        _pack(kind, w, c + GROUP, tbl, buf[nb:])
        _gemm_pass(kind, buf, acts, da, aux, sums, out, c, True)
        c += 2 * GROUP
    while c + GROUP <= r1:
        _pack(kind, w, c, tbl, buf[:nb])
        _gemm_pass(kind, buf[:nb], acts, da, aux, sums, out, c, False)
        c += GROUP
    return c


@njit(cache=True, nogil=True, inline="always")
def _gemm_pass(kind, buf, acts, da, aux, sums, out, c, pair):  # noqa: ANN001, ANN202, PLR0913
    """Every activation row times the buffered groups (two if ``pair``) from column c."""
    n = acts.shape[0]
    i = 0
    while i + _ROWS_AT_ONCE <= n:
        if pair:
            _gemm_n2(kind, buf, acts, da, aux, sums, i, out, c)
        else:
            _gemm_n(kind, buf, acts, da, aux, sums, i, out, c)
        i += _ROWS_AT_ONCE
    while i < n:
        if pair:
            _gemm_12(kind, buf, acts, da, aux, sums, i, out, c)
        else:
            _gemm_1(kind, buf, acts, da, aux, sums, i, out, c)
        i += 1
