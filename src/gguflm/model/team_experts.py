"""The team's mixture-of-experts FFN: in a model whose every layer's FFN is experts
(qwen3moe, Mixtral, OLMoE...), a decoded token's router, choice and chosen experts run
inside the one team call (``team._member``) instead of a compiled call and two parallel
regions a layer (``fused_experts.moe_step``).

The members share the router's rows (F32, read from memory: ``ROUTER_ROWS`` a work item),
then each computes the softmax, the choice and the rows' grouping by expert itself, into
its own arrays, and quantizes the slots' rows; then it takes the chosen experts' gate and
up row ranges (``expert_products.expert_items``) from the step's shared counter until none
is left, and waits for the others' (``spin.wait``); the gated activation, then the downs
likewise; then each sums its rows' experts in selection order. The numbers are
``moe_step``'s element for element: the same kernels on the same rows, each step computed
as it computes it.
"""

from __future__ import annotations

from numba import njit

from gguflm.quant.act_quant import activation_sets
from gguflm.quant.expert_products import expert_item, expert_items
from gguflm.quant.floatdot import f32_matmul_serial

from .fused import add_bias, glu
from .fused_experts import by_expert, choose, slot_rows, softmax_rows, weighted_sum
from .spin import LINE, fetch_add, wait

ROUTER_ROWS = 8  # router rows per work item


@njit(cache=True, nogil=True)
def _route(h, router, rbias, sbias, choice, scale, shared, sync, k):  # noqa: ANN001, ANN202, PLR0913
    """h (T, n_embd) f32 -> (chosen (T, n_used) i64, weights (T, n_used) f32) as
    ``fused_experts.moe_route`` and ``_choose_up`` choose them (an F32 router): the
    router's rows taken ROUTER_ROWS at a time from step ``k``'s counter into the shared
    logits (T, n_expert), then each member's choice from its own copy."""
    n_expert = router.shape[0]
    total = (n_expert + ROUTER_ROWS - 1) // ROUTER_ROWS
    c = fetch_add(sync, k)
    while c < total:
        r0, r1 = c * ROUTER_ROWS, min(n_expert, (c + 1) * ROUTER_ROWS)
        f32_matmul_serial(h, router[r0:r1], shared[:, r0:r1])
        fetch_add(sync, k + LINE)
        c = fetch_add(sync, k)
    wait(sync, k, total)
    logits = shared.copy()
    add_bias(logits, rbias)
    gating, n_used, groups, groups_used, norm = choice
    scores = softmax_rows(logits) if gating == 0 else logits
    return choose(scores, sbias, gating, n_used, groups, groups_used, norm == 1, scale)


@njit(cache=True, nogil=True)
def _shared_products(kinds, ptrs, shape, x, experts, starts, tbl, out, sync, k, members):  # noqa: ANN001, ANN202, PLR0913
    """``expert_products`` of the slots' rows x (S, K) f32 into the shared ``out`` (M, S,
    rows) f32, its row ranges taken from step ``k``'s counter, then waiting for the
    others' items."""
    a32, ak = activation_sets(kinds, kinds.shape[0], x)
    items = expert_items(kinds.shape[0], shape[0], starts, 4 * members)
    total = items.shape[0]
    c = fetch_add(sync, k)
    while c < total:
        expert_item(kinds, ptrs, shape, experts, starts, a32, ak, tbl, out, items, c)
        fetch_add(sync, k + LINE)
        c = fetch_add(sync, k)
    wait(sync, k, total)


@njit(cache=True, nogil=True)
def expert_ffn(h, router, rbias, sbias, choice, scale, mats, act, gelu_tbl, tbl, gu_flat,  # noqa: ANN001, ANN201, PLR0913
               logits, d_flat, sync, steps, members):
    """Normed input h (T, n_embd) f32 -> (T, n_embd) f32, this member's own: each row's
    chosen experts weighted and summed in selection order (``fused_experts.weighted_sum``).
    ``router`` (n_expert, n_embd) f32 and its bias (or empty); ``sbias`` the selection
    bias (or empty); ``choice`` (``fused_experts.choice_of``, as ints) and ``scale`` as
    ``fused_experts.choose`` takes them; ``mats`` the gates' and ups' (type
    ids (2,), addresses (2, n_expert), shape (2,)) then the downs' likewise; ``act`` as
    ``fused.glu``; ``gu_flat``, ``logits``, ``d_flat`` the layer's shared arrays for the
    gates and ups (2 S n_ff floats), the router's logits (T, n_expert) and the downs (S
    n_embd), S = T n_used; ``steps`` the router's, the gates and ups' and the downs' counters
    in ``sync``, shared by ``members``."""
    n_embd = h.shape[1]
    k_route, k_up, k_down = steps
    chosen, w = _route(h, router, rbias, sbias, choice, scale, logits, sync, k_route)
    experts, starts, rows, slots = by_expert(chosen, router.shape[0])
    n_s = rows.shape[0]
    xs, at = slot_rows(h, rows, slots, w.shape[1])
    kinds_gu, ptrs_gu, shape_gu, kinds_d, ptrs_d, shape_d = mats
    gu = gu_flat.reshape((2, n_s, shape_gu[0]))
    _shared_products(kinds_gu, ptrs_gu, shape_gu, xs, experts, starts, tbl, gu, sync, k_up,
                     members)
    a = glu(gu[0], gu[1], act, gelu_tbl)
    d = d_flat.reshape((1, n_s, n_embd))
    _shared_products(kinds_d, ptrs_d, shape_d, a, experts, starts, tbl, d, sync, k_down,
                     members)
    return weighted_sum(d[0], at, w)
