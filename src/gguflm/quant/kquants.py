"""Dequantizers of the K-quants (Q2_K .. Q6_K): 256-value super-blocks of 16 or 8 sub-blocks.

Same contract and the same exactness rule as ``simple.py``: each follows ggml's
``dequantize_row_q*_K`` with the same float32 operands in the same order, e.g. Q4_K
computes ``d1 = d * sc`` and ``m1 = dmin * m`` per sub-block, then ``d1 * q - m1``.
"""

from __future__ import annotations

import numpy as np

from ..gguf.types import GGMLType
from .bits import bit_planes
from .formats import FORMATS

T = GGMLType
F = FORMATS

def dequant_q2_k(blocks: np.ndarray, out: np.ndarray) -> None:
    # 2 halves x 4 bit-planes x 32 bytes; sub-block of 16 values g uses scales[g]:
    # low nibble scales d, high nibble scales dmin. y = (d*sc) * q - (dmin*m)
    f = F[T.Q2_K]
    n = len(blocks)
    out[:] = bit_planes(blocks, f["qs"].offset, 64, 32, 2)
    sc = f.field(blocks, "scales")
    dl = f.scale(blocks, "d") * (sc & 0xF)
    ml = f.scale(blocks, "dmin") * (sc >> 4)
    o = out.reshape(n, 16, 16)
    o *= dl[:, :, None]
    o -= ml[:, :, None]


def q3_k_scales(s: np.ndarray) -> np.ndarray:
    """Sixteen 6-bit scales packed in 12 bytes -> (n, 16) ints in [0, 64).

    ggml unpacks them with uint32 masks; per byte k of group g that is: low 4 bits from
    the low (g even) or high (g odd, bytes 0..7 reused) nibble, top 2 bits from byte 8+k.
    """
    lo = np.concatenate([s[:, 0:4] & 0xF, s[:, 4:8] & 0xF, s[:, 0:4] >> 4, s[:, 4:8] >> 4], 1)
    hi = s[:, 8:12]
    top = np.concatenate([hi & 3, (hi >> 2) & 3, (hi >> 4) & 3, hi >> 6], 1)
    return lo | (top << 4)


def dequant_q3_k(blocks: np.ndarray, out: np.ndarray) -> None:
    # like Q2_K, plus a high bit per value from hmask (bit plane 4*half + j); a clear bit
    # subtracts 4. y = (d * (scale - 32)) * (q - (hbit ? 0 : 4))
    f = F[T.Q3_K]
    n = len(blocks)
    q = bit_planes(blocks, f["qs"].offset, 64, 32, 2)
    h = bit_planes(blocks, f["hmask"].offset, 32, 32, 1)
    h ^= 1
    h <<= 2
    q = q.view(np.int8)
    q -= h.view(np.int8)
    out[:] = q
    scales = q3_k_scales(f.field(blocks, "scales")).astype(np.int8) - np.int8(32)
    dl = f.scale(blocks, "d") * scales
    out.reshape(n, 16, 16)[:] *= dl[:, :, None]


def k4_scales_mins(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml's get_scale_min_k4 for j = 0..7: 6-bit scales and mins from 12 bytes."""
    sc = np.concatenate([s[:, 0:4] & 63, (s[:, 8:12] & 0xF) | ((s[:, 0:4] >> 6) << 4)], 1)
    m = np.concatenate([s[:, 4:8] & 63, (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)], 1)
    return sc, m


def _k4_scale_out(f, blocks: np.ndarray, out: np.ndarray) -> None:
    """out (n, 256) holding q: apply ``(d*sc) * q - (dmin*m)`` per 32-value sub-block."""
    sc, m = k4_scales_mins(f.field(blocks, "scales"))
    d1 = f.scale(blocks, "d") * sc  # float32 * uint8 -> float32, as in ggml
    m1 = f.scale(blocks, "dmin") * m
    o = out.reshape(len(blocks), 8, 32)
    o *= d1[:, :, None]
    o -= m1[:, :, None]


def dequant_q4_k(blocks: np.ndarray, out: np.ndarray) -> None:
    # 4 chunks of 32 bytes: low nibbles are sub-block 2i, high nibbles 2i+1
    f = F[T.Q4_K]
    out[:] = bit_planes(blocks, f["qs"].offset, 128, 32, 4)
    _k4_scale_out(f, blocks, out)


def dequant_q5_k(blocks: np.ndarray, out: np.ndarray) -> None:
    # as Q4_K, plus bit s of qh[l] as the fifth bit of value l of sub-block s
    f = F[T.Q5_K]
    q = bit_planes(blocks, f["qs"].offset, 128, 32, 4)
    h = bit_planes(blocks, f["qh"].offset, 32, 32, 1)
    h <<= 4
    q |= h
    out[:] = q
    _k4_scale_out(f, blocks, out)


def dequant_q6_k(blocks: np.ndarray, out: np.ndarray) -> None:
    # per half (128 values): value 32*k + l has low 4 bits from ql[l + 32*(k&1)] (low
    # nibble for k<2, high for k>=2) and top 2 bits from qh[l] >> 2k; scale index = 16-group.
    # y = (d * sc) * (q - 32)
    f = F[T.Q6_K]
    n = len(blocks)
    q = bit_planes(blocks, f["ql"].offset, 128, 64, 4)
    h = bit_planes(blocks, f["qh"].offset, 64, 32, 2)
    h <<= 4
    q |= h
    q = q.view(np.int8)
    q -= 32
    out[:] = q
    ds = f.scale(blocks, "d") * f.field(blocks, "scales")
    out.reshape(n, 16, 16)[:] *= ds[:, :, None]


DEQUANTIZERS = {
    T.Q2_K: dequant_q2_k,
    T.Q3_K: dequant_q3_k,
    T.Q4_K: dequant_q4_k,
    T.Q5_K: dequant_q5_k,
    T.Q6_K: dequant_q6_k,
}
