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
from .bits import bit_planes, spread_bits
from .formats import FORMATS

T = GGMLType
F = FORMATS

# ggml's kvalues_iq4nl and kvalues_fp4 (the E2M1 values, doubled), from ggml-common.h
KVALUES_IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10,
                          1, 13, 25, 38, 53, 69, 89, 113], dtype=np.float32)
KVALUES_FP4 = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12],
                       dtype=np.float32)


def _nibbles(blocks: np.ndarray, fmt, name: str = "qs") -> np.ndarray:
    """A 16-byte field's 32 nibbles in element order (low nibbles, then high): (n, 32) uint8."""
    f = fmt[name]
    return bit_planes(blocks, f.offset, f.nbytes, f.nbytes, 4)


def _fifth_bits(blocks: np.ndarray, fmt) -> np.ndarray:
    """Q5_0/Q5_1: the 32 bits of ``qh`` (bit j belongs to value j) as 0/16 bytes."""
    h = spread_bits(blocks, fmt["qh"].offset, 4)
    h <<= 4
    return h


def dequant_q4_0(blocks: np.ndarray, out: np.ndarray) -> None:
    # y = ((q & 15) - 8) * d: the int is formed first, then converted and scaled
    q = _nibbles(blocks, F[T.Q4_0]).view(np.int8)
    q -= 8
    out[:] = q
    out *= F[T.Q4_0].scale(blocks)


def dequant_q4_1(blocks: np.ndarray, out: np.ndarray) -> None:
    # y = q*d + m
    f = F[T.Q4_1]
    out[:] = _nibbles(blocks, f)
    out *= f.scale(blocks, "d")
    out += f.scale(blocks, "m")


def dequant_q5_0(blocks: np.ndarray, out: np.ndarray) -> None:
    # y = ((q | high bit << 4) - 16) * d
    f = F[T.Q5_0]
    q = _nibbles(blocks, f)
    q |= _fifth_bits(blocks, f)
    q = q.view(np.int8)
    q -= 16
    out[:] = q
    out *= f.scale(blocks)


def dequant_q5_1(blocks: np.ndarray, out: np.ndarray) -> None:
    # y = (q | high bit << 4) * d + m
    f = F[T.Q5_1]
    q = _nibbles(blocks, f)
    q |= _fifth_bits(blocks, f)
    out[:] = q
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
    np.take(KVALUES_IQ4NL, _nibbles(blocks, f), out=out, mode="clip")
    out *= f.scale(blocks)


def e8m0_half(e: np.ndarray) -> np.ndarray:
    """ggml_e8m0_to_fp32_half: 2**(e - 128) as float32, built from its bits like ggml does."""
    e = e.astype(np.uint32)
    bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - 1) << 23)
    return bits.astype(np.uint32).view(np.float32)


def dequant_mxfp4(blocks: np.ndarray, out: np.ndarray) -> None:
    f = F[T.MXFP4]
    np.take(KVALUES_FP4, _nibbles(blocks, f), out=out, mode="clip")
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
    q = bit_planes(blocks, f["qs"].offset, 32, 8, 4)
    np.take(KVALUES_FP4, q, out=out, mode="clip")
    out.reshape(n * 4, 16)[:] *= np.take(UE4M3, f.field(blocks, "d")).reshape(n * 4, 1)


def dequant_tq2_0(blocks: np.ndarray, out: np.ndarray) -> None:
    # per 32 bytes, 4 planes of 32 values (bits 0-1, 2-3, ...); y = (q - 1) * d
    f = F[T.TQ2_0]
    q = bit_planes(blocks, 0, 64, 32, 2).view(np.int8)
    q -= 1
    out[:] = q
    out *= f.scale(blocks)


_POW3 = np.array([1, 3, 9, 27, 81], dtype=np.uint8)[:, None]


def dequant_tq1_0(blocks: np.ndarray, out: np.ndarray) -> None:
    # base-3 fixed point: trit n of byte b is ((b * 3**n mod 256) * 3) >> 8. Trit n of byte
    # m lands at n*width + m within its group: 32 bytes x 5 trits, 16 x 5, then qh 4 x 4.
    f = F[T.TQ1_0]
    qs, qh = f.field(blocks, "qs"), f.field(blocks, "qh")
    n = len(blocks)
    q = np.empty((n, 256), dtype=np.uint8)
    np.multiply(qs[:, None, :32], _POW3, out=q[:, :160].reshape(n, 5, 32))
    np.multiply(qs[:, None, 32:], _POW3, out=q[:, 160:240].reshape(n, 5, 16))
    np.multiply(qh[:, None, :], _POW3[:4], out=q[:, 240:].reshape(n, 4, 4))
    trit = np.multiply(q, 3, dtype=np.uint16)
    trit >>= 8
    np.subtract(trit.view(np.int16), 1, out=out, casting="unsafe")
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
