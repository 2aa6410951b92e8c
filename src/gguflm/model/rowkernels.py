"""Per-row kernels of the forward pass, in numba: each row computed on its own in one
fixed order, as ggml's CPU backend computes it, whatever the batch.

``rmsnorm_rows`` is ggml's ``rms_norm`` fused with the weight multiply
(ggml_compute_forward_rms_norm_f32): the sum of squares in float64, one float32 scale.
``rmsnorm_twin`` is the same in plain numpy, for the tests.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def rmsnorm_rows(x, w, eps, out):  # noqa: ANN001, ANN201
    """x (T, n) f32, w (n,) f32, eps f32 -> out (T, n) f32: ``(x * scale) * w`` with
    ``scale = 1 / sqrt(float32(sum(x * x) / n) + eps)``, the squares (rounded to float32)
    summed in float64 in index order."""
    n = x.shape[1]
    for t in range(x.shape[0]):
        s = 0.0
        for i in range(n):
            s += np.float64(x[t, i] * x[t, i])
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
