"""A Q8_0 KV cache's numbers: keys and values stored as ggml ``block_q8_0`` rows, and the
arithmetic llama.cpp's CPU code does with them.

One cached key (or value) of one KV head is a row of ``d / 32`` blocks of 34 bytes, as ggml
lays them out: the block's scale as float16 (2 bytes, little-endian), then its 32 values
as int8. A row is stored as ggml's x86 ``quantize_row_q8_0`` makes it (``ggml_set_rows``
into a Q8_0 cache): scale amax / 127 rounded to float16, values rint(x * 127 / amax).
Scores are ggml's ``ggml_vec_dot_q8_0_q8_0`` (AVX2) of the key row and the query quantized
the same way (its ``vec_dot_type``); a value is dequantized exactly (int8 times the
float16 scale is exact in float32) before it is weighted, as ``dequantize_row_q8_0``.

The arrays are int8 with the row's bytes last: keys and values (S, H_kv, n_ctx, d / 32 *
34) per layer, one contiguous row per position (no tiles: a score is one row's dot).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..quant import jitcache  # noqa: F401 - stamps the cached kernels below (before any njit)
from ..quant.floatbits import f16_from_f32, fma32, kv_load
from ..quant.kerneltypes import twin_quantize_q8_0
from .kv_cache import BLOCK8 as BLOCK  # bytes per block: float16 scale, 32 int8 values
from .kv_cache import QK8 as QK  # values per block


def row_bytes(n: int) -> int:
    """Bytes of one cached row of n values (n a multiple of 32)."""
    return n // QK * BLOCK


@njit(cache=True, nogil=True, inline="always")
def block_scale(row, b):  # noqa: ANN001, ANN201
    """Block b's scale (float16, as float32) of an int8 row of blocks."""
    lo = np.uint16(np.uint8(row[b * BLOCK]))
    hi = np.uint16(np.uint8(row[b * BLOCK + 1]))
    return kv_load(np.uint16(lo | (hi << np.uint16(8))))


@njit(cache=True, nogil=True)
def quantize_row(x, out):  # noqa: ANN001, ANN201
    """x (n,) f32 -> out (n / 32 * 34,) int8 blocks: ggml's x86 quantize_row_q8_0 (scale
    amax / 127 stored as float16, values rint(x * 127 / amax), ties to even)."""
    for b in range(x.shape[0] // QK):
        amax = np.float32(0.0)
        for j in range(QK):
            amax = max(amax, abs(x[b * QK + j]))
        inv = np.float32(127.0) / amax if amax != 0 else np.float32(0.0)
        bits = f16_from_f32(amax / np.float32(127.0))
        out[b * BLOCK] = np.int8(np.uint8(bits & np.uint16(0xFF)))
        out[b * BLOCK + 1] = np.int8(np.uint8(bits >> np.uint16(8)))
        for j in range(QK):
            out[b * BLOCK + 2 + j] = np.int8(np.rint(x[b * QK + j] * inv))


@njit(cache=True, nogil=True, inline="always")
def _lane(kr, qr, o):  # noqa: ANN001, ANN202
    """The exact integer sum of the 4 products at o..o+3, as float32 (|sum| < 2**16)."""
    s = np.int32(kr[o]) * np.int32(qr[o]) + np.int32(kr[o + 1]) * np.int32(qr[o + 1])
    s += np.int32(kr[o + 2]) * np.int32(qr[o + 2]) + np.int32(kr[o + 3]) * np.int32(qr[o + 3])
    return np.float32(s)


@njit(cache=True, nogil=True, inline="always")
def dot(kr, qr):  # noqa: ANN001, ANN201
    """Rows kr . qr of blocks (equal lengths) as ggml_vec_dot_q8_0_q8_0 sums on x86 (AVX2):
    per block, 8 lanes of exact integer sums of 4 products each (lane l: values 4l..4l+3),
    each added as fma(d_k * d_q, lane, acc_l); the lanes reduced ((0+4)+(2+6))+((1+5)+(3+7))."""
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = np.float32(0.0)
    for b in range(kr.shape[0] // BLOCK):
        d = block_scale(kr, b) * block_scale(qr, b)  # exact: two float16 values
        o = b * BLOCK + 2
        a0 = fma32(d, _lane(kr, qr, o), a0)
        a1 = fma32(d, _lane(kr, qr, o + 4), a1)
        a2 = fma32(d, _lane(kr, qr, o + 8), a2)
        a3 = fma32(d, _lane(kr, qr, o + 12), a3)
        a4 = fma32(d, _lane(kr, qr, o + 16), a4)
        a5 = fma32(d, _lane(kr, qr, o + 20), a5)
        a6 = fma32(d, _lane(kr, qr, o + 24), a6)
        a7 = fma32(d, _lane(kr, qr, o + 28), a7)
    return ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7))


@njit(cache=True, nogil=True, inline="always")
def dequantize_row(row, out):  # noqa: ANN001, ANN201
    """row of blocks -> out (n,) f32: each value int8 * scale (exact)."""
    for b in range(row.shape[0] // BLOCK):
        d = block_scale(row, b)
        for j in range(QK):
            out[b * QK + j] = np.float32(row[b * BLOCK + 2 + j]) * d


@njit(cache=True, nogil=True)
def store_rows(kc, vc, slot, pos, k_new, v_new):  # noqa: ANN001, ANN201
    """Quantize k_new (T, H_kv, d) and v_new (T, H_kv, d_v) of rows at positions ``pos`` of
    slots ``slot`` into one layer's keys ``kc`` and values ``vc`` (S, H_kv, n_ctx, bytes)."""
    for t in range(k_new.shape[0]):
        s, p = slot[t], pos[t]
        for g in range(k_new.shape[1]):
            quantize_row(k_new[t, g], kc[s, g, p])
            quantize_row(v_new[t, g], vc[s, g, p])


# -- numpy twins (tests) ------------------------------------------------------------------------

def twin_quantize(x: np.ndarray) -> np.ndarray:
    """``quantize_row`` of each row of x (n, d) -> (n, d / 32 * 34) int8, in numpy."""
    qa, da, _ = twin_quantize_q8_0(np.ascontiguousarray(x, np.float32))
    n, nb = da.shape
    out = np.zeros((n, nb, BLOCK), np.uint8)
    out[:, :, :2] = da.astype(np.float16).view(np.uint8).reshape(n, nb, 2)
    out[:, :, 2:] = qa.reshape(n, nb, QK).view(np.uint8)
    return out.reshape(n, -1).view(np.int8)


def twin_dequantize(rows: np.ndarray) -> np.ndarray:
    """(n, bytes) int8 blocks -> (n, d) f32."""
    b = rows.reshape(len(rows), -1, BLOCK)
    d = b[:, :, :2].copy().view(np.float16).astype(np.float32)
    return (b[:, :, 2:].astype(np.float32) * d).reshape(len(rows), -1)


def twin_dot(kr: np.ndarray, qr: np.ndarray) -> np.float32:
    """``dot`` in numpy: lanes of 4 integer products, fused per block, the x86 reduction."""
    k = kr.reshape(-1, BLOCK)
    q = qr.reshape(-1, BLOCK)
    dk = k[:, :2].copy().view(np.float16).astype(np.float32)[:, 0]
    dq = q[:, :2].copy().view(np.float16).astype(np.float32)[:, 0]
    lanes = (k[:, 2:].astype(np.int64) * q[:, 2:]).reshape(len(k), 8, 4).sum(-1)
    acc = np.zeros(8, np.float32)
    for b in range(len(k)):  # fused: the float64 product and sum rounded once (exact inputs)
        acc = (np.float64(dk[b] * dq[b]) * lanes[b] + acc).astype(np.float32)
    return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]))
