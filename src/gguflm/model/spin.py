"""What the team's members (``team.py``) synchronise with: atomic counters and spin waits.

numba has no atomics; each is the one LLVM instruction. A step's counters are two words a
cache line apart: the next work item to take and the count of finished ones (``LINE``).
"""

from __future__ import annotations

import sys

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from gguflm.quant import kernels

LINE = 8  # int64 words per cache line: a step's "finished" counter sits one line after


@intrinsic
def fetch_add(typingctx, arr, i):  # noqa: ANN001, ANN202, ARG001
    """``arr[i] += 1`` atomically (sequentially consistent); the value before."""
    sig = types.int64(arr, types.intp)

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        a = context.make_array(signature.args[0])(context, builder, args[0])
        p = cgutils.get_item_pointer(context, builder, signature.args[0], a, [args[1]])
        return builder.atomic_rmw("add", p, ir.Constant(ir.IntType(64), 1), "seq_cst")

    return sig, codegen


@intrinsic
def load_acquire(typingctx, arr, i):  # noqa: ANN001, ANN202, ARG001
    """``arr[i]`` read atomically: what was written before a ``fetch_add`` another thread
    made is visible after reading its result."""
    sig = types.int64(arr, types.intp)

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        a = context.make_array(signature.args[0])(context, builder, args[0])
        p = cgutils.get_item_pointer(context, builder, signature.args[0], a, [args[1]])
        return builder.load_atomic(p, "acquire", 8)

    return sig, codegen


_X86 = kernels.SIMD != "generic"
_YIELD = sys.platform != "win32"


@intrinsic
def spin_hint(typingctx, rounds):  # noqa: ANN001, ANN202, ARG001
    """One round of a spin wait: the CPU's pause hint (x86); every 4096th round gives the
    core away (``sched_yield``), so that a member waiting for one whose thread lost its
    core to another process lets that thread run."""
    sig = types.int64(types.int64)

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        if _X86:
            fn = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), []), "llvm.x86.sse2.pause")
            builder.call(fn, [])
        if _YIELD:
            every = builder.icmp_signed("==", builder.and_(args[0], ir.Constant(
                ir.IntType(64), 4095)), ir.Constant(ir.IntType(64), 4095))
            with builder.if_then(every, likely=False):
                fn = cgutils.get_or_insert_function(
                    builder.module, ir.FunctionType(ir.IntType(32), []), "sched_yield")
                builder.call(fn, [])
        return context.get_constant(types.int64, 0)

    return sig, codegen


@njit(cache=True, nogil=True)
def wait(sync, k, total):  # noqa: ANN001, ANN202
    """Until step ``k`` has finished ``total`` items."""
    r = 0
    while load_acquire(sync, k + LINE) < total:
        spin_hint(r)
        r += 1
