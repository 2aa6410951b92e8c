"""Float32 bit casts, fused multiply-add and float16 rounding for numba code: the one home
of these helpers, shared by the quantized kernels and the attention kernel.

numba has no bitcast between float32 and its bits and no float32 fma; these are numba
intrinsics that emit the single LLVM instruction.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

_I32, _F32 = ir.IntType(32), ir.FloatType()


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


@njit(cache=True, nogil=True, inline="always")
def round_f16(x):  # noqa: ANN001, ANN201
    """float32 x (|x| < 65504) rounded to the nearest float16 (ties to even), as float32."""
    if abs(x) < np.float32(6.103515625e-05):  # float16 subnormals: a fixed step of 2**-24
        return np.float32(np.rint(x * np.float32(16777216.0)) / np.float32(16777216.0))
    u = f32_bits(x)
    u = (u + np.uint32(0xFFF) + ((u >> np.uint32(13)) & np.uint32(1))) & np.uint32(0xFFFFE000)
    return f32_from_bits(u)
