"""The Q8_0 cache's two inner loops as explicit LLVM vectors: a key row's dot with the
quantized query, and a value row's weighted add into the heads' sums.

The arithmetic is ``kv_q8``'s (ggml's), element for element: the dot's 8 lanes are the
exact integer sums of ggml's x86 ``mul_sum_i8_pairs_float`` (``VectorIR.span_dot``: the
same instructions the Q8_0 weight products use), fused into 8 float accumulators per block
and reduced as ``hsum_float_8``; a value is its int8 times the block's float16 scale
(exact), fused into each head's sum. Written as numba loops they ran at a fifth of the
speed (scalar byte loads, negative-index checks); ``tests/kernels/test_kv_q8.py`` holds them to
the plain loops and numpy twins bit for bit.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ..quant.vector_ir import F32, I8, I16, I64, VectorIR, row_pointer, vec
from .kv_cache import BLOCK8, QK8

_F16 = ir.HalfType()
_V8 = vec(F32, 8)


def _c(v: int) -> ir.Constant:
    return ir.Constant(I64, v)


def _scale(b: ir.IRBuilder, base: ir.Value, off: ir.Value) -> ir.Value:
    """The float16 at byte ``base + off`` as float32 (exact)."""
    p = b.bitcast(b.gep(base, [off]), I16.as_pointer())
    return b.fpext(b.bitcast(b.load(p, align=1), _F16), F32)


def _row1(context: object, builder: ir.IRBuilder, ty: types.Type, val: ir.Value
          ) -> tuple[ir.Value, ir.Value]:
    """A 1-D contiguous int8 row: its data pointer and its length."""
    ary = context.make_array(ty)(context, builder, val)
    return builder.bitcast(ary.data, I8.as_pointer()), cgutils.unpack_tuple(builder, ary.shape)[0]


def _is_row(t: types.Type, dtype: types.Type, ndim: int) -> bool:
    return isinstance(t, types.Array) and t.ndim == ndim and t.dtype == dtype \
        and t.layout in "CA"


@intrinsic
def q8_dot(typingctx, kr, qr):  # noqa: ANN001, ANN202, ARG001
    """Rows kr . qr of Q8_0 blocks (1-D int8, equal lengths, contiguous) as
    ggml_vec_dot_q8_0_q8_0 on x86: per block lanes of exact integer sums of 4 products,
    ``fma(d_k * d_q, lane, acc)``; the lanes reduced ((0+4)+(2+6))+((1+5)+(3+7))."""
    if not (_is_row(kr, types.int8, 1) and _is_row(qr, types.int8, 1)):
        return None

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202, ARG001
        g = VectorIR(builder, None)
        kp, n = _row1(context, builder, signature.args[0], args[0])
        qp, _ = _row1(context, builder, signature.args[1], args[1])
        acc = cgutils.alloca_once_value(builder, ir.Constant(_V8, [0.0] * 8))
        nb = builder.udiv(n, _c(BLOCK8))
        with cgutils.for_range(builder, nb) as loop:
            off = builder.mul(loop.index, _c(BLOCK8))
            d = builder.fmul(_scale(builder, kp, off), _scale(builder, qp, off))
            k8 = g.vload(kp, builder.add(off, _c(2)), QK8)
            q8 = g.vload(qp, builder.add(off, _c(2)), QK8)
            lanes = g.span_dot(k8, g.magnitude(k8), q8, None, True)
            builder.store(g.fma8(builder.load(acc), lanes, d), acc)
        return g.hsum8(builder.load(acc))

    return types.float32(kr, qr), codegen


@intrinsic
def q8_weighted_add(typingctx, vr, ws, acc):  # noqa: ANN001, ANN202, ARG001
    """``acc[h, c] = fma(value[c], ws[h], acc[h, c])`` for every head h: vr one value row
    of Q8_0 blocks (1-D int8, contiguous), ``value[c]`` its int8 times the block's scale
    (exact); ws (heads,) float32 (any stride); acc (heads, d_v) float32, rows contiguous."""
    if not (_is_row(vr, types.int8, 1) and _is_row(ws, types.float32, 1)
            and _is_row(acc, types.float32, 2)):
        return None

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202, ARG001
        g = VectorIR(builder, None)
        vp, n = _row1(context, builder, signature.args[0], args[0])
        wa = context.make_array(signature.args[1])(context, builder, args[1])
        aa = context.make_array(signature.args[2])(context, builder, args[2])
        heads = cgutils.unpack_tuple(builder, aa.shape)[0]
        with cgutils.for_range(builder, builder.udiv(n, _c(BLOCK8))) as loop:
            off = builder.mul(loop.index, _c(BLOCK8))
            d = g.splatf8(_scale(builder, vp, off))
            vals = []
            for i in range(QK8 // 8):  # 4 vectors of 8 values, dequantized once
                q = g.vload(vp, builder.add(off, _c(2 + 8 * i)), 8)
                vals.append(builder.fmul(builder.sitofp(q, _V8), d))
            with cgutils.for_range(builder, heads) as hl:
                stride = cgutils.unpack_tuple(builder, wa.strides)[0]
                wp = builder.gep(builder.bitcast(wa.data, I8.as_pointer()),
                                 [builder.mul(hl.index, stride)])
                w = g.splatf8(builder.load(builder.bitcast(wp, F32.as_pointer())))
                row = row_pointer(builder, aa, hl.index, F32)
                for i, v in enumerate(vals):
                    at = builder.bitcast(
                        builder.gep(row, [builder.add(builder.mul(loop.index, _c(QK8)),
                                                      _c(8 * i))]), _V8.as_pointer())
                    s = g.call("llvm.fma.v8f32", _V8, [v, w, builder.load(at, align=4)])
                    builder.store(s, at, align=4)
        return context.get_dummy_value()

    return types.none(vr, ws, acc), codegen
