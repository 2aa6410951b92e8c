"""Float tiles: F16 weights times float32 activations, fp16 -> float32 conversion in the
vector unit (F16C), 16 products per step in float lanes."""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from . import jitcache  # noqa: F401 - stamps the cached kernels below (before any njit)
from .vector_ir import F32, I16, VectorIR, array_args, row_pointer, vec

STREAM_CHUNK = 2048  # weight rows per parallel work item (long sequential streams)


def _make_f16_rowdot(nr: int):  # noqa: ANN202 - returns a numba intrinsic
    """Intrinsic ``f16dot(w (R, K) u16, r0, rs, x (n, K) f32, i, out (n, R) f32)``:
    ``out[i, r0+j*rs] = W[r0+j*rs] . x[i]`` for ``j < nr``, 16 values per step."""

    @intrinsic
    def f16dot(typingctx, w, r0, rs, x, i, out):  # noqa: ANN001, ANN202, ARG001
        sig = types.int64(w, r0, rs, x, i, out)

        def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
            ws, r0_, rs_, xs, i_, outs = array_args(context, builder, signature, args)
            bld = builder
            g = VectorIR(bld, None)
            ridx = [bld.add(r0_, bld.mul(rs_, g.c64(j))) for j in range(nr)]
            rows = [row_pointer(bld, ws, ri, I16) for ri in ridx]
            xrow = row_pointer(bld, xs, i_, F32)
            k = cgutils.unpack_tuple(bld, ws.shape)[1]
            nfull = bld.udiv(k, g.c64(16))
            zero = ir.Constant(vec(F32, 16), [0.0] * 16)
            accp = [cgutils.alloca_once_value(bld, zero) for _ in range(nr)]
            tailp = [cgutils.alloca_once_value(bld, ir.Constant(F32, 0.0)) for _ in range(nr)]
            half16 = ir.VectorType(ir.HalfType(), 16)
            with cgutils.for_range(bld, nfull) as loop:
                off = bld.mul(loop.index, g.c64(16))
                xv = bld.load(bld.bitcast(bld.gep(xrow, [off]), vec(F32, 16).as_pointer()),
                              align=4)
                for j, row in enumerate(rows):
                    hv = bld.load(bld.bitcast(bld.gep(row, [off]), half16.as_pointer()), align=2)
                    wf = bld.fpext(hv, vec(F32, 16))
                    acc = bld.load(accp[j])
                    bld.store(bld.fadd(bld.fmul(wf, xv, flags=("fast",)), acc, flags=("fast",)),
                              accp[j])
            with cgutils.for_range_slice(bld, bld.mul(nfull, g.c64(16)), k, g.c64(1)) as (e, _):
                xe = bld.load(bld.gep(xrow, [e]))
                for j, row in enumerate(rows):
                    we = bld.fpext(bld.bitcast(bld.load(bld.gep(row, [e])), ir.HalfType()), F32)
                    bld.store(bld.fadd(bld.load(tailp[j]), bld.fmul(we, xe)), tailp[j])
            for j in range(nr):
                g.store_2d(outs, i_, ridx[j],
                           bld.fadd(g.hsum(bld.load(accp[j])), bld.load(tailp[j])))
            return context.get_constant(types.int64, 0)

        return sig, codegen

    return f16dot


_f16_4 = _make_f16_rowdot(4)
_f16_1 = _make_f16_rowdot(1)


@njit(cache=True, nogil=True)
def f16_matmul_rows(w, x, out, r0, r1):  # noqa: ANN001, ANN201
    """The hot loop. W rows r0:r1 (R, K) fp16 bits (uint16) @ x (n, K) f32 -> out[:, r0:r1]
    (n, R) f32; four far-apart rows per pass (long sequential streams, as for the quantized
    types)."""
    quarter = (r1 - r0) // 4
    for i in range(x.shape[0]):
        for k in range(quarter):
            _f16_4(w, r0 + k, quarter, x, i, out)
        for r in range(r0 + 4 * quarter, r1):
            _f16_1(w, r, 1, x, i, out)


@njit(cache=True, nogil=True, parallel=True)
def f16_matmul_par(w, x, out):  # noqa: ANN001, ANN201
    """W (R, K) fp16 bits (uint16) @ x (n, K) f32 -> out (n, R) f32, rows in parallel."""
    rows = w.shape[0]
    nchunk = (rows + STREAM_CHUNK - 1) // STREAM_CHUNK
    for c in prange(nchunk):
        f16_matmul_rows(w, x, out, c * STREAM_CHUNK, min(rows, (c + 1) * STREAM_CHUNK))


def twin_f16_matmul(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Numpy twin of ``f16_matmul_rows``: ``W (R, K) fp16 bits @ x (n, K) -> (n, R)``."""
    wf = np.ascontiguousarray(w).view(np.float16).astype(np.float64)
    return (x.astype(np.float64) @ wf.T).astype(np.float32)
