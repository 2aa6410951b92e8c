"""The compiled parts of an encoder (BERT) layer: its layer norm, and its bidirectional
attention, where every position of a sequence sees every position of its own sequence,
none of the others', and there is no cache.

One numba pass per (sequence, head), in parallel, with one fixed order of arithmetic per
query (so a text's vectors never depend on the texts batched beside it): scores are sums
over the head dimension in index order (``attention_ir.tile_scores``, 64 keys a tile, a
block of queries at a time); the softmax's exp is ggml's (``expf_ggml``), its sum in
position order; the weighted sum over values goes in position order
(``attention_ir.weighted_sum``). ``encoder_attention_twin`` is the
same computation in numpy, for the tests.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..quant import jitcache  # noqa: F401 - stamps the cached kernels below (before any njit)
from ..quant.floatbits import expf_ggml, expf_ggml_twin
from .attention_ir import tile_scores, weighted_sum

QUERY_BLOCK = 32  # queries whose scores are made together (each key tile read once for them)


@njit(cache=True, nogil=True)
def _softmax_rows(s, n, scale):  # noqa: ANN001, ANN202
    """Rows of s (B, >= n) f32: the first n columns -> softmax(scale * s), in place."""
    for r in range(s.shape[0]):
        m = np.float32(-np.inf)
        for j in range(n):
            s[r, j] *= scale
            m = max(m, s[r, j])
        for j in range(n):  # its own loop: the exp vectorizes
            s[r, j] = expf_ggml(s[r, j] - m)
        total = np.float32(0.0)
        for j in range(n):
            total += s[r, j]
        inv = np.float32(1.0) / total
        for j in range(n):
            s[r, j] *= inv


@njit(cache=True, nogil=True)
def _head(q, kt, v, scale, out):  # noqa: ANN001, ANN202
    """q (T, d), kt (d, 64 * tiles) (keys past T zero), v (T, dv) f32 of one head -> out
    (T, dv)."""
    n = q.shape[0]
    tiles = kt.shape[1] // 64
    s = np.empty((QUERY_BLOCK, 64 * tiles), np.float32)
    part = np.empty((QUERY_BLOCK, 64), np.float32)
    for i0 in range(0, n, QUERY_BLOCK):
        b = min(QUERY_BLOCK, n - i0)
        for t in range(tiles):
            tile_scores(q[i0:i0 + b], kt[:, 64 * t:64 * t + 64], part[:b])
            s[:b, 64 * t:64 * t + 64] = part[:b]
        _softmax_rows(s[:b], n, scale)
        weighted_sum(s[:b, :n], v, out[i0:i0 + b])


@njit(cache=True, nogil=True, parallel=True)
def encoder_attention(q, k, v, spans, scale, out):  # noqa: ANN001, ANN201
    """q, k (T, H, d), v (T, H, dv) f32 (H a multiple of k's heads: grouped queries share
    their K/V head), spans (S+1,) i64 sequence starts -> out (T, H, dv) f32."""
    n_seq = spans.shape[0] - 1
    n_head, n_kv = q.shape[1], k.shape[1]
    rep = n_head // n_kv
    for job in prange(n_seq * n_head):
        s, h = job // n_head, job % n_head
        a, b = spans[s], spans[s + 1]
        kt = np.zeros((k.shape[2], (b - a + 63) // 64 * 64), np.float32)
        kt[:, :b - a] = k[a:b, h // rep, :].T
        qh = np.ascontiguousarray(q[a:b, h, :])
        vh = np.ascontiguousarray(v[a:b, h // rep, :])
        res = np.empty((b - a, v.shape[2]), np.float32)
        _head(qh, kt, vh, np.float32(scale), res)
        out[a:b, h, :] = res


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


@njit(cache=True, nogil=True, parallel=True)
def layer_norm(x, w, b, eps, out):  # noqa: ANN001, ANN201
    """x (T, n) f32 -> out (T, n): ``(x - mean) / sqrt(var + eps) * w + b`` per row, as
    ggml_norm (float64 sums, the scale in float32) then ggml_mul and ggml_add; rows in
    parallel. ``out`` may be ``x``."""
    n = x.shape[1]
    for t in prange(x.shape[0]):
        total = 0.0
        for i in range(n):
            total += np.float64(x[t, i])
        mean = np.float32(total / n)
        sq = 0.0
        for i in range(n):
            c = x[t, i] - mean
            sq += np.float64(c * c)
        scale = np.float32(1.0) / np.sqrt(np.float32(sq / n + eps))
        for i in range(n):
            out[t, i] = (x[t, i] - mean) * scale * w[i] + b[i]
