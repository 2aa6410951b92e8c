"""Whole steps of a layer in one compiled call: the attention block and the feed-forward
block, for batches too long for the team (``team.py``: prompts).

Per layer, a Python-level call per op would cost microseconds each, its wrapper and
numba's dispatch, more still after the products have streamed megabytes of weights
through the caches the interpreter lives in. ``ffn_step`` runs llama.cpp's build_ffn
with a parallel gate behind its norm (``rmsnorm``, the gate and up products, the gated
activation: SwiGLU, GeGLU, or GeGLU through ggml-cpu's float16 table, the down product) as
one call instead of five Python-level steps; ``attention_step`` runs build_attn behind its
norm (``rmsnorm``, the Q, K and V products, per-head Q/K/V norms, RoPE, storing K and V,
attention, the output product) as one call instead of about ten; V may be K's product
(Gemma 4), a layer may read an earlier layer's keys and values and store none (Gemma 4's
shared KV layers), and an output gate (Qwen3.5) splits it in two calls around numpy's
sigmoid (``attention``), the one the reference path computes. ``end_step`` runs a Gemma 4
layer's per-layer input (its gate's product, the float16-table GELU times the input, the
projection and its norm) and output scale after the FFN's residual add. A gated delta
net (``delta_net``: Qwen3.5's recurrent mixer) runs as ``delta_in`` (norm and products),
its gates in numpy (``deltanet.gates``, the reference path's exp and log1p), per sequence
``deltanet.sequence`` (convolution, L2 norms, delta rule; the states staged between calls,
as ``deltanet.forward`` stages them), then ``delta_out`` (gated norm, output product) in
the last sequence's call (``delta_last``); a gated short convolution (``short_conv``:
LFM2's) as ``short_in``, per sequence ``shortconv.sequence``, the last with ``short_out``
(``short_last``). Two compiled calls per layer for a batch of one sequence.

A mixture-of-experts FFN runs as one such step too (``fused_experts``: the router, the
choice of the experts, every chosen expert's products in two calls, the weighted sum),
called from ``layer`` as ``experts``.

They are plain compiled functions calling the compiled kernels the separate ops call
(``rowkernels.rmsnorm_rows``/``rope_rows``, ``kernels.qmatmul_par``/``qmatmul_serial``,
``kernels.swiglu``/``geglu``, ``attention._attend_par``/``_attend_serial``; ``geglu_f16``
here, ``ops.geglu_f16``'s numbers element for element), each kernel
with its own parallel region as before. (A ``prange`` inlined into a block was serialized
by numba, and ran much slower.) So they compute exactly what the separate ops
compute, element for element: a model gives the same logits whichever path runs, and the
batch-invariance rule holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import njit

from gguflm.quant import grouped, kernels, matrix
from gguflm.quant.floatbits import f16_from_f32
from gguflm.quant.grouped import matmul_par, matmul_serial
from gguflm.quant.kernels import geglu, swiglu

from . import attention as _attention
from . import ops, reference
from .attention import _attend_par, _attend_serial
from .layer import (
    Block,
    DeltaNet,
    DenseAndExperts,
    Experts,
    LatentAttention,
    Linear,
    Mamba2,
    ShortConv,
)
from .rowkernels import rmsnorm_rows, rope_rows


@njit(cache=True, nogil=True, inline="always")
def products(kinds, ws, x, tbl, outs, count, parallel, threads):  # noqa: ANN001, ANN202
    """The products as ``grouped.matmul_par``/``matmul_serial`` run them."""
    if parallel:
        matmul_par(kinds, ws, x, tbl, outs, count, threads)
    else:
        matmul_serial(kinds, ws, x, tbl, outs, count)


@njit(cache=True, nogil=True)
def qk_heads(q, k, q_norm, k_norm, eps, rot, neox, heads):  # noqa: ANN001, ANN201
    """Q (T, H d) and K (T, H_kv d) f32 in place: RMS-normalized times ``q_norm``/
    ``k_norm`` when not empty, each head (a norm of d) or each row's heads at once (of H d
    and H_kv d: OLMo 2), then rotated by ``rot`` (``rope_rows``); returned as (T, H, d)
    and (T', H_kv, d) (K may have no rows: a layer reading an earlier layer's keys)."""
    n_head, n_kv, d, _ = heads
    if q_norm.shape[0]:
        qh = q.reshape((q.size // q_norm.shape[0], q_norm.shape[0]))
        rmsnorm_rows(qh, q_norm, eps, qh)
    if k_norm.shape[0]:
        kh = k.reshape((k.size // k_norm.shape[0], k_norm.shape[0]))
        rmsnorm_rows(kh, k_norm, eps, kh)
    q3 = q.reshape((q.shape[0], n_head, d))
    k3 = k.reshape((k.shape[0], n_kv, d))
    rope_rows(q3, rot, neox)
    rope_rows(k3, rot, neox)
    return q3, k3


@njit(cache=True, nogil=True, inline="always")
def pre_norm(x, w, eps, h):  # noqa: ANN001, ANN201
    """h (T, n) f32 = x RMS-normalized times w (n,) f32, or x itself for w empty (a
    block without its pre-norm: OLMo 2, EXAONE 4)."""
    if w.shape[0]:
        rmsnorm_rows(x, w, eps, h)
    else:
        h[:] = x


@njit(cache=True, nogil=True, inline="always")
def add_bias(y, b):  # noqa: ANN001, ANN201
    """y (T, n) f32 += b (n,) f32 in place, as numpy adds it; b empty: nothing."""
    if b.shape[0]:
        for t in range(y.shape[0]):
            for i in range(y.shape[1]):
                y[t, i] += b[i]


@njit(cache=True, nogil=True)
def geglu_f16(gate, up, table, out):  # noqa: ANN001, ANN201
    """gate, up (T, F) f32 -> out (T, F) f32 = gelu(gate) * up as ggml-cpu's
    ggml_vec_geglu_f32 with GGML_GELU_FP16 (numpy twin: ``ops.geglu_f16``): 0 for
    gate <= -10, gate for gate >= 10, else ``table`` (``ops.gelu_f16_table``) at gate
    rounded to float16 (C-contiguous)."""
    g, u, o = gate.reshape(-1), up.reshape(-1), out.reshape(-1)
    for j in range(g.shape[0]):
        v = g[j]
        y = (np.float32(0.0) if v <= np.float32(-10.0) else v if v >= np.float32(10.0)
             else table[f16_from_f32(v)])
        o[j] = y * u[j]


GLU_ACTS = {"silu": 0, "gelu": 1, "gelu_f16": 2}  # ``ffn_step``'s ``act`` by GLU.act


@njit(cache=True, nogil=True, inline="always")
def glu_into(g, u, act, gelu_tbl, out):  # noqa: ANN001, ANN201
    """out (T, F) f32 = the gated activation ``act`` (``GLU_ACTS``) of g, u (T, F) f32:
    SwiGLU, GeGLU, or GeGLU through ggml's float16 table ``gelu_tbl`` (``geglu_f16``);
    ``out`` another array (an aliased loop runs unvectorized)."""
    if act == 2:
        geglu_f16(g, u, gelu_tbl, out)
    elif act == 1:
        geglu(g, u, out)
    else:
        swiglu(g, u, out)


@njit(cache=True, nogil=True)
def glu(g, u, act, gelu_tbl):  # noqa: ANN001, ANN201
    """(T, F) f32 x2 -> (T, F) f32: ``glu_into`` a new array."""
    out = np.empty_like(g)
    glu_into(g, u, act, gelu_tbl, out)
    return out


@njit(cache=True, nogil=True)
def ffn_step(x, norm_w, eps, kinds_gu, ws_gu, kinds_d, ws_d, tbl, act, gelu_tbl, post_norm,  # noqa: ANN001, ANN201, PLR0913
              par_gu, par_d, threads, b_gate, b_up, b_down):
    """x (T, n_embd) f32 -> (T, n_embd) f32: ``down(glu(gate(h), up(h)))`` with
    ``h = rmsnorm(x) * norm_w`` (x itself for ``norm_w`` empty: ``pre_norm``).
    ``ws_gu``/``kinds_gu``: the gate and up weights (R, row bytes) u8 and ggml type ids,
    padded as ``kernels.pad_products`` pads them; ``ws_d``/``kinds_d`` the down weight
    likewise; ``act`` (``GLU_ACTS``): 0 SwiGLU, 1 GeGLU, 2 GeGLU through ggml's float16
    table ``gelu_tbl`` (``geglu_f16``); ``post_norm``
    (n_embd,) f32 or empty: the output RMS-normalized times it (Gemma's post-FFN norm);
    ``par_*``: whether each product runs on ``threads`` threads; ``b_*`` each product's
    bias (its rows,) f32, or empty."""
    h = np.empty_like(x)
    pre_norm(x, norm_w, eps, h)
    return glu_ffn(h, kinds_gu, ws_gu, kinds_d, ws_d, tbl, act, gelu_tbl, post_norm, eps,
                   par_gu, par_d, threads, b_gate, b_up, b_down)


@njit(cache=True, nogil=True, inline="always")
def glu_ffn(h, kinds_gu, ws_gu, kinds_d, ws_d, tbl, act, gelu_tbl, post_norm, eps, par_gu,  # noqa: ANN001, ANN201, PLR0913
            par_d, threads, b_gate, b_up, b_down):
    """``ffn_step`` of its normed input h (T, n_embd): the gate and up products and their
    biases, the gated activation, the down product, its bias and the post norm."""
    n_ff = ws_gu[0].shape[0]
    g = np.empty((h.shape[0], n_ff), np.float32)
    u = np.empty((h.shape[0], n_ff), np.float32)
    products(kinds_gu, ws_gu, h, tbl, (g, u, g), 2, par_gu, threads)
    add_bias(g, b_gate)
    add_bias(u, b_up)
    return part_out(glu(g, u, act, gelu_tbl), kinds_d, ws_d, tbl, par_d, threads, b_down,
                    post_norm, eps)


@njit(cache=True, nogil=True)
def end_step(x, inp, kinds_g, ws_g, kinds_p, ws_p, tbl, gelu_tbl, norm_w, eps, out_scale,  # noqa: ANN001, ANN201, PLR0913
             par_g, par_p, threads, b_g, b_p):
    """x (T, n_embd) f32 after the FFN's residual add -> (T, n_embd) f32, as
    ``reference.layer_end`` with a per-layer input (``inp`` (T, d) f32):
    ``x + rmsnorm(proj(gelu_f16(gate(x)) * inp)) * norm_w``, then times ``out_scale``
    (1: none). ``ws_g``/``kinds_g`` the gate's weight and type id, ``ws_p``/``kinds_p`` the
    projection's (padded as ``kernels.pad_products`` pads them); ``gelu_tbl`` ggml's
    float16 GELU table (``geglu_f16``); ``par_*`` whether each product runs on ``threads``
    threads; ``b_*`` each product's bias, or empty. (A layer with an output scale alone
    multiplies in numpy, as the reference path.)"""
    g = np.empty((x.shape[0], ws_g[0].shape[0]), np.float32)
    products(kinds_g, ws_g, x, tbl, (g, g, g), 1, par_g, threads)
    add_bias(g, b_g)
    gated = np.empty_like(g)
    geglu_f16(g, inp, gelu_tbl, gated)
    y = x + part_out(gated, kinds_p, ws_p, tbl, par_p, threads, b_p, norm_w, eps)
    return y if out_scale == np.float32(1.0) else y * out_scale


@njit(cache=True, nogil=True)
def _heads(h, kinds, ws, n_qkv, tbl, heads, q_norm, k_norm, v_norm, eps, rot, neox, gate,  # noqa: ANN001, ANN202, PLR0913
           par, threads, b_q, b_k, b_v):
    """Normed input h (T, n_embd) -> the queries (T, H, d), and the keys (T', H_kv, d) and
    values (T', H_kv, d_v) to store, as ``reference.attention`` forms them: ``n_qkv`` 3
    products Q, K, V; 2: Q, K and V = K's product before K's norm (Gemma 4); 1: Q alone
    (a layer reading an earlier layer's keys and values: T' = 0). ``gate`` (T, H d) f32:
    Q's rows are per head d query rows then d gate rows, the gate rows written into it;
    (0, 0): none. ``v_norm`` (d_v,) f32 or empty: each value head RMS-normed times it;
    the rest as ``qk_heads`` takes it."""
    n = h.shape[0]
    n_head, n_kv, d, dv = heads
    q = np.empty((n, n_head * d * (2 if gate.shape[0] else 1)), np.float32)
    m = n if n_qkv > 1 else 0
    k = np.empty((m, n_kv * d), np.float32)
    vv = np.empty((m if n_qkv == 3 else 0, n_kv * dv), np.float32)
    outs = (q, k, vv) if n_qkv == 3 else (q, k, q) if n_qkv == 2 else (q, q, q)
    products(kinds, ws, h, tbl, outs, n_qkv, par, threads)
    add_bias(q, b_q)
    add_bias(k, b_k)
    add_bias(vv, b_v)
    if n_qkv == 2:
        vv = k.copy()
    if gate.shape[0]:
        qg = q.reshape((n, n_head, 2 * d))
        q = np.empty((n, n_head * d), np.float32)
        q.reshape((n, n_head, d))[:] = qg[:, :, :d]
        gate.reshape((n, n_head, d))[:] = qg[:, :, d:]
    if v_norm.shape[0] and m:
        vh = vv.reshape((vv.size // v_norm.shape[0], v_norm.shape[0]))
        rmsnorm_rows(vh, v_norm, eps, vh)
    q3, k3 = qk_heads(q, k, q_norm, k_norm, eps, rot, neox, heads)
    return q3, k3, vv.reshape((m, n_kv, dv))


@njit(cache=True, nogil=True, inline="always")
def part_out(a, kinds_o, ws_o, tbl, par, threads, b_o, post_norm, eps):  # noqa: ANN001, ANN202, PLR0913
    """a (T, d_in) f32 -> (T, n_embd) f32: a layer part's last product (the attention's
    output, the FFN's down), its bias, then the post norm (empty: none)."""
    out = np.empty((a.shape[0], ws_o[0].shape[0]), np.float32)
    products(kinds_o, ws_o, a, tbl, (out, out, out), 1, par, threads)
    add_bias(out, b_o)
    if post_norm.shape[0]:
        rmsnorm_rows(out, post_norm, eps, out)
    return out


@njit(cache=True, nogil=True)
def attention_step(x, norm_w, eps, kinds_qkv, ws_qkv, n_qkv, kinds_o, ws_o, tbl, heads,  # noqa: ANN001, ANN201, PLR0913
                    q_norm, k_norm, v_norm, rot, neox, kt, v, slot, pos, window, scale, cap,
                    f16, flash, post_norm, par, threads, b_q, b_k, b_v, b_o, sinks, gate,
                    stage):
    """x (T, n_embd) f32 -> (T, n_embd) f32: ``reference.attention``'s steps behind the
    norm. ``ws_qkv``/``kinds_qkv`` the Q, K, V weights and type ids (``n_qkv`` of them, as
    ``_heads`` takes them), ``ws_o``/``kinds_o`` the output's (padded as
    ``kernels.pad_products`` pads them); ``norm_w`` as ``pre_norm`` takes it; ``heads``
    (H, H_kv, d, d_v); ``q_norm``/``k_norm`` as ``qk_heads`` takes them, ``v_norm`` and
    ``gate`` as ``_heads``; ``rot`` (T, n_rot/2) c64; ``kt``, ``v``, ``slot``, ``pos``,
    ``window``, ``scale``, ``cap``, ``f16``, ``flash`` as ``attention.attend`` takes them
    (``kt``, ``v``: the cache of the layer whose keys and values these are);
    ``post_norm`` (n_embd,) f32 or empty: the output RMS-normed times it (Gemma's);
    ``par`` whether the QKV products, the attention and the output product run on
    ``threads`` threads; ``b_*`` each product's bias, or empty (added before the norms and
    RoPE, as llama.cpp). ``stage`` 0: all of it; 1: up to the attention's output (T, H d_v),
    before the output product (the caller gates it); 2: x is that, gated: the rest."""
    if stage == 2:
        return part_out(x, kinds_o, ws_o, tbl, par[2], threads, b_o, post_norm, eps)
    n = x.shape[0]
    n_head, _, _, dv = heads
    h = np.empty_like(x)
    pre_norm(x, norm_w, eps, h)
    q3, k3, v3 = _heads(h, kinds_qkv, ws_qkv, n_qkv, tbl, heads, q_norm, k_norm, v_norm, eps,
                        rot, neox, gate, par[0], threads, b_q, b_k, b_v)
    a = np.empty((n, n_head, dv), np.float32)
    if par[1]:
        _attend_par(q3, kt, v, slot, pos, window, scale, cap, f16, flash, a, k3, v3, sinks)
    else:
        _attend_serial(q3, kt, v, slot, pos, window, scale, cap, f16, flash, a, k3, v3, sinks)
    a2 = a.reshape((n, n_head * dv))
    if stage == 1:
        return a2
    return part_out(a2, kinds_o, ws_o, tbl, par[2], threads, b_o, post_norm, eps)


_NONE = kernels.read_only(np.zeros(0, np.float32))


def vector(w: np.ndarray | None) -> np.ndarray:
    """A norm weight or bias as the compiled code takes it: float32 and read-only (as a
    file's weights are: one compiled signature whether the model came from a file or not),
    or an empty array for none."""
    return _NONE if w is None else kernels.read_only(np.ascontiguousarray(w, np.float32))


@dataclass(frozen=True, eq=False)
class Group:
    """Products of one input that share a call: type ids and weights padded as
    ``kernels.pad_products`` pads them, their biases (``vector``), and the multiply-adds
    per activation row."""

    kinds: np.ndarray
    ws: tuple[np.ndarray, ...]
    biases: tuple[np.ndarray, ...]
    macs: int
    count: int  # how many products


def group(lins: tuple[Linear, ...]) -> Group:
    """The ``Group`` of these products (the planner checked they can share a call)."""
    kinds, ws = kernels.pad_products(
        [int(lin.w.type) for lin in lins],
        [kernels.read_only(grouped.weight_bytes(lin.w.raw)) for lin in lins])
    return Group(kinds, ws, tuple(vector(lin.b) for lin in lins),
                 sum(lin.w.shape[0] for lin in lins) * lins[0].w.shape[1], len(lins))


def _qkv(a: Any) -> tuple[Linear, ...]:
    """The products attention ``a`` runs on its input, as ``reference.attention`` (and
    ``_heads``) takes them: Q, K, V; Q, K (V = K's); Q alone (an earlier layer's K, V)."""
    return (a.q,) if a.kv_layer is not None else (a.q, a.k) if a.v is a.k else (a.q, a.k, a.v)


@dataclass(frozen=True, eq=False)
class LayerArgs:
    """What one layer's fused steps take that stays the same from call to call: worked out
    once by the planner (``executor.plan``), which decided each part's path."""

    qkv: Group | None  # None: the mixer runs on the reference path (``reference.mixer_part``)
    out: Group | None
    gate_up: Group | None  # None: the FFN runs as ``reference.ffn_part`` (experts, ...)
    down: Group | None
    # attn, Q heads, K heads, post-attn, FFN, post-FFN, sinks, V heads
    norms: tuple[np.ndarray, ...]
    eps: np.float32
    scale: np.float32
    cap: np.float32
    heads: tuple[int, int, int, int]
    head_macs: int  # attention's multiply-adds per row and cached position
    # the per-layer input's gate, projection and norm (None: none, or on the reference path)
    per_layer: tuple[Group, Group, np.ndarray] | None = None
    # a recurrent or latent mixer's fused steps' (``fused_recurrent``, ``fused_mla``);
    # qkv None
    mixer: Any = None
    # the fused experts' (``fused_experts.ExpertArgs``; beside a dense FFN:
    # ``DenseExpertArgs``), or None: no experts or they run as ``reference.ffn_part``
    experts: Any = None


def layer_args(b: Block, mixer: bool = True, ffn: bool = True, end: bool = True
               ) -> LayerArgs:
    """``LayerArgs`` of a layer whose mixer (an attention, a gated delta net or short
    convolution: ``mixer``), FFN (``ffn``: a dense one, or experts, alone or beside a dense
    one, ``fused_experts``) and
    per-layer input (``end``) run fused: their products all have compiled kernels
    (``grouped.COMPILED_TYPES``); the other parts run on the reference path."""
    a, f = b.attn, b.ffn
    dense = ffn and not isinstance(f, Experts | DenseAndExperts)
    moe = None
    if ffn and not dense:
        from .fused_experts import dense_expert_args, expert_args  # they build on this module

        moe = (expert_args if isinstance(f, Experts) else dense_expert_args)(
            f, b.ffn_norm, b.ffn_post_norm, b.eps)
    other = mixer and isinstance(a, DeltaNet | ShortConv | Mamba2 | LatentAttention)
    attn = mixer and not other
    heads = ((a.n_head, a.n_head_kv, a.head_dim, a.head_dim_v) if attn else (0, 0, 0, 0))
    q_norm, k_norm, sinks, v_norm = ((a.q_norm, a.k_norm, a.sinks, a.v_norm) if attn else
                                     (None, None, None, None))
    return LayerArgs(
        group(_qkv(a)) if attn else None, group((a.o,)) if attn else None,
        group((f.gate, f.up)) if dense else None, group((f.down,)) if dense else None,
        tuple(vector(w) for w in (b.attn_norm, q_norm, k_norm, b.attn_post_norm, b.ffn_norm,
                                  b.ffn_post_norm, sinks, v_norm)),
        np.float32(b.eps), np.float32(a.scale if attn else 0.0),
        np.float32(a.softcap if attn else 0.0), heads, heads[0] * (heads[2] + heads[3]),
        (group((b.per_layer.gate,)), group((b.per_layer.proj,)), vector(b.per_layer.norm))
        if end and b.per_layer is not None else None,
        _mixer_args(a, b.eps) if other else None, moe)


def _mixer_args(a: DeltaNet | ShortConv | Mamba2 | LatentAttention, eps: float) -> Any:
    """A recurrent or latent mixer's fused steps' arguments (those modules build on this
    one's steps: imported here)."""
    if isinstance(a, LatentAttention):
        from .fused_mla import latent_args

        return latent_args(a)
    from .fused_recurrent import recurrent_args

    return recurrent_args(a, eps)


_NO_GATE = np.zeros((0, 0), np.float32)


def attention(x: np.ndarray, b: Block, la: LayerArgs, batch: Any, il: int,
              rot: np.ndarray) -> np.ndarray:
    """``attention_step`` for x (T, n_embd) in layer ``il`` of ``batch``'s caches (those of
    the layer it shares keys and values with: ``kv_layer``); each part on all threads from
    the separate ops' thresholds. An output gate (``q_gate``) splits it in two calls: its
    sigmoid is numpy's (``ops.sigmoid``, as the reference path's), between them."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    n = len(x)
    lim = matrix.PARALLEL_MIN_MACS
    arena, a = batch.arena, b.attn
    kv = il if a.kv_layer is None else a.kv_layer
    par = (n * la.qkv.macs >= lim,
           _attention.runs_parallel(n, la.heads[1], n * la.head_macs * batch.span),
           n * la.out.macs >= lim)
    bq, bk, bv = (*la.qkv.biases, _NONE, _NONE)[:3]
    gate = np.empty((n, la.heads[0] * la.heads[2]), np.float32) if a.q_gate else _NO_GATE

    def step(y: np.ndarray, stage: int) -> np.ndarray:
        return attention_step(
            y, la.norms[0], la.eps, la.qkv.kinds, la.qkv.ws, la.qkv.count, la.out.kinds,
            la.out.ws, kernels.F16_TABLE, la.heads, la.norms[1], la.norms[2], la.norms[7],
            np.ascontiguousarray(rot, dtype=np.complex64), a.neox, arena.k[kv], arena.v[kv],
            batch.slot, batch.pos, int(a.window), la.scale, la.cap, arena.f16, batch.flash,
            la.norms[3], par, matrix.threads(), bq, bk, bv, la.out.biases[0], la.norms[6],
            gate, stage)

    if not a.q_gate:
        return step(x, 0)
    return step(step(x, 1) * ops.sigmoid(gate), 2)


def mixer(x: np.ndarray, b: Block, la: LayerArgs, batch: Any, il: int,
          ropes: tuple[np.ndarray, ...]) -> np.ndarray:
    """A recurrent or latent mixer's fused calls for x (T, n_embd), by its kind."""
    kind = la.mixer.kind
    if kind == "delta_net":
        return delta_net(x, b, la, batch)
    if kind == "short_conv":
        return short_conv(x, b, la, batch)
    if kind == "mamba2":
        return mamba2(x, b, la, batch)
    return latent_attention(x, b, la, batch, il, ropes[b.attn.rope])


def delta_net(x: np.ndarray, b: Block, la: LayerArgs, batch: Any) -> np.ndarray:
    """The gated delta net's fused calls (``fused_recurrent.delta_net``)."""
    from . import fused_recurrent

    return fused_recurrent.delta_net(x, b, la, batch)


def short_conv(x: np.ndarray, b: Block, la: LayerArgs, batch: Any) -> np.ndarray:
    """The gated short convolution's fused calls (``fused_recurrent.short_conv``)."""
    from . import fused_recurrent

    return fused_recurrent.short_conv(x, b, la, batch)


def mamba2(x: np.ndarray, b: Block, la: LayerArgs, batch: Any) -> np.ndarray:
    """The Mamba2 mixer's fused calls (``fused_recurrent.mamba2``)."""
    from . import fused_recurrent

    return fused_recurrent.mamba2(x, b, la, batch)


def latent_attention(x: np.ndarray, b: Block, la: LayerArgs, batch: Any, il: int,
                     rot: np.ndarray) -> np.ndarray:
    """The latent attention's fused call (``fused_mla.latent_attention``)."""
    from . import fused_mla

    return fused_mla.latent_attention(x, b, la, batch, il, rot)


def ffn(x: np.ndarray, b: Block, la: LayerArgs) -> np.ndarray:
    """``ffn_step`` for x (T, n_embd); each product on all threads from
    ``matrix.PARALLEL_MIN_MACS`` multiply-adds, as the separate products decide."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    n = len(x)
    lim = matrix.PARALLEL_MIN_MACS
    bg, bu = la.gate_up.biases
    return ffn_step(x, la.norms[4], la.eps, la.gate_up.kinds, la.gate_up.ws, la.down.kinds,
                     la.down.ws, kernels.F16_TABLE, GLU_ACTS[b.ffn.act], ops.gelu_f16_table(),
                     la.norms[5], n * la.gate_up.macs >= lim, n * la.down.macs >= lim,
                     matrix.threads(), bg, bu, la.down.biases[0])


def layer_end(x: np.ndarray, b: Block, la: LayerArgs, inp: np.ndarray | None) -> np.ndarray:
    """``end_step`` for x (T, n_embd) after the FFN's residual add (``reference.layer_end``
    where the plan left the per-layer input there); ``inp`` (T, d) this layer's input."""
    if b.per_layer is None or la.per_layer is None:  # an output scale alone: one multiply
        return reference.layer_end(x, b, inp)
    x = np.ascontiguousarray(x, dtype=np.float32)
    n, lim = len(x), matrix.PARALLEL_MIN_MACS
    g, p, norm = la.per_layer
    return end_step(x, np.ascontiguousarray(inp, dtype=np.float32), g.kinds, g.ws, p.kinds,
                    p.ws, kernels.F16_TABLE, ops.gelu_f16_table(), norm,
                    la.eps, np.float32(b.out_scale), n * g.macs >= lim, n * p.macs >= lim,
                    matrix.threads(), g.biases[0], p.biases[0])


def experts(x: np.ndarray, la: LayerArgs) -> np.ndarray:
    """The fused experts' FFN of x (T, n_embd) (``fused_experts.run``; beside a dense FFN:
    ``fused_experts.run_dense``)."""
    return la.experts.run(x)


def layer(x: np.ndarray, b: Block, la: LayerArgs, batch: Any, il: int,
          ropes: tuple[np.ndarray, ...], rows: np.ndarray | None = None,
          inp: np.ndarray | None = None) -> np.ndarray:
    """``reference.layer`` with each part the plan compiled (``la``) as one compiled call:
    the attention, the dense FFN or the experts (``fused_experts``; a gated delta net, a
    short convolution: ``delta_net``'s, ``short_conv``'s calls); the others as the
    reference path runs them (another recurrent mixer; experts the fused step does not
    take: ``reference.ffn_part``, each expert's products compiled); then the per-layer
    input and the output scale (``layer_end``). The branches join the residual as
    ``reference.residual`` scales them; ``ropes``, ``rows``, ``inp`` as
    ``reference.stack`` takes them, ``inp`` this layer's input."""
    if la.qkv is not None:
        a = attention(x, b, la, batch, il, ropes[b.attn.rope])
    elif la.mixer is not None:
        a = mixer(x, b, la, batch, il, ropes)
    else:
        a = reference.mixer_part(x, b, batch, il, *reference.rotations(b, ropes))
    if rows is not None:
        a, x = a[rows], x[rows]
        inp = None if inp is None else inp[rows]
    x = x + reference.residual(a, b)
    f = (ffn(x, b, la) if la.gate_up is not None else experts(x, la)
         if la.experts is not None else reference.ffn_part(x, b))
    return layer_end(x + reference.residual(f, b), b, la, inp)
