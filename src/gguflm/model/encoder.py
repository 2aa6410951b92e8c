"""The compiled parts of an encoder (BERT) layer: its layer norm, and its bidirectional
attention, where every position of a sequence sees every position of its own sequence,
none of the others', and there is no cache.

One numba pass per (sequence, head), in parallel, with one fixed order of arithmetic per
query (so a text's vectors never depend on the texts batched beside it): a score is one
fused multiply-add chain over the head dimension in index order, an output element one
over the positions in order (``encoder_ir``'s register tiles, the same chain whatever
tile a query falls in); the softmax's exp is ggml's (``expf_ggml``), its maximum and sum
in 8 interleaved lanes. ``encoder_attention_twin`` is the same computation in numpy, for
the tests.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..quant import jitcache  # noqa: F401 - stamps the cached kernels below (before any njit)
from ..quant.floatbits import expf_ggml, expf_ggml_twin, f16_from_f32
from .encoder_ir import make_fma_tile

QUERY_BLOCK = 48  # queries whose scores are made together (each key tile read once for them)
_ROWS = 6  # queries per register tile
_TILES = {(rows, nv): make_fma_tile(rows, nv) for rows in (_ROWS, 1) for nv in (4, 2, 1)}
_T6x4, _T6x2, _T6x1 = _TILES[_ROWS, 4], _TILES[_ROWS, 2], _TILES[_ROWS, 1]
_T1x4, _T1x2, _T1x1 = _TILES[1, 4], _TILES[1, 2], _TILES[1, 1]


@njit(nogil=True, inline="always")
def _tile(a, b, out, i, j, m, six, width):  # noqa: ANN001, ANN202, PLR0913
    """One register tile at (i, j): _ROWS rows if ``six`` else one, ``width`` (64, 32 or
    16) columns."""
    if six:
        if width == 64:
            _T6x4(a, b, out, i, j, m)
        elif width == 32:
            _T6x2(a, b, out, i, j, m)
        else:
            _T6x1(a, b, out, i, j, m)
    elif width == 64:
        _T1x4(a, b, out, i, j, m)
    elif width == 32:
        _T1x2(a, b, out, i, j, m)
    else:
        _T1x1(a, b, out, i, j, m)


@njit(cache=True, nogil=True)
def _matmul(a, b, out, m):  # noqa: ANN001, ANN202
    """out (M, N) = a[:, :m] @ b[:m] (float32, N a multiple of 16), each element one fused
    multiply-add chain over e < m in order: register tiles of _ROWS rows, then row by row;
    the widest column tile that fits."""
    rows, n = out.shape
    i = 0
    while i < rows:
        six = i + _ROWS <= rows
        j = 0
        while j < n:
            width = 64 if j + 64 <= n else 32 if j + 32 <= n else 16
            _tile(a, b, out, i, j, m, six, width)
            j += width
        i += _ROWS if six else 1


@njit(cache=True, nogil=True)
def _softmax_rows(s, n, scale):  # noqa: ANN001, ANN202
    """Rows of s (B, >= n) f32: the first n columns -> softmax(scale * s), in place. The
    maximum and the sum run in 8 interleaved lanes (position j in lane j % 8, the lanes
    added pairwise, the positions past a multiple of 8 last), so they are not one long
    dependency chain."""
    n8 = n - n % 8
    for r in range(s.shape[0]):
        row = s[r]
        for j in range(n):
            row[j] *= scale
        m0 = m1 = m2 = m3 = m4 = m5 = m6 = m7 = np.float32(-np.inf)
        for j in range(0, n8, 8):
            m0, m1, m2, m3 = max(m0, row[j]), max(m1, row[j + 1]), max(m2, row[j + 2]), \
                max(m3, row[j + 3])
            m4, m5, m6, m7 = max(m4, row[j + 4]), max(m5, row[j + 5]), max(m6, row[j + 6]), \
                max(m7, row[j + 7])
        m = max(max(max(m0, m1), max(m2, m3)), max(max(m4, m5), max(m6, m7)))
        for j in range(n8, n):
            m = max(m, row[j])
        for j in range(n):  # its own loop: the exp vectorizes
            row[j] = expf_ggml(row[j] - m)
        t0 = t1 = t2 = t3 = t4 = t5 = t6 = t7 = np.float32(0.0)
        for j in range(0, n8, 8):
            t0, t1, t2, t3 = t0 + row[j], t1 + row[j + 1], t2 + row[j + 2], t3 + row[j + 3]
            t4, t5, t6, t7 = t4 + row[j + 4], t5 + row[j + 5], t6 + row[j + 6], t7 + row[j + 7]
        total = ((t0 + t1) + (t2 + t3)) + ((t4 + t5) + (t6 + t7))
        for j in range(n8, n):
            total += row[j]
        inv = np.float32(1.0) / total
        for j in range(n):
            row[j] *= inv


@njit(cache=True, nogil=True)
def _head(q, kt, v, scale, out):  # noqa: ANN001, ANN202
    """q (T, d), kt (d, 64 * tiles) (keys past T zero), v (T, dv) f32 of one head, dv a
    multiple of 16 -> out (T, dv)."""
    n = q.shape[0]
    s = np.empty((QUERY_BLOCK, kt.shape[1]), np.float32)
    for i0 in range(0, n, QUERY_BLOCK):
        b = min(QUERY_BLOCK, n - i0)
        _matmul(q[i0:i0 + b], kt, s[:b], q.shape[1])
        _softmax_rows(s[:b], n, scale)
        _matmul(s[:b], v, out[i0:i0 + b], n)


@njit(cache=True, nogil=True, parallel=True)
def encoder_attention(q, k, v, spans, scale, out):  # noqa: ANN001, ANN201
    """q, k (T, H, d), v (T, H, dv) f32 (H a multiple of k's heads: grouped queries share
    their K/V head), spans (S+1,) i64 sequence starts -> out (T, H, dv) f32."""
    n_seq = spans.shape[0] - 1
    n_head, n_kv = q.shape[1], k.shape[1]
    rep = n_head // n_kv
    dv = v.shape[2]
    dvp = (dv + 15) // 16 * 16  # values padded with zero columns to whole vectors
    for job in prange(n_seq * n_head):
        s, h = job // n_head, job % n_head
        a, b = spans[s], spans[s + 1]
        kt = np.zeros((k.shape[2], (b - a + 63) // 64 * 64), np.float32)
        kt[:, :b - a] = k[a:b, h // rep, :].T
        qh = np.ascontiguousarray(q[a:b, h, :])
        vh = np.zeros((b - a, dvp), np.float32)
        vh[:, :dv] = v[a:b, h // rep, :]
        res = np.empty((b - a, dvp), np.float32)
        _head(qh, kt, vh, np.float32(scale), res)
        out[a:b, h, :] = res[:, :dv]


def encoder_attention_twin(q: np.ndarray, k: np.ndarray, v: np.ndarray, spans: np.ndarray,
                           scale: float) -> np.ndarray:
    """numpy twin of ``encoder_attention`` (float64 sums: equal within float32 rounding)."""
    out = np.empty((q.shape[0], q.shape[1], v.shape[2]), np.float32)
    rep = q.shape[1] // k.shape[1]
    for a, b in zip(spans[:-1], spans[1:]):
        qh = q[a:b].transpose(1, 0, 2).astype(np.float64)
        kh = np.repeat(k[a:b].transpose(1, 0, 2), rep, axis=0).astype(np.float64)
        vh = np.repeat(v[a:b].transpose(1, 0, 2), rep, axis=0).astype(np.float64)
        s = (qh @ kh.transpose(0, 2, 1) * scale).astype(np.float32)
        p = expf_ggml_twin(s - s.max(axis=2, keepdims=True)).astype(np.float64)
        p /= p.sum(axis=2, keepdims=True)
        out[a:b] = (p @ vh).transpose(1, 0, 2)
    return out


@njit(cache=True, nogil=True, inline="always")
def _norm_row(x, w, b, eps, out):  # noqa: ANN001, ANN202
    """One row: ``(x - mean) / sqrt(var + eps) * w + b`` (``out`` may be ``x``)."""
    n = x.shape[0]
    total = 0.0
    for i in range(n):
        total += np.float64(x[i])
    mean = np.float32(total / n)
    sq = 0.0
    for i in range(n):
        c = x[i] - mean
        sq += np.float64(c * c)
    scale = np.float32(1.0) / np.sqrt(np.float32(sq / n + eps))
    for i in range(n):
        out[i] = (x[i] - mean) * scale * w[i] + b[i]


@njit(cache=True, nogil=True, parallel=True)
def layer_norm(x, w, b, eps, out):  # noqa: ANN001, ANN201
    """x (T, n) f32 -> out (T, n): ``(x - mean) / sqrt(var + eps) * w + b`` per row, as
    ggml_norm (float64 sums, the scale in float32) then ggml_mul and ggml_add; rows in
    parallel. ``out`` may be ``x``."""
    for t in prange(x.shape[0]):
        _norm_row(x[t], w, b, eps, out[t])


@njit(cache=True, nogil=True, parallel=True)
def add_layer_norm(x, y, w, b, eps, out):  # noqa: ANN001, ANN201
    """``layer_norm(x + y)`` (x, y (T, n) f32; the residual sum in float32, as ggml_add),
    the sum made row by row in ``out`` instead of a separate array (``out`` may be x)."""
    for t in prange(x.shape[0]):
        for i in range(x.shape[1]):
            out[t, i] = x[t, i] + y[t, i]
        _norm_row(out[t], w, b, eps, out[t])


_GELU_TABLE: list[np.ndarray] = []
_UNUSED_BIAS = np.zeros(1, np.float32)  # ggml's float16 GELU table as float32, made on first use


def gelu_f16(x: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """x (T, n) f32 (plus ``bias`` (n,), added in float32 first, as ggml_add) -> GELU as
    ggml-cpu computes it (GGML_GELU_FP16: 0 for x <= -10, x for x >= 10, else x rounded to
    float16 and looked up in its float16 table); compiled, rows in parallel.
    ``ops.gelu_f16`` is its numpy twin (and makes the table)."""
    from . import ops

    if not _GELU_TABLE:
        halves = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
        with np.errstate(all="ignore"):
            _GELU_TABLE.append(ops.gelu_f16(halves.astype(np.float32)))
    out = np.empty(x.shape, np.float32)
    b = _UNUSED_BIAS if bias is None else bias  # read only when given
    _gelu_table(np.ascontiguousarray(x, np.float32), np.ascontiguousarray(b, np.float32),
                bias is not None, _GELU_TABLE[0], out)
    return out


@njit(cache=True, nogil=True, parallel=True)
def _gelu_table(x, bias, biased, table, out):  # noqa: ANN001, ANN202
    for t in prange(x.shape[0]):
        for j in range(x.shape[1]):
            v = x[t, j] + bias[j] if biased else x[t, j]
            if v <= np.float32(-10.0):
                out[t, j] = np.float32(0.0)
            elif v >= np.float32(10.0):
                out[t, j] = v
            else:
                out[t, j] = table[f16_from_f32(v)]
