"""Dequantizers of the IQ types: lattice (grid) codebooks with separate sign bits.

Same contract and exactness rule as ``simple.py``. Each 8 (or 4) values come from one
grid row picked by an index; signs come as bits (or as 7 bits expanded through ggml's
``ksigns_iq2xs``). Applying a sign is exact, so ``db * (grid * sign)`` equals ggml's
``db * grid * sign`` bit for bit; scales are formed as ggml forms them, e.g. IQ2_XXS's
``db = d * (0.5f + s) * 0.25f``.
"""

from __future__ import annotations

import numpy as np

from ..gguf.types import GGMLType
from .formats import FORMATS, BlockFormat
from .iq_tables import grid, ksigns
from .simple import KVALUES_IQ4NL

T = GGMLType
F = FORMATS
f32 = np.float32

# grids as float32 (one gather gives ready values), signs as +-1 rows
_IQ2XXS = grid("iq2xxs").astype(f32)
_IQ2XS = grid("iq2xs").astype(f32)
_IQ2S = grid("iq2s").astype(f32)
_IQ3XXS = grid("iq3xxs").astype(f32)
_IQ3S = grid("iq3s").astype(f32)
_IQ1S = grid("iq1s").astype(f32)
_KSIGNS = ksigns()  # (128, 8)
_SHIFT_7 = np.array([0, 7, 14, 21], dtype=np.uint32)  # 4 x 7 sign bits in a uint32
_SHIFT_2 = np.array([0, 2, 4, 6], dtype=np.uint8)
_SHIFT_NIB = np.array([0, 4], dtype=np.uint8)
_SHIFT_3 = np.array([0, 3, 6, 9], dtype=np.uint16)  # 4 x 3-bit fields of a uint16


def _rows(table: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """``table[idx]`` for a 2-D table: np.take copies whole rows (fancy indexing is ~10x
    slower here)."""
    return np.take(table, idx, axis=0)


def _flip_signs(out: np.ndarray, bits: np.ndarray) -> None:
    """Negate the values of ``out`` (float32) whose bit is 1: flipping the sign bit is
    exactly a multiplication by -1."""
    out.view(np.uint32).reshape(bits.shape)[:] ^= np.left_shift(bits, 31, dtype=np.uint32)


def _scale_halves(f: BlockFormat, blocks: np.ndarray, out: np.ndarray) -> None:
    """IQ2_XS/IQ2_S: two 4-bit sub-scales per ``scales`` byte, one per 16 values; scale
    ``out`` (n, 256) by ``d * (0.5f + s) * 0.25f``."""
    s = ((f.field(blocks, "scales")[:, :, None] >> _SHIFT_NIB) & 0xF).astype(f32)
    db = f.scale(blocks)[:, :, None] * (f32(0.5) + s) * f32(0.25)
    out.reshape(len(blocks), 8, 2, 16)[:] *= db[:, :, :, None]


def dequant_iq2_xxs(blocks: np.ndarray, out: np.ndarray) -> None:
    # per 32 values: 4 grid bytes, then a uint32 of 4 x 7 sign bits and a 4-bit scale
    f = F[T.IQ2_XXS]
    n = len(blocks)
    qs = f.field(blocks, "qs").reshape(n, 8, 8)
    aux = np.ascontiguousarray(qs[:, :, 4:]).view("<u4")  # (n, 8, 1)
    db = f.scale(blocks) * (f32(0.5) + (aux[:, :, 0] >> 28).astype(f32)) * f32(0.25)
    o = out.reshape(n, 8, 4, 8)
    np.multiply(_rows(_IQ2XXS, qs[:, :, :4]), _rows(_KSIGNS, (aux >> _SHIFT_7) & 127), out=o)
    o *= db[:, :, None, None]


def dequant_iq2_xs(blocks: np.ndarray, out: np.ndarray) -> None:
    # uint16 per 8 values: 9-bit grid index, 7 sign bits; two 4-bit scales per 32 values
    f = F[T.IQ2_XS]
    n = len(blocks)
    qs = f.field(blocks, "qs")
    o = out.reshape(n, 32, 8)
    np.multiply(_rows(_IQ2XS, qs & 511), _rows(_KSIGNS, qs >> 9), out=o)
    _scale_halves(f, blocks, out)


def dequant_iq2_s(blocks: np.ndarray, out: np.ndarray) -> None:
    # 32 bytes of grid index low bits, 32 bytes of plain sign bits; qh adds 2 index bits
    f = F[T.IQ2_S]
    n = len(blocks)
    qs = f.field(blocks, "qs")
    high = (f.field(blocks, "qh")[:, :, None] >> _SHIFT_2) & 3  # (n, 8, 4)
    idx = qs[:, :32].reshape(n, 8, 4) | (high.astype(np.uint16) << 8)
    np.take(_IQ2S, idx, axis=0, out=out.reshape(n, 8, 4, 8))
    _flip_signs(out, np.unpackbits(qs[:, 32:], axis=1, bitorder="little"))
    _scale_halves(f, blocks, out)


def dequant_iq3_xxs(blocks: np.ndarray, out: np.ndarray) -> None:
    # 64 grid bytes (4 values each), then per 32 values a uint32 of signs + 4-bit scale
    f = F[T.IQ3_XXS]
    n = len(blocks)
    qs = f.field(blocks, "qs")
    aux = np.ascontiguousarray(qs[:, 64:]).view("<u4")  # (n, 8)
    db = f.scale(blocks) * (f32(0.5) + (aux >> 28).astype(f32)) * f32(0.5)
    o = out.reshape(n, 8, 4, 8)
    vals = _rows(_IQ3XXS, qs[:, :64]).reshape(n, 8, 4, 8)
    np.multiply(vals, _rows(_KSIGNS, (aux[:, :, None] >> _SHIFT_7) & 127), out=o)
    o *= db[:, :, None, None]


def dequant_iq3_s(blocks: np.ndarray, out: np.ndarray) -> None:
    # 9-bit grid indices (bit k of qh[ib] tops index k), plain sign bits, 4-bit odd scales
    f = F[T.IQ3_S]
    n = len(blocks)
    qh = np.unpackbits(f.field(blocks, "qh"), axis=1, bitorder="little")  # (n, 64)
    idx = f.field(blocks, "qs") | (qh.astype(np.uint16) << 8)
    np.take(_IQ3S, idx, axis=0, out=out.reshape(n, 64, 4))
    _flip_signs(out, np.unpackbits(f.field(blocks, "signs"), axis=1, bitorder="little"))
    sc = (f.field(blocks, "scales")[:, :, None] >> _SHIFT_NIB) & 0xF
    db = f.scale(blocks) * (1 + 2 * sc.reshape(n, 8).astype(np.int32)).astype(f32)
    out.reshape(n, 8, 32)[:] *= db[:, :, None]


def dequant_iq1_s(blocks: np.ndarray, out: np.ndarray) -> None:
    # uint16 qh per 32 values: 4 x 3 index bits, a 3-bit scale, the sign of a +-1/8 shift.
    # y = (d * (2s + 1)) * (grid + delta)
    f = F[T.IQ1_S]
    n = len(blocks)
    qh = f.field(blocks, "qh")  # (n, 8)
    high = (qh[:, :, None] >> _SHIFT_3) & 7  # (n, 8, 4)
    idx = f.field(blocks, "qs").reshape(n, 8, 4) | (high << 8)
    delta = np.where(qh & 0x8000, f32(-0.125), f32(0.125))
    dl = f.scale(blocks) * (2 * ((qh >> 12) & 7).astype(np.int32) + 1).astype(f32)
    o = out.reshape(n, 8, 4, 8)
    np.add(_rows(_IQ1S, idx), delta[:, :, None, None], out=o)
    o *= dl[:, :, None, None]



def dequant_iq1_m(blocks: np.ndarray, out: np.ndarray) -> None:
    # no f16 field: the block scale's 16 bits are the top nibbles of the 4 uint16 scales.
    # Each qh nibble serves 8 values: 3 index bits and the delta's sign; 3-bit sub-scales.
    f = F[T.IQ1_M]
    n = len(blocks)
    sc = f.field(blocks, "scales")  # (n, 4) uint16
    bits = ((sc[:, 0] >> 12) | ((sc[:, 1] >> 8) & 0x00F0) | ((sc[:, 2] >> 4) & 0x0F00)
            | (sc[:, 3] & 0xF000))
    d = bits.astype(np.uint16).view(np.float16).astype(f32)[:, None]
    nib = ((f.field(blocks, "qh")[:, :, None] >> _SHIFT_NIB) & 0xF).reshape(n, 32)
    idx = f.field(blocks, "qs") | ((nib & 7).astype(np.uint16) << 8)
    delta = np.where(nib & 8, f32(-0.125), f32(0.125))
    s = (sc[:, :, None] >> _SHIFT_3) & 7  # (n, 4, 4): ib = 2i + k//2, half = k%2
    dl = d * (2 * s.reshape(n, 16).astype(np.int32) + 1).astype(f32)
    o = out.reshape(n, 32, 8)
    np.add(_rows(_IQ1S, idx), delta[:, :, None], out=o)
    out.reshape(n, 16, 16)[:] *= dl[:, :, None]



def dequant_iq4_xs(blocks: np.ndarray, out: np.ndarray) -> None:
    # 6-bit sub-scales: low 4 bits from scales_l nibbles, high 2 from scales_h
    f = F[T.IQ4_XS]
    n = len(blocks)
    lo = (f.field(blocks, "scales_l")[:, :, None] >> _SHIFT_NIB) & 0xF
    hi = (f.field(blocks, "scales_h")[:, None] >> _SHIFT_8x2) & 3
    ls = lo.reshape(n, 8).astype(np.int32) | (hi.astype(np.int32) << 4)
    dl = f.scale(blocks) * (ls - 32).astype(f32)
    qs = f.field(blocks, "qs").reshape(n * 8, 16)
    o = out.reshape(n * 8, 32)
    np.take(KVALUES_IQ4NL, qs & 0xF, out=o[:, :16], mode="clip")
    np.take(KVALUES_IQ4NL, qs >> 4, out=o[:, 16:], mode="clip")
    out.reshape(n, 8, 32)[:] *= dl[:, :, None]


_SHIFT_8x2 = np.arange(0, 16, 2, dtype=np.uint16)


DEQUANTIZERS = {
    T.IQ2_XXS: dequant_iq2_xxs,
    T.IQ2_XS: dequant_iq2_xs,
    T.IQ2_S: dequant_iq2_s,
    T.IQ3_XXS: dequant_iq3_xxs,
    T.IQ3_S: dequant_iq3_s,
    T.IQ1_S: dequant_iq1_s,
    T.IQ1_M: dequant_iq1_m,
    T.IQ4_XS: dequant_iq4_xs,
}
