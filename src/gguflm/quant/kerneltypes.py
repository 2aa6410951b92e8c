"""The weight types with integer kernels: one declaration each, read by everything else.

A ``KernelType`` says how a block of its type becomes the integers ggml's ``vec_dot``
multiplies with 8-bit activations: which bit planes of which fields (``formats.FORMATS``
gives their byte offsets) make each value, the constant subtracted (or the value
table they index: MXFP4's, IQ4_NL's), the integer group scales, the per-block float
scale (and how it is encoded), the offset term (Q4_1/Q5_1's ``m``, Q4_K/Q5_K/Q2_K's
``dmin``), and which activation type ggml pairs with it. From that one declaration:

- ``matrix.QMatrix`` dispatches a weight to the integer kernels (``KERNEL_TYPES``);
- ``int_weights``/``int_tiles`` (hot, numba/LLVM) build each type's block loop;
- ``twin_unpack``/``twin_block_terms`` here (portable numpy) are the slow readable twins
  the tests hold the kernels to;
- ``KernelType.dequantizer`` is the type's own ``to_float`` (``simple.py``/``kquants.py``),
  and the twin reuses its bit-plane helpers; the tests hold the declaration's values to it.

Plain numpy only: nothing here imports numba.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np

from ..gguf.types import GGMLType
from .bits import bit_planes, spread_bits
from .formats import FORMATS, BlockFormat, f16_to_f32
from .kquants import k4_scales_mins, q3_k_scales
from .simple import KVALUES_IQ4NL, e8m0_half

T = GGMLType
ACTIVATION_TYPES = (T.Q8_0, T.Q8_1, T.Q8_K)


@dataclass(frozen=True)
class Plane:
    """Some bits of every value of a block: field ``field`` cut as ``bits.bit_planes`` cuts
    it (runs of ``group`` bytes, ``width`` bits per value, low bits first; ``group`` 1 with
    ``width`` 1 is bit j of the field for value j), shifted left by ``shift``."""

    field: str
    group: int
    width: int
    shift: int = 0


@dataclass(frozen=True)
class KernelType:
    """Value j of a block is ``(OR of its planes) - bias`` (or, with a ``table``,
    ``table[OR of its planes]``), times the integer scale of its group (``scales``), times
    the block's float scale (field ``d_field``, encoded as ``d_enc`` says); plus the
    ``offset`` term."""

    type: GGMLType
    act: GGMLType  # the activation type ggml's vec_dot pairs with it
    planes: tuple[Plane, ...]
    bias: int = 0
    # "": none; "k4": 8 six-bit scales and mins in 12 bytes (per 32 values); "i8": int8s
    # per 16; "q3k": 16 six-bit scales minus 32 in 12 bytes; "q2k": 16 bytes of a nibble
    # scale (low) and a nibble min (high) per 16; "iq4xs": 8 six-bit scales minus 32 per 32,
    # low nibbles in ``scales_l``, top 2 bits in ``scales_h``
    scales: str = ""
    # "": none; "m": + m * (Q8_1 block sum); "dmin": - dmin * (mins . activation group sums)
    offset: str = ""
    batch8: bool = True  # 1 weight row x 8 activations tiles (False: 2x4, if LLVM spills)
    table: tuple[int, ...] = ()  # (): none; 16 int8 values the 4-bit plane value indexes
    d_field: str = "d"  # the block's float scale
    d_enc: str = "f16"  # "f16"; "e8m0_half": ggml_e8m0_to_fp32_half of one byte (MXFP4)
    # two lanes (K-quants), the split the 8-row interleaved GEMM (``int_gemm``) computes: a
    # block's scaled integer dot split only into its even and its odd 32-value spans
    parity_lanes: bool = False
    # one lane (IQ4_XS, Q5_K): a block's whole scaled integer dot in one lane, converted once
    # (llama.cpp's tiled prompt path's split), which lets the GEMM apply a 32-value span's
    # scale once to all its values' dots instead of once per 4 values as vec_dot's lanes do
    block_lane: bool = False

    @property
    def groups(self) -> int:
        """Integer scales per block (1: none)."""
        return SCALE_GROUPS[self.scales]

    @property
    def format(self) -> BlockFormat:
        return FORMATS[self.type]

    @property
    def block_size(self) -> int:
        return self.format.block_size

    @property
    def type_size(self) -> int:
        return self.format.type_size

    @property
    def dequantizer(self):  # noqa: ANN201 - the type's block function (simple.py, kquants.py)
        from .dequant import block_dequantizer

        return block_dequantizer(self.type)


SCALE_GROUPS = {"": 1, "k4": 8, "i8": 16, "q3k": 16, "q2k": 16, "iq4xs": 8}
KVALUES_IQ4 = tuple(int(v) for v in KVALUES_IQ4NL)  # kvalues_iq4nl (ggml-common.h)


def _nibbles(field: str) -> Plane:  # 16 bytes -> 32 values: low nibbles, then high
    return Plane(field, 16, 4)


def _fifth_bit(field: str) -> Plane:  # bit j of a 32-bit field is bit 4 of value j
    return Plane(field, 1, 1, shift=4)


# Transcribed from ggml's block structs and dequantize_row_* (ggml-quants.c).
KERNEL_TYPES: dict[GGMLType, KernelType] = {k.type: k for k in [
    KernelType(T.Q4_0, T.Q8_0, (_nibbles("qs"),), bias=8),
    KernelType(T.Q4_1, T.Q8_1, (_nibbles("qs"),), offset="m"),
    KernelType(T.Q5_0, T.Q8_0, (_nibbles("qs"), _fifth_bit("qh")), bias=16),
    KernelType(T.Q5_1, T.Q8_1, (_nibbles("qs"), _fifth_bit("qh")), offset="m"),
    KernelType(T.Q8_0, T.Q8_0, (Plane("qs", 32, 8),)),
    # four 32-byte runs: value 64i + l is the low nibble of byte 32i + l, 64i + 32 + l the high
    KernelType(T.Q4_K, T.Q8_K, (Plane("qs", 32, 4),), scales="k4", offset="dmin",
               parity_lanes=True),
    KernelType(T.Q5_K, T.Q8_K, (Plane("qs", 32, 4), Plane("qh", 32, 1, shift=4)),
               scales="k4", offset="dmin", block_lane=True),
    # per 128 values: low 4 bits from 64 bytes of ql, top 2 bits from 32 bytes of qh
    KernelType(T.Q6_K, T.Q8_K, (Plane("ql", 64, 4), Plane("qh", 32, 2, shift=4)), bias=32,
               scales="i8", parity_lanes=True),
    # per 128 values: 2-bit planes of 32 bytes; Q3_K's third bit from hmask, set meaning
    # "not minus 4" (bit 4n + j of byte l is value 128n + 32j + l)
    KernelType(T.Q2_K, T.Q8_K, (Plane("qs", 32, 2),), scales="q2k", offset="dmin"),
    KernelType(T.Q3_K, T.Q8_K, (Plane("qs", 32, 2), Plane("hmask", 32, 1, shift=2)), bias=4,
               scales="q3k"),
    KernelType(T.IQ4_NL, T.Q8_0, (_nibbles("qs"),), table=KVALUES_IQ4),
    KernelType(T.IQ4_XS, T.Q8_K, (_nibbles("qs"),), table=KVALUES_IQ4, scales="iq4xs",
               block_lane=True),
    # kvalues_mxfp4 (ggml-common.h): E2M1 values doubled, as d is half the E8M0 scale
    KernelType(T.MXFP4, T.Q8_0, (_nibbles("qs"),),
               table=(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12),
               d_field="e", d_enc="e8m0_half"),
]}


def kernel_type(t: GGMLType | int) -> KernelType:
    """The declaration of ``t``; ValueError naming the type when it has no integer kernel."""
    try:
        return KERNEL_TYPES[GGMLType(t)]
    except (KeyError, ValueError):
        name = GGMLType(t).ggml_name if t in GGMLType._value2member_map_ else str(t)
        raise ValueError(f"no integer kernel for ggml type {name} (kernel types: "
                         f"{', '.join(k.ggml_name for k in KERNEL_TYPES)})") from None


# -- checks, once at import: a declaration that disagrees with its layout fails here --------


def _check(k: KernelType) -> None:
    fmt, name = k.format, k.type.ggml_name
    assert k.act in ACTIVATION_TYPES, name
    assert FORMATS[k.act].block_size == k.block_size or k.act == T.Q8_K, name
    assert (k.act == T.Q8_K) == (k.block_size == 256), name
    assert (k.offset == "m") == (k.act == T.Q8_1), name
    d = fmt[k.d_field]
    assert (d.kind, d.nbytes) == {"f16": ("f16", 2), "e8m0_half": ("u8", 1)}[k.d_enc], name
    if k.table:
        # one byte lane per value, looked up 16 at a time (pshufb): 4-bit indexes, int8 values
        assert len(k.table) == 16 and all(-128 <= v < 128 for v in k.table), name
        assert not k.bias and sum(((1 << p.width) - 1) << p.shift for p in k.planes) < 16, name
    for p in k.planes:
        f = fmt[p.field]
        assert f.nbytes * 8 // p.width == k.block_size, (name, p)
        assert p.width == 8 or f.nbytes % p.group == 0, (name, p)
    if k.offset:
        assert fmt[k.offset].kind == "f16", name
    if k.scales in ("k4", "q3k"):
        assert fmt["scales"].nbytes == 12 and k.block_size == 256, name
    elif k.scales in ("i8", "q2k"):
        assert fmt["scales"].count * 16 == k.block_size, name
        assert fmt["scales"].kind == ("i8" if k.scales == "i8" else "u8"), name
    elif k.scales == "iq4xs":
        assert (fmt["scales_l"].nbytes, fmt["scales_h"].nbytes) == (4, 2), name
    else:
        assert k.scales == "" and k.block_size == 32, name
    assert k.block_size % k.groups == 0, name
    assert k.offset != "dmin" or k.scales in ("k4", "q2k"), name


for _k in KERNEL_TYPES.values():
    _check(_k)


def table_key() -> int:
    """A checksum of every declaration and the layouts they read, as loaded: part of the
    compiled kernels' cache stamp (``jitcache``)."""
    parts = [repr(k) + repr(k.format) for k in KERNEL_TYPES.values()]
    return zlib.crc32("\n".join(parts).encode())


# ======================================================================================
# The numpy twin (portable, slow, readable): the same declaration, read with numpy
# ======================================================================================


@dataclass
class TwinBlocks:
    """Weight rows in the integer form ggml's vec_dot uses: value j of group g of block b is
    ``d[b] * sc[b, g] * q[b, g, j]``, ``+ m[b]`` (Q4_1/Q5_1) or ``- m[b] * mins[b, g]``
    (Q4_K/Q5_K). Arrays are ``(R, n_blocks, ...)``."""

    q: np.ndarray  # (R, nb, QK) int32
    sc: np.ndarray  # (R, nb, G) int32: integer scale per group of QK/G values (1: none)
    d: np.ndarray  # (R, nb) float32
    m: np.ndarray | None = None  # (R, nb) float32: m or dmin
    mins: np.ndarray | None = None  # (R, nb, G) int32


def plane_values(blocks: np.ndarray, fmt: BlockFormat, p: Plane) -> np.ndarray:
    """Plane ``p`` of every block ``(n, type_size)`` -> ``(n, block_size)`` uint8."""
    f = fmt[p.field]
    if p.width == 8:
        return blocks[:, f.offset:f.offset + f.nbytes]
    if p.group == 1 and p.width == 1:
        return spread_bits(blocks, f.offset, f.nbytes)
    return bit_planes(blocks, f.offset, f.nbytes, p.group, p.width)


def twin_unpack(t: GGMLType | int, w: np.ndarray) -> TwinBlocks:
    """Weight rows ``(R, row_bytes)`` uint8 of type ``t`` -> their ``TwinBlocks``."""
    k = kernel_type(t)
    fmt = k.format
    r = w.shape[0]
    blk = np.ascontiguousarray(w).reshape(-1, fmt.type_size)
    nb = blk.shape[0] // r
    q = np.zeros((blk.shape[0], k.block_size), np.int32)
    for p in k.planes:
        v = plane_values(blk, fmt, p)
        q |= (v.view(np.int8) if fmt[p.field].kind == "i8" else v).astype(np.int32) << p.shift
    q = np.asarray(k.table, np.int32)[q] if k.table else q - k.bias
    raw = fmt.field(blk, k.d_field)
    d = (e8m0_half(raw) if k.d_enc == "e8m0_half" else f16_to_f32(raw)).reshape(r, nb)
    m = f16_to_f32(fmt.field(blk, k.offset)).reshape(r, nb) if k.offset else None
    sc, mins = twin_scales(k, blk)
    shape = (r, nb, k.groups)
    return TwinBlocks(q.reshape(r, nb, -1), sc.reshape(shape), d, m,
                      None if mins is None else mins.reshape(shape))


def twin_scales(k: KernelType, blk: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """The integer scales ``(n, G)`` int32 of blocks ``(n, type_size)`` of type ``k``, and
    its mins (Q4_K/Q5_K/Q2_K) or None."""
    fmt = k.format
    if not k.scales:
        return np.ones((len(blk), 1), np.int32), None
    if k.scales == "iq4xs":  # as dequant_iq4_xs reads them
        lo = (fmt.field(blk, "scales_l")[:, :, None] >> np.array([0, 4], np.uint8)) & 0xF
        hi = (fmt.field(blk, "scales_h")[:, None] >> np.arange(0, 16, 2, dtype=np.uint16)) & 3
        return (lo.reshape(-1, 8).astype(np.int32) | (hi.astype(np.int32) << 4)) - 32, None
    raw = fmt.field(blk, "scales")
    if k.scales == "k4":
        sc, mn = k4_scales_mins(raw)  # the dequantizer's own
        return sc.astype(np.int32), mn.astype(np.int32)
    if k.scales == "q2k":
        return (raw & 0xF).astype(np.int32), (raw >> 4).astype(np.int32)
    if k.scales == "q3k":
        return q3_k_scales(raw).astype(np.int32) - 32, None
    return raw.astype(np.int32), None


def twin_dequantize(t: GGMLType | int, w: np.ndarray) -> np.ndarray:
    """``TwinBlocks`` back to float64 weights ``(R, K)``: what the declaration says the
    values are (the tests hold it to the type's dequantizer)."""
    tb = twin_unpack(t, w)
    r, nb, qk = tb.q.shape
    g = tb.sc.shape[-1]
    v = (tb.q.reshape(r, nb, g, -1) * tb.sc[..., None]).astype(np.float64)
    v *= tb.d[..., None, None]
    if tb.mins is not None:
        v -= (tb.m[..., None] * tb.mins)[..., None]
    elif tb.m is not None:
        v += tb.m[..., None, None]
    return v.reshape(r, nb * qk)


def pack_activation_blocks(act: GGMLType, qa: np.ndarray, da: np.ndarray,
                           aux: np.ndarray) -> np.ndarray:
    """The quantizers' arrays (``quantize_q8_0``'s or ``quantize_q8_k``'s, or their twins')
    laid out as ggml's ``block_q8_0``/``block_q8_1``/``block_q8_K`` rows: ``(n, row_bytes)``
    uint8, byte for byte what ggml's ``from_float`` writes (Q8_K's 16-value ``bsums`` are
    recomputed from ``qa``; ``aux`` holds 32-value sums there)."""
    act = GGMLType(act)
    fmt = FORMATS[act]
    n, k = qa.shape
    blk = np.zeros((n, k // fmt.block_size, fmt.type_size), np.uint8)

    def put(name: str, values: np.ndarray) -> None:
        f = fmt[name]
        raw = np.ascontiguousarray(values.reshape(n, blk.shape[1], -1).astype(
            "<f2" if f.kind == "f16" else "<i2" if name == "bsums" else values.dtype))
        blk[:, :, f.offset:f.offset + f.nbytes] = raw.view(np.uint8)

    if act == GGMLType.Q8_K:
        put("d", da.astype("<f4"))
        put("bsums", qa.reshape(n, -1, 16).astype(np.int32).sum(-1))
    else:
        put("d", da)
        if act == GGMLType.Q8_1:
            put("s", aux)
        elif act != GGMLType.Q8_0:
            raise ValueError(f"{act.ggml_name} is not an activation type (Q8_0, Q8_1, Q8_K)")
    put("qs", qa.astype(np.int8))
    return blk.reshape(n, -1)


def twin_quantize_q8_0(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ggml's x86 quantize_row_q8_0/q8_1: (qa int8 (n,K), d (n,K/32) fp16 values as f32,
    s (n,K/32): Q8_1's block sum fp16(d * sum(q)) with d before its fp16 rounding)."""
    xb = x.reshape(x.shape[0], -1, 32).astype(np.float32)
    amax = np.abs(xb).max(-1)
    d32 = (amax / np.float32(127)).astype(np.float32)
    d = d32.astype(np.float16).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.rint(xb * inv[..., None]).astype(np.int32)
    s = (q.sum(-1).astype(np.float32) * d32).astype(np.float16).astype(np.float32)
    return q.reshape(x.shape).astype(np.int8), d, s


def twin_quantize_q8_k(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ggml's quantize_row_q8_K: (qa int8 (n,K), d (n,K/256), sums of 32 values (n,K/32))."""
    xb = x.reshape(x.shape[0], -1, 256).astype(np.float32)
    idx = np.abs(xb).argmax(-1)
    vmax = np.take_along_axis(xb, idx[..., None], -1)[..., 0]
    with np.errstate(divide="ignore"):
        iscale = np.where(vmax != 0, np.float32(-127) / vmax, np.float32(0)).astype(np.float32)
    q = np.minimum(127, np.rint(xb * iscale[..., None])).astype(np.int32)
    with np.errstate(divide="ignore"):
        d = np.where(iscale != 0, np.float32(1) / iscale, np.float32(0)).astype(np.float32)
    bsum = q.reshape(x.shape[0], -1, 32).sum(-1).astype(np.float32)
    return q.reshape(x.shape).astype(np.int8), d, bsum


def twin_block_terms(t: GGMLType | int, w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """ggml's vec_dot block by block: ``(n, R, n_blocks, 2)`` float64 terms whose sum is
    ``W (R, row_bytes) @ x (n, K)``. Term 0 is ``fp32(d_act * d) * isum``, ``isum`` the
    block's exact integer dot (group dots times their integer scales); term 1 is
    Q4_1/Q5_1's ``fp32(m * s_act)`` or Q4_K/Q5_K/Q2_K's ``-fp32(d_act * dmin) * sum(mins *
    activation group sums)`` (32-value groups; Q2_K's of 16, ggml's ``bsums``). The float32
    roundings are ggml's; only the summation order of the terms is free (the kernels sum
    in float32 lanes, ggml in its own)."""
    k = kernel_type(t)
    tb = twin_unpack(t, w)
    n = x.shape[0]
    r, nb, qk = tb.q.shape
    groups = tb.sc.shape[-1]
    if k.act == T.Q8_K:
        qa, da, _ = twin_quantize_q8_k(x)
    else:
        qa, da, sa = twin_quantize_q8_0(x)
    qa = qa.reshape(n, nb, groups, qk // groups).astype(np.int64)
    q = tb.q.reshape(r, nb, groups, qk // groups).astype(np.int64)
    isum = (np.einsum("rbgj,nbgj->nrbg", q, qa) * tb.sc[None]).sum(-1)
    terms = np.zeros((n, r, nb, 2))
    terms[..., 0] = (da[:, None, :] * tb.d[None]).astype(np.float32) * isum
    if k.offset == "dmin":
        gsum = qa.reshape(n, nb, groups, -1).sum(-1)  # the activations' sum per group
        msum = np.einsum("rbs,nbs->nrb", tb.mins.astype(np.int64), gsum)
        terms[..., 1] = -(da[:, None, :] * tb.m[None]).astype(np.float32) * msum
    elif k.offset == "m":
        terms[..., 1] = (tb.m[None] * sa[:, None, :]).astype(np.float32)
    return terms


def twin_qmatmul(t: GGMLType | int, w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``twin_block_terms`` summed in float64: ``W (R, row_bytes) @ x (n, K) -> (n, R)``."""
    return twin_block_terms(t, w, x).sum((-1, -2)).astype(np.float32)


# every weight type a compiled product takes (``grouped``): the integer kernels', F16, BF16
COMPILED_TYPES = frozenset(KERNEL_TYPES) | {GGMLType.F16, GGMLType.BF16}
