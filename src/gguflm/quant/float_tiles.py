"""Float tiles: F16 and BF16 weights times float32 activations, converted to float32 in the
vector unit (F16C; BF16 a 16-bit shift), 16 products per step in float lanes.

numpy has no bfloat16: the tiles take F16 weights as their uint16 bits and BF16 weights as
their int16 bits (``bf16_bits``), and the array's dtype selects the conversion when a tile
is compiled. Both multiply activations rounded to the weight's type (ggml converts them
first), in one fixed order per element (one ``fma`` per 16 values into 16 lanes, the tail
in order, then ``VectorIR.hsum``); ggml's own order differs with its SIMD build, so no build
of it is matched to the last bit, but every build of ours gives the same numbers."""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from . import jitcache  # noqa: F401 - stamps the cached kernels below (before any njit)
from .floatbits import to_bf16, to_f16
from .vector_ir import F32, I16, I32, VectorIR, array_args, row_pointer, vec

STREAM_CHUNK = 2048  # weight rows per parallel work item (long sequential streams)


def bf16_bits(raw: np.ndarray) -> np.ndarray:
    """BF16 weights (their bits, any 16-bit dtype) as the tiles take them: int16."""
    return raw.view(np.int16)


def _widen(bld: ir.IRBuilder, v: ir.Value, bf16: bool) -> ir.Value:
    """16-bit weight bits (i16 or <16 x i16>) as float32: fp16 converted (``vcvtph2ps``),
    or bf16's bits moved to the top of a float32's (exact); float32 weights (already
    widened, ``widen_rows``) as they are."""
    n = v.type.count if isinstance(v.type, ir.VectorType) else 0
    if (v.type.element if n else v.type) == F32:
        return v
    if not bf16:
        return bld.fpext(bld.bitcast(v, vec(ir.HalfType(), n) if n else ir.HalfType()),
                         vec(F32, n) if n else F32)
    i32 = vec(I32, n) if n else I32
    wide = bld.shl(bld.zext(v, i32), ir.Constant(i32, [16] * n if n else 16))
    return bld.bitcast(wide, vec(F32, n) if n else F32)


def _make_f16_rowdot(nr: int, na: int = 1):  # noqa: ANN202 - returns a numba intrinsic
    """Intrinsic ``f16dot(w (R, K) u16 (F16) or i16 (BF16), r0, rs, x (n, K) f32, i0,
    out (n, R) f32, bias (R or 1,) f32, biased)``:
    ``out[i0+i, r0+j*rs] = W[r0+j*rs] . x[i0+i] (+ bias[r0+j*rs] if biased)`` for
    ``j < nr``, ``i < na``, 16 values per step: each weight vector is converted once for
    the ``na`` activation rows. Every tile shape runs the same per-element sequence (one
    ``fma`` per 16 values into 16 lanes, the tail in order, then ``VectorIR.hsum``, then the
    bias added, as ``y += b`` after the product would), so results do not depend on the
    tile."""

    @intrinsic
    def f16dot(typingctx, w, r0, rs, x, i0, out, bias, biased):  # noqa: ANN001, ANN202, ARG001
        sig = types.int64(w, r0, rs, x, i0, out, bias, biased)
        bf16 = w.dtype == types.int16
        wt = F32 if w.dtype == types.float32 else I16

        def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
            ws, r0_, rs_, xs, i0_, outs, bs, on = array_args(context, builder, signature, args)
            bld = builder
            g = VectorIR(bld, None)
            on = bld.icmp_unsigned("!=", on, ir.Constant(on.type, 0))

            def store(i: int, j: int, value: ir.Value) -> None:
                at = bld.select(on, ridx[j], g.c64(0))  # bias[0] exists when not biased
                b = bld.load(bld.gep(bs.data, [at]))
                g.store_2d(outs, iidx[i], ridx[j], bld.select(on, bld.fadd(value, b), value))

            ridx = [bld.add(r0_, bld.mul(rs_, g.c64(j))) for j in range(nr)]
            rows = [row_pointer(bld, ws, ri, wt) for ri in ridx]
            iidx = [bld.add(i0_, g.c64(i)) for i in range(na)]
            xrows = [row_pointer(bld, xs, ii, F32) for ii in iidx]
            k = cgutils.unpack_tuple(bld, ws.shape)[1]
            nfull = bld.udiv(k, g.c64(16))
            v16 = vec(F32, 16)
            zero = ir.Constant(v16, [0.0] * 16)
            accp = [[cgutils.alloca_once_value(bld, zero) for _ in range(na)]
                    for _ in range(nr)]
            tailp = [[cgutils.alloca_once_value(bld, ir.Constant(F32, 0.0))
                      for _ in range(na)] for _ in range(nr)]
            with cgutils.for_range(bld, nfull) as loop:
                off = bld.mul(loop.index, g.c64(16))
                xv = [bld.load(bld.bitcast(bld.gep(xr, [off]), v16.as_pointer()), align=4)
                      for xr in xrows]
                for j, row in enumerate(rows):
                    hv = bld.load(bld.bitcast(bld.gep(row, [off]), vec(wt, 16).as_pointer()),
                                  align=2)
                    wf = _widen(bld, hv, bf16)
                    for i in range(na):
                        acc = g.call("llvm.fma.v16f32", v16, [wf, xv[i], bld.load(accp[j][i])])
                        bld.store(acc, accp[j][i])
            with cgutils.for_range_slice(bld, bld.mul(nfull, g.c64(16)), k, g.c64(1)) as (e, _):
                xe = [bld.load(bld.gep(xr, [e])) for xr in xrows]
                for j, row in enumerate(rows):
                    we = _widen(bld, bld.load(bld.gep(row, [e])), bf16)
                    for i in range(na):
                        bld.store(bld.fadd(bld.load(tailp[j][i]), bld.fmul(we, xe[i])),
                                  tailp[j][i])
            if nr * na == 16:  # a 4x4 tile: the 16 sums reduced together
                sums = _hsum16(bld, [bld.load(accp[j][i]) for i in range(na) for j in range(nr)])
                for n, (i, j) in enumerate((i, j) for i in range(na) for j in range(nr)):
                    store(i, j, bld.fadd(bld.extract_element(sums, ir.Constant(I32, n)),
                                         bld.load(tailp[j][i])))
                return context.get_constant(types.int64, 0)
            for j in range(nr):
                for i in range(na):
                    store(i, j, bld.fadd(g.hsum(bld.load(accp[j][i])), bld.load(tailp[j][i])))
            return context.get_constant(types.int64, 0)

        return sig, codegen

    return f16dot


def _hsum16(bld: ir.IRBuilder, vs: list[ir.Value]) -> ir.Value:
    """16 <16 x float> -> one <16 x float> whose lane n is the sum of vs[n], by exactly
    ``VectorIR.hsum``'s tree (lanes i and i+8, then i+4, i+2, i+1), reduced two vectors at
    a time: 30 shuffles and 15 adds where 16 separate sums take 64 and 64."""
    for width in (8, 4, 2, 1):
        lo = [seg * 2 * width + t for seg in range(16 // width) for t in range(width)]
        hi = [i + width for i in lo]
        vs = [bld.fadd(bld.shuffle_vector(a, b, ir.Constant(vec(I32, 16), lo)),
                       bld.shuffle_vector(a, b, ir.Constant(vec(I32, 16), hi)))
              for a, b in zip(vs[::2], vs[1::2], strict=True)]
    return vs[0]


_f16_4 = _make_f16_rowdot(4)
_f16_1 = _make_f16_rowdot(1)
_f16_4x4 = _make_f16_rowdot(4, 4)
_f16_1x4 = _make_f16_rowdot(1, 4)

TILE_MIN_ROWS = 4  # activation rows from which the weights are walked in 4x4 tiles
TILE_CHUNK = 32  # weight rows kept hot while every activation row passes them


@njit(cache=True, nogil=True)
def f16_matmul_rows(w, x, out, r0, r1):  # noqa: ANN001, ANN201
    """W rows r0:r1 (R, K) fp16 bits (uint16; BF16: int16 bits) @ x (n, K) f32 ->
    out[:, r0:r1] (n, R) f32 (``f16_matmul_rows_bias`` without a bias)."""
    f16_matmul_rows_bias(w, x, out, r0, r1, NO_BIAS, 0)


NO_BIAS = np.zeros(1, np.float32)


@njit(cache=True, nogil=True)
def f16_matmul_rows_bias(w, x, out, r0, r1, bias, biased):  # noqa: ANN001, ANN201, PLR0913
    """The hot loop. W rows r0:r1 (R, K) fp16 bits (uint16; BF16: int16 bits) @ x (n, K)
    f32 (+ bias (R,) f32 if ``biased``; else ``bias`` any 1-element array) ->
    out[:, r0:r1] (n, R) f32. A batch: chunks of TILE_CHUNK weight rows, each walked by
    every group of 4 activation rows in 4x4 tiles (a weight vector converted once serves 4
    rows); the rows past a multiple of 4 and token-by-token decoding: four far-apart rows
    per pass (long sequential streams, as for the quantized types)."""
    n = x.shape[0]
    n4 = n - n % 4 if n >= TILE_MIN_ROWS else 0
    for c0 in range(r0, r1, TILE_CHUNK):
        c1 = min(r1, c0 + TILE_CHUNK)
        i = 0
        while i < n4:
            r = c0
            while r + 4 <= c1:
                _f16_4x4(w, r, 1, x, i, out, bias, biased)
                r += 4
            while r < c1:
                _f16_1x4(w, r, 1, x, i, out, bias, biased)
                r += 1
            i += 4
    quarter = (r1 - r0) // 4
    for i in range(n4, n):
        for k in range(quarter):
            _f16_4(w, r0 + k, quarter, x, i, out, bias, biased)
        for r in range(r0 + 4 * quarter, r1):
            _f16_1(w, r, 1, x, i, out, bias, biased)


@njit(cache=True, nogil=True, parallel=True)
def f16_matmul_par(w, x, out, bias, biased):  # noqa: ANN001, ANN201
    """W (R, K) fp16 bits (uint16; BF16: int16 bits) @ x (n, K) f32 (+ bias) -> out (n, R)
    f32, rows in parallel."""
    rows = w.shape[0]
    nchunk = (rows + STREAM_CHUNK - 1) // STREAM_CHUNK
    for c in prange(nchunk):
        f16_matmul_rows_bias(w, x, out, c * STREAM_CHUNK, min(rows, (c + 1) * STREAM_CHUNK),
                             bias, biased)


@intrinsic
def _round16_f16(typingctx, src, dst, i):  # noqa: ANN001, ANN202, ARG001
    """``dst[i:i+16] = src[i:i+16]`` rounded to float16 values (1-D float32 arrays): one
    ``vcvtps2ph`` and one ``vcvtph2ps`` for 16 values, the rounding of ``to_f16``."""
    sig = types.int64(src, dst, i)

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202, ARG001
        s, d, i_ = array_args(context, builder, signature, args)
        v16 = vec(F32, 16)
        ps = builder.bitcast(builder.gep(s.data, [i_]), v16.as_pointer())
        pd = builder.bitcast(builder.gep(d.data, [i_]), v16.as_pointer())
        half = builder.fptrunc(builder.load(ps, align=4), vec(ir.HalfType(), 16))
        builder.store(builder.fpext(half, v16), pd, align=4)
        return context.get_constant(types.int64, 0)

    return sig, codegen


@njit(cache=True, nogil=True)
def _round_row_f16(src, dst):  # noqa: ANN001, ANN202
    """src (K,) f32 -> dst (K,) rounded to float16 values, 16 at a time, the tail one by one."""
    k = src.shape[0]
    n16 = k - k % 16
    for e in range(0, n16, 16):
        _round16_f16(src, dst, e)
    for e in range(n16, k):
        dst[e] = to_f16(src[e])


@njit(cache=True, nogil=True)
def rounded_f16(x):  # noqa: ANN001, ANN201
    """x (n, K) f32 rounded to float16 values (numpy's astype, F16C), as float32: what an
    F16 weight multiplies (ggml converts the activations to the weight's type)."""
    out = np.empty_like(x)
    for t in range(x.shape[0]):
        _round_row_f16(x[t], out[t])
    return out


@njit(cache=True, nogil=True, parallel=True)
def rounded_f16_par(x):  # noqa: ANN001, ANN201
    """``rounded_f16`` with the rows shared out: an encoder's batch rounds millions of
    values per product."""
    out = np.empty_like(x)
    for t in prange(x.shape[0]):
        _round_row_f16(x[t], out[t])
    return out


@njit(cache=True, nogil=True)
def rounded_bf16(x):  # noqa: ANN001, ANN201
    """x (n, K) f32 rounded to bfloat16 values (ggml's ``fp32_to_bf16``), as float32: what a
    BF16 weight multiplies."""
    out = np.empty_like(x)
    for t in range(x.shape[0]):
        for e in range(x.shape[1]):
            out[t, e] = to_bf16(x[t, e])
    return out


@njit(cache=True, nogil=True, parallel=True)
def rounded_bf16_par(x):  # noqa: ANN001, ANN201
    """``rounded_bf16`` with the rows shared out."""
    out = np.empty_like(x)
    for t in prange(x.shape[0]):
        for e in range(x.shape[1]):
            out[t, e] = to_bf16(x[t, e])
    return out


def twin_bf16_matmul(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Numpy twin of ``f16_matmul_rows`` for BF16: ``W (R, K) bf16 bits @ x (n, K) -> (n,
    R)`` (x already rounded to bfloat16; the products are exact in float32)."""
    wf = (np.ascontiguousarray(w).view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return (x.astype(np.float64) @ wf.astype(np.float64).T).astype(np.float32)


def twin_f16_matmul(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Numpy twin of ``f16_matmul_rows``: ``W (R, K) fp16 bits @ x (n, K) -> (n, R)``."""
    wf = np.ascontiguousarray(w).view(np.float16).astype(np.float64)
    return (x.astype(np.float64) @ wf.T).astype(np.float32)
