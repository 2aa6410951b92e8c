"""Products of one input over a group of weights of any compiled type: the integer kernels'
types, F16 and BF16, mixed freely (the compiled layers' Q/K/V, gate/up, ...).

The integer types multiply the activations quantized to 8 bits (``kernels``); F16 (BF16)
weights multiply them rounded to float16 (bfloat16), as ggml's vec_dot_f16 (vec_dot_bf16)
does, and ``QMatrix.matmul`` for such a weight. Each output element is computed exactly
as the weight's own product computes it alone: grouping, the row ranges and the batch
change no number.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..gguf.types import GGMLType
from . import jitcache  # noqa: F401 - stamps the cached kernels below (before any njit)
from .act_quant import activation_sets as int_activation_sets
from .float_tiles import f16_matmul_rows, rounded_bf16, rounded_f16
from .kerneltypes import COMPILED_TYPES  # noqa: F401 - the types these products take
from .products import run_item as int_run_item
from .products import work_items

F16_KIND = int(GGMLType.F16)
BF16_KIND = int(GGMLType.BF16)
Q8_0_KIND = int(GGMLType.Q8_0)  # an integer type whose empty sets stand for "none needed"


def weight_bytes(raw: np.ndarray) -> np.ndarray:
    """A weight's raw encoding as the grouped products take it: (rows, row bytes) u8 (a
    view: F16's and BF16's (rows, K) 16-bit values as 2 K bytes a row)."""
    return raw if raw.dtype == np.uint8 else raw.view(np.uint8)


@njit(cache=True, nogil=True)
def activation_sets(kinds, count, x):  # noqa: ANN001, ANN201
    """``(a32, ak, xh, xb)``: x (n, K) f32 in the forms the ``count`` weights of types
    ``kinds`` multiply: the integer kernels' two 8-bit sets (``kernels._activation_sets``;
    empty sets when no weight needs them), x rounded to float16 (no rows when no weight
    is F16) and to bfloat16 (no rows when none is BF16)."""
    first = -1
    f16 = bf16 = False
    for m in range(count):
        if kinds[m] == F16_KIND:
            f16 = True
        elif kinds[m] == BF16_KIND:
            bf16 = True
        elif first < 0:
            first = kinds[m]
    ints = kinds.copy()  # float places take an integer type of the group: no new set
    for m in range(count):
        if ints[m] == F16_KIND or ints[m] == BF16_KIND:
            ints[m] = first if first >= 0 else Q8_0_KIND
    # no integer weight: the sets of no rows (the integer products never run)
    a32, ak = int_activation_sets(ints, count, x if first >= 0 else x[:0])
    xh = rounded_f16(x) if f16 else x[:0]
    xb = rounded_bf16(x) if bf16 else x[:0]
    return a32, ak, xh, xb


@njit(cache=True, nogil=True)
def run_item(kinds, ws, a32, ak, xh, xb, tbl, outs, items, c):  # noqa: ANN001, ANN201
    """Work item c of ``items`` ((matrix, r0, r1) rows): that matrix's rows r0:r1 for every
    activation row, into its ``outs`` entry."""
    m = items[c, 0]
    if kinds[m] == F16_KIND:
        f16_matmul_rows(ws[m].view(np.uint16), xh, outs[m], items[c, 1], items[c, 2])
    elif kinds[m] == BF16_KIND:  # int16: the tiles' BF16 (float_tiles.bf16_bits)
        f16_matmul_rows(ws[m].view(np.int16), xb, outs[m], items[c, 1], items[c, 2])
    else:
        int_run_item(kinds, ws, a32, ak, tbl, outs, items, c)


@njit(cache=True, nogil=True)
def matmul_serial(kinds, ws, x, tbl, outs, count):  # noqa: ANN001, ANN201
    """``count`` products ``ws[m] (R_m, row_bytes_m) u8 @ x (n, K) f32 -> outs[m] (n, R_m)``
    (types ``kinds[m]``) on this thread; ``ws``/``outs`` MAX_FUSED-tuples, the unused
    entries repeating a used one (``kernels.pad_products``)."""
    a32, ak, xh, xb = activation_sets(kinds, count, x)
    items = work_items(ws, count, x.shape[0], 0)
    for c in range(items.shape[0]):
        run_item(kinds, ws, a32, ak, xh, xb, tbl, outs, items, c)


@njit(cache=True, nogil=True, parallel=True)
def _run_items_par(kinds, ws, a32, ak, xh, xb, tbl, outs, items):  # noqa: ANN001, ANN202
    # (the activation sets come in as arguments: numba's parallel loops find a named
    # tuple's class only there)
    for c in prange(items.shape[0]):  # handed out one at a time (matrix.set_threads)
        run_item(kinds, ws, a32, ak, xh, xb, tbl, outs, items, c)


@njit(cache=True, nogil=True)
def matmul_par(kinds, ws, x, tbl, outs, count, threads):  # noqa: ANN001, ANN201
    """``matmul_serial``'s products with their row ranges run in parallel."""
    a32, ak, xh, xb = activation_sets(kinds, count, x)
    _run_items_par(kinds, ws, a32, ak, xh, xb, tbl, outs,
                   work_items(ws, count, x.shape[0], threads))
