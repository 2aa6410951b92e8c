"""Per-row kernels of the forward pass, in numba: each row computed on its own in one
fixed order, as ggml's CPU backend computes it, whatever the batch.

``rmsnorm_rows`` is ggml's ``rms_norm`` fused with the weight multiply
(ggml_compute_forward_rms_norm_f32): the sum of squares in float64, one float32 scale.
``rmsnorm_twin`` is the same in plain numpy, for the tests. ``rope_rows`` rotates each
head's pairs of dimensions in place (ggml's rope), for both pairings.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..quant import jitcache  # noqa: F401 - stamps the cached kernels below (before any njit)


@njit(cache=True, nogil=True)
def rmsnorm_rows(x, w, eps, out):  # noqa: ANN001, ANN201
    """x (T, n) f32, w (n,) f32, eps f32 -> out (T, n) f32: ``(x * scale) * w`` with
    ``scale = 1 / sqrt(float32(sum(x * x) / n) + eps)``, the squares (rounded to float32)
    summed in float64 in index order."""
    n, rows = x.shape[1], x.shape[0]
    t = 0
    while t + 4 <= rows:  # four rows' sums side by side: each an ordered chain of adds
        s0 = s1 = s2 = s3 = 0.0  # whose latency, one row alone, bounds the loop
        for i in range(n):
            s0 += np.float64(x[t, i] * x[t, i])
            s1 += np.float64(x[t + 1, i] * x[t + 1, i])
            s2 += np.float64(x[t + 2, i] * x[t + 2, i])
            s3 += np.float64(x[t + 3, i] * x[t + 3, i])
        for r, s in ((t, s0), (t + 1, s1), (t + 2, s2), (t + 3, s3)):
            _scaled_row(x, w, eps, s, r, out)
        t += 4
    for r in range(t, rows):
        s = 0.0
        for i in range(n):
            s += np.float64(x[r, i] * x[r, i])
        _scaled_row(x, w, eps, s, r, out)


@njit(cache=True, nogil=True)
def _scaled_row(x, w, eps, s, t, out):  # noqa: ANN001, ANN202, PLR0913
    """out[t] = (x[t] * scale) * w, ``scale`` from row t's float64 sum of squares s."""
    n = x.shape[1]
    mean = np.float32(s / n)
    scale = np.float32(1.0) / np.float32(np.sqrt(mean + eps))
    for i in range(n):
        out[t, i] = (x[t, i] * scale) * w[i]


def rmsnorm_twin(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """numpy twin of ``rmsnorm_rows``: x (T, n), w (n,) -> (T, n)."""
    sq = (x * x).astype(np.float64)
    s = np.cumsum(sq, axis=1)[:, -1]  # a sequential sum, in index order
    mean = (s / x.shape[1]).astype(np.float32)
    scale = np.float32(1.0) / np.sqrt(mean + np.float32(eps)).astype(np.float32)
    return (x * scale[:, None]) * w


@njit(cache=True, nogil=True)
def rope_rows(x, rot, neox):  # noqa: ANN001, ANN201
    """x (T, H, d) f32 rotated in place by rot (T, n_rot/2) c64 (``ops.rope_table``): the
    pair (a, b) of each head's first n_rot dimensions becomes ``(x_a c - x_b s, x_a s +
    x_b c)`` with ``c + i s = rot[t, i]``, each product rounded, as ggml's rope_f32; pairs
    (2i, 2i+1) (llama.cpp's NORM) or, with ``neox``, (i, i + n_rot/2) (NEOX)."""
    half = rot.shape[1]
    for t in range(x.shape[0]):
        for i in range(half):
            c, s = rot[t, i].real, rot[t, i].imag
            a = i if neox else 2 * i
            b = i + half if neox else 2 * i + 1
            for h in range(x.shape[1]):
                x0, x1 = x[t, h, a], x[t, h, b]
                x[t, h, a] = x0 * c - x1 * s
                x[t, h, b] = x0 * s + x1 * c
