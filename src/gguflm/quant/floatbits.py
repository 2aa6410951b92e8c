"""Float32 bit casts, fused multiply-add, float16 rounding and conversion, and ggml's
vector exp, for numba code: the one home of these helpers, shared by the quantized kernels
and the attention kernel.

numba has no bitcast between float32 and its bits, no float32 fma and no float16 type;
these are numba intrinsics that emit the single LLVM instruction.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from . import jitcache  # noqa: F401 - stamps the cached kernels below (before any njit)

_I32, _F32, _I16, _F16 = ir.IntType(32), ir.FloatType(), ir.IntType(16), ir.HalfType()


@intrinsic
def f32_bits(typingctx, x):  # noqa: ANN001, ANN202, ARG001
    """float32 -> its bits as uint32."""
    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202, ARG001
        return builder.bitcast(args[0], _I32)

    return types.uint32(types.float32), codegen


@intrinsic
def f32_from_bits(typingctx, u):  # noqa: ANN001, ANN202, ARG001
    """32-bit integer bits (int32 or uint32) -> the float32 they encode (a bitcast the
    vectorizer keeps in lanes)."""
    if not isinstance(u, types.Integer):
        return None
    arg = u if u.bitwidth == 32 else types.uint32  # wider: numba casts it to 32 bits first

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202, ARG001
        return builder.bitcast(args[0], _F32)

    return types.float32(arg), codegen


@intrinsic
def fma32(typingctx, a, b, c):  # noqa: ANN001, ANN202, ARG001
    """float32 a * b + c with one rounding (x86 ``vfmadd``, as ggml's vector code)."""
    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202, ARG001
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_F32, [_F32] * 3),
                                            "llvm.fma.f32")
        return builder.call(fn, list(args))

    return types.float32(types.float32, types.float32, types.float32), codegen


def _f16_bits(builder: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """float32 -> the bits (i16) of the nearest float16 (``vcvtps2ph``)."""
    return builder.bitcast(builder.fptrunc(x, _F16), _I16)


def _same(context, builder, signature, args):  # noqa: ANN001, ANN202, ARG001
    return args[0]


@intrinsic
def f16_from_f32(typingctx, x):  # noqa: ANN001, ANN202, ARG001
    """float32 -> the bits (uint16) of the nearest float16: IEEE rounding to nearest even,
    infinite beyond its range, NaN kept (numpy's ``astype(np.float16)``; ``vcvtps2ph``)."""
    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202, ARG001
        return _f16_bits(builder, args[0])

    return types.uint16(types.float32), codegen


@intrinsic
def kv_load(typingctx, x):  # noqa: ANN001, ANN202, ARG001
    """A cached key or value as float32: float16 bits (uint16) converted exactly
    (``vcvtph2ps``), a float32 as it is. The attention kernel reads either cache type."""
    if x == types.uint16:
        def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202, ARG001
            return builder.fpext(builder.bitcast(args[0], _F16), _F32)

        return types.float32(types.uint16), codegen
    if x == types.float32:
        return types.float32(types.float32), _same
    return None


@intrinsic
def kv_encode(typingctx, x, like):  # noqa: ANN001, ANN202, ARG001
    """float32 ``x`` as an element of array ``like``: float16 bits for a uint16 (float16)
    cache, ``x`` itself for a float32 one."""
    if isinstance(like, types.Array) and like.dtype == types.uint16:
        def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202, ARG001
            return _f16_bits(builder, args[0])

        return types.uint16(types.float32, like), codegen
    if isinstance(like, types.Array) and like.dtype == types.float32:
        return types.float32(types.float32, like), _same
    return None


@njit(cache=True, nogil=True, inline="always")
def to_f16(x):  # noqa: ANN001, ANN201
    """float32 x rounded to float16 exactly as numpy's ``astype(np.float16)`` (infinite
    beyond its range, NaN kept), as float32 (``round_f16`` without its range limit)."""
    return kv_load(f16_from_f32(x))


@njit(cache=True, nogil=True, inline="always")
def to_bf16(x):  # noqa: ANN001, ANN201
    """float32 x rounded to bfloat16 as ggml's ``fp32_to_bf16`` (nearest, ties to even; a
    NaN keeps its top bits, made quiet), as float32."""
    u = f32_bits(x)
    if (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):
        return f32_from_bits((u & np.uint32(0xFFFF0000)) | np.uint32(0x00400000))
    u = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return f32_from_bits(u)


@njit(cache=True, nogil=True, inline="always")
def round_f16(x):  # noqa: ANN001, ANN201
    """float32 x (|x| < 65504) rounded to the nearest float16 (ties to even), as float32."""
    if abs(x) < np.float32(6.103515625e-05):  # float16 subnormals: a fixed step of 2**-24
        return np.float32(np.rint(x * np.float32(16777216.0)) / np.float32(16777216.0))
    u = f32_bits(x)
    u = (u + np.uint32(0xFFF) + ((u >> np.uint32(13)) & np.uint32(1))) & np.uint32(0xFFFFE000)
    return f32_from_bits(u)


# ggml_v_expf's constants (ggml-cpu/vec.h), as written there
_R, _LOG2E, _LN2_LO, _LN2_HI, _P4, _P3, _P2, _P1, _P0 = (np.float32(float.fromhex(h)) for h in (
    "0x1.8p23", "0x1.715476p+0", "0x1.7f7d1cp-20", "0x1.62e4p-1", "0x1.0e4020p-7",
    "0x1.573e2ep-5", "0x1.555e66p-3", "0x1.fffdb6p-2", "0x1.ffffecp-1"))


@njit(cache=True, nogil=True, inline="always")
def expf_ggml(x):  # noqa: ANN001, ANN201
    """exp(x) for float32 x as ggml's ``ggml_v_expf`` computes each lane on x86 (AVX2/FMA;
    the soft_max of llama.cpp's CPU attention): 2^n * (1 + j(b)) with a degree-5
    polynomial j, within a few ulp of exp. Branch-free, so a loop of it vectorizes."""
    z = fma32(x, _LOG2E, _R)
    n = z - _R
    b = fma32(-n, _LN2_LO, fma32(-n, _LN2_HI, x))
    e = np.uint32(f32_bits(z) << np.uint32(23))
    k = f32_from_bits(np.uint32(e + np.uint32(0x3F800000)))
    u = b * b
    j = fma32(fma32(fma32(_P4, b, _P3), u, fma32(_P2, b, _P1)), u, _P0 * b)
    an = abs(n)
    g = np.uint32(0x82000000) if n <= 0 else np.uint32(0)
    s1 = f32_from_bits(np.uint32(g + np.uint32(0x7F000000)))
    # The large-|n| step runs in every lane (branch-free). For 0 < n < 32, which never
    # take it, 2**(n - 127) * (1 + j) would be subnormal, and each subnormal result costs
    # the FMA a microcode assist (SiLU's exp(-x) ran many times slower); the lanes that take it
    # have s2 >= 2**-67, so raising s2's bits to 2**-95 changes none of them. (A float
    # select here, LLVM moves after the FMA; ggml branches around the step instead.)
    s2 = f32_from_bits(max(np.uint32(e - g), np.uint32(0x10000000)))
    big = fma32(s2, j, s2) * s1
    normal = fma32(k, j, k)
    out = big if an > np.float32(126.0) else normal
    return s1 * s1 if an > np.float32(192.0) else out


@njit(cache=True, nogil=True)
def expf_ggml_rows(x):  # noqa: ANN001, ANN201
    """x (n, m) f32 -> (n, m) f32: ``expf_ggml`` of each element (the compiled form of
    ``expf_ggml_twin``, the same numbers: for a router's few values, where the twin's numpy
    temporaries cost more than the exp)."""
    out = np.empty_like(x)
    for i in range(x.shape[0]):
        for j in range(x.shape[1]):
            out[i, j] = expf_ggml(x[i, j])
    return out


def expf_ggml_twin(x: np.ndarray) -> np.ndarray:
    """``expf_ggml`` in numpy (fused steps as float64 sums rounded once to float32)."""
    f32, f64 = np.float32, np.float64

    def fma(a, b, c):  # noqa: ANN001, ANN202
        with np.errstate(all="ignore"):  # -inf * c + r: nan there, as in the kernel
            return (np.asarray(a, f64) * np.asarray(b, f64) + np.asarray(c, f64)).astype(f32)

    x = np.asarray(x, f32)
    z = fma(x, _LOG2E, _R)
    n = (z - _R).astype(f32)
    b = fma(-n, _LN2_LO, fma(-n, _LN2_HI, x))
    e = (z.view(np.uint32) << np.uint32(23)).astype(np.uint32)
    k = (e + np.uint32(0x3F800000)).astype(np.uint32).view(f32)
    u = (b * b).astype(f32)
    j = fma(fma(fma(_P4, b, _P3), u, fma(_P2, b, _P1)), u, (_P0 * b).astype(f32))
    an = np.abs(n)
    g = np.where(n <= 0, np.uint32(0x82000000), np.uint32(0)).astype(np.uint32)
    s1 = (g + np.uint32(0x7F000000)).astype(np.uint32).view(f32)
    s2 = (e - g).astype(np.uint32).view(f32)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        big = (fma(s2, j, s2) * s1).astype(f32)
        out = np.where(an > 126, big, fma(k, j, k))
        return np.where(an > 192, (s1 * s1).astype(f32), out).astype(f32)
