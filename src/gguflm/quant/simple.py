"""Dequantizers of the single-level block types: Q4_0..Q8_0, Q1_0, Q2_0, IQ4_NL, MXFP4, NVFP4,
TQ1_0 and TQ2_0.

Each ``dequant_<type>(blocks, out)`` takes ``(n_blocks, type_size)`` uint8 blocks and fills
``out`` ``(n_blocks, block_size)`` float32, following ggml's ``dequantize_row_<type>``
(ggml-quants.c) operation for operation: the same float32 operands, combined in the same
order, so the results are bit-identical. The integer part of each value is built first
(exactly, in small integer or float32 arrays), then scaled once per block.
"""

from __future__ import annotations

import numpy as np

from ..gguf.types import GGMLType
from .formats import FORMATS

T = GGMLType
F = FORMATS

# ggml's kvalues_iq4nl and kvalues_fp4 (the E2M1 values, doubled), from ggml-common.h
KVALUES_IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10,
                          1, 13, 25, 38, 53, 69, 89, 113], dtype=np.float32)
KVALUES_FP4 = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12],
                       dtype=np.float32)


def _nibbles(qs: np.ndarray, out: np.ndarray, lut: np.ndarray | None = None) -> None:
    """Low nibbles of ``qs`` (n, k) to ``out[:, :k]``, high nibbles to ``out[:, k:]``.

    With ``lut`` each nibble is mapped through it (a float32 table of 16), else converted.
    """
    k = qs.shape[1]
    lo, hi = qs & 0x0F, qs >> 4
    if lut is None:
        out[:, :k] = lo
        out[:, k:] = hi
    else:
        np.take(lut, lo, out=out[:, :k], mode="clip")
        np.take(lut, hi, out=out[:, k:], mode="clip")


def _high_bits(qh: np.ndarray) -> np.ndarray:
    """The 32 bits of a little-endian ``qh`` (n, 4) as (n, 32) uint8, bit j -> column j."""
    return np.unpackbits(qh, axis=1, bitorder="little")


def dequant_q4_0(blocks: np.ndarray, out: np.ndarray) -> None:
    # y = ((q & 15) - 8) * d: the int is formed first, then converted and scaled
    _nibbles(F[T.Q4_0].field(blocks, "qs"), out, _Q4_0_LUT)
    out *= F[T.Q4_0].scale(blocks)


_Q4_0_LUT = np.arange(16, dtype=np.float32) - 8


def dequant_q4_1(blocks: np.ndarray, out: np.ndarray) -> None:
    # y = q*d + m
    f = F[T.Q4_1]
    _nibbles(f.field(blocks, "qs"), out)
    out *= f.scale(blocks, "d")
    out += f.scale(blocks, "m")


def dequant_q5_0(blocks: np.ndarray, out: np.ndarray) -> None:
    # y = ((q | high bit << 4) - 16) * d
    f = F[T.Q5_0]
    _nibbles(f.field(blocks, "qs"), out)
    hb = _high_bits(f.field(blocks, "qh"))
    hb <<= 4
    out += hb
    out -= 16
    out *= f.scale(blocks)


def dequant_q5_1(blocks: np.ndarray, out: np.ndarray) -> None:
    # y = (q | high bit << 4) * d + m
    f = F[T.Q5_1]
    _nibbles(f.field(blocks, "qs"), out)
    hb = _high_bits(f.field(blocks, "qh"))
    hb <<= 4
    out += hb
    out *= f.scale(blocks, "d")
    out += f.scale(blocks, "m")


def dequant_q8_0(blocks: np.ndarray, out: np.ndarray) -> None:
    f = F[T.Q8_0]
    np.multiply(f.field(blocks, "qs"), f.scale(blocks), out=out)


def dequant_q1_0(blocks: np.ndarray, out: np.ndarray) -> None:
    # each bit picks d or -d (no arithmetic at all)
    f = F[T.Q1_0]
    bits = np.unpackbits(f.field(blocks, "qs"), axis=1, bitorder="little")
    d = f.scale(blocks)
    np.copyto(out, np.where(bits.view(bool), d, -d))


def dequant_q2_0(blocks: np.ndarray, out: np.ndarray) -> None:
    # four 2-bit values per byte, lowest bits first; y = (q - 1) * d
    f = F[T.Q2_0]
    qs = f.field(blocks, "qs")
    q = (qs[:, :, None] >> _SHIFT_2BIT) & 3
    np.subtract(q.reshape(out.shape).view(np.int8), 1, out=out, casting="unsafe")
    out *= f.scale(blocks)


_SHIFT_2BIT = np.array([0, 2, 4, 6], dtype=np.uint8)


def dequant_iq4_nl(blocks: np.ndarray, out: np.ndarray) -> None:
    f = F[T.IQ4_NL]
    _nibbles(f.field(blocks, "qs"), out, KVALUES_IQ4NL)
    out *= f.scale(blocks)


def e8m0_half(e: np.ndarray) -> np.ndarray:
    """ggml_e8m0_to_fp32_half: 2**(e - 128) as float32, built from its bits like ggml does."""
    e = e.astype(np.uint32)
    bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - 1) << 23)
    return bits.astype(np.uint32).view(np.float32)


def dequant_mxfp4(blocks: np.ndarray, out: np.ndarray) -> None:
    f = F[T.MXFP4]
    _nibbles(f.field(blocks, "qs"), out, KVALUES_FP4)
    out *= e8m0_half(f.field(blocks, "e"))[:, None]


def _ue4m3_table() -> np.ndarray:
    """ggml_ue4m3_to_fp32 for all 256 byte values (half the UE4M3 value, 0 for 0 and 0x7F)."""
    x = np.arange(256)
    exp, man = (x >> 3) & 0xF, x & 7
    raw = np.where(exp == 0, np.ldexp(man.astype(np.float32), -9),
                   np.ldexp(1 + man.astype(np.float32) / 8, exp - 7))
    raw = raw.astype(np.float32) * np.float32(0.5)
    raw[(x == 0) | (x == 0x7F)] = 0
    return raw.astype(np.float32)


UE4M3 = _ue4m3_table()


def dequant_nvfp4(blocks: np.ndarray, out: np.ndarray) -> None:
    # four sub-blocks of 16, each with its own UE4M3 scale and 8 bytes of nibbles
    f = F[T.NVFP4]
    n = len(blocks)
    qs = f.field(blocks, "qs").reshape(n * 4, 8)
    sub = out.reshape(n * 4, 16)
    _nibbles(qs, sub, KVALUES_FP4)
    sub *= UE4M3[f.field(blocks, "d")].reshape(n * 4, 1)


def dequant_tq2_0(blocks: np.ndarray, out: np.ndarray) -> None:
    # per 32 bytes, 4 planes of 32 values (bits 0-1, 2-3, ...); y = (q - 1) * d
    f = F[T.TQ2_0]
    qs = f.field(blocks, "qs").reshape(-1, 2, 1, 32)
    q = (qs >> _SHIFT_2BIT[:, None]) & 3
    np.subtract(q.reshape(out.shape).view(np.int8), 1, out=out, casting="unsafe")
    out *= f.scale(blocks)


def _tq1_table() -> np.ndarray:
    """Trit ``n`` (0..4) of each base-3 fixed-point byte, minus 1: (5, 256) float32.

    ggml: q = byte * 3**n (mod 256); trit = (q * 3) >> 8.
    """
    b = np.arange(256, dtype=np.uint32)
    pow3 = np.array([1, 3, 9, 27, 81], dtype=np.uint32)[:, None]
    q = (b * pow3) & 0xFF
    return (((q * 3) >> 8).astype(np.int32) - 1).astype(np.float32)


_TQ1 = _tq1_table()


def dequant_tq1_0(blocks: np.ndarray, out: np.ndarray) -> None:
    # 32 bytes x 5 trits, then 16 bytes x 5 trits, then 4 bytes (qh) x 4 trits; trit n of
    # byte m lands at n*width + m within its group
    f = F[T.TQ1_0]
    qs, qh = f.field(blocks, "qs"), f.field(blocks, "qh")
    n = len(blocks)
    out[:, :160].reshape(n, 5, 32)[:] = _TQ1[:, qs[:, :32]].transpose(1, 0, 2)
    out[:, 160:240].reshape(n, 5, 16)[:] = _TQ1[:, qs[:, 32:]].transpose(1, 0, 2)
    out[:, 240:].reshape(n, 4, 4)[:] = _TQ1[:4, qh].transpose(1, 0, 2)
    out *= f.scale(blocks)


DEQUANTIZERS = {
    T.Q4_0: dequant_q4_0,
    T.Q4_1: dequant_q4_1,
    T.Q5_0: dequant_q5_0,
    T.Q5_1: dequant_q5_1,
    T.Q8_0: dequant_q8_0,
    T.Q1_0: dequant_q1_0,
    T.Q2_0: dequant_q2_0,
    T.IQ4_NL: dequant_iq4_nl,
    T.MXFP4: dequant_mxfp4,
    T.NVFP4: dequant_nvfp4,
    T.TQ1_0: dequant_tq1_0,
    T.TQ2_0: dequant_tq2_0,
}
