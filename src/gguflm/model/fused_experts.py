"""A mixture-of-experts FFN (``layer.Experts``, llama.cpp's build_moe_ffn) as one compiled
call a layer: the pre-norm, the router product, the scores, the choice of each row's
experts and their weights, the rows grouped by expert, every chosen expert's gate and up in
one product call and their downs in another (``expert_products``; F16 experts through the
float kernel), the biases, the gated activation, the weighted sum in selection order, the
shared expert and the post norm.

``reference.experts`` runs the same steps op by op (about fifteen Python-level steps a
layer, each a numpy temporary or a kernel's dispatch: what a decoded token paid); here
each step computes its numbers as the reference path's does, element for element:

- the softmax as ``reference._softmax``: ``floatbits.expf_ggml`` of each logit less the
  row's max, the sum in float64 in numpy's pairwise order (``pairwise_sum``), its inverse
  rounded to float32 once;
- the top ``n_used`` as ``argsort(-ranked, kind="stable")``: the best first, ties the lower
  index (NaN last); the grouped selection as ``reference.best_groups``; the weights'
  renormalising sum in numpy's pairwise float32 order;
- the products through the kernels the reference path's calls run (the same numbers
  whatever rows share a call), the rows of each expert ascending.

Three numpy steps stay numpy's, their compiled exp being another function, and the call
splits around them: a sigmoid gating's scores (``moe_route``, numpy, ``moe_experts``),
gpt-oss's clamped SwiGLU (``moe_front``, ``reference.swiglu_oai``, ``moe_back``), and a
shared expert's sigmoid gate (added after the call, ``reference.gated_shared``, then the
post norm). A sigmoid gating beside the clamped SwiGLU (no such model) stays on the
reference path (``executor._experts_refused``).

A router may read its own input (Gemma 4's ``router_in_norm``): the FFN's input RMS-normed
without a weight, scaled, times that weight, in the call (``router_input``). Gemma 4's MoE
layers, a dense GLU beside the experts (``layer.DenseAndExperts``), run as one call too
(``dense_moe_step``: ``fused.glu_ffn``'s dense branch and its post norm, ``moe_step``'s
experts behind their own pre-norm and post norm, the sum and the block's post norm).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import njit, prange, types

from gguflm.gguf.types import GGMLType
from gguflm.quant import kernels, matrix
from gguflm.quant.expert_products import expert_items, expert_products_kernel
from gguflm.quant.float_tiles import f16_matmul_rows, rounded_f16
from gguflm.quant.floatbits import expf_ggml
from gguflm.quant.floatdot import f32_matmul_par, f32_matmul_serial
from gguflm.quant.int_tiles import prepare
from gguflm.quant.vector_ir import array_view

from . import ops, reference
from .fused import (
    GLU_ACTS,
    Group,
    add_bias,
    glu,
    glu_ffn,
    group,
    pre_norm,
    products,
    vector,
)
from .layer import DenseAndExperts, Experts
from .rowkernels import rmsnorm_rows

_NONE = vector(None)
_u16_view = array_view(types.uint16, 2, "C", readonly=True)
GATING = {"softmax": 0, "sigmoid": 1, "softmax_weight": 2}  # ``moe_experts``'s ``gating``
# the experts' activations: ``glu``'s, and gpt-oss's clamped SwiGLU between two calls
ACTS = {**GLU_ACTS, "swiglu_oai": 3}
_CLAMP = np.float32(6.103515625e-5)  # 2^-14: the renormalising sum's floor (ggml's)


@njit(cache=True, nogil=True, inline="always")
def _block_sum(a, lo, n):  # noqa: ANN001, ANN202
    """numpy's pairwise_sum of a[lo:lo + n] for n <= 128: in order below 8 values, else 8
    interleaved partial sums folded in a fixed tree, then the rest in order."""
    if n < 8:
        res = np.zeros_like(a[:1])[0]  # +0 first, as numpy's
        for i in range(n):
            res += a[lo + i]
        return res
    r0, r1, r2, r3 = a[lo], a[lo + 1], a[lo + 2], a[lo + 3]
    r4, r5, r6, r7 = a[lo + 4], a[lo + 5], a[lo + 6], a[lo + 7]
    i = 8
    while i < n - n % 8:
        r0 += a[lo + i]
        r1 += a[lo + i + 1]
        r2 += a[lo + i + 2]
        r3 += a[lo + i + 3]
        r4 += a[lo + i + 4]
        r5 += a[lo + i + 5]
        r6 += a[lo + i + 6]
        r7 += a[lo + i + 7]
        i += 8
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < n:
        res += a[lo + i]
        i += 1
    return res


@njit(cache=True, nogil=True)
def pairwise_sum(a, lo, n):  # noqa: ANN001, ANN201
    """a[lo:lo + n] (1-D f32 or f64) summed in a's type as numpy's ``sum`` sums a row:
    ``_block_sum`` up to 128 values, else the sums of two halves (the first cut at a
    multiple of 8) added. (Without recursion: a cached recursive function crashed numba
    when loaded from its cache.)"""
    if n <= 128:
        return _block_sum(a, lo, n)
    f_lo = np.empty(64, np.int64)  # frames (lo, n, stage) of the recursion, unrolled
    f_n = np.empty(64, np.int64)
    f_st = np.zeros(64, np.int64)
    vals = np.empty(64, a.dtype)
    top, nv = 0, 0
    f_lo[0], f_n[0], f_st[0] = lo, n, 0
    while top >= 0:
        m = f_n[top]
        n2 = m // 2 - (m // 2) % 8
        if m <= 128:
            vals[nv] = _block_sum(a, f_lo[top], m)
            nv += 1
            top -= 1
        elif f_st[top] == 0:
            f_st[top] = 1
            top += 1
            f_lo[top], f_n[top], f_st[top] = f_lo[top - 1], n2, 0
        elif f_st[top] == 1:
            f_st[top] = 2
            top += 1
            f_lo[top], f_n[top], f_st[top] = f_lo[top - 1] + n2, m - n2, 0
        else:
            vals[nv - 2] = vals[nv - 2] + vals[nv - 1]
            nv -= 1
            top -= 1
    return vals[0]


@njit(cache=True, nogil=True)
def softmax_rows(x):  # noqa: ANN001, ANN201
    """x (T, n) f32 -> (T, n) f32: each row's softmax as ``reference._softmax``."""
    out = np.empty_like(x)
    ex = np.empty(x.shape[1], np.float64)
    for t in range(x.shape[0]):
        m = x[t, 0]
        for j in range(1, x.shape[1]):
            m = max(m, x[t, j])
        for j in range(x.shape[1]):
            e = expf_ggml(np.float32(x[t, j] - m))
            out[t, j] = e
            ex[j] = e
        inv = np.float32(1.0 / pairwise_sum(ex, 0, x.shape[1]))
        for j in range(x.shape[1]):
            out[t, j] = out[t, j] * inv
    return out


@njit(cache=True, nogil=True, inline="always")
def _before(a, b):  # noqa: ANN001, ANN202
    """Whether value a ranks before b in ``argsort(-ranked)``: larger first, NaN last."""
    return -a < -b or (b != b and a == a)


@njit(cache=True, nogil=True)
def best(values, k, out):  # noqa: ANN001, ANN201
    """out[:k] = ``np.argsort(-values, kind="stable")[:k]`` of values (n,) f32."""
    taken = np.zeros(values.shape[0], np.bool_)
    for j in range(k):
        pick = -1
        for i in range(values.shape[0]):
            if not taken[i] and (pick < 0 or _before(values[i], values[pick])):
                pick = i
        taken[pick] = True
        out[j] = pick


@njit(cache=True, nogil=True)
def best_groups(ranked, groups, used):  # noqa: ANN001, ANN201
    """``reference.best_groups`` of ranked (T, E) f32, in place."""
    size = ranked.shape[1] // groups
    score = np.empty(groups, np.float32)
    kept = np.zeros(used, np.int64)
    keep = np.zeros(groups, np.bool_)
    for t in range(ranked.shape[0]):
        for g in range(groups):
            a = b = np.float32(-np.inf)
            for i in range(g * size, (g + 1) * size):
                v = ranked[t, i]
                if v > a:
                    b = a
                    a = v
                elif v > b:
                    b = v
            score[g] = a + b if size > 1 else a
        best(score, used, kept)
        keep[:] = False
        for g in kept:
            keep[g] = True
        for g in range(groups):
            if not keep[g]:
                ranked[t, g * size:(g + 1) * size] = -np.inf


@njit(cache=True, nogil=True)
def choose(scores, select_bias, gating, n_used, groups, groups_used, norm, scale):  # noqa: ANN001, ANN201, PLR0913
    """``reference.expert_choice`` from the scores (T, n_expert) f32 (the logits for a
    softmax_weight gating) -> (chosen (T, n_used) i64, weights (T, n_used) f32):
    ``select_bias`` (n_expert,) f32 or empty, ``groups``/``groups_used`` (0: none),
    ``norm`` whether the weights are renormalised, ``scale`` (1: none)."""
    ranked = scores.copy()
    if select_bias.shape[0]:
        for t in range(ranked.shape[0]):
            for i in range(ranked.shape[1]):
                ranked[t, i] = scores[t, i] + select_bias[i]
    if groups > 1:
        best_groups(ranked, groups, groups_used)
    n = scores.shape[0]
    chosen = np.empty((n, n_used), np.int64)
    w = np.empty((n, n_used), np.float32)
    for t in range(n):
        best(ranked[t], n_used, chosen[t])
        for j in range(n_used):
            w[t, j] = scores[t, chosen[t, j]]
    if gating == 2:
        w = softmax_rows(w)
    for t in range(n):
        if norm:
            s = pairwise_sum(w[t], 0, n_used)
            d = s if s >= _CLAMP or s != s else _CLAMP
            for j in range(n_used):
                w[t, j] = w[t, j] / d
        if scale != np.float32(1.0):
            for j in range(n_used):
                w[t, j] = w[t, j] * scale
    return chosen, w


@njit(cache=True, nogil=True)
def by_expert(chosen, n_expert):  # noqa: ANN001, ANN201
    """``reference._by_expert`` of chosen (T, n_used) i64 as arrays: (experts (G,)
    ascending, starts (G + 1,), rows (S,), slots (S,)), each expert's rows ascending."""
    count = np.zeros(n_expert, np.int64)
    for ex in chosen.ravel():
        count[ex] += 1
    g = 0
    for ex in range(n_expert):
        g += count[ex] > 0
    experts = np.empty(g, np.int64)
    starts = np.zeros(g + 1, np.int64)
    at = np.empty(n_expert, np.int64)
    g = 0
    for ex in range(n_expert):
        if count[ex]:
            experts[g] = ex
            at[ex] = starts[g]
            starts[g + 1] = starts[g] + count[ex]
            g += 1
    rows = np.empty(chosen.size, np.int64)
    slots = np.empty(chosen.size, np.int64)
    for t in range(chosen.shape[0]):
        for j in range(chosen.shape[1]):
            p = at[chosen[t, j]]
            rows[p] = t
            slots[p] = j
            at[chosen[t, j]] = p + 1
    return experts, starts, rows, slots


@njit(cache=True, nogil=True, parallel=True)
def _f16_run_par(ptrs, shape, experts, starts, xh, out, items):  # noqa: ANN001, ANN202
    # item c: rows r0:r1 of matrix m of expert experts[g] (shape) fp16 @ its group's rows
    for c in prange(items.shape[0]):
        m, g = items[c, 0], items[c, 1]
        w = _u16_view(ptrs[m, experts[g]], (shape[0], shape[1]), (2 * shape[1], 2))
        s0, s1 = starts[g], starts[g + 1]
        f16_matmul_rows(w, xh[s0:s1], out[m, s0:s1], items[c, 2], items[c, 3])


@njit(cache=True, nogil=True, inline="always")
def _add_rows(y, b, of_slot):  # noqa: ANN001, ANN202
    """y (S, F) += b[of_slot[s]] each row s (b (n_expert, F) f32; no rows: none)."""
    if b.shape[0]:
        for s in range(y.shape[0]):
            for i in range(y.shape[1]):
                y[s, i] += b[of_slot[s], i]


@njit(cache=True, nogil=True)
def expert_products(f16, kinds, ptrs, shape, x, experts, starts, tbl, out, threads):  # noqa: ANN001, ANN201, PLR0913
    """``expert_products.expert_products_kernel`` (``f16`` False) or the same for F16 experts
    (``ptrs`` each expert's (rows, K) fp16 bits, ``shape`` (rows, K)): x rounded to
    float16 once, each element as ``QMatrix.matmul``'s float kernel gives it."""
    if x.shape[0] == 0:  # no rows: nothing to share out
        return
    if not f16:
        expert_products_kernel(kinds, ptrs, shape, x, experts, starts, tbl, out, threads)
        return
    _f16_run_par(ptrs, shape, experts, starts, rounded_f16(x), out,
                 expert_items(kinds.shape[0], shape[0], starts, threads))


@njit(cache=True, nogil=True)
def experts_up(h, chosen, n_expert, mats, biases, tbl, threads):  # noqa: ANN001, ANN201, PLR0913
    """The first half of ``reference._experts_at_once``: h (T, n_embd) f32's rows grouped
    by their chosen experts (T, n_used) i64 (``by_expert``) through those experts' gates
    and ups, plus their biases -> ((2, S, n_ff) f32 a row per slot, the grouping
    (experts, starts, each row's slot of its j-th choice (``slot_rows``), each slot's
    expert)). ``mats`` (f16, type ids,
    addresses, shape) of the gates and ups, then of the downs (``expert_products``);
    ``biases`` the gate's, up's, down's (n_expert, rows) f32 and the down scale
    (n_expert,) f32, each empty for none."""
    experts, starts, rows, slots = by_expert(chosen, n_expert)
    xs, at = slot_rows(h, rows, slots, chosen.shape[1])
    n_s = rows.shape[0]
    of_slot = np.empty(n_s, np.int64)  # each slot's expert
    for g in range(experts.shape[0]):
        of_slot[starts[g]:starts[g + 1]] = experts[g]
    f16, kinds, ptrs, shape = mats[0], mats[1], mats[2], mats[3]
    gu = np.empty((2, n_s, shape[0]), np.float32)
    expert_products(f16, kinds, ptrs, shape, xs, experts, starts, tbl, gu, threads)
    _add_rows(gu[0], biases[0], of_slot)
    _add_rows(gu[1], biases[1], of_slot)
    return gu, (experts, starts, at, of_slot)


@njit(cache=True, nogil=True)
def experts_down(a, grouping, mats, biases, tbl, threads):  # noqa: ANN001, ANN201, PLR0913
    """The second half: the gated activations a (S, n_ff) f32 through the downs, times
    the down scale, plus the bias -> (S, n_embd) f32 a row per slot (``experts_up``'s
    ``grouping``, ``mats``, ``biases``)."""
    experts, starts, _, of_slot = grouping
    f16, kinds, ptrs, shape = mats[4], mats[5], mats[6], mats[7]
    d = np.empty((1, a.shape[0], shape[0]), np.float32)
    expert_products(f16, kinds, ptrs, shape, a, experts, starts, tbl, d, threads)
    y = d[0]
    scale = biases[3]
    if scale.shape[0]:
        for s in range(y.shape[0]):
            for i in range(y.shape[1]):
                y[s, i] = y[s, i] * scale[of_slot[s]]
    _add_rows(y, biases[2], of_slot)
    return y


@njit(cache=True, nogil=True, inline="always")
def slot_rows(h, rows, slots, n_used):  # noqa: ANN001, ANN201
    """(h's row of each slot (S, n_embd) f32, each row's slot of its j-th choice (T,
    n_used) i64) from ``by_expert``'s rows and slots."""
    xs = np.empty((rows.shape[0], h.shape[1]), np.float32)
    at = np.empty((h.shape[0], n_used), np.int64)
    for s in range(rows.shape[0]):
        xs[s] = h[rows[s]]
        at[rows[s], slots[s]] = s
    return xs, at


@njit(cache=True, nogil=True, inline="always")
def weighted_sum(y, at, w):  # noqa: ANN001, ANN201
    """(T, n_embd) f32: each row's experts' outputs y[at[t, j]] (y (S, n_embd) f32) times
    their weights w (T, n_used) f32, added in selection order, each product rounded (numpy's
    order)."""
    n, n_used = w.shape
    out = np.empty((n, y.shape[1]), np.float32)
    for t in range(n):
        s0 = at[t, 0]
        for i in range(y.shape[1]):
            out[t, i] = y[s0, i] * w[t, 0]
        for j in range(1, n_used):
            s = at[t, j]
            for i in range(y.shape[1]):
                out[t, i] = out[t, i] + y[s, i] * w[t, j]
    return out


@njit(cache=True, nogil=True)
def _finish(h, y, at, w, shared, post_norm, eps, gelu_tbl, tbl, threads):  # noqa: ANN001, ANN202, PLR0913
    """The weighted sum of the slots' outputs y (S, n_embd) by w (T, n_used)
    (``weighted_sum``), the shared expert and the post norm, as ``moe_experts`` says."""
    out = weighted_sum(y, at, w)
    n, n_embd = out.shape
    kind, sh_act, sh_gu, sh_d, sh_par = shared
    y = h[:0]
    if kind:
        y = shared_ffn(h, sh_gu, sh_d, sh_act, gelu_tbl, tbl, sh_par, threads)
    if kind == 1:
        for t in range(n):
            for i in range(n_embd):
                out[t, i] = out[t, i] + y[t, i]
    if post_norm.shape[0]:
        rmsnorm_rows(out, post_norm, eps, out)
    return out, y


@njit(cache=True, nogil=True)
def shared_ffn(h, gu, d, act, gelu_tbl, tbl, par, threads):  # noqa: ANN001, ANN201, PLR0913
    """``reference.ffn`` of the shared expert: ``gu`` (type ids, weights, gate bias, up
    bias) of its gate and up as ``fused.ffn_step`` takes them, ``d`` (type ids, weights,
    bias) of its down; ``par`` whether each runs on ``threads`` threads."""
    return glu_ffn(h, gu[0], gu[1], d[0], d[1], tbl, act, gelu_tbl, d[2][:0], np.float32(0.0),
                   par[0], par[1], threads, gu[2], gu[3], d[2])


@njit(cache=True, nogil=True, inline="always")
def router_input(x, h, in_norm, in_scale, eps):  # noqa: ANN001, ANN201
    """What the router reads, as ``reference.router_input``: the experts' normed input h
    (T, n_embd) f32, or, for ``in_norm`` (n_embd,) f32 not empty, the FFN's input x RMS-normed
    with ones (ggml's weightless rms_norm: ``ops.rmsnorm``'s kernel), times ``in_scale``
    f32, times ``in_norm``: two rounded products, left to right, as numpy's."""
    if not in_norm.shape[0]:
        return h
    r = np.empty_like(x)
    rmsnorm_rows(x, np.ones(x.shape[1], np.float32), eps, r)
    for t in range(r.shape[0]):
        for i in range(r.shape[1]):
            r[t, i] = (r[t, i] * in_scale) * in_norm[i]
    return r


@njit(cache=True, nogil=True)
def moe_route(x, norm_w, eps, router, tbl, par, threads):  # noqa: ANN001, ANN201
    """x (T, n_embd) f32 -> (h: x pre-normed as ``fused.pre_norm``, the router's logits
    (T, n_expert) f32). ``router`` (w32, type ids, weights, bias, in_norm, in_scale): an F32
    router's (n_expert, n_embd) f32 weight (``floatdot``'s fixed order), or no rows and its
    compiled product's type ids and weights (``kernels.pad_products``); its bias
    (n_expert,) f32 or empty; what it reads as ``router_input`` takes it."""
    h = np.empty_like(x)
    pre_norm(x, norm_w, eps, h)
    w32, kinds, ws, b, in_norm, in_scale = router
    r = router_input(x, h, in_norm, in_scale, eps)
    if w32.shape[0]:
        logits = np.empty((x.shape[0], w32.shape[0]), np.float32)
        if par:
            f32_matmul_par(r, w32, logits)
        else:
            f32_matmul_serial(r, w32, logits)
    else:
        logits = np.empty((x.shape[0], ws[0].shape[0]), np.float32)
        products(kinds, ws, r, tbl, (logits, logits, logits), 1, par, threads)
    add_bias(logits, b)
    return h, logits


@njit(cache=True, nogil=True)
def moe_experts(h, scores, choice, select_bias, scale, mats, biases, act, shared, post_norm,  # noqa: ANN001, ANN201, PLR0913
                eps, gelu_tbl, tbl, threads):
    """The experts of h (T, n_embd) f32 from the router's scores (T, n_expert) f32 (its
    logits but for a sigmoid gating) -> (the FFN's output (T, n_embd) f32, the shared
    expert's (T, n_embd) f32 where it is left to the caller, else no rows).
    ``choice`` (gating (``GATING``), n_used, groups, groups used, renormalise) and
    ``select_bias``, ``scale`` as ``choose`` takes them; ``mats``, ``biases`` as
    ``experts_up``, ``act`` as ``glu``; ``shared`` (0 none, 1 added here, 2 returned;
    act, gate/up, down, par) as ``shared_ffn``; ``post_norm`` (n_embd,) f32 or empty:
    the output RMS-normed times it."""
    w, gu, grouping = _choose_up(h, scores, choice, select_bias, scale, mats, biases, tbl,
                                 threads)
    y = experts_down(glu(gu[0], gu[1], act, gelu_tbl), grouping, mats, biases, tbl, threads)
    return _finish(h, y, grouping[2], w, shared, post_norm, eps, gelu_tbl, tbl, threads)


@njit(cache=True, nogil=True, inline="always")
def _choose_up(h, scores, choice, select_bias, scale, mats, biases, tbl, threads):  # noqa: ANN001, ANN202, PLR0913
    """The experts' choice from the router's scores (its logits but for a sigmoid gating:
    a softmax gating's softmax here), then ``experts_up``: (the weights, the gates and ups,
    the grouping)."""
    gating, n_used, groups, groups_used, norm = choice
    if gating == 0:
        scores = softmax_rows(scores)
    chosen, w = choose(scores, select_bias, gating, n_used, groups, groups_used, norm, scale)
    gu, grouping = experts_up(h, chosen, scores.shape[1], mats, biases, tbl, threads)
    return w, gu, grouping


@njit(cache=True, nogil=True)
def moe_front(x, norm_w, eps, router, par, choice, select_bias, scale, mats, biases, tbl,  # noqa: ANN001, ANN201, PLR0913
              threads):
    """``moe_step`` up to the gated activation (gpt-oss's clamped SwiGLU, numpy's exp,
    comes between): (h, the weights, the gates and ups (2, S, n_ff), the grouping) as
    ``experts_up`` gives them."""
    h, logits = moe_route(x, norm_w, eps, router, tbl, par, threads)
    w, gu, grouping = _choose_up(h, logits, choice, select_bias, scale, mats, biases, tbl,
                                 threads)
    return h, w, gu, grouping


@njit(cache=True, nogil=True)
def moe_back(h, w, a, grouping, mats, biases, shared, post_norm, eps, gelu_tbl, tbl,  # noqa: ANN001, ANN201, PLR0913
             threads):
    """The rest of ``moe_step`` from the gated activations a (S, n_ff) f32: the downs,
    the weighted sum, the shared expert, the post norm -> as ``moe_experts``."""
    y = experts_down(a, grouping, mats, biases, tbl, threads)
    return _finish(h, y, grouping[2], w, shared, post_norm, eps, gelu_tbl, tbl, threads)


@njit(cache=True, nogil=True)
def moe_step(x, norm_w, eps, router, par, choice, select_bias, scale, mats, biases, act,  # noqa: ANN001, ANN201, PLR0913
             shared, post_norm, gelu_tbl, tbl, threads):
    """``moe_route`` then ``moe_experts`` (a gating without numpy's sigmoid) in one call:
    (the FFN's output, the shared expert's where returned, h)."""
    h, logits = moe_route(x, norm_w, eps, router, tbl, par, threads)
    out, y = moe_experts(h, logits, choice, select_bias, scale, mats, biases, act, shared,
                         post_norm, eps, gelu_tbl, tbl, threads)
    return out, y, h


def _empty2() -> np.ndarray:
    return kernels.read_only(np.zeros((0, 0), np.float32))


_Q8_0 = int(GGMLType.Q8_0)
# a product group's place where there is none (the types its arguments must have)
_NO_WS = tuple(kernels.read_only(np.zeros((0, 34), np.uint8)) for _ in range(3))
_NO_KINDS = np.full(3, _Q8_0, np.int64)


def _matrices(all_w: Any, mats: tuple) -> tuple:
    """(f16, type ids, addresses, shape) of one ``expert_products`` call over ``mats`` (per
    matrix, every expert's ``QMatrix``): an ``ExpertWeights``' quantized ones, or F16
    experts' (rows, K) float16 weights (kept alive by the model's QMatrix)."""
    if all_w.usable:
        prepare(all_w.kinds)
        return (False, all_w.kinds, all_w.ptrs, np.array(all_w.shape, np.int64))
    ptrs = np.array([[m.raw.ctypes.data for m in ms] for ms in mats], np.int64)
    return (True, np.full(len(mats), int(GGMLType.F16), np.int64), ptrs,
            np.array(mats[0][0].shape, np.int64))


def _rows(b: np.ndarray | None) -> np.ndarray:
    return _empty2() if b is None else kernels.read_only(np.ascontiguousarray(b, np.float32))


@dataclass(frozen=True, eq=False)
class ExpertArgs:
    """What a layer's fused experts take from call to call (``executor`` checked they
    can: ``_experts_refused``)."""

    e: Experts
    norms: tuple[np.ndarray, np.ndarray]  # the FFN's pre-norm and post norm, or empty
    eps: np.float32
    router: tuple
    router_macs: int
    choice: tuple[int, int, int, int, bool]
    select_bias: np.ndarray
    scale: np.float32
    mats: tuple
    biases: tuple[np.ndarray, ...]
    act: int
    shared: Group | None
    shared_down: Group | None

    def run(self, x: np.ndarray) -> np.ndarray:
        """``run`` of x with these arguments."""
        return run(x, self)


def choice_of(e: Experts) -> tuple[int, int, int, int, bool]:
    """``choose``'s choice of ``e``: (gating (``GATING``), n_used, groups, groups used (0:
    no grouping), renormalise)."""
    groups = e.groups if e.groups > 1 else 0
    return (GATING[e.gating], e.n_used, groups, e.groups_used if groups else 0,
            bool(e.norm_weights))


def weights_scale(e: Experts) -> np.float32:
    """What ``choose`` multiplies the weights of ``e`` by (1: none)."""
    return np.float32(e.scale if e.scale not in (0.0, 1.0) else 1.0)


def expert_args(e: Experts, ffn_norm: np.ndarray | None, post_norm: np.ndarray | None,
                eps: float) -> ExpertArgs:
    """The ``ExpertArgs`` of experts ``e`` behind the norm ``ffn_norm`` and before
    ``post_norm``."""
    w = e.router.w
    reads = (vector(e.router_in_norm), np.float32(e.router_in_scale))
    if w.type == GGMLType.F32:
        router = (kernels.read_only(np.ascontiguousarray(w.raw, np.float32)), _NO_KINDS,
                  _NO_WS, vector(e.router.b), *reads)
    else:
        g = group((e.router,))
        router = (_empty2(), g.kinds, g.ws, g.biases[0], *reads)
    return ExpertArgs(
        e, (vector(ffn_norm), vector(post_norm)), np.float32(eps), router,
        w.shape[0] * w.shape[1], choice_of(e), vector(e.select_bias), weights_scale(e),
        _matrices(e.gate_up_all, (e.gate, e.up)) + _matrices(e.down_all, (e.down,)),
        (_rows(e.gate_b), _rows(e.up_b), _rows(e.down_b), vector(e.down_scale)),
        ACTS[e.act],
        None if e.shared is None else group((e.shared.gate, e.shared.up)),
        None if e.shared is None else group((e.shared.down,)))


def run(x: np.ndarray, ea: ExpertArgs) -> np.ndarray:
    """What the expert FFN adds to x (T, n_embd), as ``reference.ffn_part``: one compiled
    call (``moe_step``); two around numpy's step for gpt-oss's clamped SwiGLU
    (``moe_front``, ``moe_back``) or a sigmoid gating (``moe_route``, ``moe_experts``); a
    shared expert's sigmoid gate and the post norm after them."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    n = len(x)
    e = ea.e
    late = e.shared_gate is not None  # the shared expert's gate: numpy's sigmoid, after
    shared = _shared(ea, n)
    post = _NONE if late else ea.norms[1]
    par = n * ea.router_macs >= matrix.PARALLEL_MIN_MACS
    rest = (ea.choice, ea.select_bias, ea.scale, ea.mats, ea.biases, ea.act, shared, post)
    gelu, tbl, threads = ops.gelu_f16_table(), kernels.F16_TABLE, matrix.threads()
    if e.act == "swiglu_oai":  # (a sigmoid gating beside it: executor._experts_refused)
        h, w, gu, grouping = moe_front(x, ea.norms[0], ea.eps, ea.router, par, *rest[:5],
                                       tbl, threads)
        out, y = moe_back(h, w, reference.swiglu_oai(gu[0], gu[1]), grouping, ea.mats,
                          ea.biases, shared, post, ea.eps, gelu, tbl, threads)
    elif e.gating != "sigmoid":
        out, y, h = moe_step(x, ea.norms[0], ea.eps, ea.router, par, *rest, gelu, tbl, threads)
    else:
        h, logits = moe_route(x, ea.norms[0], ea.eps, ea.router, tbl, par, threads)
        out, y = moe_experts(h, reference.gate_scores(logits, e.gating), *rest, ea.eps,
                             gelu, tbl, threads)
    if not late:
        return out
    out = out + reference.gated_shared(y, h, e)
    return ops.rmsnorm(out, ea.norms[1], ea.eps) if ea.norms[1].shape[0] else out


def _shared(ea: ExpertArgs, n: int) -> tuple:
    """The shared expert's arguments for a batch of n rows, as ``moe_experts`` takes them
    (0: none; 1: added in the call; 2: returned, its sigmoid gate numpy's, after it)."""
    s_gu, s_d, lim = ea.shared, ea.shared_down, matrix.PARALLEL_MIN_MACS
    return (0 if s_gu is None else 2 if ea.e.shared_gate is not None else 1,
            GLU_ACTS[ea.e.shared.act] if s_gu else 0,
            (s_gu.kinds, s_gu.ws, *s_gu.biases) if s_gu else (_NO_KINDS, _NO_WS, _NONE, _NONE),
            (s_d.kinds, s_d.ws, s_d.biases[0]) if s_d else (_NO_KINDS, _NO_WS, _NONE),
            (bool(s_gu and n * s_gu.macs >= lim), bool(s_d and n * s_d.macs >= lim)))


# -- a dense FFN beside the experts (``layer.DenseAndExperts``: Gemma 4's MoE layers) ------


@njit(cache=True, nogil=True)
def dense_moe_step(x, dense, moe, post_norm, eps, gelu_tbl, tbl, threads):  # noqa: ANN001, ANN201
    """x (T, n_embd) f32 -> (T, n_embd) f32 as ``reference.ffn_part`` of a
    ``DenseAndExperts``: the dense GLU of x pre-normed, its post norm (``fused.ffn_step``'s
    steps: ``dense`` (norm, gate/up type ids and weights, down's, act, post norm, par
    gate/up, par down, gate, up and down biases)), plus the experts of x with their own
    pre-norm and post norm (``moe_step``: ``moe`` (norm, router, par, choice, select bias,
    scale, mats, biases, act, shared, post norm)), the sum RMS-normed times ``post_norm``
    (empty: none)."""
    d_norm, kinds_gu, ws_gu, kinds_d, ws_d, d_act, d_post, par_gu, par_d, bg, bu, bd = dense
    h = np.empty_like(x)
    pre_norm(x, d_norm, eps, h)
    y = glu_ffn(h, kinds_gu, ws_gu, kinds_d, ws_d, tbl, d_act, gelu_tbl, d_post, eps, par_gu,
                par_d, threads, bg, bu, bd)
    e_norm, router, par, choice, select_bias, scale, mats, biases, act, shared, e_post = moe
    out, _, _ = moe_step(x, e_norm, eps, router, par, choice, select_bias, scale, mats,
                         biases, act, shared, e_post, gelu_tbl, tbl, threads)
    for t in range(y.shape[0]):  # dense + experts, as numpy adds them
        for i in range(y.shape[1]):
            y[t, i] = y[t, i] + out[t, i]
    if post_norm.shape[0]:
        rmsnorm_rows(y, post_norm, eps, y)
    return y


@dataclass(frozen=True, eq=False)
class DenseExpertArgs:
    """What a layer's fused dense-beside-experts FFN takes from call to call (``executor``
    checked it can: the experts in one call, ``moe_step``, without a gated shared expert)."""

    experts: ExpertArgs  # behind their own pre-norm, before their own post norm
    gate_up: Group
    down: Group
    act: int
    norms: tuple[np.ndarray, np.ndarray, np.ndarray]  # the dense's pre, post; the block's post

    def run(self, x: np.ndarray) -> np.ndarray:
        """``run_dense`` of x with these arguments."""
        return run_dense(x, self)


def dense_expert_args(f: DenseAndExperts, ffn_norm: np.ndarray | None,
                      post_norm: np.ndarray | None, eps: float) -> DenseExpertArgs:
    """The ``DenseExpertArgs`` of ``f`` behind the block's ``ffn_norm`` (the dense's) and
    before its ``post_norm`` (the sum's)."""
    d = f.dense
    return DenseExpertArgs(expert_args(f.experts, f.experts_norm, f.experts_post_norm, eps),
                           group((d.gate, d.up)), group((d.down,)), GLU_ACTS[d.act],
                           (vector(ffn_norm), vector(f.dense_post_norm), vector(post_norm)))


def run_dense(x: np.ndarray, da: DenseExpertArgs) -> np.ndarray:
    """What the dense-beside-experts FFN adds to x (T, n_embd), as ``reference.ffn_part``:
    one compiled call (``dense_moe_step``)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    n, ea, lim = len(x), da.experts, matrix.PARALLEL_MIN_MACS
    gu, d = da.gate_up, da.down
    dense = (da.norms[0], gu.kinds, gu.ws, d.kinds, d.ws, da.act, da.norms[1],
             n * gu.macs >= lim, n * d.macs >= lim, *gu.biases, d.biases[0])
    moe = (ea.norms[0], ea.router, n * ea.router_macs >= lim, ea.choice, ea.select_bias,
           ea.scale, ea.mats, ea.biases, ea.act, _shared(ea, n), ea.norms[1])
    return dense_moe_step(x, dense, moe, da.norms[2], ea.eps, ops.gelu_f16_table(),
                          kernels.F16_TABLE, matrix.threads())
