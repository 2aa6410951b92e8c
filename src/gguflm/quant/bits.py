"""Byte-field helpers that keep numpy's inner loops long.

A block field such as Q4_0's 16 ``qs`` bytes is a short strided row per block; numpy pays a
fixed cost per row, which dominated naive dequantizers. Here a field is read as a few
little-endian uint64 words per block, and each word column is processed as one long 1-D
strided loop (SWAR: eight bytes per 64-bit operation). Results come back as contiguous
``(n_blocks, k)`` uint8 arrays, in element order, ready for one contiguous cast to float32.
"""

from __future__ import annotations

import numpy as np

LO4 = np.uint64(0x0F0F0F0F0F0F0F0F)
ONES = np.uint64(0x0101010101010101)
BIT_SPREAD = np.uint64(0x8040201008040201)  # byte j keeps bit j
LOW7 = np.uint64(0x7F7F7F7F7F7F7F7F)
_U4, _U7 = np.uint64(4), np.uint64(7)


def words(blocks: np.ndarray, offset: int, nbytes: int) -> np.ndarray:
    """Field bytes ``[offset, offset+nbytes)`` of each block as (n, nbytes/8) uint64 (a view)."""
    return blocks[:, offset:offset + nbytes].view("<u8")


def bit_planes(blocks: np.ndarray, offset: int, nbytes: int, group: int,
               width: int) -> np.ndarray:
    """Split a field into ``width``-bit values, plane by plane: (n, nbytes*8/width) uint8.

    Per ``group`` bytes of the field come first bits 0..width-1 of each byte, then the next
    ``width`` bits, and so on: ggml's order everywhere (Q4_0's nibbles: group 16, width 4;
    Q4_K: 32, 4; Q2_K/TQ2_0 crumbs: 32, 2; Q5_K's fifth bits: 32, 1).
    Returns a contiguous uint8 view of uint64 words.
    """
    w = words(blocks, offset, nbytes)
    n, nw = w.shape
    g, planes = group // 8, 8 // width
    mask = np.uint64(int(ONES) * ((1 << width) - 1))
    out = np.empty((n, planes * nw), dtype=np.uint64)
    for k in range(nw):
        first = (k // g) * planes * g + k % g
        for p in range(planes):
            col = out[:, first + p * g]
            if p:
                np.right_shift(w[:, k], np.uint64(p * width), out=col)
                col &= mask
            else:
                np.bitwise_and(w[:, k], mask, out=col)
    return out.view(np.uint8)


def spread_bits(blocks: np.ndarray, offset: int, nbytes: int) -> np.ndarray:
    """Each bit of a little-endian field as one byte (0 or 1): (n, 8*nbytes) uint8.

    Bit j (bit j%8 of byte j//8) becomes byte j. A contiguous uint8 view of uint64 words.
    """
    src = blocks[:, offset:offset + nbytes]
    n = len(blocks)
    out = np.empty((n, nbytes), dtype=np.uint64)
    for k in range(nbytes):
        x = out[:, k]
        np.multiply(src[:, k], ONES, out=x, dtype=np.uint64)  # the byte in all 8 lanes
        x &= BIT_SPREAD  # lane j keeps bit j
        x += LOW7  # a lane is >= 0x80 iff its bit was set (no carries between lanes)
        x >>= _U7
        x &= ONES
    return out.view(np.uint8)
