"""The interleaved GEMM's 256-bit variant (``int_gemm`` on CPUs without AVX512-VNNI: AVX2,
and AVX-VNNI), for Q4_K, Q6_K and the 32-value types Q8_0, Q4_0, Q5_0 and IQ4_NL (at the
end):
the same buffer of 8 weight rows (``gemm_kquants``' blocks, plus each scale group's scales
as words; the 32-value types' without lane starts), the same integers per lane and so the
same numbers as the 512-bit GEMM and the per-row tiles.

A buffered 64-byte vector (8 values of the 8 rows) is two 256-bit halves, rows 0-3 and
rows 4-7. Per activation row:

- ``pmaddubsw`` (AVX2; Q6_K with AVX-VNNI too) of each half's 8 values of 4 rows and the
  activation's 8 bytes broadcast, the words of a scale group added (Q4_K's 32 values:
  unsigned nibbles times activations within 127, at most 8 * 15 * 128 a word; Q6_K's 16
  values: the activations plus 128 times values within -32..31, at most 4 * 255 * 32 =
  32640: no pair or word sum saturates), then ``pmaddwd`` by the group's scale words into
  an even and an odd accumulator (each row's two dwords); a block's two accumulators end
  in one ``phaddd``, which gives the 512-bit GEMM's lane order (``gemm_ir.PAIRED``: in
  128-bit lane L, rows 2L, 2L + 1's even, then odd sums). One scale step per 16 values
  of a row, where ``vpdpbusd``'s 4-value dwords would need one per 8 (``packssdw`` first),
  so Q6_K takes this form on AVX-VNNI as well.
- AVX-VNNI, Q4_K: the 512-bit GEMM's steps on each half: ``vpdpbusd`` accumulated over a
  32-value group, then ``packssdw`` of the even and the odd span's result and ``pmaddwd``
  by the scales in that order (``gemm_ir.scale_index``).

Either way a lane is an exact integer sum of the same products, so the same integer.
"""

from __future__ import annotations

from functools import partial

from llvmlite import ir

from ..gguf.types import GGMLType
from . import gemm_kquants as kq
from . import gemm_spans as sp
from .gemm_ir import Layout, cat, load, pack_starts, scale_index, store
from .vector_ir import I8, I16, I32, VNNI, VectorIR, vec

_ZERO8 = ir.Constant(vec(I32, 8), [0] * 8)


def _words_layout(base: Layout, count: int) -> Layout:
    """``base`` with ``count`` <32 x i16> scale-word vectors after its block (at
    ``base.block_bytes``)."""
    return base._replace(block_bytes=base.block_bytes + 64 * count)


# the scale words: for ``pmaddubsw``, one vector per scale group (word i: row i // 4's
# scale, the row's 4 words of pair sums); for Q4_K's ``vpdpbusd``, one per pair of groups
# ``packssdw`` joins (``scale_index``' order)
L4Y = _words_layout(kq.L4, 4 if VNNI else 8)
L6Y = _words_layout(kq.L6, 16)
W4, W6 = kq.L4.block_bytes, kq.L6.block_bytes


def _group_words(groups: int, grp: int) -> list[int]:
    return [groups * (i // 4) + grp for i in range(32)]


def _store_words(g: VectorIR, sz, signed: bool, idxs: list, out, at: int) -> None:  # noqa: ANN001
    """Each index list of ``idxs`` (32 byte indexes into ``sz``, [row][group]) as <32 x
    i16> words, one after the other from ``at``."""
    bld = g.b
    for k, idx in enumerate(idxs):
        b = bld.shuffle_vector(sz, sz, ir.Constant(vec(I32, 32), idx))
        store(g, (bld.sext if signed else bld.zext)(b, vec(I16, 32)), out, at + 64 * k)


def pack_q4k_y(g: VectorIR, rows: list, off, out) -> None:  # noqa: ANN001
    """``pack_q4k``, then the scale words."""
    kq.pack_q4k(g, rows, off, out)
    sz = load(g, out, kq.L4.scales, vec(I8, 64))
    idxs = ([scale_index(8, 2 * p, 2 * p + 1) for p in range(4)] if VNNI else
            [_group_words(8, s) for s in range(8)])
    _store_words(g, sz, False, idxs, out, W4)


def pack_q6k_y(g: VectorIR, rows: list, off, out) -> None:  # noqa: ANN001
    """``pack_q6k`` with the scale words and the lane starts of these steps."""
    kq.pack_q6k(g, rows, off, out, starts=False)
    sz = kq._scales16(g, out, kq.L6.scales)  # noqa: SLF001 - the same block's scales
    _store_words(g, sz, True, [_group_words(16, s) for s in range(16)], out, W6)
    pack_starts(g, out, isums_q6k_y, 1, kq.L6.extra)


# -- 256-bit steps -----------------------------------------------------------------------

def _half(g: VectorIR, blk, at: int, h: int, t: ir.Type) -> ir.Value:  # noqa: ANN001
    """Half ``h`` (32 bytes) of the 64-byte vector at ``at`` of the buffer block."""
    return load(g, blk, at + 32 * h, vec(t, 32 // (t.width // 8)))


def _act(g: VectorIR, act, v: int) -> ir.Value:  # noqa: ANN001
    """<32 x i8>: an activation row's 8 bytes from value ``v``, 4 times."""
    x = act(v)
    if x.type.count == 32:
        return x
    return g.b.shuffle_vector(x, x, ir.Constant(vec(I32, 32), list(range(32))))


def _madd(g: VectorIR, w16, m16) -> ir.Value:  # noqa: ANN001
    return g.call("llvm.x86.avx2.pmadd.wd", vec(I32, 8), [w16, m16])


def _add(g: VectorIR, acc, x) -> ir.Value:  # noqa: ANN001
    return x if acc is None else g.b.add(acc, x)


def _pack_madd(g: VectorIR, even, odd, sc, acc) -> ir.Value:  # noqa: ANN001
    """``acc + pmaddwd(packssdw(even, odd), sc)`` (<8 x i32>; every dword within int16)."""
    packed = g.call("llvm.x86.avx2.packssdw", vec(I16, 16), [even, odd])
    return _add(g, acc, _madd(g, packed, sc))


def _word_group(g: VectorIR, blk, acts: list, vecs: list, values: list,  # noqa: ANN001
                weights_first: bool) -> list:
    """Per activation row, its two halves' <16 x i16>: the ``pmaddubsw`` pair sums of
    buffer vectors ``vecs`` and its bytes at ``values``, added (the weights the unsigned
    operand if ``weights_first``, else the activations plus 128)."""
    words = [None for _ in acts]
    for v, at in zip(vecs, values, strict=True):
        ws = [_half(g, blk, 64 * v, h, I8) for h in range(2)]
        for a, act in enumerate(acts):
            words[a] = _maddubs_add2(g, words[a], _act(g, act, at), ws, weights_first)
    return words


def _maddubs_add2(g: VectorIR, accs: list | None, x, ws: list, weights_first: bool) -> list:  # noqa: ANN001
    """``accs[h] + pmaddubsw(ws[h], x)`` (or of ``x`` and ``ws[h]``; ``accs`` None: 0) for
    both halves, as inline asm kept in order: as plain IR, LLVM schedules one activation
    row's and half's chain after the other, holding every weight and broadcast for the
    next on the stack."""
    w16 = vec(I16, 16)
    # AT&T order: ``vpmaddubsw signed, unsigned, dest``; x is $n0, the weights $n0 + 1, 2
    n0 = 2 if accs is None else 3
    ops = [(f"${n0 + 1 + h}", f"${n0}")[:: 1 if weights_first else -1] for h in range(2)]
    if accs is None:
        fnty = ir.FunctionType(ir.LiteralStructType([w16] * 2), [vec(I8, 32)] * 3)
        code = "\n\t".join(f"vpmaddubsw {s}, {u}, ${h}" for h, (u, s) in enumerate(ops))
        res = g.b.asm(fnty, code, "=&x,=x,x,x,x", [x, *ws], True, "maddubs2")
    else:
        fnty = ir.FunctionType(ir.LiteralStructType([w16] * 3),
                               [vec(I8, 32)] * 3 + [w16] * 2)
        code = "\n\t".join(f"vpmaddubsw {s}, {u}, $2\n\tvpaddw $2, ${h}, ${h}"
                             for h, (u, s) in enumerate(ops))
        res = g.b.asm(fnty, code, "=x,=x,=&x,x,x,x,0,1", [x, *ws, *accs], True,
                      "maddubs_add2")
    return [g.b.extract_value(res, h) for h in range(2)]


def _scaled_halves(g: VectorIR, blk, acts: list, groups: list, at) -> list:  # noqa: ANN001
    """Per activation row its two halves (<8 x i32>, ``gemm_ir.PAIRED``'s lanes): each
    group of ``groups`` (parity, buffer vectors, their values' offsets) through
    ``_word_group`` and ``pmaddwd`` by its scale words (``at(group index)``), summed by
    parity, the two parities joined by ``phaddd``."""
    accs = [[None, None] for _ in acts]  # [row][parity]: its two halves
    for k, (par, vecs, values, first) in enumerate(groups):
        words = _word_group(g, blk, acts, vecs, values, first)
        scs = [_half(g, blk, at(k), h, I16) for h in range(2)]
        for a in range(len(acts)):
            accs[a][par] = _madd_add2(g, accs[a][par], words[a], scs)
    return [[g.call("llvm.x86.avx2.phadd.d", vec(I32, 8), [acc[0][h], acc[1][h]])
             for h in range(2)] for acc in accs]


def _madd_add2(g: VectorIR, accs: list | None, words: list, scs: list) -> list:
    """``accs[h] + pmaddwd(words[h], scs[h])`` (``accs`` None: 0) for both halves, as
    ordered inline asm (``_maddubs_add2``)."""
    v32, w16 = vec(I32, 8), vec(I16, 16)
    if accs is None:
        fnty = ir.FunctionType(ir.LiteralStructType([v32] * 2), [w16] * 4)
        code = "vpmaddwd $4, $2, $0\n\tvpmaddwd $5, $3, $1"
        res = g.b.asm(fnty, code, "=&x,=x,x,x,x,x", [*words, *scs], True, "madd2")
    else:
        fnty = ir.FunctionType(ir.LiteralStructType([v32] * 3), [w16] * 4 + [v32] * 2)
        code = ("vpmaddwd $5, $3, $2\n\tvpaddd $2, $0, $0\n\t"
                "vpmaddwd $6, $4, $2\n\tvpaddd $2, $1, $1")
        res = g.b.asm(fnty, code, "=x,=x,=&x,x,x,x,x,0,1", [*words, *scs, *accs], True,
                      "madd_add2")
    return [g.b.extract_value(res, h) for h in range(2)]


def _join(g: VectorIR, halves: list, starts: list) -> list:
    """Per activation row its <16 x i32> from its two halves (plus ``starts[0]``)."""
    out = []
    for lo, hi in halves:
        v = cat(g, lo, hi)
        out.append(g.b.add(v, starts[0]) if starts else v)
    return out


# -- Q4_K ----------------------------------------------------------------------------------

def isums_q4k_y(g: VectorIR, blk, acts: list, starts: list, j: int) -> list:  # noqa: ANN001, ARG001
    """``gemm_kquants.isums_q4k`` (the same lanes) in 256-bit steps."""
    if VNNI:
        return _join(g, list(zip(*(_q4k_half_vnni(g, blk, acts, h) for h in range(2)),
                                 strict=True)), [])
    # span 2p + par: buffer vectors 8p + 4 par + q, values 64p + 32 par + 8q
    spans = [(par, [8 * p + 4 * par + q for q in range(4)],
              [64 * p + 32 * par + 8 * q for q in range(4)], True)
             for p in range(4) for par in range(2)]
    return _join(g, _scaled_halves(g, blk, acts, spans, lambda k: W4 + 64 * k), [])


def _q4k_half_vnni(g: VectorIR, blk, acts: list, h: int) -> list:  # noqa: ANN001
    isums = [None] * len(acts)
    for p in range(4):
        sc = _half(g, blk, W4 + 64 * p, h, I16)
        dots = [[_ZERO8, _ZERO8] for _ in acts]
        for q in range(4):  # each row's two dwords: 16 values of one group (< 2**15)
            for par in range(2):
                w = _half(g, blk, 64 * (8 * p + 4 * par + q), h, I8)
                for a, act in enumerate(acts):
                    x = _act(g, act, 64 * p + 32 * par + 8 * q)
                    dots[a][par] = g.dpbusd(dots[a][par], w, x)
        for a in range(len(acts)):
            isums[a] = _pack_madd(g, *dots[a], sc, isums[a])
    return isums


# -- Q6_K ----------------------------------------------------------------------------------

def isums_q6k_y(g: VectorIR, blk, acts: list, starts: list, j: int) -> list:  # noqa: ANN001, ARG001
    """``gemm_kquants.isums_q6k`` (the same lanes, from ``starts[0]``) in 256-bit steps."""
    # group 4p + 2 par + half: buffer vectors 8p + 4 par + q, values 64p + 32 par + 8q
    groups = [(par, [8 * p + 4 * par + q for q in (2 * half, 2 * half + 1)],
               [64 * p + 32 * par + 8 * q for q in (2 * half, 2 * half + 1)], False)
              for p in range(4) for half in range(2) for par in range(2)]
    return _join(g, _scaled_halves(g, blk, acts, groups, lambda k: W6 + 64 * _Q6_GROUP[k]),
                 starts)


# the scale group of ``isums_q6k_y``'s k-th group (its order: p, half, parity)
_Q6_GROUP = [4 * p + 2 * par + half for p in range(4) for half in range(2) for par in range(2)]


# -- the 32-value types: Q8_0, Q4_0, Q5_0, IQ4_NL -------------------------------------------

def isums_q80_y(g: VectorIR, blk, acts: list, starts: list, j: int) -> list:  # noqa: ANN001, ARG001
    """``gemm_spans.isums_q80``'s lanes (the same integers) in 256-bit steps from the signed
    activations (no lane starts): ``VectorIR.span_dot`` on each half, ggml's own steps (the
    weights' signs moved to the activations, ``pmaddubsw`` of the magnitudes, ``pmaddwd``
    by 1; ``vpdpbusd`` with AVX-VNNI: pair sums within 2 * 128 * 127, no saturation)."""
    ws = [_half(g, blk, 64 * j, h, I8) for h in range(2)]
    mags = [g.magnitude(w) for w in ws]
    return [cat(g, *(g.span_dot(w, m, _act(g, act, 8 * j), None, True)
                     for w, m in zip(ws, mags, strict=True))) for act in acts]


# type: the fields of ``int_gemm``'s spec these steps replace (the 32-value types read the
# signed activations, ``SIGNED_ACTS``: no lane starts)
TYPES = {int(GGMLType.Q4_K): dict(layout=L4Y, pack=pack_q4k_y, isums=isums_q4k_y),
         int(GGMLType.Q6_K): dict(layout=L6Y, pack=pack_q6k_y, isums=isums_q6k_y)}
for _t, _pack in ((GGMLType.Q8_0, sp.pack_q80), (GGMLType.Q4_0, sp.pack_q40),
                  (GGMLType.Q5_0, sp.pack_q50), (GGMLType.IQ4_NL, sp.pack_iq4nl)):
    TYPES[int(_t)] = dict(pack=partial(_pack, starts=False), isums=isums_q80_y, starts=0)
SIGNED_ACTS = tuple(int(t) for t in (GGMLType.Q8_0, GGMLType.Q4_0, GGMLType.Q5_0,
                                     GGMLType.IQ4_NL))
