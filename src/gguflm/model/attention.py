"""Attention over the KV arena: one numba pass for every query row of a batch, whatever
sequences the rows belong to, with one fixed order of arithmetic per query.

Batch invariance is the point. A query's result depends only on its own vector, its
sequence's cached keys and values, its position and the window: never on how many other
rows (of its own sequence or of others) share the call, nor on where its keys sit in a
tile. Scores are sums over the head dimension in index order (vectorized across keys,
never across the sum); the softmax's exp and its sum are ggml's own (``expf_ggml``,
``_soft_max_sum``: what llama.cpp's AVX2 soft_max computes for the same scores); the
weighted sum over values goes in position order. BLAS, whose blocking changes with the
batch's shape, is not used.

``attend_twin`` is the same computation in plain numpy, for the tests.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange, types
from numba.extending import overload

from ..quant import (
    jitcache,  # noqa: F401 - stamps the cached kernels below (before any njit)
    matrix,
)
from ..quant.floatbits import (
    expf_ggml,
    expf_ggml_twin,
    fma32,
    kv_encode,
    kv_load,
    round_f16,
    to_f16,
)
from . import kv_q8
from .attention_ir import tile_scores, weighted_sum
from .kv_cache import TILE  # key positions per tile of the arena's transposed keys
from .kv_q8_ir import q8_dot, q8_weighted_add


@njit(cache=True, nogil=True, inline="always")
def _span(slot, pos, window, t):  # noqa: ANN001, ANN202
    """Row t's slot s and its first and last visible positions lo..hi."""
    hi = pos[t]
    lo = max(0, hi - window + 1) if window > 0 else 0
    return slot[t], lo, hi


@njit(cache=True, nogil=True, inline="always")
def _soft_max_sum(ex, lo, hi):  # noqa: ANN001, ANN202
    """The sum of ex[lo..hi] as ggml_vec_soft_max_f32 adds a row on x86 (AVX2): 8 lanes at a
    time from index 0 (a multiple of 8 positions; the keys not visible are 0 there), each
    group reduced in float32 as ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)), the groups summed in
    float64."""
    total = 0.0
    z = np.float32(0.0)
    for g in range(lo - lo % 8, hi + 1, 8):
        if lo <= g and g + 7 <= hi:  # a whole group: plain loads (the lanes are locals,
            # kept in registers, not an array written and read back)
            l0, l1, l2, l3 = ex[g], ex[g + 1], ex[g + 2], ex[g + 3]
            l4, l5, l6, l7 = ex[g + 4], ex[g + 5], ex[g + 6], ex[g + 7]
        else:
            l0 = ex[g] if lo <= g <= hi else z
            l1 = ex[g + 1] if lo <= g + 1 <= hi else z
            l2 = ex[g + 2] if lo <= g + 2 <= hi else z
            l3 = ex[g + 3] if lo <= g + 3 <= hi else z
            l4 = ex[g + 4] if lo <= g + 4 <= hi else z
            l5 = ex[g + 5] if lo <= g + 5 <= hi else z
            l6 = ex[g + 6] if lo <= g + 6 <= hi else z
            l7 = ex[g + 7] if lo <= g + 7 <= hi else z
        total += np.float64(((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)))
    return total


@njit(cache=True, nogil=True, inline="always")
def _max_of(x, n):  # noqa: ANN001, ANN202
    """The largest of x[:n] (n >= 1) by 8 running maxima: a maximum does not depend on
    the order it is taken in, and 8 independent chains run at the loads' pace rather than
    at one compare's latency per element."""
    m0 = m1 = m2 = m3 = m4 = m5 = m6 = m7 = np.float32(-np.inf)
    j = 0
    while j + 8 <= n:
        m0, m1, m2, m3 = max(m0, x[j]), max(m1, x[j + 1]), max(m2, x[j + 2]), max(m3, x[j + 3])
        m4, m5, m6, m7 = (max(m4, x[j + 4]), max(m5, x[j + 5]), max(m6, x[j + 6]),
                          max(m7, x[j + 7]))
        j += 8
    while j < n:
        m0 = max(m0, x[j])
        j += 1
    return max(max(max(m0, m1), max(m2, m3)), max(max(m4, m5), max(m6, m7)))


@njit(cache=True, nogil=True, inline="always", error_model="numpy")
def _attend_group(q, kt, v, slot, pos, window, scale, cap, f16, out, t, g, sinks):  # noqa: ANN001, ANN202
    """Query row t, every query head of KV head g (one fixed order of arithmetic per head,
    whichever loop calls it). The heads sharing a KV head go together: the vector loops
    (``attention_ir``) load each key and value vector once for several of them, their
    sums kept in registers. ``sinks`` (H,) f32, or empty: each head's
    sink logit joins its softmax's max and sum, as ggml's soft_max with sinks."""
    tile_len = kt.shape[4]
    group = q.shape[1] // kt.shape[1]
    h0 = g * group
    s, lo, hi = _span(slot, pos, window, t)
    tile0 = lo // tile_len
    base = tile0 * tile_len
    sc = np.empty((group, hi + 1 - base), np.float32)
    acc = np.empty((group, TILE), np.float32)
    for tile in range(tile0, hi // tile_len + 1):
        o = tile * tile_len - base
        n = min(tile_len, hi + 1 - tile * tile_len)
        kk = kt[s, g, tile]
        # score j of head h: a sum over e in index order, vectorized over a whole tile of
        # keys (a fixed trip count vectorizes where stopping at n does not; unused lanes dropped)
        tile_scores(q[t, h0:h0 + group], kk, acc)
        for hh in range(group):
            for jj in range(n):
                sc[hh, o + jj] = acc[hh, jj]
    n_vis = hi + 1 - lo
    for hh in range(group):
        # the visible keys' scores as a view from index 0: loops over range(n_vis) need no
        # negative-index checks, so they vectorize whatever the window
        sh = sc[hh, lo - base:]
        if cap > 0:
            for j in range(n_vis):
                sh[j] = np.float32(np.tanh(sh[j] * scale * (np.float32(1.0) / cap))) * cap
        else:
            for j in range(n_vis):  # vectorizes
                sh[j] = sh[j] * scale
        m = _max_of(sh, n_vis)
        if sinks.shape[0]:
            m = max(m, sinks[h0 + hh])
        for j in range(n_vis):  # ggml's vector exp: this loop vectorizes
            sh[j] = expf_ggml(sh[j] - m)
        total = _soft_max_sum(sc[hh], lo - base, hi - base)
        if sinks.shape[0]:
            total += np.float64(np.exp(sinks[h0 + hh] - m))
        inv = np.float32(1.0 / total)
        for j in range(n_vis):
            p = sh[j] * inv
            sh[j] = round_f16(p) if f16 else p
    # the weighted sums in position order, vectorized over c
    weighted_sum(sc[:, lo - base:], v[s, g, lo:hi + 1], out[t, h0:h0 + group])


@njit(cache=True, nogil=True, inline="always", error_model="numpy")
def _ggml_dot(kt, s, g, j, qv, acc):  # noqa: ANN001, ANN202
    """Key j of (slot s, KV head g) . qv as ggml_vec_dot_f16/f32 sums on x86 (AVX2): 32
    float accumulators (4 vectors of 8 lanes), element e into accumulator e % 32, fused;
    the vectors added 0+2, 1+3, then 0+1; then lanes l + (l+4), pairs, pair; a tail beyond
    the last multiple of 32 added in float64."""
    tile_len = kt.shape[4]
    tile, jj = j // tile_len, j % tile_len
    d = qv.shape[0]
    n32 = d - d % 32
    for a in range(32):
        acc[a] = 0.0
    for i in range(0, n32, 32):
        for a in range(32):
            acc[a] = fma32(kv_load(kt[s, g, tile, i + a, jj]), qv[i + a], acc[a])
    for a in range(8):
        acc[a] = (acc[a] + acc[16 + a]) + (acc[8 + a] + acc[24 + a])
    t0 = acc[0] + acc[4]
    t1 = acc[1] + acc[5]
    t2 = acc[2] + acc[6]
    t3 = acc[3] + acc[7]
    r = (t0 + t1) + (t2 + t3)
    if n32 == d:
        return r
    total = np.float64(r)
    for e in range(n32, d):
        total += np.float64(kv_load(kt[s, g, tile, e, jj]) * qv[e])
    return np.float32(total)


@njit(cache=True, nogil=True, inline="always", error_model="numpy")
def _attend_row_flash(q, kt, v, slot, pos, window, scale, cap, f16, out, t, h, g, sinks):  # noqa: ANN001, ANN202
    """Query row t, head h (of KV head g) as llama.cpp's CPU flash attention computes it for
    a prompt of fewer than 64 rows (ggml_compute_forward_flash_attn_ext_f16_one_chunk): scores by
    ``_ggml_dot``; an online softmax over the keys in position order, the running sum of
    values kept in float16 (rounded after every fused step) with an F16 cache; divided by
    the softmax sum at the end."""
    d_v = v.shape[3]
    s, lo, hi = _span(slot, pos, window, t)
    if cap > 0:
        scale = scale / cap
    acc = np.empty(32, np.float32)
    qv = q[t, h]
    vkq = out[t, h]
    for c in range(d_v):
        vkq[c] = 0.0
    total = np.float32(0.0)
    m = np.float32(-np.inf)
    for j in range(lo, hi + 1):
        x = _ggml_dot(kt, s, g, j, qv, acc) * scale
        if cap > 0:
            x = cap * np.float32(np.tanh(x))
        ms = np.float32(1.0)
        vs = np.float32(1.0)
        if x > m:
            ms = np.float32(np.exp(m - x))
            m = x
            for c in range(d_v):
                vkq[c] = round_f16(vkq[c] * ms) if f16 else vkq[c] * ms
        else:
            vs = np.float32(np.exp(x - m))
        for c in range(d_v):
            y = fma32(kv_load(v[s, g, j, c]), vs, vkq[c])
            vkq[c] = round_f16(y) if f16 else y
        total = fma32(total, ms, vs)
    _flash_finish(vkq, total, m, sinks, h)


@njit(cache=True, nogil=True, inline="always", error_model="numpy")
def _flash_finish(vkq, total, m, sinks, h):  # noqa: ANN001, ANN202
    """The end of a flash row: head h's sink (if any) after the keys, on the float32 sum,
    as ggml; then the value sum ``vkq`` divided by the softmax sum ``total``."""
    if sinks.shape[0]:
        ms = np.float32(1.0)
        vs = np.float32(1.0)
        if sinks[h] > m:
            ms = np.float32(np.exp(m - sinks[h]))
            for c in range(vkq.shape[0]):
                vkq[c] = vkq[c] * ms
        else:
            vs = np.float32(np.exp(sinks[h] - m))
        total = total * ms + vs
    inv = np.float32(0.0) if total == 0 else np.float32(1.0) / total
    for c in range(vkq.shape[0]):
        vkq[c] = vkq[c] * inv


@njit(cache=True, nogil=True, error_model="numpy")
def _attend_one_float(q, kt, v, slot, pos, window, scale, cap, f16, flash, out, item, sinks):  # noqa: ANN001, ANN202
    """``_attend_one`` with a float16 or float32 cache."""
    n_kv = kt.shape[1]
    t, g = item // n_kv, item % n_kv
    if flash[t]:
        group = q.shape[1] // n_kv
        for h in range(g * group, (g + 1) * group):
            _attend_row_flash(q, kt, v, slot, pos, window, scale, cap, f16, out, t, h, g,
                              sinks)
    elif window > 0 and pos[t] >= window:  # the window hides the first keys
        _attend_group(q, kt, v, slot, pos, window, scale, cap, f16, out, t, g, sinks)
    else:  # every key from position 0 (no window, or not yet past it): compiled apart, as
        # with the window a constant 0 the loops simplify
        _attend_group(q, kt, v, slot, pos, 0, scale, cap, f16, out, t, g, sinks)


@njit(cache=True, nogil=True, error_model="numpy")
def _attend_one_q8(q, kc, vc, slot, pos, window, scale, cap, out, item, sinks):  # noqa: ANN001, ANN202
    """``_attend_one`` with a Q8_0 cache (``kv_q8``): every row as llama.cpp's CPU flash
    attention computes with Q8_0 K and V, the one arithmetic it has for them (quantized V
    needs flash attention; quantized K/V always take ggml_compute_forward_flash_attn_ext_f16_
    one_chunk, never the tiled or split-KV paths): each head's query quantized to Q8_0 (K's
    vec_dot_type), scores by the q8_0 . q8_0 dot; an online softmax over the keys in
    position order, each value dequantized to float32 and the value sum kept in float32.
    The heads sharing KV head g go together, each with its own state, so that a value is
    dequantized once for all of them; each head's arithmetic is its own, in order."""
    n_kv = kc.shape[1]
    t, g = item // n_kv, item % n_kv
    group = q.shape[1] // n_kv
    h0 = g * group
    s, lo, hi = _span(slot, pos, window, t)
    if cap > 0:
        scale = scale / cap
    qb = np.empty((group, kc.shape[3]), np.int8)
    for hh in range(group):
        kv_q8.quantize_row(q[t, h0 + hh], qb[hh])
    vkq = out[t, h0:h0 + group]
    vkq[:] = 0.0
    total = np.zeros(group, np.float32)
    m = np.full(group, -np.inf, np.float32)
    vs = np.empty(group, np.float32)  # each head's weight of value j
    for j in range(lo, hi + 1):
        for hh in range(group):
            x = q8_dot(kc[s, g, j], qb[hh]) * scale
            if cap > 0:
                x = cap * np.float32(np.tanh(x))
            ms = np.float32(1.0)
            vs[hh] = np.float32(1.0)
            if x > m[hh]:
                ms = np.float32(np.exp(m[hh] - x))
                m[hh] = x
                for c in range(vkq.shape[1]):
                    vkq[hh, c] = vkq[hh, c] * ms
            else:
                vs[hh] = np.float32(np.exp(x - m[hh]))
            total[hh] = fma32(total[hh], ms, vs[hh])
        q8_weighted_add(vc[s, g, j], vs, vkq)  # vkq[hh] = fma(value j, vs[hh], vkq[hh])
    for hh in range(group):
        _flash_finish(vkq[hh], total[hh], m[hh], sinks, h0 + hh)


def _is_q8(cache: types.Type) -> bool:
    """Whether a numba type is a Q8_0 cache's (int8 rows of ggml blocks)."""
    return isinstance(cache, types.Array) and cache.dtype == types.int8


def _attend_cache(q, kt, v, slot, pos, window, scale, cap, f16, flash, out, item, sinks):  # noqa: ANN001, ANN202, ARG001
    """``_attend_one``'s arithmetic for the cache's type (chosen when numba compiles)."""
    raise NotImplementedError("numba only")


@overload(_attend_cache)
def _attend_cache_impl(q, kt, v, slot, pos, window, scale, cap, f16, flash, out, item, sinks):  # noqa: ANN001, ANN202, ARG001
    if _is_q8(kt):
        def q8(q, kt, v, slot, pos, window, scale, cap, f16, flash, out, item, sinks):  # noqa: ANN001, ANN202, ARG001
            _attend_one_q8(q, kt, v, slot, pos, window, scale, cap, out, item, sinks)
        return q8

    def floats(q, kt, v, slot, pos, window, scale, cap, f16, flash, out, item, sinks):  # noqa: ANN001, ANN202
        _attend_one_float(q, kt, v, slot, pos, window, scale, cap, f16, flash, out, item,
                          sinks)
    return floats


# not inlined: numba's front end then types its body once, not again in every caller
@njit(cache=True, nogil=True, error_model="numpy")
def _attend_one(q, kt, v, slot, pos, window, scale, cap, f16, flash, out, item, sinks):  # noqa: ANN001, ANN202
    """Work item ``item``: query row t = item // H_kv with the heads of KV head
    g = item % H_kv, by the arithmetic the row and the cache ask for (with a Q8_0 cache
    every row is a flash row and ``f16`` is unused: ``_attend_one_q8``)."""
    _attend_cache(q, kt, v, slot, pos, window, scale, cap, f16, flash, out, item, sinks)


@njit(cache=True, nogil=True)
def _store_float(kt, v, slot, pos, k_new, v_new):  # noqa: ANN001, ANN202
    """``store_rows`` into a float16 or float32 cache."""
    tile_len = kt.shape[4]
    for t in range(k_new.shape[0]):
        s, p = slot[t], pos[t]
        tile, off = p // tile_len, p % tile_len
        for g in range(k_new.shape[1]):
            for e in range(k_new.shape[2]):
                kt[s, g, tile, e, off] = kv_encode(k_new[t, g, e], kt)
            for c in range(v_new.shape[2]):
                v[s, g, p, c] = kv_encode(v_new[t, g, c], v)


def _store_cache(kt, v, slot, pos, k_new, v_new):  # noqa: ANN001, ANN202, ARG001
    """``store_rows`` for the cache's type (chosen when numba compiles)."""
    raise NotImplementedError("numba only")


@overload(_store_cache)
def _store_cache_impl(kt, v, slot, pos, k_new, v_new):  # noqa: ANN001, ANN202, ARG001
    if _is_q8(kt):
        def q8(kt, v, slot, pos, k_new, v_new):  # noqa: ANN001, ANN202
            kv_q8.store_rows(kt, v, slot, pos, k_new, v_new)
        return q8

    def floats(kt, v, slot, pos, k_new, v_new):  # noqa: ANN001, ANN202
        _store_float(kt, v, slot, pos, k_new, v_new)
    return floats


@njit(cache=True, nogil=True)
def store_rows(kt, v, slot, pos, k_new, v_new):  # noqa: ANN001, ANN201
    """Write k_new (T, H_kv, d) and v_new (T, H_kv, d_v) of rows at positions ``pos`` of
    slots ``slot`` into one layer's keys ``kt`` (S, H_kv, tiles, d, TILE) and values ``v``
    (S, H_kv, n_ctx, d_v): as float16 bits into a uint16 cache (llama.cpp's F16 cache),
    as they are into a float32 one; into a Q8_0 cache's int8 rows (S, H_kv, n_ctx, bytes)
    as ggml's Q8_0 blocks (``kv_q8.store_rows``)."""
    _store_cache(kt, v, slot, pos, k_new, v_new)


@njit(cache=True, nogil=True)
def _prepare(q, kt, v, slot, pos, k_new, v_new, f16):  # noqa: ANN001, ANN202
    """Store the batch's keys and values; the queries as the kernel reads them (rounded to
    float16 with an F16 cache: ggml converts the other operand of an F16 product)."""
    store_rows(kt, v, slot, pos, k_new, v_new)
    if not f16:
        return q
    qr = np.empty_like(q)
    for t in range(q.shape[0]):
        for h in range(q.shape[1]):
            for e in range(q.shape[2]):
                qr[t, h, e] = to_f16(q[t, h, e])
    return qr


@njit(cache=True, nogil=True, error_model="numpy")
def _attend_serial(q, kt, v, slot, pos, window, scale, cap, f16, flash, out, k_new, v_new,  # noqa: ANN001, ANN202
                   sinks):
    q = _prepare(q, kt, v, slot, pos, k_new, v_new, f16)
    for item in range(q.shape[0] * kt.shape[1]):
        _attend_one(q, kt, v, slot, pos, window, scale, cap, f16, flash, out, item, sinks)


@njit(cache=True, nogil=True, parallel=True, error_model="numpy")
def _attend_par(q, kt, v, slot, pos, window, scale, cap, f16, flash, out, k_new, v_new,  # noqa: ANN001, ANN202
                sinks):
    q = _prepare(q, kt, v, slot, pos, k_new, v_new, f16)
    n_rows, n_kv = q.shape[0], kt.shape[1]
    for i in prange(n_rows * n_kv):
        # rows in the order first, last, second, second-to-last, ...: numba hands each
        # thread one contiguous run of items, and a prompt's later rows attend over more
        # keys (in order, the thread with the second half had 3/4 of the work)
        r = i // n_kv
        row = r // 2 if r % 2 == 0 else n_rows - 1 - r // 2
        _attend_one(q, kt, v, slot, pos, window, scale, cap, f16, flash, out,
                    np.int64(row * n_kv + i % n_kv), sinks)  # one signature (i is unsigned)


def runs_parallel(rows: int, n_kv: int, macs: int) -> bool:
    """Whether attention over ``rows`` query rows with ``n_kv`` KV heads, ``macs``
    multiply-adds in all, runs on all threads: with two work items (row, KV head) or more,
    from the products' threshold (``matrix.PARALLEL_MIN_MACS``: waking sleeping workers
    costs more, spinning ones much less: measured in docs/performance.md)."""
    return rows * n_kv >= 2 and macs >= matrix.PARALLEL_MIN_MACS


def attend(q: np.ndarray, kt: np.ndarray, v: np.ndarray, slot: np.ndarray, pos: np.ndarray,
           window: int, scale: np.float32, cap: np.float32, f16: bool, out: np.ndarray,
           flash: np.ndarray | None = None, k_new: np.ndarray | None = None,
           v_new: np.ndarray | None = None, sinks: np.ndarray | None = None) -> None:
    """q (T, H, d) f32, keys kt (S, H_kv, tiles, d, TILE), values v (S, H_kv, n_ctx, d_v),
    slot (T,) i64, pos (T,) i64 -> out (T, H, d_v) f32; or a Q8_0 cache's keys and values
    (S, H_kv, n_ctx, bytes) int8 (``kv_q8``: every row as llama.cpp's flash attention with
    Q8_0 K and V computes it, ``_attend_one_q8``; ``f16`` and ``flash`` unused).

    Row t attends over positions lo..pos[t] of sequence slot[t] (lo = pos[t] - window + 1
    when window > 0, else 0); query head h reads KV head h // (H / H_kv). Scores are
    ``q.k * scale``, soft-capped (``cap * tanh(s / cap)``) when cap > 0; with ``f16`` the
    queries and the probabilities are rounded to float16 before their products (ggml's
    products against an F16 cache). ``k_new`` (T, H_kv, d) and ``v_new`` (T, H_kv, d_v),
    the batch's own keys and values, are stored first (``store_rows``; else the cache must
    already hold them): one compiled call per layer. Serial or parallel, each (row, head)
    is computed by the same code in the same order.

    ``flash`` (T,) bool, optional: rows computed as llama.cpp's CPU flash attention does
    (``_attend_row_flash``: online softmax, the value sum kept in float16 with ``f16``)
    instead of its soft_max-then-product path. ``sinks`` (H,) f32, optional: each head's
    attention sink logit (gpt-oss), in its softmax's max and sum but weighting no value.
    """
    if flash is None:
        flash = np.zeros(len(q), np.bool_)
    if kt.dtype != np.int8 and kt.shape[4] != TILE:
        raise ValueError(f"attend: keys in tiles of {kt.shape[4]}, the kernel reads {TILE}")
    if k_new is None or v_new is None:
        k_new = np.zeros((0, kt.shape[1], q.shape[2]), np.float32)
        v_new = np.zeros((0, v.shape[1], out.shape[2]), np.float32)
    work = q.shape[0] * q.shape[1] * (int(pos.max()) + 1) * (q.shape[2] + out.shape[2])
    fn = _attend_par if runs_parallel(len(q), kt.shape[1], work) else _attend_serial
    sinks = NO_SINKS if sinks is None else np.ascontiguousarray(sinks, np.float32)
    fn(q, kt, v, slot, pos, int(window), np.float32(scale), np.float32(cap), bool(f16), flash,
       out, k_new, v_new, sinks)


NO_SINKS = np.zeros(0, np.float32)


def _twin_ggml_dot(k: np.ndarray, q: np.ndarray) -> np.float32:
    """``_ggml_dot``'s order in numpy: 32 fused accumulators (float64 products rounded once
    to float32 are exact fused steps here: |k q| products of float16-sized values), the
    x86 reduction, a float64 tail."""
    n32 = len(q) - len(q) % 32
    acc = np.zeros(32, np.float32)
    for i in range(0, n32, 32):
        acc = (k[i:i + 32].astype(np.float64) * q[i:i + 32] + acc).astype(np.float32)
    a = (acc[:8] + acc[16:24]) + (acc[8:16] + acc[24:32])
    t = a[:4] + a[4:]
    r = (t[0] + t[1]) + (t[2] + t[3])
    if n32 == len(q):
        return r
    tail = np.float64(r) + sum(np.float64(k[e] * q[e]) for e in range(n32, len(q)))
    return np.float32(tail)


def _twin_flash_row(q: np.ndarray, kk: np.ndarray, vh: np.ndarray, scale: float, cap: float,
                    f16: bool) -> np.ndarray:
    """``_attend_row_flash`` for one (row, head): kk (S, d) and vh (S, d_v) its visible keys
    and values in position order."""
    return twin_flash([_twin_ggml_dot(k, q) for k in kk], vh, scale, cap, f16)


def twin_flash(dots: list[np.float32], vh: np.ndarray, scale: float, cap: float, f16: bool
               ) -> np.ndarray:
    """ggml's one_chunk flash attention for one (row, head) in numpy, from its keys' raw
    dot products ``dots`` (S,) with the query and their values vh (S, d_v) in position
    order: the value sum rounded to float16 after every step with ``f16`` (an F16 V), kept
    in float32 otherwise (F32 or a dequantized Q8_0 V)."""
    def rnd(x: np.ndarray) -> np.ndarray:
        return x.astype(np.float16).astype(np.float32) if f16 else x.astype(np.float32)

    f32 = np.float32
    sc = f32(scale) / f32(cap) if cap > 0 else f32(scale)
    vkq = np.zeros(vh.shape[1], np.float32)
    total, m = f32(0.0), f32(-np.inf)
    for j in range(len(dots)):
        x = f32(dots[j] * sc)
        if cap > 0:
            x = f32(cap) * f32(np.tanh(x))
        ms = vs = f32(1.0)
        if x > m:
            ms = f32(np.exp(f32(m - x)))
            m = x
            vkq = rnd(vkq * ms)
        else:
            vs = f32(np.exp(f32(x - m)))
        vkq = rnd(vh[j].astype(np.float64) * np.float64(vs) + vkq)  # one rounding: fused
        total = f32(np.float64(total) * np.float64(ms) + np.float64(vs))
    inv = f32(0.0) if total == 0 else f32(1.0) / total
    return vkq * inv


def _twin_soft_max_sum(ex: np.ndarray, lo: int) -> np.float64:
    """``_soft_max_sum`` of keys lo, lo+1, ... in numpy."""
    lanes = np.zeros(lo % 8 + len(ex) + 7, np.float32)[:(lo % 8 + len(ex) + 7) // 8 * 8]
    lanes[lo % 8:lo % 8 + len(ex)] = ex
    g = lanes.reshape(-1, 8)
    s = ((g[:, 0] + g[:, 4]) + (g[:, 2] + g[:, 6])) + ((g[:, 1] + g[:, 5]) + (g[:, 3] + g[:, 7]))
    return np.cumsum(s.astype(np.float64))[-1]


def attend_twin(q: np.ndarray, keys: list[np.ndarray], values: list[np.ndarray],
                pos: np.ndarray, window: int, scale: float, cap: float, f16: bool,
                flash: np.ndarray | None = None, sinks: np.ndarray | None = None
                ) -> np.ndarray:
    """numpy twin of ``attend``: q (T, H, d); keys[t] (H_kv, S_t, d) and values[t]
    (H_kv, S_t, d_v) are row t's sequence's cached positions 0..S_t-1 -> (T, H, d_v);
    ``sinks`` as ``attend`` takes them (the softmax path only)."""
    n_tok, n_head, _ = q.shape
    out = np.zeros((n_tok, n_head, values[0].shape[-1]), np.float32)
    for t in range(n_tok):
        k, vv = keys[t], values[t]
        group = n_head // k.shape[0]
        hi = int(pos[t])
        lo = max(0, hi - window + 1) if window > 0 else 0
        for h in range(n_head):
            kk, vh = k[h // group, lo:hi + 1], vv[h // group, lo:hi + 1]
            if flash is not None and flash[t]:
                out[t, h] = _twin_flash_row(q[t, h], kk, vh, scale, cap, f16)
                continue
            sc = np.zeros(len(kk), np.float32)
            for e in range(q.shape[2]):
                sc += q[t, h, e] * kk[:, e]
            sc = sc * np.float32(scale)
            if cap > 0:
                sc = np.tanh(sc * (np.float32(1.0) / np.float32(cap))).astype(np.float32) \
                    * np.float32(cap)
            m = sc.max() if sinks is None else max(sc.max(), np.float32(sinks[h]))
            ex = expf_ggml_twin(sc - m)
            total = _twin_soft_max_sum(ex, lo)
            if sinks is not None:
                total += np.float64(np.exp(np.float32(sinks[h]) - m))
            p = ex * np.float32(1.0 / total)
            if f16:
                p = p.astype(np.float16).astype(np.float32)
            acc = np.zeros(vh.shape[1], np.float32)
            for j in range(len(p)):
                acc += p[j] * vh[j]
            out[t, h] = acc
    return out
