"""Float matrix products in one fixed order per output element (batch-invariant).

BLAS picks its blocking, and so its summation order, from the shapes of a product: a row of
``x @ W.T`` computed in a batch of 8 differs in its last bits from the same row alone. The
serving engine's standing rule (a sequence's logits never depend on its batch) needs every
output element summed the same way whatever the batch, so F32 weights and the dequantized
tiles of the fallback types multiply here: each element is a sum over k in 8 interleaved
float32 partial sums (lane j takes k = j, j + 8, ...), folded in a fixed tree. The 8 lanes
let LLVM use vector registers without reassociating anything.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from . import jitcache  # noqa: F401 - stamps the cached kernels below (before any njit)

__all__ = ["f32_matmul", "twin_f32_matmul"]

LANES = 8


@njit(cache=True, nogil=True, inline="always")
def _dot(x, w):  # noqa: ANN001, ANN202
    """x (K,) f32 . w (K,) f32 in the fixed order described above."""
    k = x.shape[0]
    acc = np.zeros(LANES, np.float32)
    main = k - k % LANES
    for b in range(0, main, LANES):
        for j in range(LANES):
            acc[j] += x[b + j] * w[b + j]
    for j in range(k - main):
        acc[j] += x[main + j] * w[main + j]
    return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]))


@njit(cache=True, nogil=True, parallel=True)
def f32_matmul_par(x, w, out):  # noqa: ANN001, ANN202
    for r in prange(w.shape[0]):
        for i in range(x.shape[0]):
            out[i, r] = _dot(x[i], w[r])


@njit(cache=True, nogil=True)
def f32_matmul_serial(x, w, out):  # noqa: ANN001, ANN202
    for r in range(w.shape[0]):
        for i in range(x.shape[0]):
            out[i, r] = _dot(x[i], w[r])


def f32_matmul(x: np.ndarray, w: np.ndarray, out: np.ndarray, parallel: bool = True) -> None:
    """x (n, K) f32 @ w (R, K).T f32 -> out (n, R) f32 (C-contiguous rows), each element in
    the same order whatever n, the rows beside it, or the thread count."""
    (f32_matmul_par if parallel else f32_matmul_serial)(x, w, out)


def twin_f32_matmul(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """numpy twin of ``f32_matmul`` (the same lanes and fold)."""
    n, k = x.shape
    pad = (-k) % LANES
    xp = np.pad(x, ((0, 0), (0, pad))).reshape(n, -1, LANES)
    wp = np.pad(w, ((0, 0), (0, pad))).reshape(w.shape[0], -1, LANES)
    acc = np.zeros((n, w.shape[0], LANES), np.float32)
    for b in range(xp.shape[1]):
        acc += xp[:, None, b, :] * wp[None, :, b, :]
    a = acc
    return ((a[..., 0] + a[..., 4]) + (a[..., 2] + a[..., 6])) + (
        (a[..., 1] + a[..., 5]) + (a[..., 3] + a[..., 7]))
