"""Attention over the KV arena: one numba pass for every query row of a batch, whatever
sequences the rows belong to, with one fixed order of arithmetic per query.

Batch invariance is the point. A query's result depends only on its own vector, its
sequence's cached keys and values, its position and the window: never on how many other
rows (of its own sequence or of others) share the call, nor on where its keys sit in a
tile. Scores are sums over the head dimension in index order (vectorized across keys,
never across the sum), the softmax visits exactly the visible keys in position order (exp
in float32, the sum in float64 as ggml's soft_max does), and the weighted sum over values
goes in position order. BLAS, whose blocking changes with the batch's shape, is not used.

``attend_twin`` is the same computation in plain numpy, for the tests.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

_I32, _F32 = ir.IntType(32), ir.FloatType()


@intrinsic
def _bits(typingctx, x):  # noqa: ANN001, ANN202, ARG001
    """float32 -> its bits as uint32."""
    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202, ARG001
        return builder.bitcast(args[0], _I32)

    return types.uint32(types.float32), codegen


@intrinsic
def _from_bits(typingctx, u):  # noqa: ANN001, ANN202, ARG001
    """uint32 bits -> the float32 they encode."""
    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202, ARG001
        return builder.bitcast(args[0], _F32)

    return types.float32(types.uint32), codegen


@njit(cache=True, nogil=True, inline="always")
def round_f16(x):  # noqa: ANN001, ANN201
    """float32 x (|x| < 65504) rounded to the nearest float16 (ties to even), as float32."""
    if abs(x) < np.float32(6.103515625e-05):  # float16 subnormals: a fixed step of 2**-24
        return np.float32(np.rint(x * np.float32(16777216.0)) / np.float32(16777216.0))
    u = _bits(x)
    u = (u + np.uint32(0xFFF) + ((u >> np.uint32(13)) & np.uint32(1))) & np.uint32(0xFFFFE000)
    return _from_bits(u)


@njit(cache=True, nogil=True, inline="always", error_model="numpy")
def _attend_row(q, kt, v, slot, pos, window, scale, cap, f16, out, th):  # noqa: ANN001, ANN202
    """Query row t = th // H, head h = th % H of ``attend`` (one fixed order of arithmetic,
    whichever loop calls it)."""
    n_head, d = q.shape[1], q.shape[2]
    group = n_head // kt.shape[1]
    tile_len = kt.shape[4]
    d_v = v.shape[3]
    t = th // n_head
    h = th - t * n_head
    g = h // group
    s = slot[t]
    hi = pos[t]
    lo = max(0, hi - window + 1) if window > 0 else 0
    tile0 = lo // tile_len
    base = tile0 * tile_len
    sc = np.zeros(hi + 1 - base, np.float32)
    for tile in range(tile0, hi // tile_len + 1):
        o = tile * tile_len - base
        n = min(tile_len, hi + 1 - tile * tile_len)
        for e in range(d):  # score j: a sum over e in index order, vectorized over j
            qe = q[t, h, e]
            for jj in range(n):
                sc[o + jj] += qe * kt[s, g, tile, e, jj]
    m = np.float32(-np.inf)
    for j in range(lo - base, hi + 1 - base):
        x = sc[j] * scale
        if cap > 0:
            x = np.float32(np.tanh(x * (np.float32(1.0) / cap))) * cap
        sc[j] = x
        m = max(m, x)
    total = 0.0  # float64, as ggml_vec_soft_max_f32 sums
    for j in range(lo - base, hi + 1 - base):
        ex = np.exp(sc[j] - m)
        sc[j] = ex
        total += ex
    inv = np.float32(1.0 / total)
    for j in range(lo - base, hi + 1 - base):
        p = sc[j] * inv
        sc[j] = round_f16(p) if f16 else p
    for c in range(d_v):
        out[t, h, c] = 0.0
    for j in range(lo, hi + 1):  # the weighted sum in position order, vectorized over c
        p = sc[j - base]
        for c in range(d_v):
            out[t, h, c] += p * v[s, g, j, c]


@njit(cache=True, nogil=True, error_model="numpy")
def _attend_serial(q, kt, v, slot, pos, window, scale, cap, f16, out):  # noqa: ANN001, ANN202
    for th in range(q.shape[0] * q.shape[1]):
        _attend_row(q, kt, v, slot, pos, window, scale, cap, f16, out, th)


@njit(cache=True, nogil=True, parallel=True, error_model="numpy")
def _attend_par(q, kt, v, slot, pos, window, scale, cap, f16, out):  # noqa: ANN001, ANN202
    for th in prange(q.shape[0] * q.shape[1]):
        _attend_row(q, kt, v, slot, pos, window, scale, cap, f16, out, th)


# Below this many multiply-adds attention runs on one thread: waking the pool costs more
# (and on a busy machine, much more).
PARALLEL_MIN_MACS = 1 << 21


def attend(q: np.ndarray, kt: np.ndarray, v: np.ndarray, slot: np.ndarray, pos: np.ndarray,
           window: int, scale: np.float32, cap: np.float32, f16: bool, out: np.ndarray) -> None:
    """q (T, H, d) f32, keys kt (S, H_kv, tiles, d, TILE), values v (S, H_kv, n_ctx, d_v),
    slot (T,) i64, pos (T,) i64 -> out (T, H, d_v) f32.

    Row t attends over positions lo..pos[t] of sequence slot[t] (lo = pos[t] - window + 1
    when window > 0, else 0); query head h reads KV head h // (H / H_kv). Scores are
    ``q.k * scale``, soft-capped (``cap * tanh(s / cap)``) when cap > 0; with ``f16`` the
    probabilities are rounded to float16 before they weigh the values (ggml's product
    against an F16 cache). Keys and values must already hold this batch's rows. Serial or
    parallel, each (row, head) is computed by the same code in the same order.
    """
    work = q.shape[0] * q.shape[1] * (int(pos.max()) + 1) * (q.shape[2] + v.shape[3])
    fn = _attend_par if work >= PARALLEL_MIN_MACS else _attend_serial
    fn(q, kt, v, slot, pos, int(window), np.float32(scale), np.float32(cap), bool(f16), out)


def attend_twin(q: np.ndarray, keys: list[np.ndarray], values: list[np.ndarray],
                pos: np.ndarray, window: int, scale: float, cap: float, f16: bool
                ) -> np.ndarray:
    """numpy twin of ``attend``: q (T, H, d); keys[t] (H_kv, S_t, d) and values[t]
    (H_kv, S_t, d_v) are row t's sequence's cached positions 0..S_t-1 -> (T, H, d_v)."""
    n_tok, n_head, _ = q.shape
    out = np.zeros((n_tok, n_head, values[0].shape[-1]), np.float32)
    for t in range(n_tok):
        k, vv = keys[t], values[t]
        group = n_head // k.shape[0]
        hi = int(pos[t])
        lo = max(0, hi - window + 1) if window > 0 else 0
        for h in range(n_head):
            kk, vh = k[h // group, lo:hi + 1], vv[h // group, lo:hi + 1]
            sc = np.zeros(len(kk), np.float32)
            for e in range(q.shape[2]):
                sc += q[t, h, e] * kk[:, e]
            sc = sc * np.float32(scale)
            if cap > 0:
                sc = np.tanh(sc * (np.float32(1.0) / np.float32(cap))).astype(np.float32) \
                    * np.float32(cap)
            ex = np.exp(sc - sc.max()).astype(np.float32)
            p = ex * np.float32(1.0 / np.cumsum(ex.astype(np.float64))[-1])
            if f16:
                p = p.astype(np.float16).astype(np.float32)
            acc = np.zeros(vh.shape[1], np.float32)
            for j in range(len(p)):
                acc += p[j] * vh[j]
            out[t, h] = acc
    return out
