"""IR pieces the interleaved GEMM's types share (``int_gemm``): where a buffered block's
parts lie, the 8-row loads and broadcasts, ``vpdpbusd`` on 512 bits, the lane layouts and
the signed types' lane starts.
"""

from __future__ import annotations

from typing import NamedTuple

from llvmlite import ir

from ..gguf.types import GGMLType
from .formats import FORMATS
from .vector_ir import F32, I8, I32, I64, VectorIR, vec

GROUP = 8  # weight rows unpacked together


class Layout(NamedTuple):
    """Where a block's parts lie in the buffer (byte offsets) and in the weights."""

    block_bytes: int
    type_size: int
    scales: int  # the rows' integer scales (bytes [row][group]; IQ4_XS: <16 x i32> a span)
    d: int  # the rows' d, float [row]
    # Q4_K, Q2_K: dmin float [row] then the mins; the signed types: <16 x i32> lane starts
    extra: int


def layout(t: GGMLType, scale_bytes: int, extra_bytes: int, values: int = 2048) -> Layout:
    """A buffer block: ``values`` bytes of values (256, 8 rows), the scales, d, the rest,
    padded to whole cache lines (in a 64-byte aligned buffer no vector load of a block
    splits across two lines: a split load costs two)."""
    used = values + scale_bytes + 32 + extra_bytes
    return Layout(-(-used // 64) * 64, FORMATS[t].type_size, values, values + scale_bytes,
                  values + scale_bytes + 32)


# the float lanes' weight rows (``d16``) and the rows' lanes that ggml's horizontal sum
# adds last (``even``, ``odd``), for the two layouts of a <16 x float> accumulator:
# ``pack_madd``'s (lane 4L + 2 src + t: row 2L + t, its source ``src``) and ``vpdpbusd``'s
# (lane 2n + e: row n, its half e of the 8 values)
EVEN = [0, 1, 4, 5, 8, 9, 12, 13]
ODD = [2, 3, 6, 7, 10, 11, 14, 15]
PAIRED = ([2 * (i // 4) + i % 2 for i in range(16)], EVEN, ODD)
PLAIN = ([i // 2 for i in range(16)], list(range(0, 16, 2)), list(range(1, 16, 2)))


def ptr(g: VectorIR, base, off, t: ir.Type) -> ir.Value:  # noqa: ANN001
    return g.b.bitcast(g.at(base, off if isinstance(off, ir.Value) else g.c64(off)),
                       t.as_pointer())


def cat(g: VectorIR, a, b) -> ir.Value:  # noqa: ANN001
    """Vectors ``a`` and ``b`` (of one type) side by side."""
    n = 2 * a.type.count
    return g.b.shuffle_vector(a, b, ir.Constant(vec(I32, n), list(range(n))))


def qwords(g: VectorIR, rows: list, off) -> list:  # noqa: ANN001
    """Four <64 x i8>: vector j holds bytes 8j..8j+7 of the 32 at ``off`` of each of the 8
    rows (row n in bytes 8n..8n+7)."""
    bld = g.b
    q = [bld.load(ptr(g, r, off, vec(I64, 4)), align=1) for r in rows]
    pairs = [cat(g, q[2 * m], q[2 * m + 1]) for m in range(4)]
    out = []
    for j in range(4):
        idx = ir.Constant(vec(I32, 4), [j, 4 + j, 8 + j, 12 + j])
        v = cat(g, bld.shuffle_vector(pairs[0], pairs[1], idx),
                bld.shuffle_vector(pairs[2], pairs[3], idx))
        out.append(bld.bitcast(v, vec(I8, 64)))
    return out


def row_qwords(g: VectorIR, rows: list, off) -> list:  # noqa: ANN001
    """Two <64 x i8>: vector h holds bytes 8h..8h+7 of the 16 at ``off`` of each of the 8
    rows (row n in bytes 8n..8n+7)."""
    bld = g.b
    qs = [bld.load(ptr(g, r, off, vec(I64, 2)), align=1) for r in rows]
    qs = [cat(g, qs[2 * m], qs[2 * m + 1]) for m in range(4)]
    qs = cat(g, cat(g, qs[0], qs[1]), cat(g, qs[2], qs[3]))  # <16 x i64>: row n, 2 qwords
    return [bld.bitcast(bld.shuffle_vector(qs, qs, ir.Constant(
        vec(I32, 8), [2 * n + h for n in range(8)])), vec(I8, 64)) for h in range(2)]


def row_values(g: VectorIR, rows: list, at, t: ir.IntType) -> ir.Value:  # noqa: ANN001
    """<8 x t>: the ``t`` at byte ``at`` of each of the 8 rows."""
    v = ir.Constant(vec(t, 8), ir.Undefined)
    for n, r in enumerate(rows):
        v = g.b.insert_element(v, g.b.load(ptr(g, r, at, t), align=1), ir.Constant(I32, n))
    return v


def bcast8(g: VectorIR, p, off, n: int = 64) -> ir.Value:  # noqa: ANN001
    """<n x i8>: the 8 bytes at ``p + off``, n / 8 times."""
    bld = g.b
    x = bld.load(ptr(g, p, off, I64), align=1)
    v = bld.insert_element(ir.Constant(vec(I64, n // 8), ir.Undefined), x, ir.Constant(I32, 0))
    v = bld.shuffle_vector(v, v, ir.Constant(vec(I32, n // 8), [0] * (n // 8)))
    return bld.bitcast(v, vec(I8, n))


def bcast_at(g: VectorIR, p, base, v: int, n: int = 64) -> ir.Value:  # noqa: ANN001
    """``bcast8`` at byte ``base + v``: an activation row's 8 values from value v of a block."""
    return bcast8(g, p, g.b.add(base, g.c64(v)), n)


def dpbusd(g: VectorIR, acc, u8, s8) -> ir.Value:  # noqa: ANN001
    v32 = vec(I32, 16)
    return g.call("llvm.x86.avx512.vpdpbusd.512", v32,
                  [acc, g.b.bitcast(u8, v32), g.b.bitcast(s8, v32)])


def splat(g: VectorIR, x, n: int) -> ir.Value:  # noqa: ANN001
    v = g.b.insert_element(ir.Constant(vec(F32, n), ir.Undefined), x, ir.Constant(I32, 0))
    return g.b.shuffle_vector(v, v, ir.Constant(vec(I32, n), [0] * n))


def store(g: VectorIR, v, base, off: int) -> None:  # noqa: ANN001
    g.b.store(v, ptr(g, base, off, v.type), align=1)


def load(g: VectorIR, base, off: int, t: ir.Type) -> ir.Value:  # noqa: ANN001
    return g.b.load(ptr(g, base, off, t), align=1)


def pack_d(g: VectorIR, rows: list, off, field: int, out, at: int) -> None:  # noqa: ANN001
    """The 8 rows' fp16 at byte ``field`` of the block at ``off``, as <8 x float> at ``at``."""
    v = ir.Constant(vec(F32, 8), [0.0] * 8)
    for n, r in enumerate(rows):
        v = g.b.insert_element(v, g.f16(r, g.b.add(off, g.c64(field))), ir.Constant(I32, n))
    store(g, v, out, at)


def scale_index(groups: int, even: int, odd: int) -> list[int]:
    """pack_madd's scale words (in 128-bit lane L, weight rows 2L, 2L + 1: each row's two
    words of its first source's group ``even``, then of its second's, ``odd``), as indexes
    into the buffer's [row][group] bytes (``groups`` a row)."""
    return [groups * (2 * (i // 8) + (i // 2) % 2) + (odd if i % 8 >= 4 else even)
            for i in range(32)]


def pack_starts(g: VectorIR, out, isums, count: int, at: int) -> None:  # noqa: ANN001
    """The signed types' lane starts, ``count`` <16 x i32> at ``at`` of the buffer block
    ``out``: the activations come plus 128 (unsigned), so each lane starts from -128 times
    the sum its weights make, the same steps (``isums``) with every activation byte 1."""
    ones = g.splat8(1, 64)
    zero = ir.Constant(vec(I32, 16), [0] * 16)
    for j in range(count):
        v = isums(g, out, [lambda _v: ones], [zero] * count, j)[0]
        store(g, g.b.mul(v, ir.Constant(vec(I32, 16), [-128] * 16)), out, at + 64 * j)


class ActRow(NamedTuple):
    """One activation row's pointers the offset terms read."""

    aux: ir.Value  # f32: Q8_K's 32-value sums (Q4_K's mins)
    # i8 pointer to its i16 16-value sums (Q2_K's mins) or 32-value sums (Q4_K's, Q5_K's;
    # ``gemm_rows``)
    sums: ir.Value


def dots_mul_add(g: VectorIR, acc, u8s: list, s8s: list, y) -> ir.Value:  # noqa: ANN001
    """<16 x i32> ``acc + (sum of vpdpbusd(0, u8s[i], s8s[i])) * y`` (``vpmulld``,
    ``vpaddd``), as inline asm the compiler cannot split: as plain IR, LLVM hoists every
    ``vpdpbusd`` chain of a block (they start from 0, independent) above the steps that
    consume them, which spills most of them to the stack."""
    n = len(u8s)
    v32 = vec(I32, 16)
    fnty = ir.FunctionType(ir.LiteralStructType([v32, v32]), [v32] * (2 * n + 2))
    code = "\n\t".join(["vpxord $1, $1, $1"]
                        + [f"vpdpbusd ${2 + n + i}, ${2 + i}, $1" for i in range(n)]
                        + [f"vpmulld ${2 + 2 * n}, $1, $1", "vpaddd $1, $0, $0"])
    args = [g.b.bitcast(x, v32) for x in (*u8s, *s8s, y)]
    cons = ",".join(["=v", "=&v"] + ["v"] * (2 * n + 1) + ["0"])
    res = g.b.asm(fnty, code, cons, [*args, acc], False, "dots_mul_add")
    return g.b.extract_value(res, 0)


def fold_rows(g: VectorIR, v) -> ir.Value:  # noqa: ANN001
    """<16 x i32>: dword 2n ``v``'s 2n + 2n + 1 (row n's two halves), 2n + 1 zero."""
    bld = g.b
    zero = ir.Constant(vec(I32, 16), [0] * 16)
    lo, hi = (bld.shuffle_vector(v, zero, ir.Constant(vec(I32, 16), [
        (i + e if i % 2 == 0 else 16) for i in range(16)])) for e in (0, 1))
    return bld.add(lo, hi)


def one_lane_isums(g: VectorIR, blks: list, acts: list, starts: list, scales: int,  # noqa: ANN001, PLR0913
                   unsigned_weights: bool) -> list:
    """Per buffered block of ``blks`` (8 weight rows each; ``starts`` its lane start), per
    activation row (``acts[a](value)``: its 8 bytes from there, broadcast), the one
    <16 x i32> lane vector of a ``KernelType.block_lane`` type: dword 2n row n's whole
    scaled integer dot, 2n + 1 zero. Span s's values are buffer vectors 4s..4s+3, its
    scales <16 x i32> at ``scales + 64 s`` (dword 2n + e row n's); its 4 ``vpdpbusd`` (8
    values of the 8 rows each) go into one sum, which the scales multiply once
    (``dots_mul_add``), from the start; row n's two halves are added at the end
    (``fold_rows``: a folded start folds to itself). The weights are ``vpdpbusd``'s
    unsigned operand if ``unsigned_weights``, else the activations (plus 128) are. The
    blocks share each activation broadcast (loaded once a span for all of them)."""
    isums = [[st for _ in acts] for st in starts]
    for s in range(8):
        scs = [load(g, blk, scales + 64 * s, vec(I32, 16)) for blk in blks]
        wss = [[load(g, blk, 64 * (4 * s + q), vec(I8, 64)) for q in range(4)] for blk in blks]
        for a, act in enumerate(acts):
            xs = [act(32 * s + 8 * q) for q in range(4)]
            for k, (ws, sc) in enumerate(zip(wss, scs, strict=True)):
                u8, s8 = (ws, xs) if unsigned_weights else (xs, ws)
                isums[k][a] = dots_mul_add(g, isums[k][a], u8, s8, sc)
    return [[fold_rows(g, v) for v in row] for row in isums]
