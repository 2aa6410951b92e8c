"""The reference forward over the layer spec: plain numpy steps, one op at a time.

This is what a layer computes, written to be read (as mlx-lm's ``TransformerBlock``):
norm, attention, residual, norm, FFN, residual. The compiled executor (``executor.py``)
computes the same numbers bit for bit, with the same kernels for the products, norms,
RoPE and attention; tests hold the two together. The parts of a layer the planner cannot
compile run through here (``mixer_part``, ``ffn_part``, ``layer_end``), the others
compiled, and a model none of whose parts it can compile runs all its layers here; the
plan says so (``executor.plan``).
"""

from __future__ import annotations

import numpy as np

from ..quant.matrix import matmul_many
from . import ops
from .forward_pass import LAYER
from .layer import (
    GLU,
    Attention,
    Block,
    DeltaNet,
    DenseAndExperts,
    Experts,
    LatentAttention,
    Mamba2,
    ShortConv,
)


def attention(h: np.ndarray, a: Attention, batch: object, il: int, rot: np.ndarray,
              eps: float, rot_q: np.ndarray | None = None) -> np.ndarray:
    """Normed input h (T, n_embd) -> (T, n_embd), storing this batch's keys and values in
    layer ``il`` of each row's cache (``Batch.attention``), or, for a layer that shares
    another's (``kv_layer``), reading that layer's; ``eps`` the Q/K/V norms'; ``rot_q``
    the queries' RoPE table where it is not ``rot`` (``Attention.q_rope``)."""
    n = len(h)
    own_kv = a.kv_layer is None
    lins = (a.q,) if not own_kv else (a.q, a.k) if a.v is a.k else (a.q, a.k, a.v)
    fused = ops.linears(h, lins)  # one kernel call where the types allow
    q = fused[0].reshape(n, a.n_head, -1)
    if a.q_gate:  # per head: head_dim query rows, then head_dim gate rows
        q, gate = q[:, :, :a.head_dim], q[:, :, a.head_dim:]
    if a.q_norm is not None:
        q = qk_norm(q, a.q_norm, eps)
    rope = ops.rope_neox if a.neox else ops.rope_norm
    k = v = None
    if own_kv:
        k = fused[1].reshape(n, a.n_head_kv, a.head_dim)
        v = fused[-1].reshape(n, a.n_head_kv, a.head_dim_v)  # K itself (Gemma 4's V = K)
        if a.k_norm is not None:
            k = qk_norm(k, a.k_norm, eps)
        if a.v_norm is not None:
            v = ops.rmsnorm(v, a.v_norm, eps)
        k = rope(k, rot)
    q = rope(q, rot if rot_q is None else rot_q)
    out = batch.attention(il if a.kv_layer is None else a.kv_layer, q, k, v,
                          a.scale, a.softcap, a.window, a.sinks)
    if a.q_gate:
        out = out * ops.sigmoid(np.ascontiguousarray(gate).reshape(n, -1))
    return ops.linear(out, a.o.w, a.o.b)


def qk_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """Heads x (T, H, d) RMS-normed times w: per head (w of d), or over each row's H
    heads at once (w of H d: OLMo 2) -> (T, H, d)."""
    if len(w) == x.shape[2]:
        return ops.rmsnorm(x, w, eps)
    return ops.rmsnorm(x.reshape(len(x), -1), w, eps).reshape(x.shape)


def pre_norm(x: np.ndarray, w: np.ndarray | None, eps: float) -> np.ndarray:
    """A block's pre-norm of x (T, n_embd): RMS-normed times w, or x itself for none."""
    return x if w is None else ops.rmsnorm(x, w, eps)


# the GLUs' gated activations by name (layer.GLU_ACTS)
GATED = {"silu": ops.swiglu, "gelu": ops.geglu, "gelu_f16": ops.geglu_f16}


def ffn(h: np.ndarray, f: GLU) -> np.ndarray:
    """Normed input h (T, n_embd) -> (T, n_embd): down(act(gate(h)) * up(h))."""
    gated = GATED[f.act]
    return ops.linear(gated(*ops.linears(h, (f.gate, f.up))), f.down.w, f.down.b)


def expert_choice(logits: np.ndarray, e: Experts) -> tuple[np.ndarray, np.ndarray]:
    """Router logits (T, n_expert) -> (selected experts (T, n_used) i64, their weights (T,
    n_used) f32), as build_moe_ffn: scores (a softmax as ggml's soft_max computes it, or a
    sigmoid; or, for ``softmax_weight``, the logits, and a softmax over the chosen ones),
    the best first (ties: lower index; ranked by the scores plus ``e.select_bias`` when
    given, weighted by the scores alone), renormalised and scaled as ``e`` says."""
    scores = _softmax(logits) if e.gating == "softmax" else gate_scores(logits, e.gating)
    ranked = scores if e.select_bias is None else scores + e.select_bias
    if e.groups > 1:
        ranked = best_groups(ranked, e.groups, e.groups_used)
    chosen = np.argsort(-ranked, axis=1, kind="stable")[:, :e.n_used]
    w = np.take_along_axis(scores, chosen, axis=1)
    if e.gating == "softmax_weight":
        w = _softmax(w)
    if e.norm_weights:
        w = w / np.maximum(w.sum(axis=1, keepdims=True), np.float32(6.103515625e-5))
    if e.scale not in (0.0, 1.0):
        w = w * np.float32(e.scale)
    return chosen, w.astype(np.float32)


def gate_scores(logits: np.ndarray, gating: str) -> np.ndarray:
    """The scores of a ``sigmoid`` gating (numpy's exp: the fused experts split their call
    around it), the logits themselves for ``softmax_weight``."""
    if gating == "softmax_weight":
        return logits
    return np.float32(1) / (np.float32(1) + np.exp(-logits))


def best_groups(ranked: np.ndarray, groups: int, used: int) -> np.ndarray:
    """Ranking scores (T, n_expert) with every expert outside each row's ``used`` best
    groups set to -inf, as build_moe_ffn's grouped selection: the experts in ``groups``
    consecutive groups, each group scored by the sum of its two best scores (the best
    first, in float32), the best groups first (ties: the lower index)."""
    by_group = ranked.reshape(len(ranked), groups, -1)
    top2 = -np.sort(-by_group, axis=2)[:, :, :2]
    score = top2[:, :, 0] + top2[:, :, 1] if top2.shape[2] == 2 else top2[:, :, 0]
    kept = np.argsort(-score, axis=1, kind="stable")[:, :used]
    masked = np.full(by_group.shape, -np.inf, np.float32)
    rows = np.arange(len(ranked))[:, None]
    masked[rows, kept] = by_group[rows, kept]
    return masked.reshape(ranked.shape)

def _softmax(x: np.ndarray) -> np.ndarray:
    """Each row's softmax as ggml's soft_max computes it: its exp, a float64 sum."""
    from ..quant.floatbits import expf_ggml_rows  # numba's module: not at import

    ex = expf_ggml_rows(np.ascontiguousarray(x - x.max(axis=1, keepdims=True), np.float32))
    return ex * (1.0 / ex.sum(axis=1, dtype=np.float64, keepdims=True)).astype(np.float32)


def swiglu_oai(gate: np.ndarray, up: np.ndarray, alpha: float = 1.702, limit: float = 7.0
               ) -> np.ndarray:
    """gpt-oss's clamped SwiGLU as ggml_swiglu_oai: x = min(gate, limit), y = up clamped
    to +-limit, x * sigmoid(alpha x) * (y + 1). (T, n_ff) x2 -> (T, n_ff) f32."""
    x = np.minimum(gate, np.float32(limit))
    y = np.clip(up, np.float32(-limit), np.float32(limit))
    with np.errstate(over="ignore"):
        glu = x / (np.float32(1) + np.exp(np.float32(alpha) * -x))
    return (glu * (y + np.float32(1))).astype(np.float32)


def _plus(y: np.ndarray, b: np.ndarray | None, ex: int) -> np.ndarray:
    return y if b is None else y + b[ex]


def _by_expert(chosen: np.ndarray) -> list[tuple[int, list[int], list[int]]]:
    """The choices (T, n_used) grouped by expert: (expert, its rows, its slot in each row)
    for each expert chosen, in increasing order, the rows ascending. One pass over the
    T * n_used choices in Python ints (a decoded token's 8 cost microseconds; numpy's
    per-expert scans cost more at every batch size here)."""
    groups: dict[int, tuple[list[int], list[int]]] = {}
    for row, experts in enumerate(chosen.tolist()):
        for slot, ex in enumerate(experts):
            rows, slots = groups.setdefault(ex, ([], []))
            rows.append(row)
            slots.append(slot)
    return [(ex, *groups[ex]) for ex in sorted(groups)]


def _expert(e: Experts, ex: int, x: np.ndarray, gated: object) -> np.ndarray:
    """Rows x (n, n_embd) through expert ``ex`` -> (n, n_embd), before its routing weight.
    Gate and up share one kernel call (x quantized once; one cached plan per expert)."""
    g, u = matmul_many((e.gate[ex], e.up[ex]), x)
    y = e.down[ex].matmul(gated(_plus(g, e.gate_b, ex), _plus(u, e.up_b, ex)))
    if e.down_scale is not None:
        y = y * e.down_scale[ex]
    return _plus(y, e.down_b, ex)


def _experts_at_once(e: Experts, h: np.ndarray, groups: list, gated: object,
                     ys: np.ndarray) -> None:
    """``_expert`` of every group at once: one kernel call for all the chosen experts'
    gate and up, one for their downs (``expert_products``; the same numbers), into
    ``ys[rows, slots]``."""
    experts = np.array([ex for ex, _, _ in groups], np.int64)
    starts = np.cumsum([0] + [len(rows) for _, rows, _ in groups], dtype=np.int64)
    rows = np.array([r for _, rs, _ in groups for r in rs], np.int64)
    slots = np.array([s for _, _, ss in groups for s in ss], np.int64)
    of_slot = np.repeat(experts, np.diff(starts))  # each slot's expert
    gu = e.gate_up_all(h[rows], experts, starts)
    g = gu[0] if e.gate_b is None else gu[0] + e.gate_b[of_slot]
    u = gu[1] if e.up_b is None else gu[1] + e.up_b[of_slot]
    y = e.down_all(gated(g, u), experts, starts)[0]
    if e.down_scale is not None:
        y = y * e.down_scale[of_slot][:, None]
    ys[rows, slots] = y if e.down_b is None else y + e.down_b[of_slot]


def router_input(h: np.ndarray, e: Experts, x: np.ndarray, eps: float) -> np.ndarray:
    """What the router reads: the experts' normed input h, or (``router_in_norm``) the
    FFN's input x RMS-normed, scaled, times that weight, in ggml's order."""
    if e.router_in_norm is None:
        return h
    normed = ops.rmsnorm(x, np.ones(x.shape[1], np.float32), eps)  # ggml's weightless one
    return normed * np.float32(e.router_in_scale) * e.router_in_norm


def experts(h: np.ndarray, e: Experts, x: np.ndarray | None = None, eps: float = 0.0
            ) -> np.ndarray:
    """Normed input h (T, n_embd) -> (T, n_embd): each row through its chosen experts,
    weighted and summed in selection order. Rows that chose an expert run through it
    together (its weights read once per batch); each row's numbers are its own. ``x``
    and ``eps``: the FFN's input and norm eps, for a router that reads x itself.

    Op by op: the compiled layers run these steps as one call (``fused_experts``, the
    same numbers) where the plan takes the experts; here the others, and every expert
    layer of a model run on the reference path."""
    logits = ops.linear(router_input(h, e, x, eps), e.router.w, e.router.b)
    chosen, w = expert_choice(logits, e)
    gated = {**GATED, "swiglu_oai": swiglu_oai}[e.act]
    ys = np.empty((*chosen.shape, e.down[0].shape[0]), np.float32)  # (T, n_used, n_embd)
    groups = _by_expert(chosen)
    if e.gate_up_all.usable and e.down_all.usable:
        _experts_at_once(e, h, groups, gated, ys)
    else:
        for ex, rows, slots in groups:
            ys[rows, slots] = _expert(e, ex, h[rows], gated)
    out = ys[:, 0] * w[:, :1]
    for j in range(1, e.n_used):
        out = out + ys[:, j] * w[:, j:j + 1]
    if e.shared is not None:
        out = out + shared_expert(h, e)
    return out


def shared_expert(h: np.ndarray, e: Experts) -> np.ndarray:
    """The shared expert's output for h (T, n_embd), times sigmoid(``shared_gate`` . h)
    where the layer has that gate."""
    return gated_shared(ffn(h, e.shared), h, e)


def gated_shared(y: np.ndarray, h: np.ndarray, e: Experts) -> np.ndarray:
    """The shared expert's output y (T, n_embd) of h, times its sigmoid gate where the
    layer has one (numpy's sigmoid and float64 sum: the fused experts leave it here)."""
    if e.shared_gate is None:
        return y
    # each row's gate logit a sum of its own (batch-invariant)
    logit = (h * e.shared_gate).astype(np.float64).sum(axis=1).astype(np.float32)
    return y * ops.sigmoid(logit)[:, None]


def layer(x: np.ndarray, b: Block, batch: object, il: int, rot: np.ndarray | None,
          rows: np.ndarray | None = None, inp: np.ndarray | None = None,
          rot_q: np.ndarray | None = None) -> np.ndarray:
    """One layer: x (T, n_embd) -> (T', n_embd); only ``rows`` go on past the attention
    (or recurrent mixer) when given (llama.cpp's inp_out_ids in the last layer: T' =
    len(rows)); ``rot`` the attention's RoPE table (None for a recurrent layer), ``rot_q``
    its queries' where they have their own; ``inp`` (T, d) the layer's per-layer input
    when it takes one."""
    a = mixer_part(x, b, batch, il, rot, rot_q)
    if rows is not None:
        a, x = a[rows], x[rows]
        inp = None if inp is None else inp[rows]
    x = x + residual(a, b)
    x = x + residual(ffn_part(x, b), b)
    return layer_end(x, b, inp)


def mixer_part(x: np.ndarray, b: Block, batch: object, il: int, rot: np.ndarray | None,
               rot_q: np.ndarray | None = None) -> np.ndarray:
    """What the mixer adds to x (T, n_embd) before the residual scale: its norm, the
    attention or recurrent mixer (``layer``'s ``rot`` and ``rot_q``) and its post norm."""
    h = pre_norm(x, b.attn_norm, b.eps)
    if isinstance(b.attn, DeltaNet):
        from . import deltanet  # numba: compiled or loaded on first use

        a = deltanet.forward(h, b.attn, batch, b.eps)
    elif isinstance(b.attn, ShortConv):
        from . import shortconv  # numba: compiled or loaded on first use

        a = shortconv.forward(h, b.attn, batch)
    elif isinstance(b.attn, Mamba2):
        from . import mamba2  # numba: compiled or loaded on first use

        a = mamba2.forward(h, b.attn, batch, b.eps)
    elif isinstance(b.attn, LatentAttention):
        from . import mla  # numba: compiled or loaded on first use

        a = mla.forward(h, b.attn, batch, il, rot, b.eps)
    else:
        a = attention(h, b.attn, batch, il, rot, b.eps, rot_q)
    return a if b.attn_post_norm is None else ops.rmsnorm(a, b.attn_post_norm, b.eps)


def layer_end(x: np.ndarray, b: Block, inp: np.ndarray | None) -> np.ndarray:
    """x (T, n_embd) after the FFN's residual add: plus the per-layer input's branch
    (``inp`` (T, d): this layer's input) where the layer takes one, times the output scale
    where it has one."""
    if b.per_layer is not None:
        p = b.per_layer
        g = ops.gelu_f16(ops.linear(x, p.gate.w, p.gate.b)) * inp
        x = x + ops.rmsnorm(ops.linear(g, p.proj.w, p.proj.b), p.norm, b.eps)
    return x if b.out_scale == 1.0 else x * np.float32(b.out_scale)


def rotations(b: Block, ropes: tuple[np.ndarray, ...]
              ) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Layer ``b``'s RoPE tables from the model's ``ropes``: (its keys', its queries' where
    they have their own, else None); (None, None) for a recurrent layer."""
    if not isinstance(b.attn, Attention | LatentAttention):
        return None, None
    q_rope = getattr(b.attn, "q_rope", None)
    return ropes[b.attn.rope], None if q_rope is None else ropes[q_rope]


def residual(y: np.ndarray, b: Block) -> np.ndarray:
    """A branch's output as it joins the residual: times ``b.residual_scale`` (ggml_scale,
    float32) where that is not 1."""
    return y if b.residual_scale == 1.0 else y * np.float32(b.residual_scale)


def ffn_part(x: np.ndarray, b: Block) -> np.ndarray:
    """What the FFN adds to x (T, n_embd): its norm, the FFN (dense, experts, or both)
    and its post norm."""
    h = pre_norm(x, b.ffn_norm, b.eps)
    f = b.ffn
    if isinstance(f, DenseAndExperts):
        e = experts(ops.rmsnorm(x, f.experts_norm, b.eps), f.experts, x, b.eps)
        y = (ops.rmsnorm(ffn(h, f.dense), f.dense_post_norm, b.eps)
             + ops.rmsnorm(e, f.experts_post_norm, b.eps))
    else:
        y = experts(h, f, x, b.eps) if isinstance(f, Experts) else ffn(h, f)
    return y if b.ffn_post_norm is None else ops.rmsnorm(y, b.ffn_post_norm, b.eps)


def stack(x: np.ndarray, blocks: list[Block], batch: object, ropes: tuple[np.ndarray, ...],
          rows: np.ndarray | None = None, inputs: np.ndarray | None = None) -> np.ndarray:
    """Every layer: x (T, n_embd) -> (T', n_embd); only ``rows`` leave the last layer;
    ``inputs`` (T, n_layer, d): the per-layer inputs of layers that take one."""
    last = len(blocks) - 1
    for il, b in enumerate(blocks):
        rot, rot_q = rotations(b, ropes)
        inp = None if b.per_layer is None else inputs[:, b.per_layer.index]
        x = layer(x, b, batch, il, rot, rows if il == last else None, inp, rot_q)
        between_layers(batch, il, last)
    return x


def between_layers(batch: object, il: int, last: int) -> None:
    """After layer ``il``: a stop of the batch's pass (``forward_pass.Stops``), except after
    the last layer (the pass stops before its output product instead)."""
    stops = getattr(batch, "stops", None)
    if il < last and stops is not None:
        stops.at(LAYER)
