"""IR helpers: the SIMD flavour the kernels are built for, and ``VectorIR``, the loads,
unpacking steps and integer block dot that the integer and float tiles (and attention's
loops, ``model.attention_ir``) are written in.

The per-block SIMD work is LLVM vector IR (numba ``@intrinsic``): numba's auto-vectorizer
turns these block loops into scalar code, at a third of the speed. The IR uses the x86
AVX2 intrinsics where the CPU has AVX2 (or AVX-512) and portable vector IR giving the same
integers elsewhere (``SIMD``). llvmlite is numba's own code generator, not an extra
dependency.
"""

from __future__ import annotations

import os

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic
from numba.np.arrayobj import populate_array

# -- which SIMD flavour the IR uses (decided once; numba's cache is keyed by CPU features,
# and jitcache's stamp by GGUFLM_SIMD) --------------------------------------------------


def _host_features() -> dict:
    """The host CPU's features as LLVM names them; none for a portable build for another
    CPU (no host intrinsics) or where probing fails."""
    cpu = numba.config.CPU_NAME
    if cpu and cpu != "host":
        return {}
    try:
        import llvmlite.binding as llvm

        return dict(llvm.get_host_cpu_features())
    except Exception:  # noqa: BLE001 - feature probing is best effort
        return {}


# a forced flavour (tests, measurements): "avx512", "avx2", "generic", or "avxvnni" (the
# AVX2 IR with 256-bit ``vpdpbusd``, as on Intel's client CPUs with AVX-VNNI; on a CPU
# without VNNI the same as "avx2")
_FORCED = os.environ.get("GGUFLM_SIMD", "")


def _simd_kind(feats: dict) -> str:
    if _FORCED in ("avx512", "avx2", "generic"):
        return _FORCED
    if _FORCED == "avxvnni":
        return "avx2"
    if feats.get("avx512bw"):
        return "avx512"
    if feats.get("avx2"):
        return "avx2"
    return "generic"


_FEATURES = _host_features()
SIMD = _simd_kind(_FEATURES)
# ``vpdpbusd`` on 256-bit vectors (AVX512-VNNI with AVX512-VL, or AVX-VNNI): one
# instruction for ``pmaddubsw`` then ``pmaddwd`` by 1, the same integers
# (``VectorIR.span_dot``); off with ``GGUFLM_SIMD=avx2`` or ``generic``, on with
# ``avxvnni``
_HAS_VNNI = bool((_FEATURES.get("avx512vnni") and _FEATURES.get("avx512vl"))
                 or _FEATURES.get("avxvnni"))
VNNI = SIMD != "generic" and _FORCED not in ("avx2", "generic") and _HAS_VNNI

# 512-bit tiles (``int_tiles``' wide block loop): two 32-value spans per instruction. The
# integer multiplies issue two a cycle at either width, so a 512-bit one does twice the
# work; ``vpdpwssd`` (AVX512-VNNI) adds the scaled pair sums in the same instruction. Off
# with ``GGUFLM_SIMD=avx2`` or ``generic``
WIDE = SIMD == "avx512"
VNNI512 = WIDE and bool(_FEATURES.get("avx512vnni"))
# ``vgf2p8affineqb``: any fixed move of the bits within each byte (a shift and a mask, as
# the weights' bit planes need) in one instruction (``VectorIR.byte_bits``), where LLVM
# emits a shift then a mask: the same bytes; off with ``GGUFLM_SIMD=avx2``, ``avxvnni`` or
# ``generic``
GFNI = (SIMD != "generic" and _FORCED not in ("avx2", "avxvnni", "generic")
        and bool(_FEATURES.get("gfni")))
if SIMD != "generic":  # the x86 inline asm (``VectorIR.dpwssd512``, the GEMM's) needs the
    # parser numba leaves out
    import llvmlite.binding as _llvm

    _llvm.initialize_native_asmparser()

# float16 bit pattern -> float32, for block scales read straight from the weight bytes;
# then, at E8M0_AT + e, ggml_e8m0_to_fp32_half of the byte e (MXFP4's scales: one load
# instead of a shift, a subtraction and a select per block): 2**(e - 128), built from bits
# as ggml does (0x00200000 << e below 2, else (e - 1) << 23)
E8M0_AT = 65536
_E = np.arange(256, dtype=np.uint32)
F16_TABLE = np.concatenate((
    np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32),
    np.where(_E < 2, np.uint32(0x00200000) << _E, (_E - 1) << 23).astype(np.uint32)
    .view(np.float32)))

I8, I16, I32, I64, F32 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64), \
    ir.FloatType()


def vec(t: ir.Type, n: int) -> ir.VectorType:
    """<n x t>."""
    return ir.VectorType(t, n)


_CAT = ir.Constant(vec(I32, 32), list(range(32)))
_CAT_SAME = ir.Constant(vec(I32, 32), list(range(16)) * 2)  # 16 lanes, twice


def row_pointer(builder: ir.IRBuilder, ary: object, i: ir.Value, elem: ir.Type) -> ir.Value:
    """Pointer to element 0 of row ``i`` of a 2-D array struct (rows may be strided, each
    row's elements contiguous)."""
    stride = cgutils.unpack_tuple(builder, ary.strides)[0]
    p = builder.gep(builder.bitcast(ary.data, I8.as_pointer()), [builder.mul(i, stride)])
    return builder.bitcast(p, elem.as_pointer())


def array_args(context: object, builder: ir.IRBuilder, signature: object,
               args: list) -> list:
    """An intrinsic's arguments with each array as its struct (``.data``, ``.shape``,
    ``.strides``), the rest as they are."""
    return [context.make_array(t)(context, builder, v) if isinstance(t, types.Array) else v
            for t, v in zip(signature.args, args, strict=True)]


def array_view(dtype: types.Type, ndim: int, layout: str = "A", readonly: bool = False):  # noqa: ANN201
    """Intrinsic ``view(addr, shape, strides)``: the array of ``dtype`` at address ``addr``
    with ``shape`` and byte ``strides`` (UniTuples of int64); its owner keeps the memory
    alive."""
    aryty = types.Array(dtype, ndim, layout, readonly=readonly)

    @intrinsic
    def view(typingctx, addr, shape, strides):  # noqa: ANN001, ANN202, ARG001
        tup = types.UniTuple(types.int64, ndim)
        sig = aryty(types.int64, tup, tup)

        def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
            ary = context.make_array(aryty)(context, builder)
            item = context.get_abi_sizeof(context.get_data_type(dtype))
            ptr = builder.inttoptr(args[0], context.get_data_type(dtype).as_pointer())
            populate_array(ary, data=ptr, shape=args[1], strides=args[2],
                           itemsize=context.get_constant(types.intp, item), meminfo=None)
            return ary._getvalue()

        return sig, codegen

    return view


class VectorIR:
    """IR helpers for one kernel function: loads, unpacking, the integer block dot."""

    def __init__(self, builder: ir.IRBuilder, tbl: ir.Value | None):
        self.b = builder
        self.tbl = tbl  # F16_TABLE's data, for ``f16``

    # constants and scalars
    def c64(self, v: int) -> ir.Constant:
        return ir.Constant(I64, v)

    def at(self, ptr: ir.Value, off: ir.Value | int) -> ir.Value:
        return self.b.gep(ptr, [off if isinstance(off, ir.Value) else self.c64(off)])

    def f16(self, ptr: ir.Value, off: ir.Value | int) -> ir.Value:
        """A little-endian fp16 at ``ptr + off`` as float (table lookup)."""
        p = self.b.bitcast(self.at(ptr, off), I16.as_pointer())
        idx = self.b.zext(self.b.load(p, align=1), I64)
        return self.b.load(self.at(self.tbl, idx))

    def store_2d(self, ary: object, i: ir.Value, j: ir.Value, value: ir.Value) -> None:
        """``ary[i, j] = value`` for a 2-D float32 array struct (any strides)."""
        strides = cgutils.unpack_tuple(self.b, ary.strides)
        off = self.b.add(self.b.mul(i, strides[0]), self.b.mul(j, strides[1]))
        p = self.b.gep(self.b.bitcast(ary.data, I8.as_pointer()), [off])
        self.b.store(value, self.b.bitcast(p, F32.as_pointer()))

    def load_f32(self, ptr: ir.Value, idx: ir.Value) -> ir.Value:
        return self.b.load(self.at(ptr, idx))

    def load_v8(self, ptr: ir.Value, idx: ir.Value) -> ir.Value:
        """<8 x float> at float ``ptr + 8 * idx``."""
        p = self.b.bitcast(self.at(ptr, self.b.mul(idx, self.c64(8))), vec(F32, 8).as_pointer())
        return self.b.load(p, align=4)

    def vload(self, ptr: ir.Value, off: ir.Value | int, n: int) -> ir.Value:
        """``n`` bytes at ``ptr + off`` as <n x i8>."""
        p = self.b.bitcast(self.at(ptr, off), vec(I8, n).as_pointer())
        return self.b.load(p, align=1)

    def splat8(self, v: int, n: int) -> ir.Constant:
        return ir.Constant(vec(I8, n), [v] * n)

    def splatf8(self, x: ir.Value) -> ir.Value:
        v = self.b.insert_element(ir.Constant(vec(F32, 8), ir.Undefined), x,
                                  ir.Constant(I32, 0))
        return self.b.shuffle_vector(v, v, ir.Constant(vec(I32, 8), [0] * 8))

    # unpacking
    def nibbles(self, ptr: ir.Value, off: ir.Value) -> ir.Value:
        """16 bytes -> <32 x i8>: the 16 low nibbles, then the 16 high nibbles (0..15).

        On x86 the 16 bytes are loaded into both halves (``vbroadcasti128``), the upper
        half's 64-bit lanes shifted right by 4 (``vpsrlvq``; a byte then holds its own
        high nibble below the next byte's low one) and all masked: two operations, not
        four (two masks, a shift, the halves joined)."""
        v = self.vload(ptr, off, 16)
        if SIMD != "generic":
            both = self.b.shuffle_vector(v, v, _CAT_SAME)
            q = self.b.lshr(self.b.bitcast(both, vec(I64, 4)),
                            ir.Constant(vec(I64, 4), [0, 0, 4, 4]))
            return self.b.and_(self.b.bitcast(q, vec(I8, 32)), self.splat8(15, 32))
        lo = self.b.and_(v, self.splat8(15, 16))
        hi = self.b.lshr(v, self.splat8(4, 16))
        return self.b.shuffle_vector(lo, hi, _CAT)

    def byte_bits(self, v: ir.Value, right: int, width: int, left: int = 0) -> ir.Value:
        """<n x i8> ``v`` (n = 32 or 64) -> each byte's bits ``right`` .. ``right + width -
        1`` moved to bit ``left`` on, the rest 0: ``((v >> right) & (2**width - 1)) <<
        left``. With GFNI one ``vgf2p8affineqb``, whose matrix has row ``7 - i`` (the byte
        that makes bit i) select source bit ``i - left + right``."""
        b, n = self.b, v.type.count
        if GFNI:
            rows = [1 << (i - left + right) if left <= i < left + width else 0
                    for i in range(8)]
            matrix = sum(r << (8 * (7 - i)) for i, r in enumerate(rows))
            mat = b.bitcast(ir.Constant(vec(I64, n // 8), [matrix] * (n // 8)), vec(I8, n))
            return self.call(f"llvm.x86.vgf2p8affineqb.{8 * n}", vec(I8, n),
                             [v, mat, ir.Constant(I8, 0)])
        if right:
            v = b.lshr(v, self.splat8(right, n))
        if right + width < 8:
            v = b.and_(v, self.splat8((1 << width) - 1, n))
        if left:
            v = b.shl(v, self.splat8(left, n))
        return v

    def bits32(self, qh: ir.Value, shift_to: int) -> ir.Value:
        """i32 ``qh`` -> <32 x i8>: bit e of qh moved to bit ``shift_to`` of element e.

        Byte e/8 of qh is broadcast to element e and tested against 1 << (e%8): a byte
        shuffle and a compare, instead of 32 variable shifts. With AVX-512 the 32 bits are
        a mask register as they stand (``kmovd``), and the result one masked move."""
        b = self.b
        if SIMD == "avx512":
            return b.select(b.bitcast(qh, vec(ir.IntType(1), 32)),
                            self.splat8(1 << shift_to, 32), self.splat8(0, 32))
        v = b.bitcast(qh, vec(I8, 4))
        v = b.shuffle_vector(v, v, ir.Constant(vec(I32, 32), [e // 8 for e in range(32)]))
        bit = ir.Constant(vec(I8, 32), [1 << (e % 8) for e in range(32)])
        hit = b.icmp_unsigned("!=", b.and_(v, bit), self.splat8(0, 32))
        return b.select(hit, self.splat8(1 << shift_to, 32), self.splat8(0, 32))

    def magnitude(self, w8: ir.Value) -> ir.Value:
        """|w| of <32 x i8> (pabsb; -128 gives 128 read as unsigned)."""
        b = self.b
        neg = b.icmp_signed("<", w8, self.splat8(0, 32))
        return b.select(neg, b.sub(self.splat8(0, 32), w8), w8)

    # the integer dot of one 32-value span: <8 x i32>, lane j = sum over values 4j..4j+3 of
    # weight * activation (* the values' integer group scale), exactly ggml's x86 lanes
    # (the types without integer scales; the K-quants take ``quad_sums``/``pack_madd``)
    def call(self, name: str, ret: ir.Type, args: list[ir.Value]) -> ir.Value:
        """A call of LLVM intrinsic ``name`` returning ``ret``."""
        fn = cgutils.get_or_insert_function(
            self.b.module, ir.FunctionType(ret, [a.type for a in args]), name)
        return self.b.call(fn, args)

    def span_dot(self, w8: ir.Value, wu: ir.Value, a8: ir.Value, sc, signed: bool,  # noqa: ANN001
                 acc: ir.Value | None = None) -> ir.Value:
        """``w8`` the span's 32 weight values (<32 x i8>), ``wu`` their magnitudes when
        ``signed`` (else ``w8``), ``a8`` 32 activation values, ``sc`` None or a
        ``SpanScales``: integer scale ``sc.scales[sc.first]`` for values 0-15,
        ``sc.scales[sc.second]`` for 16-31; ``acc`` None or the lanes of the block's
        earlier spans, which the result then includes.
        On x86 as ggml does it: ``pmaddubsw`` (|w| with the activation's sign moved to w's,
        pair sums that cannot saturate: |w| <= 128, |a| <= 127), then ``pmaddwd`` by 1 or
        by the scales; elsewhere the same integers in portable vector IR. Where the CPU
        has VNNI and there are no scales, ``vpdpbusd`` sums each lane's four products in
        one instruction, added onto ``acc``: the same integers, since the pair sums never
        saturate and integer sums do not depend on their order."""
        b = self.b
        if SIMD != "generic":
            a = self.call("llvm.x86.avx2.psign.b", vec(I8, 32), [a8, w8]) if signed else a8
            if VNNI and sc is None:
                src = acc if acc is not None else ir.Constant(vec(I32, 8), [0] * 8)
                return self.dpbusd(src, wu, a)
            s16 = self.call("llvm.x86.avx2.pmadd.ub.sw", vec(I16, 16), [wu, a])
            if sc is None:
                m = ir.Constant(vec(I16, 16), [1] * 16)
            else:
                m = b.shuffle_vector(sc.scales, sc.scales,
                                     ir.Constant(vec(I32, 16), [sc.first] * 8 + [sc.second] * 8))
            p = self.call("llvm.x86.avx2.pmadd.wd", vec(I32, 8), [s16, m])
            return p if acc is None else b.add(acc, p)
        p = b.mul(b.sext(w8, vec(I32, 32)), b.sext(a8, vec(I32, 32)))
        if sc is not None:
            lanes = ir.Constant(vec(I32, 32), [sc.first] * 16 + [sc.second] * 16)
            p = b.mul(p, b.sext(b.shuffle_vector(sc.scales, sc.scales, lanes), vec(I32, 32)))
        p = self.pair_sums(self.pair_sums(p))  # lane j sums values 4j..4j+3
        return p if acc is None else b.add(acc, p)

    def pair_sums(self, v: ir.Value) -> ir.Value:
        """<2n x i32> -> <n x i32>: lane j is lanes 2j and 2j + 1 added (portable IR)."""
        n = v.type.count // 2
        ev = ir.Constant(vec(I32, n), list(range(0, 2 * n, 2)))
        od = ir.Constant(vec(I32, n), list(range(1, 2 * n, 2)))
        return self.b.add(self.b.shuffle_vector(v, v, ev), self.b.shuffle_vector(v, v, od))

    def dpbusd(self, acc: ir.Value, u8: ir.Value, s8: ir.Value) -> ir.Value:
        """``vpdpbusd``: <8 x i32> ``acc`` plus, in lane j, the four products of unsigned
        bytes ``u8[4j..4j+3]`` and signed bytes ``s8[4j..4j+3]`` (<32 x i8> each)."""
        v32 = vec(I32, 8)
        return self.call("llvm.x86.avx512.vpdpbusd.256", v32,
                         [acc, self.b.bitcast(u8, v32), self.b.bitcast(s8, v32)])

    # 512-bit integer steps (``WIDE``): 64 bytes, 32 words or 16 dwords
    def maddubs512(self, u8: ir.Value, s8: ir.Value) -> ir.Value:
        """``pmaddubsw`` on <64 x i8>: word j = u8[2j] s8[2j] + u8[2j+1] s8[2j+1] (u8
        unsigned, s8 signed; the callers' sums cannot saturate)."""
        return self.call("llvm.x86.avx512.pmaddubs.w.512", vec(I16, 32), [u8, s8])

    def dpwssd512(self, acc: ir.Value | None, w16: ir.Value, m16: ir.Value) -> ir.Value:
        """<16 x i32> ``acc`` plus ``pmaddwd(w16, m16)`` (<32 x i16> each): one ``vpdpwssd``
        with AVX512-VNNI, else ``pmaddwd`` (two 256-bit ones without AVX-512) then an add
        (the same integers)."""
        v32 = vec(I32, 16)
        if acc is None:
            acc = ir.Constant(v32, [0] * 16)
        if VNNI512:  # inline asm: LLVM splits the intrinsic back into pmaddwd and an add
            # (shorter chains, twice the uops), and the tiles have ILP enough without that
            fnty = ir.FunctionType(v32, [v32, v32, v32])
            return self.b.asm(fnty, "vpdpwssd $2, $1, $0", "=v,v,v,0",
                              [self.b.bitcast(w16, v32), self.b.bitcast(m16, v32), acc],
                              False, "dpwssd")
        if WIDE:
            p = self.call("llvm.x86.avx512.pmaddw.d.512", v32, [w16, m16])
            return self.b.add(acc, p)
        b = self.b
        halves = [self.call("llvm.x86.avx2.pmadd.wd", vec(I32, 8), [
            self.lanes(x, list(range(16 * h, 16 * h + 16))) for x in (w16, m16)])
            for h in range(2)]
        return b.add(acc, b.shuffle_vector(*halves, ir.Constant(vec(I32, 16), list(range(16)))))

    # the integer steps of the types with integer scales (``int_tiles._scaled_dot``)
    def quad_sums(self, u8: ir.Value, s8: ir.Value, both_signed: bool = False) -> ir.Value:
        """<n x i8> ``u8`` (unsigned bytes) and ``s8`` (signed), n = 32 or 64 -> <n/4 x
        i32>: lane j the sum of the products of bytes 4j..4j+3. One ``vpdpbusd`` with VNNI;
        else ``pmaddubsw`` then ``pmaddwd`` by 1 (the same integers: the callers' pair sums
        stay within int16); portable IR where there is no x86 (``both_signed``: ``u8``
        holds signed values there, the weights themselves)."""
        b, n = self.b, u8.type.count
        v32 = vec(I32, n // 4)
        zero = ir.Constant(v32, [0] * (n // 4))
        if SIMD != "generic" and (VNNI if n == 32 else VNNI512):
            name = "llvm.x86.avx512.vpdpbusd." + ("256" if n == 32 else "512")
            return self.call(name, v32, [zero, b.bitcast(u8, v32), b.bitcast(s8, v32)])
        if SIMD != "generic":
            w16 = vec(I16, n // 2)
            if n == 32:
                s16 = self.call("llvm.x86.avx2.pmadd.ub.sw", w16, [u8, s8])
                return self.call("llvm.x86.avx2.pmadd.wd", v32, [s16, ir.Constant(w16, [1] * 16)])
            s16 = self.maddubs512(u8, s8)
            return self.call("llvm.x86.avx512.pmaddw.d.512", v32, [s16, ir.Constant(w16, [1] * 32)])
        ext = b.sext if both_signed else b.zext
        return self.pair_sums(self.pair_sums(b.mul(ext(u8, vec(I32, n)), b.sext(s8, vec(I32, n)))))

    def pack_madd(self, d_a: ir.Value, d_b: ir.Value, scales: ir.Value,
                  acc: ir.Value | None = None) -> ir.Value:
        """<n x i32> ``d_a``, ``d_b`` (n = 8 or 16; every value within int16) and <2n x
        i16> ``scales`` -> <n x i32> (plus ``acc``): ``packssdw`` (in each 128-bit lane k
        the words d_a[4k..4k+3], d_b[4k..4k+3]) then ``pmaddwd`` by ``scales`` (adjacent
        words times their scales, summed). Portable IR where there is no x86."""
        b, n = self.b, d_a.type.count
        v32, w16 = vec(I32, n), vec(I16, 2 * n)
        if SIMD != "generic":
            if n == 16:
                packed = self.call("llvm.x86.avx512.packssdw.512", w16, [d_a, d_b])
                return self.dpwssd512(acc, packed, scales)
            packed = self.call("llvm.x86.avx2.packssdw", w16, [d_a, d_b])
            p = self.call("llvm.x86.avx2.pmadd.wd", v32, [packed, scales])
            return p if acc is None else b.add(acc, p)
        order = [x for k in range(n // 4) for x in
                 [4 * k + i for i in range(4)] + [n + 4 * k + i for i in range(4)]]
        words = b.shuffle_vector(d_a, d_b, ir.Constant(vec(I32, 2 * n), order))
        p = self.pair_sums(b.mul(words, b.sext(scales, vec(I32, 2 * n))))
        return p if acc is None else b.add(acc, p)

    def fma8(self, acc: ir.Value, lanes: ir.Value, scale: ir.Value) -> ir.Value:
        """``acc + float(lanes) * scale`` fused, 8 lanes (ggml's ``_mm256_fmadd_ps``)."""
        f = self.b.sitofp(lanes, vec(F32, 8))
        return self.call("llvm.fma.v8f32", vec(F32, 8), [f, self.splatf8(scale), acc])

    def hsum(self, v: ir.Value) -> ir.Value:
        """Sum of a <16 x float> (lanes i and i+8, then i+4, i+2, i+1)."""
        for width in (8, 4, 2, 1):
            hi = self.b.shuffle_vector(v, v, ir.Constant(vec(I32, 16),
                                                         [i + width for i in range(width)]
                                                         + [0] * (16 - width)))
            v = self.b.fadd(v, hi, flags=("fast",))
        return self.b.extract_element(v, ir.Constant(I32, 0))

    def hsum8(self, v: ir.Value) -> ir.Value:
        """Sum of a <8 x float> (pairwise: lanes i and i+4, then i+2, then i+1)."""
        for width in (4, 2, 1):
            hi = self.b.shuffle_vector(v, v, ir.Constant(vec(I32, 8),
                                                         [i + width for i in range(width)]
                                                         + [0] * (8 - width)))
            v = self.b.fadd(v, hi)
        return self.b.extract_element(v, ir.Constant(I32, 0))

    def lanes(self, v: ir.Value, idx: list[int]) -> ir.Value:
        """A vector made of lanes ``idx`` of ``v``."""
        return self.b.shuffle_vector(v, v, ir.Constant(vec(I32, len(idx)), idx))
