"""Expert products (ggml's ``mul_mat_id``): the same input rows times the weights of the
experts each row chose, every chosen expert of every row in one call.

The rows come grouped by expert (the experts, where each one's run of slots starts, and
a row per slot), so each expert's weights are read once per
call however many rows chose it; a mixture-of-experts layer takes two calls a step (gate
and up together, then down) instead of two per expert. Every output element is the one
``QMatrix.matmul`` of that expert gives for that row alone: each row is quantized on its
own, and the row kernels compute each element the same way whatever tile it falls in.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange, types

from . import jitcache  # noqa: F401 - stamps the cached kernels below (before any njit)
from .act_quant import Q8_K_KINDS
from .int_tiles import ROW_CHUNK, prepare, qmatmul_rows
from .products import CHUNKS_PER_THREAD, activation_sets, activation_sets_for_par
from .vector_ir import F16_TABLE, array_view

_u8_view = array_view(types.uint8, 2, readonly=True)


@njit(cache=True, nogil=True)
def expert_items(count, nrows, starts, threads):  # noqa: ANN001, ANN201
    """(items, 4) i64 rows ``(matrix, group, r0, r1)``: each matrix's rows for each group,
    cut so that the threads get a few items each (a batch's in multiples of ROW_CHUNK)."""
    groups = starts.shape[0] - 1
    want = max(1, CHUNKS_PER_THREAD * threads)
    parts = max(1, (want + count * groups - 1) // (count * groups))
    step = max(ROW_CHUNK, (nrows + parts - 1) // parts)
    step = (step + ROW_CHUNK - 1) // ROW_CHUNK * ROW_CHUNK
    per = (nrows + step - 1) // step
    items = np.empty((count * groups * per, 4), np.int64)
    c = 0
    for m in range(count):
        for g in range(groups):
            for r0 in range(0, nrows, step):
                items[c, 0] = m
                items[c, 1] = g
                items[c, 2] = r0
                items[c, 3] = min(nrows, r0 + step)
                c += 1
    return items


@njit(cache=True, nogil=True, inline="always")
def expert_item(kinds, ptrs, shape, experts, starts, a32, ak, tbl, out, items, c):  # noqa: ANN001, ANN201, PLR0913
    """Item c of ``expert_items``: rows r0:r1 of matrix m of expert ``experts[g]``
    (``shape`` (rows, row bytes) u8) times the group's activation rows (``a32``/``ak``:
    ``activation_sets`` of the slots' rows) -> out[m, s0:s1, r0:r1]."""
    m, g = items[c, 0], items[c, 1]
    kind = kinds[m]
    w = _u8_view(ptrs[m, experts[g]], (shape[0], shape[1]), (shape[1], 1))
    a = ak if kind in Q8_K_KINDS else a32
    s0, s1 = starts[g], starts[g + 1]
    nc, nq = a.cor.shape[0], a.qu.shape[0]
    qmatmul_rows(kind, w, a.qa[s0:s1], a.da[s0:s1], a.aux[s0:s1],
                 a.cor[min(s0, nc):min(s1, nc)], a.qu[min(s0, nq):min(s1, nq)], tbl,
                 out[m, s0:s1], items[c, 2], items[c, 3])


@njit(cache=True, nogil=True, parallel=True)
def _run_par(kinds, ptrs, shape, experts, starts, a32, ak, tbl, out, items):  # noqa: ANN001, ANN202
    for c in prange(items.shape[0]):
        expert_item(kinds, ptrs, shape, experts, starts, a32, ak, tbl, out, items, c)


@njit(cache=True, nogil=True)
def expert_products_kernel(kinds, ptrs, shape, x, experts, starts, tbl, out, threads):  # noqa: ANN001, ANN201
    """``expert_products``' work; ``threads`` 1: in this thread, no parallel region (a
    step too small to share: the same numbers, each item computed alike)."""
    count = kinds.shape[0]
    if threads == 1:
        a32, ak = activation_sets(kinds, count, x)
        items = expert_items(count, shape[0], starts, 1)
        for c in range(items.shape[0]):
            expert_item(kinds, ptrs, shape, experts, starts, a32, ak, tbl, out, items, c)
        return
    a32, ak = activation_sets_for_par(kinds, count, x)
    _run_par(kinds, ptrs, shape, experts, starts, a32, ak, tbl, out,
             expert_items(count, shape[0], starts, threads))


def expert_products(kinds: np.ndarray, ptrs: np.ndarray, shape: tuple[int, int],
                    x: np.ndarray, experts: np.ndarray, starts: np.ndarray,
                    out: np.ndarray) -> np.ndarray:
    """``out[m, s] = W[m][experts[g]] @ x[s]`` for the slots s of each group g (``starts[g]
    <= s < starts[g + 1]``).

    ``kinds`` (M,) i64: the ggml type of each of the M matrices (integer kernels);
    ``ptrs`` (M, n_expert) i64: the address of each expert's weights, (rows, row bytes) =
    ``shape`` C-contiguous u8 (read-only: the caller keeps them alive); ``x`` (S, K) f32,
    a row per slot; ``experts`` (G,), ``starts`` (G + 1,) i64; ``out`` (M, S, rows) f32."""
    if len(x) == 0:  # no rows (a step with nothing to compute here)
        return out
    prepare([int(k) for k in kinds])
    expert_products_kernel(kinds, ptrs, np.array(shape, np.int64),
                           np.ascontiguousarray(x, np.float32), experts, starts, F16_TABLE,
                           out, threads_for(len(x) * len(kinds) * shape[0] * x.shape[1]))
    return out


def threads_for(macs: int) -> int:
    """The threads an expert-products call of ``macs`` multiply-adds runs on: all of them
    from ``matrix.PARALLEL_MIN_MACS`` (read at the call: spinning threads lower it), else
    1, in the calling thread (no parallel region)."""
    from . import matrix

    return numba.get_num_threads() if macs >= matrix.PARALLEL_MIN_MACS else 1

