"""A Q8_0 KV cache's numbers: keys and values stored as ggml ``block_q8_0`` rows, and the
arithmetic llama.cpp's CPU code does with them.

One cached key (or value) of one KV head is a row of ``d / 32`` blocks of 34 bytes, as ggml
lays them out: the block's scale as float16 (2 bytes, little-endian), then its 32 values
as int8. A row is stored as ggml's x86 ``quantize_row_q8_0`` makes it (``ggml_set_rows``
into a Q8_0 cache): scale amax / 127 rounded to float16, values rint(x * 127 / amax).
Scores are ggml's ``ggml_vec_dot_q8_0_q8_0`` (AVX2) of the key row and the query quantized
the same way (its ``vec_dot_type``); a value is dequantized exactly (int8 times the
float16 scale is exact in float32) before it is weighted, as ``dequantize_row_q8_0``: the
two loops are vector IR in ``kv_q8_ir``, their numpy twins here.

The arrays are int8 with the row's bytes last: keys and values (S, H_kv, n_ctx, d / 32 *
34) per layer, one contiguous row per position (no tiles: a score is one row's dot).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..quant import jitcache  # noqa: F401 - stamps the cached kernels below (before any njit)
from ..quant.floatbits import f16_from_f32
from ..quant.kerneltypes import twin_quantize_q8_0
from .kv_cache import BLOCK8 as BLOCK  # bytes per block: float16 scale, 32 int8 values
from .kv_cache import QK8 as QK  # values per block


def row_bytes(n: int) -> int:
    """Bytes of one cached row of n values (n a multiple of 32)."""
    return n // QK * BLOCK


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
