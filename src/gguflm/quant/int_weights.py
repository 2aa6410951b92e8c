"""The weight side of an integer product, as LLVM IR built from each type's declaration
(``kerneltypes.KernelType``): one weight block unpacked into the values of its 32-value
spans (<32 x i8>, plane by plane as ``kerneltypes.Plane`` describes them), the integer
group scales, the block's float scale and its offset term. ``int_tiles`` multiplies them
with the activations.
"""

from __future__ import annotations

from typing import NamedTuple

from llvmlite import ir

from .kerneltypes import KERNEL_TYPES, KernelType, Plane
from .vector_ir import E8M0_AT, F32, I8, I16, I32, I64, SIMD, VNNI, WIDE, VectorIR, vec


class SpanScales(NamedTuple):
    """The integer scales of one span: ``scales`` (<16 x i16>, the block's), lane
    ``first`` for values 0-15 and ``second`` for 16-31; ``bytes`` the same scales as
    bytes where they are unsigned (Q2_K, Q4_K, Q5_K), which ``scale_words`` spreads to
    words in one byte shuffle, else None."""

    scales: ir.Value
    first: int
    second: int
    # <16 x i8>; on x86 <32 x i8>, the 16 in both 128-bit halves (``vpshufb``'s tables)
    bytes: ir.Value | None = None


class Span(NamedTuple):
    """32 weight values of a block, as ``VectorIR.span_dot`` takes them."""

    values: ir.Value  # <32 x i8>, the bias taken off (or the shifted values)
    magnitudes: ir.Value  # |values| where the type is signed, else ``values``
    scales: SpanScales | None


class OffsetTerm(NamedTuple):
    """What a block adds besides its integer dot: ``m * s_act`` (kind "m": Q4_1/Q5_1,
    with the activations' Q8_1 block sum), ``- d_act * dmin * sum(mins * 32-sums)``
    (kind "dmin": Q4_K/Q5_K, the 32-sums the activations' ``aux``) or ``- d_act * dmin *
    sum(mins * 16-sums)`` (kind "dmin16": Q2_K, the 16-sums the activations' ``cor``:
    ``min_sums``)."""

    kind: str
    factor: ir.Value  # m or dmin, float
    # "dmin": the 8 integer mins as <8 x float>; "dmin16": the 16 as <16 x i16>
    mins: ir.Value | None = None


class Block(NamedTuple):
    spans: list[Span]
    d: ir.Value  # the block's float scale
    offset: OffsetTerm | None


def signed(k: KernelType) -> bool:
    """Whether the type's values can be negative (a bias, whole signed bytes, or a value
    table with negative entries)."""
    return bool(k.bias) or any(p.width == 8 for p in k.planes) or min(k.table, default=0) < 0


def vnni_offset(k: KernelType) -> int:
    """What makes type ``k``'s values unsigned for ``vpdpbusd`` (its bias; 128 for whole
    signed bytes), where the CPU has VNNI and the type has no integer scales; else 0 (the
    sign step stays). ``sum((w + o) a) - o sum(a)`` is the same integer as ``sum(w a)``.
    A signed table's entries are int8 (``kerneltypes._check``) like whole signed bytes, so
    the same 128 (the top bit flipped) makes them unsigned; it is also what Q8_0 takes,
    so gpt-oss's MXFP4 experts and Q8_0 layers share one set of lane corrections."""
    if not VNNI or k.scales:
        return 0
    if k.bias:
        return k.bias
    return 128 if signed(k) else 0


def max_magnitude(k: KernelType) -> int:
    """The largest |value| a block of type ``k`` can hold (before its scales)."""
    if k.table:
        return max(abs(v) for v in k.table)
    top = sum(((1 << p.width) - 1) << p.shift for p in k.planes)
    return max(top - k.bias, k.bias)


def quad_words(k: KernelType) -> bool:
    """Whether type ``k`` takes ``int_tiles._scaled_dot`` (integer scales, and sums of 4
    products that stay within int16 for ``packssdw``, even with the activations plus 128:
    |value| <= 32). IQ4_XS's values reach 127: its spans take ggml's own steps instead
    (``VectorIR.span_dot``: pair sums, then ``pmaddwd`` by the span's scale)."""
    return bool(k.scales) and 4 * 255 * max_magnitude(k) < 1 << 15


def row_bias(k: KernelType) -> int:
    """The bias that type ``k``'s tiles of one activation row (decoding's 4x1, the 1x1
    tails) leave on its values, which are then unsigned (no sign step: ``int_tiles``'
    shift "u"), each lane started from ``-bias`` times its 4 activations' sum, worked out
    once per block and activation row for all the tile's weight rows: the biased types of
    ``quad_words`` (Q3_K, Q6_K) on x86; else 0 (portable IR has no sign step to skip,
    and the lane sums would cost it multiplies)."""
    return k.bias if quad_words(k) and SIMD != "generic" else 0


def wide(k: KernelType) -> bool:
    """Whether type ``k``'s lanes tiles take the 512-bit block loop (``WIDE``; the types
    of ``quad_words``: the others' spans have a float step or a ``pmaddwd`` each)."""
    return WIDE and quad_words(k)


def wide_plus_128(k: KernelType) -> bool:
    """Whether that loop multiplies the activations plus 128 (``ActivationSet.qu``) by the
    signed weights: AVX-512 has no ``vpsignb`` for the sign step."""
    return wide(k) and signed(k)


def _emit_plane(g: VectorIR, k: KernelType, p: Plane, row, off, span: int) -> ir.Value:  # noqa: ANN001
    """<32 x i8>: plane ``p`` of values ``32 * span`` .. ``+ 31`` of the block at ``row +
    off``, already shifted into place. Three shapes cover every declared plane: whole bytes,
    one 32-byte run (Q4_K/Q5_K/Q6_K: a load, a shift, a mask), and the two cases of the
    32-value types (16 bytes of nibbles; a 32-bit field of one bit per value)."""
    bld = g.b
    e0 = 32 * span
    foff = k.format[p.field].offset
    if p.width == 8:
        return g.vload(row, bld.add(off, g.c64(foff + e0)), 32)
    if p.group == 1 and p.width == 1:
        word = bld.bitcast(g.at(row, bld.add(off, g.c64(foff + e0 // 8))), I32.as_pointer())
        return g.bits32(bld.load(word, align=1), p.shift)
    per_set = p.group * 8 // p.width  # values per run of ``group`` bytes
    s, within = divmod(e0, per_set)
    plane, byte0 = divmod(within, p.group)
    at = bld.add(off, g.c64(foff + s * p.group + byte0))
    if p.group == 16 and p.width == 4 and plane == 0 and byte0 == 0:
        v = g.nibbles(row, at)
    elif p.group >= 32 and byte0 + 32 <= p.group:
        v = g.vload(row, at, 32)
        if plane or p.shift:  # a shift and a mask, in one step where the CPU has one
            return g.byte_bits(v, plane * p.width, p.width, p.shift)
        if p.width < 8:
            v = bld.and_(v, g.splat8((1 << p.width) - 1, 32))
    else:
        raise NotImplementedError(f"{k.type.ggml_name}: no IR for plane {p}")
    if p.shift:
        v = bld.shl(v, g.splat8(p.shift, 32))
    return v


def _lookup(g: VectorIR, idx: ir.Value, table: tuple[int, ...]) -> ir.Value:
    """<32 x i8>: ``table[idx]`` for 4-bit indexes ``idx``. On x86 one ``vpshufb`` (the
    16 entries in both 128-bit halves; indexes below 16 never set the zeroing bit), as
    ggml's vec_dot does; elsewhere a chain of compares and selects, one per entry."""
    bld = g.b
    if SIMD != "generic":
        tbl = ir.Constant(vec(I8, 32), list(table) * 2)
        return g.call("llvm.x86.avx2.pshuf.b", vec(I8, 32), [tbl, idx])
    v = g.splat8(table[0], 32)
    for i, t in enumerate(table[1:], 1):
        v = bld.select(bld.icmp_unsigned("==", idx, g.splat8(i, 32)), g.splat8(t, 32), v)
    return v


def _emittable(k: KernelType) -> bool:
    """Whether ``_emit_plane`` has a shape for every plane of ``k`` (checked at import)."""
    for p in k.planes:
        if p.width == 8 or (p.group == 1 and p.width == 1):
            continue
        per_set = p.group * 8 // p.width
        for e0 in range(0, k.block_size, 32):
            plane, byte0 = divmod(e0 % per_set, p.group)
            if not ((p.group == 16 and p.width == 4 and plane == 0 and byte0 == 0)
                    or (p.group >= 32 and byte0 + 32 <= p.group)):
                return False
    return True


# the builder and the table must agree: every declared type gets a block loop, or none loads
_UNBUILDABLE = [k.type.ggml_name for k in KERNEL_TYPES.values() if not _emittable(k)]
if _UNBUILDABLE:
    raise ImportError(f"kernels: no IR for the declared planes of {', '.join(_UNBUILDABLE)}")


def _k_scales(g: VectorIR, row, at):  # noqa: ANN001, ANN202
    """Q4_K/Q5_K's 8 six-bit scales and 8 mins (ggml get_scale_min_k4) from the 12 bytes at
    ``row + at`` as <16 x i8> (scales in lanes 0-7, mins in 8-15), unpacked with word-wide
    masks as ggml's x86 code does, the four words at once in one vector (one load; scalar
    steps and inserts took a fifth of a Q4_K decoding block's instructions). The load
    starts 4 bytes before the scales (the block's ``d`` and ``dmin``: inside the block)."""
    u = g.b.bitcast(g.vload(row, g.b.sub(at, g.c64(4)), 16), vec(I32, 4))
    return _k_scales_words(g, u)


def _k_scales_words(g: VectorIR, u: ir.Value) -> ir.Value:
    """``_k_scales`` of n blocks at once: ``u`` <4n x i32>, each block's 16 bytes from 4
    before its scales (``[d|dmin, u0, u1, u2]``) -> <16n x i8>, block j's scales and mins
    in bytes 16 j .. 16 j + 15."""
    bld = g.b
    n = u.type.count // 4

    def c(*xs: int) -> ir.Constant:
        return ir.Constant(vec(I32, 4 * n), list(xs) * n)

    def per_block(idx: list[int]) -> ir.Value:
        return g.lanes(u, [4 * j + i for j in range(n) for i in idx])

    # lanes [s_lo, s_hi, m_lo, m_hi]: u0 & 3F, (u2 & 0F) | (u0 >> 6 & 03) << 4,
    # u1 & 3F, (u2 >> 4 & 0F) | (u1 >> 6 & 03) << 4 (each byte its own scale or min)
    low = bld.and_(bld.lshr(per_block([1, 3, 2, 3]), c(0, 0, 0, 4)),
                   c(0x3F3F3F3F, 0x0F0F0F0F, 0x3F3F3F3F, 0x0F0F0F0F))
    top = bld.and_(bld.lshr(per_block([1, 1, 2, 2]), c(6, 6, 6, 6)),
                   c(0, 0x03030303, 0, 0x03030303))
    return bld.bitcast(bld.or_(low, bld.shl(top, c(4, 4, 4, 4))), vec(I8, 16 * n))


class QuadScales(NamedTuple):
    """Four Q4_K/Q5_K blocks' scales, unpacked together (``quad_k_scales``)."""

    bytes: ir.Value  # <64 x i8>: block j's scales and mins in bytes 16 j .. 16 j + 15
    dd: ir.Value  # <8 x float>: d_0, dmin_0, d_1, dmin_1, ...

    def row(self, g: VectorIR, j: int) -> tuple:
        """Block j's (<16 x i8> scales and mins, d, dmin)."""
        b = g.b
        return (g.lanes(self.bytes, [16 * j + i for i in range(16)]),
                b.extract_element(self.dd, ir.Constant(I32, 2 * j)),
                b.extract_element(self.dd, ir.Constant(I32, 2 * j + 1)))


def quad_k_scales(g: VectorIR, k: KernelType, rows: list, off) -> QuadScales:  # noqa: ANN001
    """The scales, mins, ``d`` and ``dmin`` of the blocks at byte ``off`` of four rows of a
    Q4_K/Q5_K matrix in one set of vector steps (the decoding tile's rows): one 16-byte
    load a row, the unpacking of ``_k_scales`` once for the four, and the four ``d|dmin``
    fp16 pairs converted by one ``vcvtph2ps`` (x86: exact, as the table; the table where
    there is no x86)."""
    bld = g.b
    at = bld.add(off, g.c64(k.format["scales"].offset - 4))
    parts = [bld.bitcast(g.vload(r, at, 16), vec(I32, 4)) for r in rows]
    u8 = bld.shuffle_vector(parts[0], parts[1], ir.Constant(vec(I32, 8), list(range(8))))
    u8b = bld.shuffle_vector(parts[2], parts[3], ir.Constant(vec(I32, 8), list(range(8))))
    u = bld.shuffle_vector(u8, u8b, ir.Constant(vec(I32, 16), list(range(16))))
    assert k.format["dmin"].offset == k.format["d"].offset + 2 == k.format["scales"].offset - 2
    if SIMD != "generic":
        halves = bld.bitcast(g.lanes(u, [0, 4, 8, 12]), vec(ir.HalfType(), 8))
        dd = bld.fpext(halves, vec(F32, 8))
    else:
        dd = ir.Constant(vec(F32, 8), [0.0] * 8)
        for j, r in enumerate(rows):
            for h, field in enumerate(("d", "dmin")):
                x = g.f16(r, bld.add(off, g.c64(k.format[field].offset)))
                dd = bld.insert_element(dd, x, ir.Constant(I32, 2 * j + h))
    return QuadScales(_k_scales_words(g, u), dd)


def quad_min_sums(g: VectorIR, qs: QuadScales, aux, b) -> ir.Value:  # noqa: ANN001
    """<4 x float>: the four blocks' ``sum(mins * 32-sums)`` with the activation row's
    32-sums of block ``b`` (``aux``: floats holding integers, |s| <= 4096): in integers,
    the mins and the sums as words multiplied in adjacent pairs. Each product is below
    2**18 and the sum below 2**24, so the float sums of other paths are these integers
    exactly: the same numbers."""
    bld = g.b
    p8 = bld.bitcast(g.at(aux, bld.mul(b, g.c64(8))), vec(F32, 8).as_pointer())
    s8 = bld.trunc(bld.fptosi(bld.load(p8, align=4), vec(I32, 8)), vec(I16, 8))
    sums = g.lanes(s8, list(range(8)) * 4)
    zero = ir.Constant(vec(I8, 64), [0] * 64)
    order = [x for j in range(4) for i in range(8) for x in (16 * j + 8 + i, 64)]
    mins = bld.bitcast(bld.shuffle_vector(qs.bytes, zero, ir.Constant(vec(I32, 64), order)),
                       vec(I16, 32))
    halves = [_madd_words(g, g.lanes(mins, list(range(16 * h, 16 * h + 16))),
                          g.lanes(sums, list(range(16 * h, 16 * h + 16)))) for h in (0, 1)]
    v = bld.shuffle_vector(*halves, ir.Constant(vec(I32, 16), list(range(16))))
    for x in (1, 2):  # block j's four pair sums added into lane 4 j
        v = bld.add(v, g.lanes(v, [i ^ x for i in range(16)]))
    return bld.sitofp(g.lanes(v, [0, 4, 8, 12]), vec(F32, 4))


def _q3_scales(g: VectorIR, row, at) -> ir.Value:  # noqa: ANN001
    """Q3_K's 16 six-bit scales from the 12 bytes at ``row + at``, minus 32, as <16 x i16>:
    ggml's unpacking (low 4 bits from the nibbles of bytes 0-7, top 2 from bytes 8-11) in
    vector steps, from one 16-byte load that ends with the scales (the 4 bytes before them
    are the block's own ``qs``, so the load never leaves the block)."""
    bld = g.b
    v = g.vload(row, bld.sub(at, g.c64(4)), 16)  # byte 4 + i: scale byte i
    # scales 0-7: the low nibbles of bytes 0-7; 8-15: their high nibbles
    lo = bld.bitcast(g.lanes(v, [4 + i % 8 for i in range(16)]), vec(I64, 2))
    lo = bld.and_(bld.bitcast(bld.lshr(lo, ir.Constant(vec(I64, 2), [0, 4])), vec(I8, 16)),
                  g.splat8(15, 16))
    # scale 4i + j's top 2 bits: bits 2i, 2i + 1 of byte 8 + j
    hi = bld.bitcast(g.lanes(v, [12 + i % 4 for i in range(16)]), vec(I32, 4))
    hi = bld.and_(bld.lshr(hi, ir.Constant(vec(I32, 4), [0, 2, 4, 6])),
                  ir.Constant(vec(I32, 4), [0x03030303] * 4))
    hi = bld.bitcast(bld.shl(hi, ir.Constant(vec(I32, 4), [4] * 4)), vec(I8, 16))
    v8 = bld.sub(bld.or_(lo, hi), g.splat8(32, 16))
    return bld.sext(v8, vec(I16, 16))


# _q3_scales' and _k_scales' loads start 4 bytes before the scales: still inside the block
assert all(k.format["scales"].offset >= 4 for k in KERNEL_TYPES.values()
           if k.scales in ("q3k", "k4"))


def _iq4xs_scales(g: VectorIR, k: KernelType, row, off) -> ir.Value:  # noqa: ANN001
    """IQ4_XS's 8 six-bit scales minus 32 as <16 x i16> (lanes 8-15 zero): scale i's low
    4 bits are nibble i % 2 of ``scales_l[i / 2]``, its top 2 bits bits 2i, 2i + 1 of
    ``scales_h``."""
    bld = g.b
    fmt = k.format
    lo = g.vload(row, bld.add(off, g.c64(fmt["scales_l"].offset)), 4)
    lo = bld.zext(g.lanes(lo, [i // 2 for i in range(8)]), vec(I16, 8))
    lo = bld.and_(bld.lshr(lo, ir.Constant(vec(I16, 8), [4 * (i % 2) for i in range(8)])),
                  ir.Constant(vec(I16, 8), [15] * 8))
    p = bld.bitcast(g.at(row, bld.add(off, g.c64(fmt["scales_h"].offset))), I16.as_pointer())
    hv = bld.insert_element(ir.Constant(vec(I16, 8), ir.Undefined), bld.load(p, align=1),
                            ir.Constant(I32, 0))
    hv = g.lanes(hv, [0] * 8)
    hi = bld.and_(bld.lshr(hv, ir.Constant(vec(I16, 8), list(range(0, 16, 2)))),
                  ir.Constant(vec(I16, 8), [3] * 8))
    sc = bld.sub(bld.or_(lo, bld.shl(hi, ir.Constant(vec(I16, 8), [4] * 8))),
                 ir.Constant(vec(I16, 8), [32] * 8))
    return bld.shuffle_vector(sc, ir.Constant(vec(I16, 8), [0] * 8),
                              ir.Constant(vec(I32, 16), list(range(16))))


def block_scale(g: VectorIR, k: KernelType, row, off) -> ir.Value:  # noqa: ANN001
    """The float scale ``d`` of the weight block at byte ``off`` of ``row``: an fp16, or
    (``e8m0_half``) ggml_e8m0_to_fp32_half's bits from the byte ``e``: ``0x00200000 << e``
    below 2 (the subnormals 2**-128, 2**-127), else ``(e - 1) << 23``."""
    at = g.b.add(off, g.c64(k.format[k.d_field].offset))
    if k.d_enc == "f16":
        return g.f16(row, at)
    bld = g.b  # the table's entry E8M0_AT + e
    e = bld.zext(bld.load(g.at(row, at)), I64)
    return bld.load(g.at(g.tbl, bld.add(e, g.c64(E8M0_AT))))


class SpanPair(NamedTuple):
    """Two adjacent spans of a block in one 512-bit vector (``unpack``'s ``pairs``)."""

    values: ir.Value  # <64 x i8>: the first span's 32 values, then the second's
    first: SpanScales
    second: SpanScales


def _plane_pair(g: VectorIR, k: KernelType, p: Plane, row, off, pair: int) -> ir.Value | None:  # noqa: ANN001
    """<64 x i8>: plane ``p`` of spans ``2 pair`` and ``2 pair + 1`` in one 512-bit vector,
    where both are runs of 32 bytes that lie side by side (one load) or are the same bytes
    (Q4_K's nibbles, the top bits: a load into both halves); else None. Each half's bits
    move into place by one 64-bit lane shift, which keeps a value's bits within its byte,
    and the mask drops what crossed from the next byte."""
    bld = g.b
    halves = []
    for span in (2 * pair, 2 * pair + 1):
        per_set = p.group * 8 // p.width
        s, within = divmod(32 * span, per_set)
        plane, byte0 = divmod(within, p.group)
        if p.width == 8 or p.group < 32 or byte0 + 32 > p.group:
            return None
        halves.append((k.format[p.field].offset + s * p.group + byte0, plane * p.width))
    (a0, r0), (a1, r1) = halves
    if a1 == a0 + 32:
        v = g.vload(row, bld.add(off, g.c64(a0)), 64)
    elif a1 == a0:
        v = g.vload(row, bld.add(off, g.c64(a0)), 32)
        v = bld.shuffle_vector(v, v, ir.Constant(vec(I32, 64), list(range(32)) * 2))
    else:
        return None
    q = bld.bitcast(v, vec(I64, 8))
    n = (p.shift - r0, p.shift - r1)  # left shift of each half (negative: right)
    if min(n) < 0:
        q = bld.lshr(q, ir.Constant(vec(I64, 8), [max(-n[0], 0)] * 4 + [max(-n[1], 0)] * 4))
    if max(n) > 0:
        q = bld.shl(q, ir.Constant(vec(I64, 8), [max(n[0], 0)] * 4 + [max(n[1], 0)] * 4))
    return bld.and_(bld.bitcast(q, vec(I8, 64)), g.splat8(((1 << p.width) - 1) << p.shift, 64))


def unpack(g: VectorIR, k: KernelType, row, off, shifted: bool = False,  # noqa: ANN001
           pairs: bool = False, scales: tuple | None = None) -> Block:
    """The weight block at byte ``off`` of ``row``. ``shifted``: the values plus
    ``vnni_offset(k)`` instead, all unsigned (``values`` = ``magnitudes``: the bias not
    taken off, or whole signed bytes plus 128). ``pairs`` (types with integer scales, for
    the 512-bit tiles): ``spans`` holds ``SpanPair``s, the values with the bias taken off.
    ``scales``: Q4_K/Q5_K's unpacked scales, ``d`` and ``dmin`` already at hand
    (``QuadScales.row``)."""
    bld = g.b
    fmt = k.format
    is_signed = signed(k) and not shifted

    def field_at(name: str) -> ir.Value:
        return bld.add(off, g.c64(fmt[name].offset))

    d = block_scale(g, k, row, off) if scales is None else scales[1]
    sc16 = mins = sc8 = None
    if k.scales == "k4":
        sm8 = _k_scales(g, row, field_at("scales")) if scales is None else scales[0]
        sc16 = bld.zext(sm8, vec(I16, 16))
        sc8 = g.lanes(sm8, list(range(16)) * 2) if SIMD != "generic" else sm8
        # the 8 integer mins, as <8 x float> (converting only the lanes used)
        mins = bld.uitofp(bld.zext(g.lanes(sm8, list(range(8, 16))), vec(I32, 8)),
                          vec(F32, 8))
    elif k.scales == "i8":
        sc16 = bld.sext(g.vload(row, field_at("scales"), 16), vec(I16, 16))
    elif k.scales == "q3k":
        sc16 = _q3_scales(g, row, field_at("scales"))
    elif k.scales == "q2k":  # a nibble scale (low) and a nibble min (high) per 16 values
        raw = g.vload(row, field_at("scales"), 16)
        sc16 = bld.zext(bld.and_(raw, g.splat8(15, 16)), vec(I16, 16))
        if SIMD != "generic":  # in both 128-bit halves for ``scale_words``' byte shuffles
            # (one broadcast load), the mins from its low half
            raw = g.lanes(raw, list(range(16)) * 2)
            sc8 = bld.and_(raw, g.splat8(15, 32))
            raw = g.lanes(raw, list(range(16)))
        else:
            sc8 = bld.and_(raw, g.splat8(15, 16))
        mins = bld.zext(bld.lshr(raw, g.splat8(4, 16)), vec(I16, 16))
    elif k.scales == "iq4xs":
        sc16 = _iq4xs_scales(g, k, row, off)
    group = k.block_size // k.groups  # values per integer scale
    spans = _pairs(g, k, row, off, sc16, group) if pairs else []
    for span in range(0 if pairs else k.block_size // 32):
        w = None
        for p in k.planes:
            v = _emit_plane(g, k, p, row, off, span)
            w = v if w is None else bld.or_(w, v)
        if k.table and shifted:  # the entries plus 128 (their top bit flipped): one step
            w = _lookup(g, w, tuple(t ^ -128 for t in k.table))
        elif k.table:
            w = _lookup(g, w, k.table)
        elif shifted and not k.bias:  # whole int8 bytes: + 128 flips the top bit
            w = bld.xor(w, g.splat8(-128, 32))
        elif k.bias and not shifted:
            w = bld.sub(w, g.splat8(k.bias, 32))
        sc = None if sc16 is None else SpanScales(sc16, 32 * span // group,
                                                  (32 * span + 16) // group, sc8)
        spans.append(Span(w, g.magnitude(w) if is_signed and SIMD != "generic" else w, sc))
    term = None
    if k.offset == "m":
        term = OffsetTerm("m", g.f16(row, field_at("m")))
    elif k.offset == "dmin":
        dmin = g.f16(row, field_at("dmin")) if scales is None else scales[2]
        term = OffsetTerm("dmin16" if k.groups == 16 else "dmin", dmin, mins)
    return Block(spans, d, term)


def min_sums(g: VectorIR, term: OffsetTerm, sums, b) -> ir.Value:  # noqa: ANN001
    """Float: Q2_K's ``sum(mins * 16-sums)`` for block ``b`` of one activation row, an
    exact integer (ggml's ``madd(mins, bsums)``), from ``sums``, the row's 16-value sums
    (int32, ``act_quant``'s Q8_K ``cor``)."""
    bld = g.b
    p = bld.bitcast(g.at(sums, bld.mul(b, g.c64(16))), vec(I32, 16).as_pointer())
    v = bld.mul(bld.load(p, align=4), bld.sext(term.mins, vec(I32, 16)))
    for width in (8, 4, 2, 1):
        v = bld.add(v, g.lanes(v, [i + width for i in range(width)] + [0] * (16 - width)))
    return bld.sitofp(bld.extract_element(v, ir.Constant(I32, 0)), F32)


def scale_words(g: VectorIR, sc: SpanScales, idx: list[int]) -> ir.Value:
    """<n x i16>: lanes ``idx`` of the block's scales (``sc.scales``); where they are
    unsigned bytes (``sc.bytes``), each byte paired with a zero byte in one byte shuffle
    (a ``vpshufb`` with zeroing) rather than a byte shuffle then a widening: the same
    words."""
    if sc.bytes is None:
        return g.lanes(sc.scales, idx)
    if sc.bytes.type.count == 32 and len(idx) == 16:  # x86: the 16 bytes in both halves
        ctl = ir.Constant(vec(I8, 32), [x for i in idx for x in (i, -128)])
        return g.b.bitcast(g.call("llvm.x86.avx2.pshuf.b", vec(I8, 32), [sc.bytes, ctl]),
                           vec(I16, 16))
    zero = ir.Constant(vec(I8, 16), [0] * 16)
    order = [x for i in idx for x in (i, 16)]
    return g.b.bitcast(g.b.shuffle_vector(sc.bytes, zero, ir.Constant(vec(I32, 2 * len(idx)),
                                                                      order)),
                       vec(I16, len(idx)))


def min_sums_rows(g: VectorIR, terms: list[OffsetTerm], sums, b) -> list[ir.Value]:  # noqa: ANN001
    """``min_sums`` of several weight rows' blocks ``b`` (the tiles of one activation
    row): the row's 16-sums narrowed to words once (|16-sum| <= 2048, exact), each weight
    row's mins times them in adjacent pairs (``pmaddwd``: 8 lanes), and four rows' lanes
    added in one transposing tree rather than a 16-lane tree each. Exact integers: the
    same floats."""
    bld = g.b
    p = bld.bitcast(g.at(sums, bld.mul(b, g.c64(16))), vec(I32, 16).as_pointer())
    s16 = bld.trunc(bld.load(p, align=4), vec(I16, 16))
    prods = [_madd_words(g, t.mins, s16) for t in terms]
    if len(prods) == 4:  # rows 0, 1 (and 2, 3) in halves, then rows 0, 2 in each half's
        # lanes 0, 1 and rows 1, 3 in lanes 4, 5

        def cat(x: ir.Value, y: ir.Value, idx: list[int]) -> ir.Value:
            return bld.shuffle_vector(x, y, ir.Constant(vec(I32, 8), idx))

        v01, v23 = (bld.add(cat(x, y, [0, 1, 2, 3, 8, 9, 10, 11]),
                            cat(x, y, [4, 5, 6, 7, 12, 13, 14, 15]))
                    for x, y in (prods[:2], prods[2:]))
        v = bld.add(cat(v01, v23, [0, 8, 1, 9, 4, 12, 5, 13]),
                    cat(v01, v23, [2, 10, 3, 11, 6, 14, 7, 15]))
        v = bld.sitofp(bld.add(v, g.lanes(v, [2, 3, 0, 1, 6, 7, 4, 5])), vec(F32, 8))
        return [bld.extract_element(v, ir.Constant(I32, lane)) for lane in (0, 4, 1, 5)]
    out = []
    for v in prods:
        for width in (4, 2, 1):
            v = bld.add(v, g.lanes(v, [i + width for i in range(width)] + [0] * (8 - width)))
        out.append(bld.sitofp(bld.extract_element(v, ir.Constant(I32, 0)), F32))
    return out


def _madd_words(g: VectorIR, a: ir.Value, b: ir.Value) -> ir.Value:
    """<16 x i16> ``a``, ``b`` -> <8 x i32>: adjacent products summed (``pmaddwd``;
    portable IR where there is no x86)."""
    if SIMD != "generic":
        return g.call("llvm.x86.avx2.pmadd.wd", vec(I32, 8), [a, b])
    w = vec(I32, 16)
    return g.pair_sums(g.b.mul(g.b.sext(a, w), g.b.sext(b, w)))


def _pairs(g: VectorIR, k: KernelType, row, off, sc16, group: int) -> list[SpanPair]:  # noqa: ANN001
    """``unpack``'s ``SpanPair``s: each plane 512 bits wide where ``_plane_pair`` has a
    shape for it, else its two 256-bit spans joined."""
    bld = g.b
    out = []
    for pair in range(k.block_size // 64):
        w = None
        for p in k.planes:
            v = _plane_pair(g, k, p, row, off, pair)
            if v is None:
                v = bld.shuffle_vector(_emit_plane(g, k, p, row, off, 2 * pair),
                                       _emit_plane(g, k, p, row, off, 2 * pair + 1),
                                       ir.Constant(vec(I32, 64), list(range(64))))
            w = v if w is None else bld.or_(w, v)
        if k.bias:
            w = bld.sub(w, g.splat8(k.bias, 64))
        e0, e1 = 64 * pair, 64 * pair + 32
        out.append(SpanPair(w, SpanScales(sc16, e0 // group, (e0 + 16) // group),
                            SpanScales(sc16, e1 // group, (e1 + 16) // group)))
    return out
