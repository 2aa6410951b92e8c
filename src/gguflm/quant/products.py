"""Quantized matrix products: up to MAX_FUSED weight matrices times the same activations in
one call, their row ranges cut into work items that run on one thread or in parallel.

``x`` is quantized once per activation type (``act_quant.activation_sets``); each work
item is a range of one matrix's rows (``work_items``), run by the weight type's row kernel
(``int_tiles.qmatmul_rows``). Every activation row of a small batch is applied to a chunk
of weight rows while those rows are hot in cache (a quantized GEMM).
"""

from __future__ import annotations

from collections.abc import Sequence

import numba
import numpy as np
from numba import njit, prange

from ..gguf.types import GGMLType
from . import jitcache  # noqa: F401 - stamps the cached kernels below (before any njit)
from .act_quant import Q8_0_KINDS, Q8_K_KINDS, activation_sets, activation_sets_par
from .int_tiles import ROW_CHUNK, prepare, qmatmul_rows, tiled
from .jitcache import cached
from .kerneltypes import KERNEL_TYPES, kernel_type
from .vector_ir import F16_TABLE

MAX_FUSED = 3  # products of one input run as one call: Q, K and V; gate and up
STREAM_CHUNK = 2048  # weight rows per parallel work item when decoding (long streams)
# work items per thread for a batch: each hand-out costs microseconds, so not one per tile,
# but a few, so that a thread kept off its core by another process leaves some to the rest
CHUNKS_PER_THREAD = 4
PAR_QUANTIZE_ROWS = 16  # activation rows from which qmatmul_par quantizes them in parallel


@njit(cache=True, nogil=True)
def work_items(ws, count, n, threads):  # noqa: ANN001, ANN201
    """(items, 3) i64 rows ``(matrix, r0, r1)``: the row ranges the products are cut into.
    threads 0: one item per matrix (one thread). A batch (``int_tiles.tiled``): runs of
    ROW_CHUNK tiles, a few items per thread; decoding: shorter runs of rows, at most
    STREAM_CHUNK."""
    total = 0
    tiles = 0
    for m in range(count):
        total += ws[m].shape[0]
        tiles += (ws[m].shape[0] + ROW_CHUNK - 1) // ROW_CHUNK
    if threads == 0:
        step = total
    elif tiled(n, ws[0]):
        step = max(1, tiles // (CHUNKS_PER_THREAD * threads)) * ROW_CHUNK
    else:
        parts = CHUNKS_PER_THREAD * threads
        step = min(STREAM_CHUNK, max(64, (total + parts - 1) // parts))
    nitems = 0
    for m in range(count):
        nitems += (ws[m].shape[0] + step - 1) // step
    items = np.empty((nitems, 3), np.int64)
    c = 0
    for m in range(count):
        rows = ws[m].shape[0]
        for r0 in range(0, rows, step):
            items[c, 0] = m
            items[c, 1] = r0
            items[c, 2] = min(rows, r0 + step)
            c += 1
    return items


@njit(cache=True, nogil=True)
def run_item(kinds, ws, a32, ak, tbl, outs, items, c):  # noqa: ANN001, ANN201
    """Work item ``c`` of ``items`` (``work_items``): its matrix's rows times the
    activation set its type reads (``a32``/``ak``, from ``activation_sets``)."""
    m = items[c, 0]
    kind = kinds[m]
    a = ak if kind in Q8_K_KINDS else a32
    qmatmul_rows(kind, ws[m], a.qa, a.da, a.aux, a.cor, a.qu, tbl, outs[m], items[c, 1],
                 items[c, 2])


@njit(cache=True, nogil=True)
def qmatmul_serial(kinds, ws, x, tbl, outs, count):  # noqa: ANN001, ANN201
    """``count`` products ``ws[m] (R_m, row_bytes_m) u8 @ x (n, K) f32 -> outs[m] (n, R_m)
    f32`` (weight types ``kinds[m]``) on this thread; ``ws``/``outs`` are MAX_FUSED-tuples
    (unused entries repeat a used one). ``x`` is quantized here, once per activation type:
    one call per layer step keeps the per-token Python overhead small."""
    a32, ak = activation_sets(kinds, count, x)
    items = work_items(ws, count, x.shape[0], 0)
    for c in range(items.shape[0]):
        run_item(kinds, ws, a32, ak, tbl, outs, items, c)


@njit(cache=True, nogil=True, parallel=True)
def _run_items_par(kinds, ws, a32, ak, tbl, outs, items):  # noqa: ANN001, ANN202
    # (the activation sets come in as arguments: numba's parallel loops find a named
    # tuple's class only there)
    # the hot loop: work item c = rows items[c, 1:3] of ws[items[c, 0]] (R_m, row_bytes)
    # u8 @ x (n, K) -> outs[m][:, r0:r1] (n, R_m); handed out one at a time
    for c in prange(items.shape[0]):
        run_item(kinds, ws, a32, ak, tbl, outs, items, c)


@njit(cache=True, nogil=True)
def activation_sets_for_par(kinds, count, x):  # noqa: ANN001, ANN201
    """``activation_sets`` for products whose rows run in parallel: a batch's rows (from
    PAR_QUANTIZE_ROWS) quantized in parallel too."""
    if x.shape[0] >= PAR_QUANTIZE_ROWS:
        return activation_sets_par(kinds, count, x)
    return activation_sets(kinds, count, x)


@njit(cache=True, nogil=True)
def qmatmul_par(kinds, ws, x, tbl, outs, count, threads):  # noqa: ANN001, ANN201
    """``qmatmul_serial``'s products with their row ranges run in parallel (and a batch's
    rows quantized in parallel)."""
    a32, ak = activation_sets_for_par(kinds, count, x)
    _run_items_par(kinds, ws, a32, ak, tbl, outs, work_items(ws, count, x.shape[0], threads))


def qmatmul(kind: int, w: np.ndarray, x: np.ndarray, out: np.ndarray,
            parallel: bool = True) -> np.ndarray:
    """``W (R, row_bytes) u8`` of ggml type ``kind`` times ``x (n, K) f32`` -> ``out (n, R)``.

    Quantizes ``x`` to 8 bits the way ggml does for this type, then runs the kernel.
    ValueError for a type without an integer kernel or shapes that do not fit together.
    """
    qmatmul_many((kind,), (w,), x, (out,), parallel)
    return out


def qmatmul_many(kinds: tuple[int, ...], ws: tuple[np.ndarray, ...], x: np.ndarray,
                 outs: tuple[np.ndarray, ...], parallel: bool = True) -> None:
    """Up to MAX_FUSED products of the same ``x (n, K) f32`` in one call: ``ws[m] (R_m,
    row_bytes) u8`` of ggml type ``kinds[m]`` -> ``outs[m] (n, R_m)``. ``x`` is quantized
    once per activation type and the row ranges of all the products share the threads
    (one parallel region instead of one per product). Each output element is computed
    exactly as by ``qmatmul``. ValueError as ``qmatmul``."""
    n, d_in = x.shape
    count = len(ws)
    if not 1 <= count <= MAX_FUSED or len(kinds) != count or len(outs) != count:
        raise ValueError(f"qmatmul_many takes 1 to {MAX_FUSED} products, got {count}")
    for kind, w, out in zip(kinds, ws, outs):
        sizes = _SIZES.get(kind)
        if sizes is None:
            kernel_type(kind)  # raises, naming the type
        qk, ts = sizes
        if (d_in % qk or w.ndim != 2 or w.shape[1] != d_in // qk * ts
                or out.shape != (n, w.shape[0])):
            raise ValueError(f"{kernel_type(kind).type.ggml_name} product: W {w.shape} bytes,"
                             f" x {x.shape}, out {out.shape} do not fit together")
    if len({w.flags.writeable for w in ws}) > 1:  # one tuple type: all read-only then
        ws = tuple(read_only(w) for w in ws)
    kind_arr, ws = pad_products(kinds, ws)
    qmatmul_planned(kind_arr, ws, x, tuple(outs) + (outs[0],) * (MAX_FUSED - count), count,
                    parallel)


def pad_products(kinds: Sequence[int], ws: Sequence[np.ndarray]
                 ) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
    """``qmatmul_planned``'s ``kinds`` array and weight tuple for 1 to MAX_FUSED products:
    one compiled signature for every count, the unused places repeating the first. Makes
    the types' row kernels ready (``int_tiles.prepare``)."""
    prepare(kinds)
    pad = MAX_FUSED - len(ws)
    return (np.array(list(kinds) + [kinds[0]] * pad, np.int64),
            tuple(ws) + (ws[0],) * pad)


def qmatmul_planned(kinds: np.ndarray, ws: tuple[np.ndarray, ...], x: np.ndarray,
                    outs: tuple[np.ndarray, ...], count: int, parallel: bool) -> None:
    """``qmatmul_many`` without its checks, for a caller that made and checked the
    arguments once with ``pad_products`` (``matrix.matmul_many``): ``kinds`` (MAX_FUSED,)
    i64 and ``ws``/``outs`` MAX_FUSED-tuples padded with used entries, ``x (n, K) f32``
    C-contiguous."""
    if parallel:
        qmatmul_par(kinds, ws, x, F16_TABLE, outs, count, numba.get_num_threads())
    else:
        qmatmul_serial(kinds, ws, x, F16_TABLE, outs, count)


def read_only(a: np.ndarray) -> np.ndarray:
    """``a`` itself when read-only, else a read-only view of it: a memory-mapped file's
    weights are read-only, in-memory ones need not be, and one array type means one
    compiled signature for both."""
    if not a.flags.writeable:
        return a
    v = a.view()
    v.flags.writeable = False
    return v


# (block size, bytes per block) by type id: the check above runs on every product
_SIZES = {int(t): (k.block_size, k.type_size) for t, k in KERNEL_TYPES.items()}


def is_compiled(kinds: Sequence[int] = ()) -> bool:
    """True when the products' machine code, and the row kernels of types ``kinds``, are
    cached on disk: starting then takes about a second; otherwise the first product
    compiles what is missing."""
    from .int_tiles import kernel_cached

    return cached((qmatmul_serial, qmatmul_par)) and all(kernel_cached(k) for k in kinds)


def warm_up(kinds: Sequence[int] = ()) -> float:
    """Compile (first run) or load (later runs) the products for memory-mapped weights of
    types ``kinds`` (default: one type of each activation kind); returns the seconds it
    took. Lets a command say "compiling" before it happens."""
    import time

    t0 = time.perf_counter()
    for kind in kinds or (Q8_0_KINDS[0], Q8_K_KINDS[0]):
        qk, ts = GGMLType(kind).block_size, GGMLType(kind).type_size
        w = np.zeros((4, ts), np.uint8)
        w.flags.writeable = False  # tensor views of the mmapped file are read-only
        out = np.empty((1, 4), np.float32)
        x = np.zeros((1, qk), np.float32)
        qmatmul(kind, w, x, out, parallel=False)
        qmatmul(kind, w, x, out, parallel=True)
    return time.perf_counter() - t0

