"""Attention's two inner loops as explicit LLVM vectors: a key tile's scores and the
weighted sum over values.

The arithmetic is that of the plain loops they replace, element for element: a score is
the sum over the head dimension, in index order, of separately rounded products (no fused
multiply-add); an output element is the sum over positions, in order, of separately
rounded products. What changes is where the running sums live. Written as numba loops over
arrays, they went to memory and back for every product (a load and a store per 8 lanes);
here each is an LLVM vector value that stays in a register for the whole loop, and a key or
value is read (and converted from float16) once per use. Measured on the attention of a
2,048-token prompt: see ``attention.py``.

The vectors are 16 lanes where the CPU has AVX-512 (8 elsewhere): each lane's arithmetic
is its own, so the same numbers at either width.

Both take a float16 (uint16 bits) or a float32 cache; their arrays' rows may be strided,
each row's elements contiguous (the arena's tiles and rows, slices of the scores, queries
and outputs are).
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ..quant.vector_ir import WIDE
from .kv_cache import TILE

_F32, _F16, _I64 = ir.FloatType(), ir.HalfType(), ir.IntType(64)
_LANES = 16 if WIDE else 8
_VEC = ir.VectorType(_F32, _LANES)
_ZERO = ir.Constant(_VEC, [0.0] * _LANES)


def _c(v: int) -> ir.Constant:
    return ir.Constant(_I64, v)


def _rows_type(arr: types.Type, ndim: int) -> bool:
    """An array the intrinsics read by rows: rows may be strided (any layout), each row's
    elements contiguous, as every caller's are (the arena's tiles and rows, ``sc``,
    slices of ``q`` and ``out``)."""
    return isinstance(arr, types.Array) and arr.ndim == ndim and arr.layout in "CA"


def _row(builder: ir.IRBuilder, ary: object, i: ir.Value, elem: ir.Type) -> ir.Value:
    """Pointer to element 0 of row ``i`` of a 2-D array struct."""
    stride = cgutils.unpack_tuple(builder, ary.strides)[0]
    p = builder.gep(builder.bitcast(ary.data, ir.IntType(8).as_pointer()),
                    [builder.mul(i, stride)])
    return builder.bitcast(p, elem.as_pointer())


def _load_vec(builder: ir.IRBuilder, base: ir.Value, at: ir.Value, half: bool) -> ir.Value:
    """<_LANES x float> of the elements at ``base + at`` (float16 converted exactly)."""
    p = builder.gep(base, [at])
    if half:
        v = builder.load(builder.bitcast(p, ir.VectorType(_F16, _LANES).as_pointer()), align=2)
        return builder.fpext(v, _VEC)
    return builder.load(builder.bitcast(p, _VEC.as_pointer()), align=4)


def _load1(builder: ir.IRBuilder, base: ir.Value, at: ir.Value, half: bool) -> ir.Value:
    v = builder.load(builder.gep(base, [at]))
    return builder.fpext(v, _F32) if half else v


def _splat(builder: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """<_LANES x float> of x."""
    v = builder.insert_element(ir.Constant(_VEC, ir.Undefined), x, ir.Constant(ir.IntType(32), 0))
    return builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(ir.IntType(32), _LANES),
                                                    [0] * _LANES))


def _operands(rows: types.Type, cache: types.Type, out: types.Type
              ) -> tuple[ir.Type, bool] | None:
    """Both intrinsics' operands: 2-D float32 ``rows`` and ``out`` and a 2-D ``cache``
    array of float16 bits (uint16) or float32. Its element type and whether it is
    float16, or None (numba then reports no matching signature)."""
    if not (all(_rows_type(a, 2) for a in (rows, cache, out))
            and rows.dtype == types.float32 and out.dtype == types.float32):
        return None
    if cache.dtype == types.uint16:
        return _F16, True
    if cache.dtype == types.float32:
        return _F32, False
    return None


# head-dimension steps per pass over a tile for all heads: a tile of d = 256 is 32 KB,
# beyond L1 with the rest; 64 steps of it (8 KB) stay there while each head takes them
E_STEP = 64


# heads of a group whose scores go together: each key vector is loaded (and converted)
# once for all of them, and their 4 x TILE / 16 running sums are independent chains; with 8
# lanes (16 registers) one head's TILE / 8 sums fill the registers already
HEADS_AT_ONCE = 4 if WIDE else 1


@intrinsic
def tile_scores(typingctx, qg, kk, out):  # noqa: ANN001, ANN202, ARG001
    """``out[h, j] = sum over e of qg[h, e] * kk[e, j]`` for each head h of a group and
    the 64 keys j of a tile: qg (heads, d) float32, kk (d, 64) the tile's keys (uint16
    float16 bits or float32), out (heads, 64) float32. Each sum in index order e = 0, 1,
    ..., from 0.0: the steps go E_STEP at a time, HEADS_AT_ONCE heads at a time, the
    partial sums kept in ``out`` between them (exactly: a float32 stored is the float32
    loaded)."""
    cache = _operands(qg, kk, out)
    if cache is None:
        return None
    elem, half = cache
    sig = types.none(qg, kk, out)

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202, ARG001
        qa, ka, oa = (context.make_array(t)(context, builder, v)
                      for t, v in zip(signature.args, args, strict=True))
        heads, d = cgutils.unpack_tuple(builder, qa.shape)
        with cgutils.for_range_slice(builder, _c(0), d, _c(E_STEP)) as (e0, _):
            e1 = builder.select(builder.icmp_signed("<", builder.add(e0, _c(E_STEP)), d),
                                builder.add(e0, _c(E_STEP)), d)
            span = (e0, e1, builder.icmp_signed("==", e0, _c(0)))
            _for_head_chunks(builder, heads, lambda hs: _emit_scores(
                builder, qa, ka, oa, elem, hs, span, half))
        return context.get_dummy_value()

    return sig, codegen


def _for_head_chunks(builder: ir.IRBuilder, heads: ir.Value, emit: object) -> None:
    """``emit(hs)`` for the heads 0..heads-1, HEADS_AT_ONCE at a time (``hs``: their
    indexes, fewer for the last chunk; one IR copy per chunk size)."""
    with cgutils.for_range_slice(builder, _c(0), heads, _c(HEADS_AT_ONCE)) as (h0, _):
        done = builder.append_basic_block("heads.done")
        sw = builder.switch(builder.sub(heads, h0), done)
        for n in range(HEADS_AT_ONCE, 0, -1):  # n heads from h0 (n or more left)
            case = builder.append_basic_block(f"heads.{n}")
            builder.position_at_end(case)
            emit([builder.add(h0, _c(i)) for i in range(n)])
            builder.branch(done)
            if n == HEADS_AT_ONCE:
                sw.default = case
            else:
                sw.add_case(_c(n), case)
        builder.position_at_end(done)


def _emit_scores(builder: ir.IRBuilder, qa: object, ka: object, oa: object, elem: ir.Type,  # noqa: PLR0913
                 hs: list, span: tuple, half: bool) -> None:
    """``tile_scores``' steps e0 <= e < e1 for the heads ``hs`` (``_emit_sums`` over the
    tile's key rows e); ``span`` = (e0, e1, first)."""
    offs = [_c(_LANES * b) for b in range(TILE // _LANES)]
    _emit_sums(builder, [_row(builder, qa, h, _F32) for h in hs],
               [[_out_vec(builder, oa, h, o) for o in offs] for h in hs], ka, elem, offs,
               span, half)


def _out_vec(builder: ir.IRBuilder, oa: object, h: ir.Value, at: ir.Value) -> ir.Value:
    """Pointer to the <_LANES x float> at element ``at`` of row h of ``oa``."""
    return builder.bitcast(builder.gep(_row(builder, oa, h, _F32), [at]), _VEC.as_pointer())


def _emit_sums(builder: ir.IRBuilder, xs: list, ats: list, ca: object, elem: ir.Type,  # noqa: PLR0913
               offs: list, span: tuple, half: bool) -> None:
    """For each head's row ``xs[k]`` (float pointer) and its output vectors ``ats[k]``:
    ``ats[k][b] (+)= sum over i0 <= i < i1 of xs[k][i] * ca[i, offs[b]:offs[b] + _LANES]``
    in order i, from 0.0 when ``first`` else from the partial sums there, the running
    sums in registers; each cache vector loaded (and converted) once for all the heads.
    ``span`` = (i0, i1, first)."""
    i0, i1, first = span
    accs = [[cgutils.alloca_once_value(builder, _ZERO) for _ in row] for row in ats]
    for row, arow in zip(ats, accs, strict=True):
        for at, acc in zip(row, arow, strict=True):
            builder.store(builder.select(first, _ZERO, builder.load(at, align=4)), acc)
    with cgutils.for_range_slice(builder, i0, i1, _c(1)) as (i, _):
        c = _row(builder, ca, i, elem)
        cvs = [_load_vec(builder, c, o, half) for o in offs]
        for x, arow in zip(xs, accs, strict=True):
            xv = _splat(builder, builder.load(builder.gep(x, [i])))
            for cv, acc in zip(cvs, arow, strict=True):
                builder.store(builder.fadd(builder.load(acc), builder.fmul(xv, cv)), acc)
    for row, arow in zip(ats, accs, strict=True):
        for at, acc in zip(row, arow, strict=True):
            builder.store(builder.load(acc), at, align=4)


# positions per pass over the values for all heads and columns: 64 rows of d_v = 256 in
# float16 are 32 KB, read from L1 by every head and column block (the whole of a long
# sequence's values would come from L2 or beyond for each)
J_STEP = 64
# column vectors per block: with several heads at once, 4 (their sums and the 4 value
# vectors in registers), else 8
_COLUMN_BLOCKS = (4, 1) if HEADS_AT_ONCE > 1 else (8, 4, 1)


def _emit_columns(builder: ir.IRBuilder, pa: object, va: object, oa: object, elem: ir.Type,  # noqa: PLR0913
                  c0: ir.Value, nvec: int, span: tuple, half: bool, hs: list) -> None:
    """``out[h, c0 + c] (+)= sum over j0 <= j < j1 of p[h, j] * vals[j, c0 + c]`` for the
    heads ``hs`` and the ``nvec`` vectors of _LANES columns from c0, in position order
    (``_emit_sums`` over the value rows j); ``span`` = (j0, j1, first)."""
    offs = [builder.add(c0, _c(_LANES * b)) for b in range(nvec)]
    _emit_sums(builder, [_row(builder, pa, h, _F32) for h in hs],
               [[_out_vec(builder, oa, h, o) for o in offs] for h in hs], va, elem, offs,
               span, half)


def _emit_column(builder: ir.IRBuilder, pa: object, va: object, oa: object, elem: ir.Type,
                 c: ir.Value, span: tuple, half: bool) -> None:
    """One column c of ``_emit_columns`` (the columns past the last multiple of 8)."""
    j0, j1, first = span
    heads = cgutils.unpack_tuple(builder, pa.shape)[0]
    acc = cgutils.alloca_once_value(builder, ir.Constant(_F32, 0.0))
    with cgutils.for_range(builder, heads) as hl:
        h = hl.index
        p = _row(builder, pa, h, _F32)
        at = builder.gep(_row(builder, oa, h, _F32), [c])
        builder.store(builder.select(first, ir.Constant(_F32, 0.0), builder.load(at)), acc)
        with cgutils.for_range_slice(builder, j0, j1, _c(1)) as (j, _):
            x = builder.fmul(builder.load(builder.gep(p, [j])),
                             _load1(builder, _row(builder, va, j, elem), c, half))
            builder.store(builder.fadd(builder.load(acc), x), acc)
        builder.store(builder.load(acc), at)


@intrinsic
def weighted_sum(typingctx, pg, vals, out):  # noqa: ANN001, ANN202, ARG001
    """``out[h, c] = sum over j of pg[h, j] * vals[j, c]``: pg (heads, n) float32 each
    head's probabilities, vals (n, d_v) the values (uint16 float16 bits or float32), out
    (heads, d_v) float32. Each sum in position order j = 0, 1, ..., from 0.0: J_STEP
    positions at a time for all heads and columns, the partial sums kept in ``out``
    between them (exactly)."""
    cache = _operands(pg, vals, out)
    if cache is None:
        return None
    elem, half = cache
    sig = types.none(pg, vals, out)

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202, ARG001
        pa, va, oa = (context.make_array(t)(context, builder, v)
                      for t, v in zip(signature.args, args, strict=True))
        heads, n = cgutils.unpack_tuple(builder, pa.shape)
        d_v = cgutils.unpack_tuple(builder, va.shape)[1]
        c0 = cgutils.alloca_once_value(builder, _c(0))
        # at least one pass, so that out is written (zeros) when there are no positions
        passes = builder.select(builder.icmp_signed(">", n, _c(0)),
                                builder.udiv(builder.add(n, _c(J_STEP - 1)), _c(J_STEP)),
                                _c(1))
        with cgutils.for_range(builder, passes) as pl:
            j0 = builder.mul(pl.index, _c(J_STEP))
            j1 = builder.select(builder.icmp_signed("<", builder.add(j0, _c(J_STEP)), n),
                                builder.add(j0, _c(J_STEP)), n)
            span = (j0, j1, builder.icmp_signed("==", j0, _c(0)))
            # columns in blocks of _COLUMN_BLOCKS registers, then one at a time
            builder.store(_c(0), c0)
            for nvec in _COLUMN_BLOCKS:
                width = _c(_LANES * nvec)
                count = builder.udiv(builder.sub(d_v, builder.load(c0)), width)
                with cgutils.for_range(builder, count):
                    at = builder.load(c0)
                    _for_head_chunks(builder, heads, lambda hs, at=at, nvec=nvec: _emit_columns(
                        builder, pa, va, oa, elem, at, nvec, span, half, hs))
                    builder.store(builder.add(at, width), c0)
            with cgutils.for_range_slice(builder, builder.load(c0), d_v, _c(1)) as (c, _):
                _emit_column(builder, pa, va, oa, elem, c, span, half)
        return context.get_dummy_value()

    return sig, codegen
