"""The reference forward over the layer spec: plain numpy steps, one op at a time.

This is what a layer computes, written to be read (as mlx-lm's ``TransformerBlock``):
norm, attention, residual, norm, FFN, residual. The compiled executor (``executor.py``)
computes the same numbers bit for bit, with the same kernels for the products, norms,
RoPE and attention; tests hold the two together. Models whose layers the planner cannot
compile run through here, and say so (``executor.plan``).
"""

from __future__ import annotations

import numpy as np

from . import ops
from .layer import GLU, Attention, Block, DeltaNet, Experts, Linear


def product(x: np.ndarray, lin: Linear) -> np.ndarray:
    """x (T, d_in) -> (T, d_out): the weight's product, then its bias."""
    return ops.linear(x, lin.w, lin.b)


def attention(h: np.ndarray, a: Attention, batch: object, il: int, rot: np.ndarray,
              eps: float) -> np.ndarray:
    """Normed input h (T, n_embd) -> (T, n_embd), storing this batch's keys and values in
    layer ``il`` of each row's cache (``Batch.attention``); ``eps`` the Q/K norms'."""
    n = len(h)
    q = product(h, a.q).reshape(n, a.n_head, -1)
    if a.q_gate:  # per head: head_dim query rows, then head_dim gate rows
        q, gate = q[:, :, :a.head_dim], q[:, :, a.head_dim:]
    k = product(h, a.k).reshape(n, a.n_head_kv, a.head_dim)
    v = product(h, a.v).reshape(n, a.n_head_kv, a.head_dim_v)
    if a.q_norm is not None:
        q = ops.rmsnorm(q, a.q_norm, eps)
    if a.k_norm is not None:
        k = ops.rmsnorm(k, a.k_norm, eps)
    rope = ops.rope_neox if a.neox else ops.rope_norm
    out = batch.attention(il, rope(q, rot), rope(k, rot), v, a.scale, a.softcap, a.window,
                          a.sinks)
    if a.q_gate:
        out = out * ops.sigmoid(np.ascontiguousarray(gate).reshape(n, -1))
    return product(out, a.o)


def ffn(h: np.ndarray, f: GLU) -> np.ndarray:
    """Normed input h (T, n_embd) -> (T, n_embd): down(act(gate(h)) * up(h))."""
    gated = ops.swiglu if f.act == "silu" else ops.geglu
    return product(gated(product(h, f.gate), product(h, f.up)), f.down)


def expert_choice(logits: np.ndarray, e: Experts) -> tuple[np.ndarray, np.ndarray]:
    """Router logits (T, n_expert) -> (selected experts (T, n_used) i64, their weights (T,
    n_used) f32), as build_moe_ffn: scores (a softmax as ggml's soft_max computes it, or a
    sigmoid; or, for ``softmax_weight``, the logits, and a softmax over the chosen ones),
    the best first (ties: lower index), renormalised and scaled as ``e`` says."""
    scores = (_softmax(logits) if e.gating == "softmax" else logits
              if e.gating == "softmax_weight" else
              np.float32(1) / (np.float32(1) + np.exp(-logits)))
    chosen = np.argsort(-scores, axis=1, kind="stable")[:, :e.n_used]
    w = np.take_along_axis(scores, chosen, axis=1)
    if e.gating == "softmax_weight":
        w = _softmax(w)
    if e.norm_weights:
        w = w / np.maximum(w.sum(axis=1, keepdims=True), np.float32(6.103515625e-5))
    if e.scale not in (0.0, 1.0):
        w = w * np.float32(e.scale)
    return chosen, w.astype(np.float32)


def _softmax(x: np.ndarray) -> np.ndarray:
    """Each row's softmax as ggml's soft_max computes it: its exp, a float64 sum."""
    from ..quant.floatbits import expf_ggml_twin  # numba's module: not at import

    ex = expf_ggml_twin(x - x.max(axis=1, keepdims=True))
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


def experts(h: np.ndarray, e: Experts) -> np.ndarray:
    """Normed input h (T, n_embd) -> (T, n_embd): each row through its chosen experts,
    weighted and summed in selection order. Rows that chose an expert run through it
    together (its weights read once per batch); each row's numbers are its own."""
    chosen, w = expert_choice(product(h, e.router), e)
    gated = {"silu": ops.swiglu, "gelu": ops.geglu, "swiglu_oai": swiglu_oai}[e.act]
    ys = np.empty((*chosen.shape, e.down[0].shape[0]), np.float32)  # (T, n_used, n_embd)
    for ex in np.unique(chosen):
        rows, slots = np.nonzero(chosen == ex)
        x = h[rows]
        g = _plus(e.gate[ex].matmul(x), e.gate_b, ex)
        u = _plus(e.up[ex].matmul(x), e.up_b, ex)
        ys[rows, slots] = _plus(e.down[ex].matmul(gated(g, u)), e.down_b, ex)
    out = ys[:, 0] * w[:, :1]
    for j in range(1, e.n_used):
        out = out + ys[:, j] * w[:, j:j + 1]
    if e.shared is not None:  # each row's gate logit a sum of its own (batch-invariant)
        logit = (h * e.shared_gate).astype(np.float64).sum(axis=1).astype(np.float32)
        out = out + ffn(h, e.shared) * ops.sigmoid(logit)[:, None]
    return out


def block(x: np.ndarray, b: Block, batch: object, il: int, rot: np.ndarray | None,
          rows: np.ndarray | None = None) -> np.ndarray:
    """One layer: x (T, n_embd) -> (T', n_embd); only ``rows`` go on past the attention
    (or recurrent mixer) when given (llama.cpp's inp_out_ids in the last layer: T' =
    len(rows)); ``rot`` the attention's RoPE table (None for a recurrent layer)."""
    h = ops.rmsnorm(x, b.attn_norm, b.eps)
    if isinstance(b.attn, DeltaNet):
        from . import deltanet  # numba: compiled or loaded on first use

        a = deltanet.forward(h, b.attn, batch, b.eps)
    else:
        a = attention(h, b.attn, batch, il, rot, b.eps)
    if b.attn_post_norm is not None:
        a = ops.rmsnorm(a, b.attn_post_norm, b.eps)
    if rows is not None:
        a, x = a[rows], x[rows]
    x = x + a
    return x + ffn_part(x, b)


def ffn_part(x: np.ndarray, b: Block) -> np.ndarray:
    """What the FFN adds to x (T, n_embd): its norm, the FFN (dense or experts) and its
    post norm."""
    h = ops.rmsnorm(x, b.ffn_norm, b.eps)
    f = experts(h, b.ffn) if isinstance(b.ffn, Experts) else ffn(h, b.ffn)
    return f if b.ffn_post_norm is None else ops.rmsnorm(f, b.ffn_post_norm, b.eps)


def stack(x: np.ndarray, blocks: list[Block], batch: object, ropes: tuple[np.ndarray, ...],
          rows: np.ndarray | None = None) -> np.ndarray:
    """Every layer: x (T, n_embd) -> (T', n_embd); only ``rows`` leave the last layer."""
    last = len(blocks) - 1
    for il, b in enumerate(blocks):
        rot = None if isinstance(b.attn, DeltaNet) else ropes[b.attn.rope]
        x = block(x, b, batch, il, rot, rows if il == last else None)
        pause = getattr(batch, "pause", None)  # other batches may run between two layers
        if il < last and pause is not None and pause.flag[0]:
            pause.run()
    return x
