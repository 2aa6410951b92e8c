"""Whole steps of a layer in one compiled call: the attention block and the feed-forward
block, for batches too long for the team (``team.py``: prompts).

Per layer, a Python-level call per op would cost microseconds each, its wrapper and
numba's dispatch, more still after the products have streamed megabytes of weights
through the caches the interpreter lives in. ``ffn_block`` runs llama.cpp's build_ffn
with a parallel gate behind its norm (``rmsnorm``, the gate and up products, the gated
activation, the down product) as one call instead of five Python-level steps;
``attention_block`` runs build_attn behind its norm (``rmsnorm``, the Q, K and V
products, per-head Q/K norms, RoPE, storing K and V, attention, the output product) as one
call instead of about ten.

They are plain compiled functions calling the compiled kernels the separate ops call
(``rowkernels.rmsnorm_rows``/``rope_rows``, ``kernels.qmatmul_par``/``qmatmul_serial``,
``kernels.swiglu``/``geglu``, ``attention._attend_par``/``_attend_serial``), each kernel
with its own parallel region as before. (A ``prange`` inlined into a block was serialized
by numba, and the block ran 2-3x slower.) So they compute exactly what the separate ops
compute, element for element: a model gives the same logits whichever path runs, and the
batch-invariance rule holds.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

from gguflm.quant import jitcache, kernels, matrix
from gguflm.quant.kernels import geglu, qmatmul_par, qmatmul_serial, swiglu

from . import attention as _attention
from .attention import _attend_par, _attend_serial
from .rowkernels import rmsnorm_rows, rope_rows


@njit(cache=True, nogil=True, inline="always")
def _products(kinds, ws, x, tbl, outs, count, parallel, threads):  # noqa: ANN001, ANN202
    """The products as ``kernels.qmatmul_planned`` runs them (the same compiled kernels)."""
    if parallel:
        qmatmul_par(kinds, ws, x, tbl, outs, count, threads)
    else:
        qmatmul_serial(kinds, ws, x, tbl, outs, count)


@njit(cache=True, nogil=True)
def qk_heads(q, k, q_norm, k_norm, eps, rot, neox, heads):  # noqa: ANN001, ANN201
    """Q (T, H d) and K (T, H_kv d) f32 in place: each head RMS-normalized times
    ``q_norm``/``k_norm`` (d,) when not empty, then rotated by ``rot`` (``rope_rows``);
    returned as (T, H, d) and (T, H_kv, d)."""
    n = q.shape[0]
    n_head, n_kv, d, _ = heads
    if q_norm.shape[0]:
        qh = q.reshape((n * n_head, d))
        rmsnorm_rows(qh, q_norm, eps, qh)
    if k_norm.shape[0]:
        kh = k.reshape((n * n_kv, d))
        rmsnorm_rows(kh, k_norm, eps, kh)
    q3 = q.reshape((n, n_head, d))
    k3 = k.reshape((n, n_kv, d))
    rope_rows(q3, rot, neox)
    rope_rows(k3, rot, neox)
    return q3, k3


@njit(cache=True, nogil=True)
def ffn_block(x, norm_w, eps, kinds_gu, ws_gu, kinds_d, ws_d, tbl, gelu, post_norm, par_gu,  # noqa: ANN001, ANN201
              par_d, threads):
    """x (T, n_embd) f32 -> (T, n_embd) f32: ``down(glu(gate(h), up(h)))`` with
    ``h = rmsnorm(x) * norm_w``. ``ws_gu``/``kinds_gu``: the gate and up weights (R, row
    bytes) u8 and ggml type ids, padded as ``kernels.pad_products`` pads them; ``ws_d``/
    ``kinds_d`` the down weight likewise; ``gelu``: GeGLU, else SwiGLU; ``post_norm``
    (n_embd,) f32 or empty: the output RMS-normalized times it (Gemma's post-FFN norm);
    ``par_*``: whether each product runs on ``threads`` threads."""
    n = x.shape[0]
    h = np.empty_like(x)
    rmsnorm_rows(x, norm_w, eps, h)
    n_ff = ws_gu[0].shape[0]
    g = np.empty((n, n_ff), np.float32)
    u = np.empty((n, n_ff), np.float32)
    _products(kinds_gu, ws_gu, h, tbl, (g, u, g), 2, par_gu, threads)
    act = np.empty((n, n_ff), np.float32)  # not in place: an aliased loop runs unvectorized
    if gelu:
        geglu(g, u, act)
    else:
        swiglu(g, u, act)
    out = np.empty((n, ws_d[0].shape[0]), np.float32)
    _products(kinds_d, ws_d, act, tbl, (out, out, out), 1, par_d, threads)
    if post_norm.shape[0]:
        rmsnorm_rows(out, post_norm, eps, out)
    return out


@njit(cache=True, nogil=True)
def attention_block(x, norm_w, eps, kinds_qkv, ws_qkv, kinds_o, ws_o, tbl, heads, q_norm,  # noqa: ANN001, ANN201, PLR0913
                    k_norm, rot, neox, kt, v, slot, pos, window, scale, cap, f16, flash,
                    post_norm, par, threads):
    """x (T, n_embd) f32 -> (T, n_embd) f32: ``ops.normed_attention``'s steps. ``ws_qkv``/
    ``kinds_qkv`` the Q, K, V weights and type ids, ``ws_o``/``kinds_o`` the output's
    (padded as ``kernels.pad_products`` pads them); ``heads`` (H, H_kv, d, d_v);
    ``q_norm``/``k_norm`` (d,) f32 or empty (none); ``rot`` (T, n_rot/2) c64; ``kt``, ``v``,
    ``slot``, ``pos``, ``window``, ``scale``, ``cap``, ``f16``, ``flash`` as
    ``attention.attend`` takes them; ``post_norm`` (n_embd,) f32 or empty: the output
    RMS-normalized times it (Gemma's post-attention norm); ``par`` whether the QKV
    products, the attention and the output product run on ``threads`` threads."""
    n = x.shape[0]
    n_head, n_kv, d, dv = heads
    h = np.empty_like(x)
    rmsnorm_rows(x, norm_w, eps, h)
    q = np.empty((n, n_head * d), np.float32)
    k = np.empty((n, n_kv * d), np.float32)
    vv = np.empty((n, n_kv * dv), np.float32)
    _products(kinds_qkv, ws_qkv, h, tbl, (q, k, vv), 3, par[0], threads)
    q3, k3 = qk_heads(q, k, q_norm, k_norm, eps, rot, neox, heads)
    a = np.empty((n, n_head, dv), np.float32)
    v3 = vv.reshape((n, n_kv, dv))
    if par[1]:
        _attend_par(q3, kt, v, slot, pos, window, scale, cap, f16, flash, a, k3, v3)
    else:
        _attend_serial(q3, kt, v, slot, pos, window, scale, cap, f16, flash, a, k3, v3)
    out = np.empty((n, ws_o[0].shape[0]), np.float32)
    _products(kinds_o, ws_o, a.reshape((n, n_head * dv)), tbl, (out, out, out), 1, par[2],
              threads)
    if post_norm.shape[0]:
        rmsnorm_rows(out, post_norm, eps, out)
    return out


_NO_NORM = kernels.read_only(np.zeros(0, np.float32))


def _norm(w: np.ndarray | None) -> np.ndarray:
    """A norm's weight for a block: float32 and read-only (as a file's weights are: one
    compiled signature whether the model came from a file or not), or an empty array for
    none."""
    return _NO_NORM if w is None else kernels.read_only(np.ascontiguousarray(w, np.float32))


def attention(x: np.ndarray, norm_w: np.ndarray, eps: float, layer: Any, plan: Any,
              batch: Any, il: int, config: Any, rot: np.ndarray, neox: bool, scale: float,
              q_norm: np.ndarray | None, k_norm: np.ndarray | None, cap: float,
              window: int, post_norm: np.ndarray | None) -> np.ndarray:
    """``attention_block`` for x (T, n_embd) with the weights of ``plan`` (``matrix.
    layer_plan(layer, ATTENTION_GROUPS)``), in layer ``il`` of ``batch``'s caches; each
    part on all threads from the separate ops' thresholds."""
    (kinds_qkv, ws_qkv, macs_qkv), (kinds_o, ws_o, macs_o) = plan
    c = config
    norms, fixed = _fixed(layer, (norm_w, q_norm, k_norm, post_norm), (eps, scale, cap), lambda: (
        (_norm(norm_w), _norm(q_norm), _norm(k_norm), _norm(post_norm)),
        (np.float32(eps), np.float32(scale), np.float32(cap),
         (c.n_head, c.n_head_kv, c.head_dim, c.head_dim_v),
         c.n_head * (c.head_dim + c.head_dim_v))))
    eps32, scale32, cap32, heads, head_macs = fixed
    x = np.ascontiguousarray(x, dtype=np.float32)
    n = len(x)
    lim = matrix.PARALLEL_MIN_MACS
    arena = batch.arena
    _check_build()
    par = (n * macs_qkv >= lim,
           _attention.runs_parallel(n, c.n_head_kv, n * head_macs * batch.span),
           n * macs_o >= lim)
    return attention_block(
        x, norms[0], eps32, kinds_qkv, ws_qkv, kinds_o, ws_o, kernels.F16_TABLE, heads,
        norms[1], norms[2], np.ascontiguousarray(rot, dtype=np.complex64), neox,
        arena.k[il], arena.v[il], batch.slot, batch.pos, int(window), scale32, cap32,
        arena.f16, batch.flash, norms[3], par, matrix.threads())


def ffn(x: np.ndarray, norm_w: np.ndarray, eps: float, layer: Any, plan: Any, gelu: bool,
        post_norm: np.ndarray | None) -> np.ndarray:
    """``ffn_block`` for x (T, n_embd) with the weights of ``plan`` (``matrix.layer_plan(
    layer, FFN_GROUPS)``); each product on all threads from ``matrix.PARALLEL_MIN_MACS``
    multiply-adds, as the separate products decide."""
    (kinds_gu, ws_gu, macs_gu), (kinds_d, ws_d, macs_d) = plan
    norms, eps32 = _fixed(layer, (norm_w, post_norm), (eps,), lambda: (
        (_norm(norm_w), _norm(post_norm)), np.float32(eps)))
    x = np.ascontiguousarray(x, dtype=np.float32)
    n = len(x)
    lim = matrix.PARALLEL_MIN_MACS
    _check_build()
    return ffn_block(x, norms[0], eps32, kinds_gu, ws_gu, kinds_d, ws_d, kernels.F16_TABLE,
                     gelu, norms[1], n * macs_gu >= lim, n * macs_d >= lim, matrix.threads())


_FIXED_KEPT = 8  # entries per layer: a caller passing new arrays each time stays bounded


def _fixed(layer: Any, arrays: tuple, values: tuple, make: Any) -> Any:
    """``make()``: a block's arguments that stay the same from token to token (the norm
    weights as the kernel takes them, float32 scalars), worked out once per layer and kept
    on it. Each token asks for them in every layer: making them took about 4 of the 8
    microseconds of Python time in an attention block's call, looking them up here takes
    2. Keyed by the arrays' identity (the entry holds them, so an identity cannot be reused
    while it is kept) and the values. The norm weights of a model are float32 (a view of
    them is kept: an edit in place is still seen)."""
    kept = layer.__dict__.setdefault("_block_args", {})
    key = (tuple(map(id, arrays)), values)
    entry = kept.get(key)
    if entry is None:
        if len(kept) >= _FIXED_KEPT:
            kept.clear()
        entry = kept[key] = (arrays, make())
    return entry[1]


# the stamp jitcache gives this file's kernels (its sources and all they import)
_SOURCES_KEY = jitcache.sources_key(__file__)


@njit(cache=True)
def _built_key() -> int:
    return _SOURCES_KEY  # frozen into the cached machine code with the blocks'


def _check_build() -> None:
    """Nothing to do: numba rebuilds machine code whose stamp (``jitcache``) is stale."""
