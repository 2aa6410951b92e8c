"""Products of many activation rows with a matrix too small to share out by weight rows.

``kernels.f16_matmul_par`` gives each thread a chunk of ``STREAM_CHUNK`` weight rows, which
is right for decoding (one activation row, a long weight stream); a matrix of fewer rows
than two chunks (every matrix of a small model, such as an encoder's 384 x 384) then runs
on one thread however many activation rows there are. Here the activation rows are shared
out instead. Each output element is computed by the same routine from the same inputs, so
the numbers are exactly those of the one-thread product (batch-invariant as before).
"""

from __future__ import annotations

from numba import njit, prange

from . import jitcache  # noqa: F401 - stamps the cached kernels below (before any njit)
from .float_tiles import f16_matmul_rows_bias

ROW_BLOCK = 16  # activation rows per work item (small: a waiting thread's share moves)


@njit(cache=True, nogil=True, parallel=True)
def f16_matmul_xrows(w, x, out, bias, biased):  # noqa: ANN001, ANN201
    """W (R, K) fp16 bits (uint16) @ x (n, K) f32 (+ bias (R,) if ``biased``) -> out (n, R)
    f32, blocks of ROW_BLOCK activation rows in parallel."""
    n = x.shape[0]
    for b in prange((n + ROW_BLOCK - 1) // ROW_BLOCK):
        a = b * ROW_BLOCK
        e = min(n, a + ROW_BLOCK)
        f16_matmul_rows_bias(w, x[a:e], out[a:e], 0, w.shape[0], bias, biased)
