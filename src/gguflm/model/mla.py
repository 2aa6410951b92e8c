"""Multi-head latent attention (``layer.LatentAttention``): DeepSeek-V2/V3's attention, as
llama.cpp's deepseek2 graph runs it with the absorption (src/models/deepseek2.cpp).

Each position stores one row of the cache, [c | k_pe]: the compressed latent c (kv_lora
numbers, RMS-normed) and the rotated key part k_pe (n_rot), shared by every head. A query
head's nope part is taken into the latent space by that head's ``k_b`` (so that q_nope .
k_nope = (k_b q_nope) . c), its rope part rotated, and the head attends over the cached
rows as multi-query attention with keys [c | k_pe] and values c; the weighted sum of c
goes out through the head's ``v_b``. Per position that caches kv_lora + n_rot numbers,
where the decompressed heads would take n_head x (nope + n_rot + head_dim_v).

The attention is one numba pass per query row with one fixed order of arithmetic, as in
``attention.py``: scores summed over the row's numbers in index order (vectorized across
the heads), ggml's soft_max (its exp, its AVX2 sum), the probabilities and queries
rounded to float16 with an F16 cache (ggml's products against an F16 cache), the weighted
sums in position order. A row's result depends on its own query and its sequence's
cached rows only, never on the batch. Rows marked ``flash`` take the same soft_max path
(llama.cpp's flash attention over a latent is not reproduced here).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..quant import jitcache  # noqa: F401 - stamps the cached kernels below (before any njit)
from ..quant.expert_products import expert_products_kernel, threads_for
from ..quant.floatbits import expf_ggml, kv_encode, kv_load, round_f16, to_f16
from ..quant.int_tiles import prepare
from ..quant.matrix import ExpertWeights, QMatrix
from ..quant.vector_ir import F16_TABLE
from . import ops
from .attention import _max_of, _soft_max_sum, runs_parallel
from .layer import LatentAttention


@njit(cache=True, nogil=True)
def store_latent(cache, slot, pos, rows):  # noqa: ANN001, ANN201
    """Write rows (T, width) f32 at positions ``pos`` of slots ``slot`` into one layer's
    latent cache (S, n_ctx, width): float16 bits into a uint16 cache, float32 as they are."""
    for t in range(rows.shape[0]):
        for e in range(rows.shape[1]):
            cache[slot[t], pos[t], e] = kv_encode(rows[t, e], cache)


@njit(cache=True, nogil=True, inline="always", error_model="numpy")
def _scores(qt, cache, s, hi, lat, acc, sc):  # noqa: ANN001, ANN202
    """sc[h, j] = q_h . row j of slot s for j in 0..hi; qt (width, H) the row's queries
    transposed, each score summed over the row's numbers in index order (the loop over
    the heads vectorizes)."""
    width, n_head = qt.shape
    for j in range(hi + 1):
        for e in range(width):
            lat[e] = kv_load(cache[s, j, e])
        for h in range(n_head):
            acc[h] = 0.0
        for e in range(width):
            x = lat[e]
            for h in range(n_head):
                acc[h] += qt[e, h] * x
        for h in range(n_head):
            sc[h, j] = acc[h]


@njit(cache=True, nogil=True, inline="always", error_model="numpy")
def _probabilities(sc, hi, scale, f16):  # noqa: ANN001, ANN202
    """Each head's scores sc[h, :hi+1] times ``scale`` -> its softmax, as ggml's soft_max
    (ggml's exp, the AVX2 float64 sum), rounded to float16 with an F16 cache."""
    n = hi + 1
    for h in range(sc.shape[0]):
        sh = sc[h]
        for j in range(n):
            sh[j] = sh[j] * scale
        m = _max_of(sh, n)
        for j in range(n):
            sh[j] = expf_ggml(sh[j] - m)
        inv = np.float32(1.0 / _soft_max_sum(sh, 0, hi))
        for j in range(n):
            p = sh[j] * inv
            sh[j] = round_f16(p) if f16 else p


@njit(cache=True, nogil=True, inline="always", error_model="numpy")
def _weighted_latents(sc, cache, s, hi, lat, out):  # noqa: ANN001, ANN202
    """out[h] = sum over j of sc[h, j] x the latent of row j (its first out.shape[1]
    numbers), in position order, vectorized over the latent."""
    n_head, n_v = out.shape
    for h in range(n_head):
        for c in range(n_v):
            out[h, c] = 0.0
    for j in range(hi + 1):
        for c in range(n_v):
            lat[c] = kv_load(cache[s, j, c])
        for h in range(n_head):
            p = sc[h, j]
            for c in range(n_v):
                out[h, c] += p * lat[c]


@njit(cache=True, nogil=True, error_model="numpy")
def _attend_row(q, cache, slot, pos, scale, f16, out, t):  # noqa: ANN001, ANN202
    """Query row t: q[t] (H, width) over its sequence's rows 0..pos[t] -> out[t] (H, n_v)."""
    s, hi = slot[t], pos[t]
    n_head, width = q.shape[1], q.shape[2]
    qt = np.empty((width, n_head), np.float32)
    for h in range(n_head):
        for e in range(width):
            x = q[t, h, e]
            qt[e, h] = to_f16(x) if f16 else x
    lat = np.empty(width, np.float32)
    acc = np.empty(n_head, np.float32)
    sc = np.empty((n_head, hi + 1), np.float32)
    _scores(qt, cache, s, hi, lat, acc, sc)
    _probabilities(sc, hi, scale, f16)
    _weighted_latents(sc, cache, s, hi, lat, out[t])


@njit(cache=True, nogil=True, error_model="numpy")
def _attend_serial(q, cache, slot, pos, scale, f16, out):  # noqa: ANN001, ANN202
    for t in range(q.shape[0]):
        _attend_row(q, cache, slot, pos, scale, f16, out, t)


@njit(cache=True, nogil=True, parallel=True, error_model="numpy")
def _attend_par(q, cache, slot, pos, scale, f16, out):  # noqa: ANN001, ANN202
    n = q.shape[0]
    for i in prange(n):
        # first, last, second, ...: later rows of a prompt attend over more positions
        row = i // 2 if i % 2 == 0 else n - 1 - i // 2
        _attend_row(q, cache, slot, pos, scale, f16, out, np.int64(row))


def attend_latent(q: np.ndarray, cache: np.ndarray, slot: np.ndarray, pos: np.ndarray,
                  scale: float, f16: bool, n_v: int, rows: np.ndarray) -> np.ndarray:
    """Store ``rows`` (T, width) f32, the batch's own latent rows, in ``cache`` (S, n_ctx,
    width) at (slot, pos), then attend: queries q (T, H, width) over each row's sequence,
    positions 0..pos[t] (causal) -> (T, H, n_v) f32, the weighted sums of the cached
    rows' first n_v numbers (the latent)."""
    store_latent(cache, slot, pos, np.ascontiguousarray(rows, np.float32))
    q = np.ascontiguousarray(q, np.float32)
    out = np.empty((len(q), q.shape[1], n_v), np.float32)
    work = q.shape[0] * q.shape[1] * (int(pos.max()) + 1) * (q.shape[2] + n_v)
    fn = _attend_par if runs_parallel(len(q), 1, work) else _attend_serial
    fn(q, cache, slot, pos, np.float32(scale), bool(f16), out)
    return out


@njit(cache=True, nogil=True)
def heads_product(kinds, ptrs, shape, x, tbl, threads):  # noqa: ANN001, ANN201
    """x (T, H, K) f32 -> (T, H, rows) f32: head h's rows times its matrix, every head in
    one ``expert_products_kernel`` call (each head an expert that every row chose, its T
    rows together); ``kinds``, ``ptrs``, ``shape`` an ``ExpertWeights``' (the shape as an
    i64 array), ``threads`` as ``expert_products.threads_for`` gives them."""
    n, n_head = x.shape[0], x.shape[1]
    slots = np.empty((n_head * n, x.shape[2]), np.float32)
    for h in range(n_head):
        slots[h * n:(h + 1) * n] = x[:, h]
    out = np.empty((1, n_head * n, shape[0]), np.float32)
    expert_products_kernel(kinds, ptrs, shape, slots, np.arange(n_head),
                           np.arange(n_head + 1) * n, tbl, out, threads)
    res = np.empty((n, n_head, shape[0]), np.float32)
    for h in range(n_head):
        res[:, h] = out[0, h * n:(h + 1) * n]
    return res


def heads_args(every: ExpertWeights) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(type ids, addresses, shape as i64) of every head's matrices, as ``heads_product``
    takes them, their row kernels made ready (once: a model's layers keep the tuple)."""
    prepare([int(k) for k in every.kinds])
    return every.kinds, every.ptrs, np.array(every.shape, np.int64)


def per_head(mats: tuple[QMatrix, ...], every: ExpertWeights, x: np.ndarray) -> np.ndarray:
    """x (T, H, K) -> (T, H, rows): head h's rows times ``mats[h]``. One kernel call for
    every head (``heads_product``) where the weights allow (``every`` usable), else head
    by head; each row's numbers are ``mats[h].matmul``'s of that row alone either way."""
    if not every.usable:
        return np.stack([m.matmul(np.ascontiguousarray(x[:, h])) for h, m in enumerate(mats)],
                        axis=1)
    x = np.ascontiguousarray(x, np.float32)
    return heads_product(*heads_args(every), x, F16_TABLE,
                         threads_for(x.shape[0] * x.shape[1] * every.rows * every.d_in))


def queries(h: np.ndarray, a: LatentAttention, eps: float, q_a: np.ndarray | None
            ) -> np.ndarray:
    """The query heads (T, H, nope + n_rot) of the normed input h: ``q_b`` of the
    RMS-normed ``q_a`` product (given: computed beside ``kv_a``), or of h itself."""
    x = h if a.q_a is None else ops.rmsnorm(q_a, a.q_a_norm, eps)
    return ops.linear(x, a.q_b.w, a.q_b.b).reshape(len(h), a.n_head, a.nope + a.n_rot)


def forward(h: np.ndarray, a: LatentAttention, batch: object, il: int, rot: np.ndarray,
            eps: float) -> np.ndarray:
    """Normed input h (T, n_embd) -> (T, n_embd), storing this batch's latent rows in layer
    ``il`` of each row's cache; ``rot`` the RoPE table of the rows' positions."""
    n, lora = len(h), a.kv_lora
    lins = (a.kv_a,) if a.q_a is None else (a.kv_a, a.q_a)
    products = ops.linears(h, lins)  # one kernel call where the types allow
    kv = products[0]
    q = queries(h, a, eps, products[-1] if a.q_a is not None else None)
    rope = ops.rope_neox if a.neox else ops.rope_norm
    latent = ops.rmsnorm(kv[:, :lora], a.kv_a_norm, eps)
    k_pe = rope(kv[:, None, lora:], rot)[:, 0]
    q_pe = rope(q[:, :, a.nope:], rot)
    absorbed = np.empty((n, a.n_head, lora + a.n_rot), np.float32)
    absorbed[:, :, :lora] = per_head(a.k_b, a.k_b_all, q[:, :, :a.nope])  # into the latent
    absorbed[:, :, lora:] = q_pe
    arena = batch.arena
    o = attend_latent(absorbed, arena.k[il], batch.slot, batch.pos, a.scale, arena.f16, lora,
                      np.concatenate([latent, k_pe], axis=1))
    heads = per_head(a.v_b, a.v_b_all, o)  # each head's latent sum out through its v_b
    return ops.linear(heads.reshape(n, -1), a.o.w, a.o.b)
