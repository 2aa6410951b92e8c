"""Hot loops on plain arrays: 8-bit activation quantization and quantized matrix products.

How a product ``W (d_out, d_in) @ x (d_in,)`` runs here, as in ggml's CPU backend:

1. ``x`` is quantized to 8 bits per block (``quantize_q8_0`` for the 32-element legacy
   types, with the Q8_1 block sums for Q4_1/Q5_1; ``quantize_q8_K`` for the K-quants),
   rounding exactly as ggml's x86 code does, so our logits track llama.cpp's.
2. Each weight block is unpacked to small integers and multiplied with the activation
   integers as ggml's x86 code does (``pmaddubsw`` then ``pmaddwd``): an exact integer dot
   product per block in 8 lanes (lane j sums values 4j..4j+3), converted and fused into an
   8-lane float accumulator times ``d_weight * d_activation``; at the end ggml's horizontal
   sum. Every tile shape runs the same per-element sequence, so results are batch-invariant.
3. Rows run in parallel chunks (``prange``); every activation row of a small batch is
   applied to a chunk of weight rows while those rows are hot in cache (a quantized GEMM).

The per-block SIMD work is written as LLVM vector IR (numba ``@intrinsic``): numba's
auto-vectorizer turns these block loops into scalar code, at a third of the speed. The IR
uses the x86 AVX2 intrinsics where the CPU has AVX2 (or AVX-512) and portable vector IR
giving the same integers elsewhere (``SIMD``). llvmlite is numba's own code generator,
not an extra dependency.

Which types have a block loop, and how each type's values, scales and offset term come out
of its block, is declared once in ``kerneltypes.KERNEL_TYPES``; the block loops are built
from those declarations (``_unpack``), and ``matrix.QMatrix`` dispatches from the same
table. Every kernel has a shape contract in one comment and a slow numpy twin (``twin_*``,
here or in ``kerneltypes``) that the tests compare against.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Sequence

import numba
import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from ..gguf.types import GGMLType
from .floatbits import expf_ggml, f32_from_bits, round_f16
from .jitcache import cached
from .kerneltypes import (
    KERNEL_TYPES,
    KernelType,
    Plane,
    kernel_type,
    pack_activation_blocks,
    table_key,
)

# -- which SIMD flavour the IR uses (decided once; numba's cache is keyed by CPU features) --


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


def _simd_kind(feats: dict) -> str:
    forced = os.environ.get("GGUFLM_SIMD", "")
    if forced in ("avx512", "avx2", "generic"):
        return forced
    if feats.get("avx512bw"):
        return "avx512"
    if feats.get("avx2"):
        return "avx2"
    return "generic"


_FEATURES = _host_features()
SIMD = _simd_kind(_FEATURES)
# ``vpdpbusd`` on 256-bit vectors (AVX512-VNNI with AVX512-VL, or AVX-VNNI): one
# instruction for ``pmaddubsw`` then ``pmaddwd`` by 1, the same integers (``_Gen.span_dot``);
# off with ``GGUFLM_SIMD=avx2`` or ``generic``
VNNI = (SIMD != "generic" and os.environ.get("GGUFLM_SIMD", "") not in ("avx2", "generic")
        and bool((_FEATURES.get("avx512vnni") and _FEATURES.get("avx512vl"))
                 or _FEATURES.get("avxvnni")))

# float16 bit pattern -> float32, for block scales read straight from the weight bytes
F16_TABLE = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32)

# What the jitted code needs from the declarations, as constant tuples of type ids (numba
# freezes them into the compiled code; _TABLE_KEY tells when a cached build is stale).
_Q8_0_KINDS = tuple(int(t) for t, k in KERNEL_TYPES.items() if k.act != GGMLType.Q8_K)
_Q8_K_KINDS = tuple(int(t) for t, k in KERNEL_TYPES.items() if k.act == GGMLType.Q8_K)
_NO_BATCH8 = tuple(int(t) for t, k in KERNEL_TYPES.items() if not k.batch8) or (-1,)
# the declarations and the instruction choices the IR was built with (GGUFLM_SIMD can
# change the latter for one cache directory)
_TABLE_KEY = zlib.crc32(f"{table_key()} {SIMD} {VNNI}".encode())

# ======================================================================================
# 1. Activation quantization (ggml quantize_row_q8_0 / q8_1 (x86) and q8_K)
# ======================================================================================


@njit(cache=True, nogil=True)
def _round_f16(v: np.ndarray) -> None:
    """Round float32 values in place to the nearest float16 value (ties to even).

    ggml stores Q8_0/Q8_1 scales as fp16 and multiplies with the rounded value.
    """
    for i in range(v.shape[0]):
        v[i] = round_f16(v[i])


@njit(cache=True, nogil=True)
def quantize_q8_0(x: np.ndarray, qa: np.ndarray, da: np.ndarray, sa: np.ndarray) -> None:
    """x (n, K) f32 -> qa (n, K) i8, da (n, K/32) f32 (fp16 values), sa (n, K/32) f32.

    ggml's x86 quantize_row_q8_0/q8_1: d = amax/127 stored as fp16, q = rint(x * 127/amax);
    sa = fp16(d * sum(q)) is Q8_1's block sum (used by Q4_1/Q5_1), with d the float32 scale
    before its own fp16 rounding (ggml's AVX code; fp16(fp16(d) * sum) is one fp16 step off
    in about a fifth of the blocks).
    """
    n, k = x.shape
    nb = k // 32
    for i in range(n):
        for b in range(nb):
            amax = np.float32(0.0)
            for j in range(32):
                amax = max(amax, abs(x[i, b * 32 + j]))
            d = amax / np.float32(127.0)
            inv = np.float32(127.0) / amax if amax != 0 else np.float32(0.0)
            s = 0
            for j in range(32):
                q = np.int32(np.rint(x[i, b * 32 + j] * inv))
                qa[i, b * 32 + j] = q
                s += q
            da[i, b] = d
            sa[i, b] = d * np.float32(s)  # d still float32 here, as in ggml's x86 code
        _round_f16(da[i])
        _round_f16(sa[i])


@njit(cache=True, nogil=True)
def quantize_q8_k(x: np.ndarray, qa: np.ndarray, da: np.ndarray, bsum: np.ndarray) -> None:
    """x (n, K) f32 -> qa (n, K) i8, da (n, K/256) f32, bsum (n, K/32) f32 (integer sums of
    each 32 values: Q8_K's 16-value bsums in pairs, as the Q4_K/Q5_K minimums use them).

    ggml's quantize_row_q8_K: scale from the signed value of largest magnitude,
    iscale = -127/max, q = min(127, nearest_int(iscale * x)), d = 1/iscale.
    """
    n, k = x.shape
    nb = k // 256
    for i in range(n):
        for b in range(nb):
            amax = np.float32(0.0)
            vmax = np.float32(0.0)
            for j in range(256):
                ax = abs(x[i, b * 256 + j])
                if ax > amax:
                    amax = ax
                    vmax = x[i, b * 256 + j]
            if amax == 0:
                for j in range(256):
                    qa[i, b * 256 + j] = 0
                for j in range(8):
                    bsum[i, b * 8 + j] = 0
                da[i, b] = 0
                continue
            iscale = np.float32(-127.0) / vmax
            for g in range(8):
                s = 0
                for j in range(32):
                    e = b * 256 + g * 32 + j
                    q = min(127, np.int32(np.rint(iscale * x[i, e])))
                    qa[i, e] = q
                    s += q
                bsum[i, b * 8 + g] = s
            da[i, b] = np.float32(1.0) / iscale


def activation_blocks(x: np.ndarray, act: GGMLType) -> np.ndarray:
    """ggml's ``from_float`` of ``x (n, K)`` f32 for ``act`` = Q8_0, Q8_1 or Q8_K, computed
    by the kernels' own quantizers: ``(n, K / QK * type_size)`` uint8 in ggml's layout."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    act = GGMLType(act)
    if act == GGMLType.Q8_K:
        qa, da, aux = quantize_activations(x, _Q8_K_KINDS[0])
    else:
        qa, da, aux = quantize_activations(x, _Q8_0_KINDS[0])
    return pack_activation_blocks(act, qa, da, aux)


# ======================================================================================
# 2. Row dot products as LLVM vector IR
# ======================================================================================

_I8, _I16, _I32, _I64, _F32 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64), \
    ir.FloatType()


def _vt(t: ir.Type, n: int) -> ir.VectorType:
    return ir.VectorType(t, n)


_CAT = ir.Constant(_vt(_I32, 32), list(range(32)))
_CAT_SAME = ir.Constant(_vt(_I32, 32), list(range(16)) * 2)  # 16 lanes, twice


class _Gen:
    """IR helpers for one row-dot function: loads, unpacking, the integer block dot."""

    def __init__(self, builder: ir.IRBuilder, tbl: ir.Value):
        self.b = builder
        self.tbl = tbl

    # constants and scalars
    def c64(self, v: int) -> ir.Constant:
        return ir.Constant(_I64, v)

    def at(self, ptr: ir.Value, off: ir.Value | int) -> ir.Value:
        return self.b.gep(ptr, [off if isinstance(off, ir.Value) else self.c64(off)])

    def add(self, a: ir.Value, k: int) -> ir.Value:
        return self.b.add(a, self.c64(k))

    def u8(self, ptr: ir.Value, off: ir.Value | int) -> ir.Value:
        """One byte, zero-extended to i32."""
        return self.b.zext(self.b.load(self.at(ptr, off)), _I32)

    def f16(self, ptr: ir.Value, off: ir.Value | int) -> ir.Value:
        """A little-endian fp16 at ``ptr + off`` as float (table lookup)."""
        p = self.b.bitcast(self.at(ptr, off), _I16.as_pointer())
        idx = self.b.zext(self.b.load(p, align=1), _I64)
        return self.b.load(self.at(self.tbl, idx))

    def load_f32(self, ptr: ir.Value, idx: ir.Value) -> ir.Value:
        return self.b.load(self.at(ptr, idx))

    def load_v8(self, ptr: ir.Value, idx: ir.Value) -> ir.Value:
        """<8 x float> at float ``ptr + 8 * idx``."""
        p = self.b.bitcast(self.at(ptr, self.b.mul(idx, self.c64(8))), _vt(_F32, 8).as_pointer())
        return self.b.load(p, align=4)

    def vload(self, ptr: ir.Value, off: ir.Value | int, n: int) -> ir.Value:
        """``n`` bytes at ``ptr + off`` as <n x i8>."""
        p = self.b.bitcast(self.at(ptr, off), _vt(_I8, n).as_pointer())
        return self.b.load(p, align=1)

    def splat8(self, v: int, n: int) -> ir.Constant:
        return ir.Constant(_vt(_I8, n), [v] * n)

    def splatf(self, x: ir.Value) -> ir.Value:
        v = self.b.insert_element(ir.Constant(_vt(_F32, 16), ir.Undefined), x,
                                  ir.Constant(_I32, 0))
        return self.b.shuffle_vector(v, v, ir.Constant(_vt(_I32, 16), [0] * 16))

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
            q = self.b.lshr(self.b.bitcast(both, _vt(_I64, 4)),
                            ir.Constant(_vt(_I64, 4), [0, 0, 4, 4]))
            return self.b.and_(self.b.bitcast(q, _vt(_I8, 32)), self.splat8(15, 32))
        lo = self.b.and_(v, self.splat8(15, 16))
        hi = self.b.lshr(v, self.splat8(4, 16))
        return self.b.shuffle_vector(lo, hi, _CAT)

    def nibbles32(self, ptr: ir.Value, off: ir.Value, high: bool) -> ir.Value:
        """32 bytes -> <32 x i8> of their low (or high) nibbles."""
        v = self.vload(ptr, off, 32)
        if high:
            return self.b.lshr(v, self.splat8(4, 32))
        return self.b.and_(v, self.splat8(15, 32))

    def bits32(self, qh: ir.Value, shift_to: int) -> ir.Value:
        """i32 ``qh`` -> <32 x i8>: bit e of qh moved to bit ``shift_to`` of element e.

        Byte e/8 of qh is broadcast to element e and tested against 1 << (e%8): a byte
        shuffle and a compare, instead of 32 variable shifts. With AVX-512 the 32 bits are
        a mask register as they stand (``kmovd``), and the result one masked move."""
        b = self.b
        if SIMD == "avx512":
            return b.select(b.bitcast(qh, _vt(ir.IntType(1), 32)),
                            self.splat8(1 << shift_to, 32), self.splat8(0, 32))
        v = b.bitcast(qh, _vt(_I8, 4))
        v = b.shuffle_vector(v, v, ir.Constant(_vt(_I32, 32), [e // 8 for e in range(32)]))
        hit = b.icmp_unsigned("!=", b.and_(v, ir.Constant(_vt(_I8, 32),
                                                        [1 << (e % 8) for e in range(32)])),
                              self.splat8(0, 32))
        return b.select(hit, self.splat8(1 << shift_to, 32), self.splat8(0, 32))

    # the integer dot of one 32-value span: <8 x i32>, lane j = sum over values 4j..4j+3 of
    # weight * activation (* the values' integer group scale), exactly ggml's x86 lanes
    def call(self, name: str, ret: ir.Type, args: list[ir.Value]) -> ir.Value:
        """A call of LLVM intrinsic ``name`` returning ``ret``."""
        fn = cgutils.get_or_insert_function(
            self.b.module, ir.FunctionType(ret, [a.type for a in args]), name)
        return self.b.call(fn, args)

    def span_dot(self, w8: ir.Value, wu: ir.Value, a8: ir.Value, sc, signed: bool,  # noqa: ANN001
                 acc: ir.Value | None = None) -> ir.Value:
        """``w8`` the span's 32 weight values (<32 x i8>), ``wu`` their magnitudes when
        ``signed`` (else ``w8``), ``a8`` 32 activation values, ``sc`` None or ``(sc16, s0,
        s1)``: integer scale ``sc16[s0]`` for values 0-15, ``sc16[s1]`` for 16-31; ``acc``
        None or the lanes of the block's earlier spans, which the result then includes.
        On x86 as ggml does it: ``pmaddubsw`` (|w| with the activation's sign moved to w's,
        pair sums that cannot saturate: |w| <= 128, |a| <= 127), then ``pmaddwd`` by 1 or
        by the scales; elsewhere the same integers in portable vector IR. Where the CPU
        has VNNI and there are no scales, ``vpdpbusd`` sums each lane's four products in
        one instruction, added onto ``acc``: the same integers, since the pair sums never
        saturate and integer sums do not depend on their order."""
        b = self.b
        if SIMD != "generic":
            a = self.call("llvm.x86.avx2.psign.b", _vt(_I8, 32), [a8, w8]) if signed else a8
            if VNNI and sc is None:
                src = acc if acc is not None else ir.Constant(_vt(_I32, 8), [0] * 8)
                return self.dpbusd(src, wu, a)
            s16 = self.call("llvm.x86.avx2.pmadd.ub.sw", _vt(_I16, 16), [wu, a])
            if sc is None:
                m = ir.Constant(_vt(_I16, 16), [1] * 16)
            else:
                sc16, s0, s1 = sc
                m = b.shuffle_vector(sc16, sc16, ir.Constant(_vt(_I32, 16), [s0] * 8 + [s1] * 8))
            p = self.call("llvm.x86.avx2.pmadd.wd", _vt(_I32, 8), [s16, m])
            return p if acc is None else b.add(acc, p)
        p = b.mul(b.sext(w8, _vt(_I32, 32)), b.sext(a8, _vt(_I32, 32)))
        if sc is not None:
            sc16, s0, s1 = sc
            s32 = b.sext(b.shuffle_vector(sc16, sc16, ir.Constant(_vt(_I32, 32),
                                                                 [s0] * 16 + [s1] * 16)),
                         _vt(_I32, 32))
            p = b.mul(p, s32)
        for width in (16, 8):  # adjacent pairs, twice: lane j sums values 4j..4j+3
            ev = ir.Constant(_vt(_I32, width), list(range(0, 2 * width, 2)))
            od = ir.Constant(_vt(_I32, width), list(range(1, 2 * width, 2)))
            p = b.add(b.shuffle_vector(p, p, ev), b.shuffle_vector(p, p, od))
        return p if acc is None else b.add(acc, p)

    def dpbusd(self, acc: ir.Value, u8: ir.Value, s8: ir.Value) -> ir.Value:
        """``vpdpbusd``: <8 x i32> ``acc`` plus, in lane j, the four products of unsigned
        bytes ``u8[4j..4j+3]`` and signed bytes ``s8[4j..4j+3]`` (<32 x i8> each)."""
        v32 = _vt(_I32, 8)
        return self.call("llvm.x86.avx512.vpdpbusd.256", v32,
                         [acc, self.b.bitcast(u8, v32), self.b.bitcast(s8, v32)])

    def magnitude(self, w8: ir.Value) -> ir.Value:
        """|w| of <32 x i8> (pabsb; -128 gives 128 read as unsigned)."""
        b = self.b
        neg = b.icmp_signed("<", w8, self.splat8(0, 32))
        return b.select(neg, b.sub(self.splat8(0, 32), w8), w8)

    def fma8(self, acc: ir.Value, lanes: ir.Value, scale: ir.Value) -> ir.Value:
        """``acc + float(lanes) * scale`` fused, 8 lanes (ggml's ``_mm256_fmadd_ps``)."""
        f = self.b.sitofp(lanes, _vt(_F32, 8))
        return self.call("llvm.fma.v8f32", _vt(_F32, 8), [f, self.splatf8(scale), acc])

    def hsum(self, v: ir.Value) -> ir.Value:
        """Sum of a <16 x float> (lanes i and i+8, then i+4, i+2, i+1)."""
        for width in (8, 4, 2, 1):
            hi = self.b.shuffle_vector(v, v, ir.Constant(_vt(_I32, 16),
                                                         [i + width for i in range(width)]
                                                         + [0] * (16 - width)))
            v = self.b.fadd(v, hi, flags=("fast",))
        return self.b.extract_element(v, ir.Constant(_I32, 0))

    def splatf8(self, x: ir.Value) -> ir.Value:
        v = self.b.insert_element(ir.Constant(_vt(_F32, 8), ir.Undefined), x,
                                  ir.Constant(_I32, 0))
        return self.b.shuffle_vector(v, v, ir.Constant(_vt(_I32, 8), [0] * 8))

    def hsum8(self, v: ir.Value) -> ir.Value:
        """Sum of a <8 x float> (pairwise: lanes i and i+4, then i+2, then i+1)."""
        for width in (4, 2, 1):
            hi = self.b.shuffle_vector(v, v, ir.Constant(_vt(_I32, 8),
                                                         [i + width for i in range(width)]
                                                         + [0] * (8 - width)))
            v = self.b.fadd(v, hi)
        return self.b.extract_element(v, ir.Constant(_I32, 0))


# The weight side of a block, built from its KernelType declaration: the values of each
# 32-value span as <32 x i8> (plane by plane, as kerneltypes.Plane describes them), the
# integer group scales, the block's float scale and its offset term.


def _emit_plane(g: _Gen, k: KernelType, p: Plane, row, off, span: int) -> ir.Value:  # noqa: ANN001
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
        word = bld.bitcast(g.at(row, bld.add(off, g.c64(foff + e0 // 8))), _I32.as_pointer())
        return g.bits32(bld.load(word, align=1), p.shift)
    per_set = p.group * 8 // p.width  # values per run of ``group`` bytes
    s, within = divmod(e0, per_set)
    plane, byte0 = divmod(within, p.group)
    at = bld.add(off, g.c64(foff + s * p.group + byte0))
    if p.group == 16 and p.width == 4 and plane == 0 and byte0 == 0:
        v = g.nibbles(row, at)
    elif p.group >= 32 and byte0 + 32 <= p.group:
        v = g.vload(row, at, 32)
        if plane:
            v = bld.lshr(v, g.splat8(plane * p.width, 32))
        if (plane + 1) * p.width < 8:
            v = bld.and_(v, g.splat8((1 << p.width) - 1, 32))
    else:
        raise NotImplementedError(f"{k.type.ggml_name}: no IR for plane {p}")
    if p.shift:
        v = bld.shl(v, g.splat8(p.shift, 32))
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


def _k_scales(g: _Gen, row, at):  # noqa: ANN001, ANN202
    """Q4_K/Q5_K's 8 six-bit scales and 8 mins (ggml get_scale_min_k4) from the 12 bytes at
    ``row + at`` as <16 x i8> (scales in lanes 0-7, mins in 8-15), unpacked with word-wide
    masks as ggml's x86 code does rather than 16 byte-by-byte extractions."""
    bld = g.b

    def word(k: int) -> ir.Value:
        p = bld.bitcast(g.at(row, bld.add(at, g.c64(4 * k))), _I32.as_pointer())
        return bld.load(p, align=1)

    def c(v: int) -> ir.Constant:
        return ir.Constant(_I32, v)

    u0, u1, u2 = word(0), word(1), word(2)
    hi2 = c(0x03030303)
    s_lo = bld.and_(u0, c(0x3F3F3F3F))
    m_lo = bld.and_(u1, c(0x3F3F3F3F))
    s_hi = bld.or_(bld.and_(u2, c(0x0F0F0F0F)), bld.shl(bld.and_(bld.lshr(u0, c(6)), hi2), c(4)))
    m_hi = bld.or_(bld.and_(bld.lshr(u2, c(4)), c(0x0F0F0F0F)),
                   bld.shl(bld.and_(bld.lshr(u1, c(6)), hi2), c(4)))
    v = ir.Constant(_vt(_I32, 4), ir.Undefined)
    for k, x in enumerate((s_lo, s_hi, m_lo, m_hi)):
        v = bld.insert_element(v, x, c(k))
    return bld.bitcast(v, _vt(_I8, 16))


def _lanes(g: _Gen, v: ir.Value, idx: list[int]) -> ir.Value:
    """A vector made of lanes ``idx`` of ``v``."""
    return g.b.shuffle_vector(v, v, ir.Constant(_vt(_I32, len(idx)), idx))


def _unpack(g: _Gen, k: KernelType, row, off, shifted: bool = False):  # noqa: ANN001, ANN202
    """One weight block as (spans, d, offset term): each 32-value span as ``(w8, wu, sc)``
    for ``_Gen.span_dot`` (values <32 x i8> after the bias, their magnitudes when signed,
    the span's integer scales or None); ``d`` the block's float scale; the offset term
    ("m", m) or ("dmin", dmin, <8 x float> integer mins) or None. ``shifted``: the values
    plus ``vnni_offset(k)`` instead, all unsigned (``w8`` = ``wu``: the bias not taken
    off, or whole signed bytes plus 128)."""
    bld = g.b
    fmt = k.format
    signed = _signed(k) and not shifted

    def field_at(name: str) -> ir.Value:
        return bld.add(off, g.c64(fmt[name].offset))

    d = _block_scale(g, k, row, off)
    sc16 = mins = None
    if k.scales == "k4":
        sm8 = _k_scales(g, row, field_at("scales"))
        sc16 = bld.zext(sm8, _vt(_I16, 16))
        smf = bld.uitofp(bld.zext(sm8, _vt(_I32, 16)), _vt(_F32, 16))
        mins = _lanes(g, smf, list(range(8, 16)))  # the 8 integer mins, as <8 x float>
    elif k.scales == "i8":
        sc16 = bld.sext(g.vload(row, field_at("scales"), 16), _vt(_I16, 16))
    group = k.block_size // (16 if k.scales == "i8" else 8)  # values per integer scale
    spans = []
    for span in range(k.block_size // 32):
        w = None
        for p in k.planes:
            v = _emit_plane(g, k, p, row, off, span)
            w = v if w is None else bld.or_(w, v)
        if shifted and not k.bias:  # whole signed bytes: + 128 is the top bit flipped
            w = bld.xor(w, g.splat8(-128, 32))
        elif k.bias and not shifted:
            w = bld.sub(w, g.splat8(k.bias, 32))
        sc = None if sc16 is None else (sc16, 32 * span // group, (32 * span + 16) // group)
        spans.append((w, g.magnitude(w) if signed and SIMD != "generic" else w, sc))
    term = None
    if k.offset == "m":
        term = ("m", g.f16(row, field_at("m")))
    elif k.offset == "dmin":
        term = ("dmin", g.f16(row, field_at("dmin")), mins)
    return spans, d, term


def _block_scale(g: _Gen, k: KernelType, row, off):  # noqa: ANN001, ANN202
    """The float scale ``d`` of the weight block at byte ``off`` of ``row``."""
    return g.f16(row, g.b.add(off, g.c64(k.format["d"].offset)))


def _signed(k: KernelType) -> bool:
    """Whether the type's values can be negative (a bias, or whole signed bytes)."""
    return bool(k.bias) or any(p.width == 8 for p in k.planes)


# Bytes ahead of the block in hand at which the tiles prefetch their weight row (and the
# next ones: a tile's rows lie one after another). The hardware's prefetchers left the
# tiles waiting on memory: SmolLM2 decoding steps (2 threads, same-process A/B) 1.14x
# faster at 4 rows and 1.20x at 8 with 2 KB ahead, 1.09x/1.16x with 1 KB.
PREFETCH = 2048
SCALE_RUN = 64  # blocks whose scale products the tiles store before their block loop


def _emit_type_loop(g: _Gen, k: KernelType, rows, acts, nb, accp, accsp,  # noqa: ANN001
                    lanes=None, shift: str = "") -> None:  # noqa: ANN001
    """The block loop of one weight type: ``accp[j][i]`` (<8 x float>) and ``accsp[j][i]``
    (float) accumulate weight row j times activation row i. Each weight block is unpacked
    once per row; each activation span is loaded once and used by every row. The float
    arithmetic is ggml's: ``(d_act * d) * isum``, ``+ m * s_act`` (Q8_1's block sum),
    ``- (d_act * dmin) * sum(min_s * activation 32-sum_s)``.

    ``lanes`` (one weight row, 8 activation rows): ``(da8, aux8, accv, scratch)``, pointers
    to the 8 rows' activation scales and Q8_1 sums interleaved (``_lanes8``: block b's 8
    values side by side), to a <8 x float> accumulator and to room for ``SCALE_RUN`` blocks'
    8 scale products. Then ``d_act * d`` is one vector product for the 8 rows and Q8_1's
    ``m * s_act`` one vector product and sum, lane i doing row i's scalar steps in the same
    order: the same numbers, with 2 vector operations in place of 24 scalar ones per
    block."""
    ts = k.type_size
    bld = g.b
    if lanes is None:
        with cgutils.for_range(bld, nb) as loop:
            _emit_block(g, k, rows, acts, loop.index, accp, accsp, None, None, shift)
        return
    # The tiles' scale products d * d_act, 8 rows a block, are worked out for a run of
    # blocks first and stored; the block loop then takes each row's product with a
    # broadcast load (a load port, no vector ALU). Spreading lane i of a register instead
    # took one or two shuffles per row and block: 20-28% of the 1x8 tile's time for the
    # 32-value types. Two loops, so LLVM cannot forward the stores into shuffles again.
    assert len(rows) == 1, "the 8 stored scale products are one weight row's"
    scratch = lanes[3]
    with cgutils.for_range_slice(bld, g.c64(0), nb, g.c64(SCALE_RUN)) as (c0, _):
        run = bld.select(bld.icmp_signed("<", bld.sub(nb, c0), g.c64(SCALE_RUN)),
                         bld.sub(nb, c0), g.c64(SCALE_RUN))
        with cgutils.for_range(bld, run) as loop:
            b = bld.add(c0, loop.index)
            d = _block_scale(g, k, rows[0], bld.mul(b, g.c64(ts)))
            dd8 = bld.fmul(g.splatf8(d), g.load_v8(lanes[0], b))
            slot = bld.gep(scratch, [bld.mul(loop.index, g.c64(8))])
            bld.store(dd8, bld.bitcast(slot, _vt(_F32, 8).as_pointer()), align=4)
        with cgutils.for_range(bld, run) as loop:
            slot = bld.gep(scratch, [bld.mul(loop.index, g.c64(8))])
            _emit_block(g, k, rows, acts, bld.add(c0, loop.index), accp, accsp, lanes, slot,
                        shift)
    if k.offset == "m":  # Q8_1's m * s_act: the lanes back to the rows' sums
        accv = bld.load(lanes[2])
        for i in range(len(acts)):
            bld.store(bld.extract_element(accv, ir.Constant(_I32, i)), accsp[0][i])


def _emit_block(g: _Gen, k: KernelType, rows, acts, b, accp, accsp, lanes, dd,  # noqa: ANN001
                shift: str = "") -> None:
    """Block ``b`` of ``_emit_type_loop`` (its arguments); with ``lanes``, ``dd`` points
    to the block's 8 stored scale products ``d * d_act``. ``shift`` (types with a
    ``vnni_offset``, on VNNI) skips the sign step with the same integers: "w" the weights
    plus their offset (``_unpack``), each lane's integer dot started from the activations'
    ``-offset * lane sum`` (``_lane_corrections``, the 4th pointer of ``acts``); "a" the
    activations plus 128, unsigned (the 5th pointer of ``acts``), times the signed weights,
    each lane started from ``-128 *`` the weights' lane sum, worked out once per weight
    block for all the activation rows (the tiles)."""
    qk, ts = k.block_size, k.type_size
    bld = g.b
    shifted = shift == "w"
    signed = _signed(k) and not shift
    lane_m = lanes is not None and k.offset == "m"  # Q8_1's m * s_act in the lanes
    abase = bld.mul(b, g.c64(qk))
    if len(rows) == 1 and len(acts) >= 4:  # a tile: see PREFETCH
        pf = g.at(rows[0], bld.add(bld.mul(b, g.c64(ts)), g.c64(PREFETCH)))
        g.call("llvm.prefetch.p0", ir.VoidType(), [pf, ir.Constant(_I32, 0),
                                                   ir.Constant(_I32, 3), ir.Constant(_I32, 1)])
    unpacked = [_unpack(g, k, row, bld.mul(b, g.c64(ts)), shifted) for row in rows]
    if lanes is None:
        dabs = [g.load_f32(da_p, b) for _, da_p, _, _, _ in acts]
    else:
        da8 = g.load_v8(lanes[0], b)
        dabs = [bld.extract_element(da8, ir.Constant(_I32, i)) for i in range(len(acts))]
    a8 = [[g.vload(qu_p if shift == "a" else qa_p, bld.add(abase, g.c64(32 * s)), 32)
           for s in range(qk // 32)] for qa_p, _, _, _, qu_p in acts]
    cor = None
    if shifted:  # each span's 8 lanes of -offset * (sum of the lane's 4 activations)
        cbase = bld.mul(b, g.c64(qk // 4))
        cor = [[bld.load(bld.bitcast(g.at(c_p, bld.add(cbase, g.c64(8 * s))),
                                     _vt(_I32, 8).as_pointer()), align=4)
                for s in range(qk // 32)] for _, _, _, c_p, _ in acts]
    for j, (spans, d, term) in enumerate(unpacked):
        if shift == "a":  # each span's 8 lanes of -128 * (sum of the lane's 4 weights)
            zero = ir.Constant(_vt(_I32, 8), [0] * 8)
            cor = [bld.sub(zero, g.dpbusd(zero, g.splat8(-128, 32), w8)) for w8, _, _ in spans]
        for i, (_, _, aux_p, _, _) in enumerate(acts):
            isum = None
            for s, (w8, wu, sc) in enumerate(spans):
                if shift == "a":
                    start = cor[s] if isum is None else bld.add(isum, cor[s])
                    isum = g.dpbusd(start, a8[i][s], w8)
                    continue
                start = isum
                if cor is not None:
                    start = cor[i][s] if isum is None else bld.add(isum, cor[i][s])
                isum = g.span_dot(w8, wu, a8[i][s], sc, signed, start)
            acc = bld.load(accp[j][i])
            if lanes is None:
                acc = g.fma8(acc, isum, bld.fmul(d, dabs[i]))
            else:  # row i's d * d_act, the same product as fmul(d, dabs[i])
                f = bld.sitofp(isum, _vt(_F32, 8))
                spread = g.splatf8(bld.load(bld.gep(dd, [g.c64(i)])))
                acc = g.call("llvm.fma.v8f32", _vt(_F32, 8), [f, spread, acc])
            bld.store(acc, accp[j][i])
            if term is None or lane_m:
                continue
            accs = bld.load(accsp[j][i])
            if term[0] == "m":  # + m * sum(x), Q8_1's stored block sum
                accs = bld.fadd(accs, bld.fmul(term[1], g.load_f32(aux_p, b)))
            else:
                p8 = bld.bitcast(g.at(aux_p, bld.mul(b, g.c64(8))),
                                 _vt(_F32, 8).as_pointer())
                # integers below 2**24 in float: the products and sums are exact
                msum = g.hsum8(bld.fmul(term[2], bld.load(p8, align=4)))
                accs = bld.fsub(accs, bld.fmul(bld.fmul(dabs[i], term[1]), msum))
            bld.store(accs, accsp[j][i])
        if lane_m:  # + m * sum(x) for the 8 rows: lane i = row i's scalar fmul and fadd
            accv = bld.load(lanes[2])
            prod = bld.fmul(g.splatf8(term[1]), g.load_v8(lanes[1], b))
            bld.store(bld.fadd(accv, prod), lanes[2])


def _make_rowdot(nr: int, na: int, lanes: bool = False):  # noqa: ANN202 - a numba intrinsic
    """Intrinsic ``rowdot(kind, w (R, row_bytes) u8, r0, rs, qa (n, K) i8, da (n, K/QK) f32,
    aux (n, .) f32, cor (n, K/4) i32 or (0, .), qu (n, K) i8 or (0, .), da8, aux8, tbl, i0,
    out (n, R) f32)``:
    ``out[i0+i, r0+j*rs] = W[r0+j*rs] . x[i0+i]`` for ``j < nr``, ``i < na``. Several rows
    share each activation load and give the CPU independent accumulator chains; ``kind`` (a
    ggml type id) selects the block loop. ``da8``/``aux8``: with ``lanes`` (1x8, 1x4),
    ``_lanes8(da, na)``/``_lanes8(aux, na)``, the scales and sums of activation rows
    i0..i0+na-1 side by side (``_emit_type_loop``); otherwise unused. ``cor``: the
    activations' ``_lane_corrections`` for the types with a ``vnni_offset``, or no rows
    (then those types take the sign step). ``qu``: the activations plus 128
    (``_activation_sets``), which the lanes tiles use for those types instead, or no rows."""

    @intrinsic
    def rowdot(typingctx, kind, w, r0, rs, qa, da, aux, cor, qu, da8, aux8, tbl, i0, out):  # noqa: ANN001, ANN202, ARG001, PLR0913
        sig = types.int64(kind, w, r0, rs, qa, da, aux, cor, qu, da8, aux8, tbl, i0, out)

        def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
            kind_, ws, r0_, rs_, qas, das, auxs, cors, qus, da8s, aux8s, tbls, i0_, outs = (
                context.make_array(t)(context, builder, v) if isinstance(t, types.Array) else v
                for t, v in zip(signature.args, args, strict=True))
            g = _Gen(builder, tbls.data)
            bld = builder

            def row_ptr(arr, i, elem):  # noqa: ANN001, ANN202 - pointer to arr[i, 0]
                stride = cgutils.unpack_tuple(bld, arr.strides)[0]
                p = bld.gep(bld.bitcast(arr.data, _I8.as_pointer()), [bld.mul(i, stride)])
                return bld.bitcast(p, elem.as_pointer())

            ridx = [bld.add(r0_, bld.mul(rs_, g.c64(j))) for j in range(nr)]
            rows = [row_ptr(ws, ri, _I8) for ri in ridx]
            nbytes = cgutils.unpack_tuple(bld, ws.shape)[1]
            acts = []
            for i in range(na):
                ii = bld.add(i0_, g.c64(i))
                acts.append((row_ptr(qas, ii, _I8), row_ptr(das, ii, _F32),
                             row_ptr(auxs, ii, _F32), row_ptr(cors, ii, _I32),
                             row_ptr(qus, ii, _I8)))
            zero = ir.Constant(_vt(_F32, 8), [0.0] * 8)
            accp = [[cgutils.alloca_once_value(bld, zero) for _ in range(na)] for _ in range(nr)]
            accsp = [[cgutils.alloca_once_value(bld, ir.Constant(_F32, 0.0)) for _ in range(na)]
                     for _ in range(nr)]
            lane_ptrs = None
            if lanes:
                g8 = bld.sdiv(i0_, g.c64(na))  # the rows' group in _lanes8(., na)
                # one scratch for every type's block loop (each its own would add 2 KB of
                # stack per type and tile where the tiles are inlined)
                lane_ptrs = (row_ptr(da8s, g8, _F32), row_ptr(aux8s, g8, _F32),
                             cgutils.alloca_once_value(bld, zero),
                             cgutils.alloca_once(bld, _F32, size=ir.Constant(_I64, 8 * SCALE_RUN)))
            done = bld.append_basic_block("rowdot.done")
            # a type id without a block loop gives NaN, never a silent 0 (the jitted entry
            # points refuse such ids before they get here)
            unknown = bld.append_basic_block("rowdot.unknown")
            sw = bld.switch(bld.sext(kind_, _I64) if kind_.type != _I64 else kind_, unknown)
            for t, k in KERNEL_TYPES.items():
                blk = bld.append_basic_block(f"rowdot.{t.ggml_name}")
                sw.add_case(ir.Constant(_I64, int(t)), blk)
                bld.position_at_end(blk)
                nb = bld.udiv(nbytes, g.c64(k.type_size))
                # no sign step (``_emit_block``'s ``shift``): the lanes tiles (one weight
                # row, 4 or 8 activation rows) take the activations plus 128 and each
                # weight block's lane corrections, the rest the weights plus their offset
                # and the activations' lane corrections. In the 1x8 tile those (a third
                # load per row and block) cost more than the sign step they save: Gemma's
                # Q8_0 output product 0.85x there, 1.09-1.11x at 4 rows; its Q5_0 products
                # 1.07-1.16x at 1 and 4 rows
                if vnni_offset(k):
                    src, shift = (qus, "a") if lanes else (cors, "w")
                    have = bld.icmp_signed("!=", cgutils.unpack_tuple(bld, src.shape)[0],
                                           g.c64(0))
                    with bld.if_else(have) as (shifted, plain):
                        with shifted:
                            _emit_type_loop(g, k, rows, acts, nb, accp, accsp, lane_ptrs, shift)
                        with plain:
                            _emit_type_loop(g, k, rows, acts, nb, accp, accsp, lane_ptrs)
                else:
                    _emit_type_loop(g, k, rows, acts, nb, accp, accsp, lane_ptrs)
                bld.branch(done)
            bld.position_at_end(unknown)
            for row_accs in accsp:
                for p in row_accs:
                    bld.store(ir.Constant(_F32, float("nan")), p)
            bld.branch(done)
            bld.position_at_end(done)
            out_stride = cgutils.unpack_tuple(bld, outs.strides)
            for j in range(nr):
                rr = ridx[j]
                for i in range(na):
                    res = bld.fadd(g.hsum8(bld.load(accp[j][i])), bld.load(accsp[j][i]))
                    ii = bld.add(i0_, g.c64(i))
                    off = bld.add(bld.mul(ii, out_stride[0]), bld.mul(rr, out_stride[1]))
                    p = bld.gep(bld.bitcast(outs.data, _I8.as_pointer()), [off])
                    bld.store(res, bld.bitcast(p, _F32.as_pointer()))
            return context.get_constant(types.int64, 0)

        return sig, codegen

    return rowdot


# (weight rows, activation rows) per call: 4x1 for token-by-token decoding; for batches 1x8
# (an unpacked block serves 8 activation rows) and 1x4 for 4-7 rows (one weight row at a
# time: on Gemma 3's 262144-row output 1.5x faster than 2x4, as fast on small matrices),
# except types declared batch8=False: 1x4 for all
_rd_4x1 = _make_rowdot(4, 1)
_rd_1x1 = _make_rowdot(1, 1)
_rd_1x8 = _make_rowdot(1, 8, lanes=True)
_rd_1x4 = _make_rowdot(1, 4)
_rd_1x4l = _make_rowdot(1, 4, lanes=True)


@njit(cache=True, nogil=True)
def _lanes8(a, group):  # noqa: ANN001, ANN201
    """a (n, m) f32 -> (n // group, 8 m) f32: each group of ``group`` (<= 8) rows with its
    columns side by side in 8 lanes, ``[g, 8 j + i] = a[group g + i, j]``, the lanes past
    ``group`` 0 (the 1x8 and 1x4 tiles' vector loads of scales and sums)."""
    n, m = a.shape
    out = np.zeros((n // group, 8 * m), np.float32)
    for g in range(n // group):
        for j in range(m):
            for i in range(group):
                out[g, 8 * j + i] = a[group * g + i, j]
    return out

# ======================================================================================
# 3. Matrix kernels
# ======================================================================================

ROW_CHUNK = 16  # weight rows per parallel work item (kept hot while all activations pass)
# Activation rows from which a product runs in tiles (1x8, 1x4) over ROW_CHUNK weight rows
# kept hot; fewer stream the weights as when decoding (four sequential streams, each weight
# row used by every activation row while in L1). From 4 rows tiles are faster, except for a
# matrix of STREAM_MIN_BYTES or more at 5-7 rows, whose 1-3 rows past the 1x4 tile would
# take slow 1x1 passes, while one stream per thread keeps up with memory. (Before the
# tiles' prefetch, PREFETCH, streams were faster for such a matrix at 4 rows too; with it
# tiles are, at 2 threads: Gemma 3's 262144-row Q8_0 output product 14.2 -> 10.0 ms, and
# SmolLM2's 49152-row one equal.)
BATCH_MIN_ROWS = 4
STREAM_MIN_BYTES = 16 << 20


@njit(cache=True, nogil=True, inline="always")
def _tiled(n, w):  # noqa: ANN001, ANN202
    """Whether n activation rows times weights ``w`` (R, row_bytes) run in tiles."""
    return n >= 8 or n == BATCH_MIN_ROWS or (
        n > BATCH_MIN_ROWS and w.shape[0] * w.shape[1] < STREAM_MIN_BYTES)


@njit(cache=True, nogil=True)
def qmatmul_rows(kind, w, qa, da, aux, cor, qu, tbl, out, r0, r1):  # noqa: ANN001, ANN201
    """W rows r0:r1 (R, row_bytes) u8 @ activations (n, K) -> out[:, r0:r1] (n, R) f32;
    ``cor`` the activations' ``_lane_corrections`` and ``qu`` the activations plus 128, or
    arrays of no rows (``_activation_sets``)."""
    n = qa.shape[0]
    if _tiled(n, w):  # a batch: tiles of ROW_CHUNK rows stay hot while activations pass
        lanes = kind not in _NO_BATCH8
        batch8 = lanes and n >= 8
        da8 = _lanes8(da if batch8 else da[:0], 8)
        aux8 = _lanes8(aux if batch8 else aux[:0], 8)
        lanes4 = lanes and n % 8 >= 4  # rows left for one 1x4 pass
        da4 = _lanes8(da if lanes4 else da[:0], 4)
        aux4 = _lanes8(aux if lanes4 else aux[:0], 4)
        for c0 in range(r0, r1, ROW_CHUNK):
            c1 = min(r1, c0 + ROW_CHUNK)
            i = 0
            if batch8:
                while i + 8 <= n:
                    for r in range(c0, c1):
                        _rd_1x8(kind, w, r, 1, qa, da, aux, cor, qu, da8, aux8, tbl, i, out)
                    i += 8
            while i + 4 <= n:
                if lanes4:
                    for r in range(c0, c1):
                        _rd_1x4l(kind, w, r, 1, qa, da, aux, cor, qu, da4, aux4, tbl, i, out)
                else:
                    for r in range(c0, c1):
                        _rd_1x4(kind, w, r, 1, qa, da, aux, cor, qu, da, aux, tbl, i, out)
                i += 4
            while i < n:
                for r in range(c0, c1):
                    _rd_1x1(kind, w, r, 1, qa, da, aux, cor, qu, da, aux, tbl, i, out)
                i += 1
        return
    # token by token: the weights stream from memory once. Four rows per pass, taken from
    # four quarters of the range, so that each quarter is one long sequential stream for
    # the prefetcher (adjacent rows would make short broken streams); the activation rows
    # take turns on those four rows while they are in L1.
    quarter = (r1 - r0) // 4
    for k in range(quarter):
        for i in range(n):
            _rd_4x1(kind, w, r0 + k, quarter, qa, da, aux, cor, qu, da, aux, tbl, i, out)
    for r in range(r0 + 4 * quarter, r1):
        for i in range(n):
            _rd_1x1(kind, w, r, 1, qa, da, aux, cor, qu, da, aux, tbl, i, out)


STREAM_CHUNK = 2048  # weight rows per parallel work item when decoding (long streams)
# work items per thread for a batch: each hand-out costs microseconds, so not one per tile,
# but a few, so that a thread kept off its core by another process leaves some to the rest
CHUNKS_PER_THREAD = 4


@njit(cache=True, nogil=True)
def quantize_activations(x, kind):  # noqa: ANN001, ANN201
    """The 8-bit form of ``x (n, K)`` that weights of ggml type ``kind`` multiply with:
    ``(qa (n, K) i8, da (n, K/QK) f32, aux (n, K/32) f32)`` with aux the Q8_1 sums or
    Q8_K 32-sums."""
    n, k = x.shape
    qa = np.empty((n, k), np.int8)
    aux = np.empty((n, k // 32), np.float32)
    if kind in _Q8_K_KINDS:
        da = np.empty((n, k // 256), np.float32)
        quantize_q8_k(x, qa, da, aux)
    elif kind in _Q8_0_KINDS:
        da = np.empty((n, k // 32), np.float32)
        quantize_q8_0(x, qa, da, aux)
    else:
        raise ValueError("no integer kernel for this ggml type id")
    return qa, da, aux


MAX_FUSED = 3  # products of one input run as one call: Q, K and V; gate and up


def vnni_offset(k: KernelType) -> int:
    """What makes type ``k``'s values unsigned for ``vpdpbusd`` (its bias; 128 for whole
    signed bytes), where the CPU has VNNI and the type has no integer scales; else 0 (the
    sign step stays). ``sum((w + o) a) - o sum(a)`` is the same integer as ``sum(w a)``."""
    if not VNNI or k.scales:
        return 0
    if k.bias:
        return k.bias
    return 128 if any(p.width == 8 for p in k.planes) else 0


_OFFSETS = [(int(t), vnni_offset(k)) for t, k in KERNEL_TYPES.items() if vnni_offset(k)]
_OFFSET_KINDS = tuple(t for t, _ in _OFFSETS) or (-1,)  # constant tuples for numba
_OFFSET_VALUES = tuple(o for _, o in _OFFSETS) or (0,)


@njit(cache=True, nogil=True)
def _shared_offset(kinds, count):  # noqa: ANN001, ANN201
    """The ``vnni_offset`` the products' types share (0: none has one, or they differ)."""
    off = 0
    for m in range(count):
        for j in range(len(_OFFSET_KINDS)):
            if _OFFSET_KINDS[j] == kinds[m]:
                if off and off != _OFFSET_VALUES[j]:
                    return 0
                off = _OFFSET_VALUES[j]
    return off


@njit(cache=True, nogil=True)
def _any_offset(kinds, count):  # noqa: ANN001, ANN201
    """Whether some of the products' types has a ``vnni_offset``."""
    for m in range(count):
        if kinds[m] in _OFFSET_KINDS:
            return True
    return False


@njit(cache=True, nogil=True)
def _lane_corrections(qa, off):  # noqa: ANN001, ANN201
    """qa (n, K) i8 -> (n, K/4) i32: ``-off`` times the sum of each 4 activations (one
    ``vpdpbusd`` lane), the start of the shifted weights' integer dots."""
    n, k = qa.shape
    cor = np.empty((n, k // 4), np.int32)
    for i in range(n):
        for j in range(k // 4):
            t = (np.int32(qa[i, 4 * j]) + np.int32(qa[i, 4 * j + 1])
                 + np.int32(qa[i, 4 * j + 2]) + np.int32(qa[i, 4 * j + 3]))
            cor[i, j] = -off * t
    return cor


@njit(cache=True, nogil=True)
def _plus_128(qa):  # noqa: ANN001, ANN201
    """qa (n, K) i8 -> (n, K) i8 holding the unsigned bytes ``qa + 128`` (the top bit
    flipped), what the lanes tiles multiply the signed weights by (``_emit_block``)."""
    n, k = qa.shape
    qu = np.empty((n, k), np.int8)
    for i in range(n):
        for j in range(k):
            qu[i, j] = qa[i, j] ^ np.int8(-128)
    return qu


@njit(cache=True, nogil=True)
def _no_activations(k):  # noqa: ANN001, ANN201
    """Empty activation arrays of ``quantize_activations``' types (an unused set)."""
    return (np.empty((0, k), np.int8), np.empty((0, 1), np.float32),
            np.empty((0, 1), np.float32), np.empty((0, 8), np.int32),
            np.empty((0, k), np.int8))


@njit(cache=True, nogil=True)
def _work_items(ws, count, n, threads):  # noqa: ANN001, ANN201
    """(items, 3) i64 rows ``(matrix, r0, r1)``: the row ranges the products are cut into.
    threads 0: one item per matrix (one thread). A batch (``_tiled``): runs of ROW_CHUNK
    tiles,
    a few items per thread; decoding: shorter runs of rows, at most STREAM_CHUNK."""
    total = 0
    tiles = 0
    for m in range(count):
        total += ws[m].shape[0]
        tiles += (ws[m].shape[0] + ROW_CHUNK - 1) // ROW_CHUNK
    if threads == 0:
        step = total
    elif _tiled(n, ws[0]):
        step = max(1, tiles // (CHUNKS_PER_THREAD * threads)) * ROW_CHUNK
    else:
        parts = CHUNKS_PER_THREAD * threads
        step = min(STREAM_CHUNK, max(64, (total + parts - 1) // parts))
    nitems = 0
    for m in range(count):
        nitems += (ws[m].shape[0] + step - 1) // step
    items = np.empty((nitems, 3), np.int64)
    c = 0
    for m in range(count):
        rows = ws[m].shape[0]
        for r0 in range(0, rows, step):
            items[c, 0] = m
            items[c, 1] = r0
            items[c, 2] = min(rows, r0 + step)
            c += 1
    return items


@njit(cache=True, nogil=True)
def _activation_sets(kinds, count, x):  # noqa: ANN001, ANN201
    """``x`` quantized once per activation type the ``count`` weight types need: the
    Q8_0/Q8_1 set and the Q8_K set (an empty set where none needs it), each as ``(qa, da,
    aux, cor, qu)``; ``cor`` the lane corrections when the products' types share one
    ``vnni_offset`` and some rows run outside the lanes tiles (fewer than BATCH_MIN_ROWS,
    or not a multiple of 4), else no rows; ``qu`` the activations plus 128 when some type
    has a ``vnni_offset`` and the rows are enough for the lanes tiles, else no rows.
    Without them the products take the sign step: the same numbers."""
    k32 = kk = -1
    for m in range(count):
        if kinds[m] in _Q8_K_KINDS:
            kk = kinds[m]
        elif kinds[m] in _Q8_0_KINDS:
            k32 = kinds[m]
        else:
            raise ValueError("no integer kernel for this ggml type id")
    no_cor = np.empty((0, 8), np.int32)
    if k32 >= 0:
        qa, da, aux = quantize_activations(x, k32)
        n = x.shape[0]
        off = _shared_offset(kinds, count) if n < BATCH_MIN_ROWS or n % 4 else 0
        tiles = n >= BATCH_MIN_ROWS and _any_offset(kinds, count)
        a32 = (qa, da, aux, _lane_corrections(qa, off) if off else no_cor,
               _plus_128(qa) if tiles else qa[:0])
    else:
        a32 = _no_activations(x.shape[1])
    if kk >= 0:
        qa, da, aux = quantize_activations(x, kk)
        ak = (qa, da, aux, no_cor, qa[:0])
    else:
        ak = _no_activations(x.shape[1])
    return a32, ak


@njit(cache=True, nogil=True)
def _run_item(kinds, ws, a32, ak, tbl, outs, items, c):  # noqa: ANN001, ANN201
    m = items[c, 0]
    kind = kinds[m]
    qa, da, aux, cor, qu = ak if kind in _Q8_K_KINDS else a32
    qmatmul_rows(kind, ws[m], qa, da, aux, cor, qu, tbl, outs[m], items[c, 1], items[c, 2])


@njit(cache=True, nogil=True)
def qmatmul_serial(kinds, ws, x, tbl, outs, count):  # noqa: ANN001, ANN201
    """``count`` products ``ws[m] (R_m, row_bytes_m) u8 @ x (n, K) f32 -> outs[m] (n, R_m)
    f32`` (weight types ``kinds[m]``) on this thread; ``ws``/``outs`` are MAX_FUSED-tuples
    (unused entries repeat a used one). ``x`` is quantized here, once per activation type:
    one call per layer step keeps the per-token Python overhead small."""
    a32, ak = _activation_sets(kinds, count, x)
    items = _work_items(ws, count, x.shape[0], 0)
    for c in range(items.shape[0]):
        _run_item(kinds, ws, a32, ak, tbl, outs, items, c)


@njit(cache=True, nogil=True, parallel=True)
def qmatmul_par(kinds, ws, x, tbl, outs, count, threads):  # noqa: ANN001, ANN201
    """``qmatmul_serial``'s products with their row ranges run in parallel."""
    a32, ak = _activation_sets(kinds, count, x)
    items = _work_items(ws, count, x.shape[0], threads)
    for c in prange(items.shape[0]):  # handed out one at a time (matrix.set_threads)
        _run_item(kinds, ws, a32, ak, tbl, outs, items, c)


@njit(cache=True)
def _built_table_key() -> int:
    return _TABLE_KEY  # frozen into the cached machine code with everything else


_CACHED = (quantize_activations, qmatmul_rows, _plus_128, _no_activations, _shared_offset,
           _any_offset, _lane_corrections, _work_items, _activation_sets, _run_item, qmatmul_serial,
           qmatmul_par, _built_table_key)
_fresh = False


def rebuild_if_stale(key_fn, key: int, fns: Sequence) -> None:  # noqa: ANN001
    """Flush and recompile ``fns`` (callees first: their callers pick up the new overloads)
    when ``key_fn``, a cached jitted function returning the key its module's kernels were
    built for (frozen into its machine code with theirs), returns another than ``key``.
    Here the key is the declarations' (``_TABLE_KEY``); kernels in other modules that call
    these use a key that covers the sources they inline (``model.blocks``)."""
    if key_fn() != key:
        for fn in fns:
            fn._cache.flush()
            if fn.overloads:
                fn.recompile()


def check_build() -> None:
    """Rebuild the kernels when numba's disk cache holds a build from other declarations.

    numba invalidates its cache when kernels.py changes, not when kerneltypes.py or
    formats.py do; the cached key says which declarations the machine code came from."""
    global _fresh
    if _fresh:
        return
    rebuild_if_stale(_built_table_key, _TABLE_KEY, _CACHED)
    _fresh = True


def qmatmul(kind: int, w: np.ndarray, x: np.ndarray, out: np.ndarray,
            parallel: bool = True) -> np.ndarray:
    """``W (R, row_bytes) u8`` of ggml type ``kind`` times ``x (n, K) f32`` -> ``out (n, R)``.

    Quantizes ``x`` to 8 bits the way ggml does for this type, then runs the kernel.
    ValueError for a type without an integer kernel or shapes that do not fit together.
    """
    qmatmul_many((kind,), (w,), x, (out,), parallel)
    return out


def qmatmul_many(kinds: tuple[int, ...], ws: tuple[np.ndarray, ...], x: np.ndarray,
                 outs: tuple[np.ndarray, ...], parallel: bool = True) -> None:
    """Up to MAX_FUSED products of the same ``x (n, K) f32`` in one call: ``ws[m] (R_m,
    row_bytes) u8`` of ggml type ``kinds[m]`` -> ``outs[m] (n, R_m)``. ``x`` is quantized
    once per activation type and the row ranges of all the products share the threads
    (one parallel region instead of one per product). Each output element is computed
    exactly as by ``qmatmul``. ValueError as ``qmatmul``."""
    n, d_in = x.shape
    count = len(ws)
    if not 1 <= count <= MAX_FUSED or len(kinds) != count or len(outs) != count:
        raise ValueError(f"qmatmul_many takes 1 to {MAX_FUSED} products, got {count}")
    for kind, w, out in zip(kinds, ws, outs):
        sizes = _SIZES.get(kind)
        if sizes is None:
            kernel_type(kind)  # raises, naming the type
        qk, ts = sizes
        if (d_in % qk or w.ndim != 2 or w.shape[1] != d_in // qk * ts
                or out.shape != (n, w.shape[0])):
            raise ValueError(f"{kernel_type(kind).type.ggml_name} product: W {w.shape} bytes,"
                             f" x {x.shape}, out {out.shape} do not fit together")
    if len({w.flags.writeable for w in ws}) > 1:  # one tuple type: all read-only then
        ws = tuple(read_only(w) for w in ws)
    kind_arr, ws = pad_products(kinds, ws)
    qmatmul_planned(kind_arr, ws, x, tuple(outs) + (outs[0],) * (MAX_FUSED - count), count,
                    parallel)


def pad_products(kinds: Sequence[int], ws: Sequence[np.ndarray]
                 ) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
    """``qmatmul_planned``'s ``kinds`` array and weight tuple for 1 to MAX_FUSED products:
    one compiled signature for every count, the unused places repeating the first."""
    pad = MAX_FUSED - len(ws)
    return (np.array(list(kinds) + [kinds[0]] * pad, np.int64),
            tuple(ws) + (ws[0],) * pad)


def qmatmul_planned(kinds: np.ndarray, ws: tuple[np.ndarray, ...], x: np.ndarray,
                    outs: tuple[np.ndarray, ...], count: int, parallel: bool) -> None:
    """``qmatmul_many`` without its checks, for a caller that made and checked the
    arguments once (``matrix.matmul_many``): ``kinds`` (MAX_FUSED,) i64 and ``ws``/``outs``
    MAX_FUSED-tuples padded with used entries, ``x (n, K) f32`` C-contiguous."""
    check_build()
    if parallel:
        qmatmul_par(kinds, ws, x, F16_TABLE, outs, count, numba.get_num_threads())
    else:
        qmatmul_serial(kinds, ws, x, F16_TABLE, outs, count)


def read_only(a: np.ndarray) -> np.ndarray:
    """``a`` itself when read-only, else a read-only view of it: a memory-mapped file's
    weights are read-only, in-memory ones need not be, and one array type means one
    compiled signature for both."""
    if not a.flags.writeable:
        return a
    v = a.view()
    v.flags.writeable = False
    return v


# (block size, bytes per block) by type id: the check above runs on every product
_SIZES = {int(t): (k.block_size, k.type_size) for t, k in KERNEL_TYPES.items()}


def is_compiled() -> bool:
    """True when the kernels' machine code is cached on disk: starting then takes about a
    second; otherwise the first product compiles them (tens of seconds, once)."""
    return cached((qmatmul_serial, qmatmul_par))


def warm_up() -> float:
    """Compile (first run) or load (later runs) the kernels for memory-mapped weights;
    returns the seconds it took. Lets a command say "compiling" before it happens."""
    import time

    t0 = time.perf_counter()
    for kind in (_Q8_0_KINDS[0], _Q8_K_KINDS[0]):  # one type of each activation kind
        qk, ts = GGMLType(kind).block_size, GGMLType(kind).type_size
        w = np.zeros((4, ts), np.uint8)
        w.flags.writeable = False  # tensor views of the mmapped file are read-only
        out = np.empty((1, 4), np.float32)
        x = np.zeros((1, qk), np.float32)
        qmatmul(kind, w, x, out, parallel=False)
        qmatmul(kind, w, x, out, parallel=True)
    return time.perf_counter() - t0


# -- F16 weights: fp16 -> float32 conversion in the vector unit (F16C), float dot products --


def _make_f16_rowdot(nr: int):  # noqa: ANN202 - returns a numba intrinsic
    """Intrinsic ``f16dot(w (R, K) u16, r0, rs, x (n, K) f32, i, out (n, R) f32)``:
    ``out[i, r0+j*rs] = W[r0+j*rs] . x[i]`` for ``j < nr``, 16 values per step."""

    @intrinsic
    def f16dot(typingctx, w, r0, rs, x, i, out):  # noqa: ANN001, ANN202, ARG001
        sig = types.int64(w, r0, rs, x, i, out)

        def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
            ws, r0_, rs_, xs, i_, outs = (
                context.make_array(t)(context, builder, v) if isinstance(t, types.Array) else v
                for t, v in zip(signature.args, args, strict=True))
            bld = builder
            g = _Gen(bld, None)

            def row_ptr(arr, row, elem):  # noqa: ANN001, ANN202
                stride = cgutils.unpack_tuple(bld, arr.strides)[0]
                p = bld.gep(bld.bitcast(arr.data, _I8.as_pointer()), [bld.mul(row, stride)])
                return bld.bitcast(p, elem.as_pointer())

            ridx = [bld.add(r0_, bld.mul(rs_, g.c64(j))) for j in range(nr)]
            rows = [row_ptr(ws, ri, _I16) for ri in ridx]
            xrow = row_ptr(xs, i_, _F32)
            k = cgutils.unpack_tuple(bld, ws.shape)[1]
            nfull = bld.udiv(k, g.c64(16))
            zero = ir.Constant(_vt(_F32, 16), [0.0] * 16)
            accp = [cgutils.alloca_once_value(bld, zero) for _ in range(nr)]
            tailp = [cgutils.alloca_once_value(bld, ir.Constant(_F32, 0.0)) for _ in range(nr)]
            half16 = ir.VectorType(ir.HalfType(), 16)
            with cgutils.for_range(bld, nfull) as loop:
                off = bld.mul(loop.index, g.c64(16))
                xv = bld.load(bld.bitcast(bld.gep(xrow, [off]), _vt(_F32, 16).as_pointer()),
                              align=4)
                for j, row in enumerate(rows):
                    hv = bld.load(bld.bitcast(bld.gep(row, [off]), half16.as_pointer()), align=2)
                    wf = bld.fpext(hv, _vt(_F32, 16))
                    acc = bld.load(accp[j])
                    bld.store(bld.fadd(bld.fmul(wf, xv, flags=("fast",)), acc, flags=("fast",)),
                              accp[j])
            with cgutils.for_range_slice(bld, bld.mul(nfull, g.c64(16)), k, g.c64(1)) as (e, _):
                xe = bld.load(bld.gep(xrow, [e]))
                for j, row in enumerate(rows):
                    we = bld.fpext(bld.bitcast(bld.load(bld.gep(row, [e])), ir.HalfType()), _F32)
                    bld.store(bld.fadd(bld.load(tailp[j]), bld.fmul(we, xe)), tailp[j])
            ostride = cgutils.unpack_tuple(bld, outs.strides)
            for j in range(nr):
                res = bld.fadd(g.hsum(bld.load(accp[j])), bld.load(tailp[j]))
                off = bld.add(bld.mul(i_, ostride[0]), bld.mul(ridx[j], ostride[1]))
                p = bld.gep(bld.bitcast(outs.data, _I8.as_pointer()), [off])
                bld.store(res, bld.bitcast(p, _F32.as_pointer()))
            return context.get_constant(types.int64, 0)

        return sig, codegen

    return f16dot


_f16_4 = _make_f16_rowdot(4)
_f16_1 = _make_f16_rowdot(1)


@njit(cache=True, nogil=True)
def f16_matmul_rows(w, x, out, r0, r1):  # noqa: ANN001, ANN201
    """W rows r0:r1 (R, K) fp16 bits (uint16) @ x (n, K) f32 -> out[:, r0:r1] (n, R) f32;
    four far-apart rows per pass (long sequential streams, as for the quantized types)."""
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


# -- GeGLU: gelu_tanh(gate) * up in one vectorized pass -------------------------------------


@njit(cache=True, nogil=True, inline="always")
def _exp_f32(z):  # noqa: ANN001, ANN202
    """e**z for float32 z in [-87, 87] (callers clamp): Cephes expf's range reduction and
    polynomial (1-2 ulp), written without a libm call so that loops over it vectorize."""
    n = np.floor(z * np.float32(1.44269504088896341) + np.float32(0.5))
    r = z - n * np.float32(0.693359375)
    r = r - n * np.float32(-2.12194440e-4)
    p = np.float32(1.9875691500e-4)
    p = p * r + np.float32(1.3981999507e-3)
    p = p * r + np.float32(8.3334519073e-3)
    p = p * r + np.float32(4.1665795894e-2)
    p = p * r + np.float32(1.6666665459e-1)
    p = p * r + np.float32(5.0000001201e-1)
    y = p * (r * r) + r + np.float32(1.0)
    return y * f32_from_bits((np.int32(n) + np.int32(127)) << np.int32(23))


@njit(cache=True, nogil=True, fastmath={"contract"}, error_model="numpy")
def _geglu_flat(x, u, out):  # noqa: ANN001, ANN201
    # x, u, out (N,) f32 contiguous; a flat loop with selects so that LLVM vectorizes it
    for j in range(x.shape[0]):
        v = x[j]
        y = np.float32(0.7978845608028654) * v * (np.float32(1.0) + np.float32(0.044715) * v * v)
        z = np.float32(-2.0) * y
        z = z if z > np.float32(-87.0) else np.float32(-87.0)
        z = z if z < np.float32(87.0) else np.float32(87.0)
        out[j] = v / (np.float32(1.0) + _exp_f32(z)) * u[j]


@njit(cache=True, nogil=True)
def geglu(gate, up, out):  # noqa: ANN001, ANN201
    """gate (T, F) f32, up (T, F) f32 -> out (T, F) f32 = gelu_tanh(gate) * up (C-contiguous;
    ``out`` may be ``up``). 0.5 x (1 + tanh(y)) is evaluated as x / (1 + e**(-2y)): the same
    function, with y = sqrt(2/pi) x (1 + 0.044715 x**2) as ggml_gelu_f32 forms it."""
    _geglu_flat(gate.reshape(-1), up.reshape(-1), out.reshape(-1))


# -- SwiGLU: silu(gate) * up as ggml's ggml_vec_swiglu_f32 ---------------------------------


@njit(cache=True, nogil=True, error_model="numpy")
def _swiglu_flat(x, u, out):  # noqa: ANN001, ANN201
    # x, u, out (N,) f32 contiguous. ggml's SIMD lanes (ggml_v_silu: x / (1 + e**-x) with
    # ggml_v_expf) for whole groups of 8, libm's expf for a row's tail, as ggml
    n = x.shape[0]
    body = n - n % 8
    for j in range(body):
        v = x[j]
        out[j] = v / (np.float32(1.0) + expf_ggml(-v)) * u[j]
    for j in range(body, n):
        v = x[j]
        out[j] = v / (np.float32(1.0) + np.exp(-v)) * u[j]


@njit(cache=True, nogil=True)
def swiglu(gate, up, out):  # noqa: ANN001, ANN201
    """gate (T, F) f32, up (T, F) f32 -> out (T, F) f32 = silu(gate) * up, each row as
    ggml_vec_swiglu_f32 computes it (C-contiguous; ``out`` may be ``gate`` or ``up``, but
    then the loop cannot vectorize and runs several times slower)."""
    for t in range(gate.shape[0]):
        _swiglu_flat(gate[t], up[t], out[t])


# ======================================================================================
# 4. Numpy twins (slow, readable; the tests hold the kernels to them). The quantized
#    products' twins live with their declarations: kerneltypes.twin_*.
# ======================================================================================


def twin_f16_matmul(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Numpy twin of ``f16_matmul_rows``: ``W (R, K) fp16 bits @ x (n, K) -> (n, R)``."""
    wf = np.ascontiguousarray(w).view(np.float16).astype(np.float64)
    return (x.astype(np.float64) @ wf.T).astype(np.float32)


def twin_swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """Numpy twin of ``swiglu``: silu(gate) * up with ggml's exp (``expf_ggml_twin``) on
    each row's whole groups of 8 and, on the tail, exp in float64 rounded to float32 (as
    glibc's expf, correctly rounded)."""
    from .floatbits import expf_ggml_twin

    gate = np.asarray(gate, np.float32)
    body = gate.shape[-1] - gate.shape[-1] % 8
    e = np.empty_like(gate)
    e[..., :body] = expf_ggml_twin(-gate[..., :body])
    with np.errstate(over="ignore"):
        e[..., body:] = np.exp(-gate[..., body:].astype(np.float64)).astype(np.float32)
    return gate / (np.float32(1.0) + e) * up


def twin_geglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """Numpy twin of ``geglu``, in float64: 0.5 (1 + tanh(y)) as 1 / (1 + e**(-2y)), which
    keeps the far negative tail that 1 + tanh would cancel away."""
    x = gate.astype(np.float64)
    y = np.sqrt(2 / np.pi) * x * (1 + 0.044715 * x * x)
    with np.errstate(over="ignore"):
        return (x / (1 + np.exp(-2 * y)) * up).astype(np.float32)
