"""The encoder's attention products as register tiles: ``out = a @ b`` for float32 arrays,
every output element one fused multiply-add chain over the inner index in order, from 0.0.

A tile is ``rows`` rows of ``a`` times ``nv`` vectors of 16 columns of ``b``: the
``rows * nv`` running sums stay in vector registers for the whole inner loop, each loaded
vector of ``b`` serves every row, each element of ``a`` is broadcast once. Every tile shape
computes each element by the same chain, so a row's result never depends on the tile it
fell in (nor, therefore, on the rows or sequences beside it).
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ..quant.vector_ir import F32, array_args, row_pointer, vec

_V16 = vec(F32, 16)
_ZERO = ir.Constant(_V16, [0.0] * 16)


def _i64(v: int) -> ir.Constant:
    return ir.Constant(ir.IntType(64), v)


def _splat16(builder: ir.IRBuilder, x: ir.Value) -> ir.Value:
    v = builder.insert_element(ir.Constant(_V16, ir.Undefined), x, ir.Constant(ir.IntType(32), 0))
    return builder.shuffle_vector(v, v, ir.Constant(vec(ir.IntType(32), 16), [0] * 16))


def _vector_at(builder: ir.IRBuilder, row: ir.Value, col: ir.Value) -> ir.Value:
    return builder.bitcast(builder.gep(row, [col]), _V16.as_pointer())


def make_fma_tile(rows: int, nv: int):  # noqa: ANN201 - returns a numba intrinsic
    """Intrinsic ``tile(a (M, >= m), b (>= m, N), out (M, N), i0, j0, m)`` (float32, rows
    contiguous): ``out[i0 + r, j0 + c] = sum over e < m of a[i0 + r, e] * b[e, j0 + c]`` for
    ``r < rows``, ``c < 16 * nv``; each sum fused multiply-adds in order e = 0, 1, ...."""

    @intrinsic
    def tile(typingctx, a, b, out, i0, j0, m):  # noqa: ANN001, ANN202, ARG001
        if not all(isinstance(t, types.Array) and t.ndim == 2 and t.dtype == types.float32
                   for t in (a, b, out)):
            return None
        sig = types.none(a, b, out, types.int64, types.int64, types.int64)

        def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
            aa, ba, oa, i0_, j0_, m_ = array_args(context, builder, signature, args)
            arows = [row_pointer(builder, aa, builder.add(i0_, _i64(r)), F32)
                     for r in range(rows)]
            accs = [[cgutils.alloca_once_value(builder, _ZERO) for _ in range(nv)]
                    for _ in range(rows)]
            fma = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(_V16, [_V16] * 3), "llvm.fma.v16f32")
            with cgutils.for_range(builder, m_) as loop:
                brow = row_pointer(builder, ba, loop.index, F32)
                bv = [builder.load(_vector_at(builder, brow, builder.add(j0_, _i64(16 * v))),
                                   align=4) for v in range(nv)]
                for r in range(rows):
                    s = _splat16(builder, builder.load(builder.gep(arows[r], [loop.index])))
                    for v in range(nv):
                        builder.store(builder.call(fma, [s, bv[v], builder.load(accs[r][v])]),
                                      accs[r][v])
            for r in range(rows):
                orow = row_pointer(builder, oa, builder.add(i0_, _i64(r)), F32)
                for v in range(nv):
                    builder.store(builder.load(accs[r][v]),
                                  _vector_at(builder, orow, builder.add(j0_, _i64(16 * v))),
                                  align=4)
            return context.get_dummy_value()

        return sig, codegen

    return tile
