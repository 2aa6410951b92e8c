"""A whole decoder layer as one compiled call, run by a team of threads: how a token is
decoded when its layer qualifies (``ops.decoder_layer``).

Decoding runs each layer over one row (a few with several sequences). The separate
blocks (``blocks.py``) open a parallel region for each of the layer's four product steps
and for attention, and between the two block calls the interpreter boxes their results
and adds the residuals. Here one call does ``x + attn(x)``, then ``+ ffn(.)``, and opens
one parallel region. Each of its ``threads`` members takes work items (row ranges of the
products, (row, KV head) pairs of attention) from shared counters, one at a time, and
waits at a spin barrier (the count of finished items) before the step that reads their
results. The small steps between the products (the norms, quantizing the activations,
the gated activation, the residual adds) each member computes itself into its own arrays
rather than one computing while the rest wait; storing keys and values, which writes the
caches, is one item that one member takes. Measured on SmolLM2, 2 threads, the FFN of 30
layers: 5.1-5.9 against 6.1-7.0 ms per token with the separate block.

Members repeat those small steps, which costs a batch of many rows its time: the team
takes at most ``MAX_ROWS`` rows. The arithmetic is the blocks' kernels, called on the
same arguments, so a layer's numbers are bit-identical either way (batch invariance).

No member can wait forever when fewer threads than members run (a busy machine, or
numba running iterations one after another): a member waits only for items already
claimed, and whoever claimed one is running it. A member that runs alone does every item
of the layer itself, and those after it find everything done.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from gguflm.quant import kernels, matrix
from gguflm.quant.floatbits import to_f16
from gguflm.quant.kernels import _activation_sets, _run_item, _work_items, geglu, swiglu

from . import blocks
from .attention import _attend_one, store_rows
from .rowkernels import rmsnorm_rows, rope_rows

MAX_ROWS = 16  # rows up to which a layer runs as a team (decoding, a few sequences)

# -- atomics: numba has none; each is the one LLVM instruction ---------------------------


@intrinsic
def _fetch_add(typingctx, arr, i):  # noqa: ANN001, ANN202, ARG001
    """``arr[i] += 1`` atomically (sequentially consistent); the value before."""
    sig = types.int64(arr, types.intp)

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        a = context.make_array(signature.args[0])(context, builder, args[0])
        p = cgutils.get_item_pointer(context, builder, signature.args[0], a, [args[1]])
        return builder.atomic_rmw("add", p, ir.Constant(ir.IntType(64), 1), "seq_cst")

    return sig, codegen


@intrinsic
def _load_acquire(typingctx, arr, i):  # noqa: ANN001, ANN202, ARG001
    """``arr[i]`` read atomically: what was written before a ``_fetch_add`` another thread
    made is visible after reading its result."""
    sig = types.int64(arr, types.intp)

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        a = context.make_array(signature.args[0])(context, builder, args[0])
        p = cgutils.get_item_pointer(context, builder, signature.args[0], a, [args[1]])
        return builder.load_atomic(p, "acquire", 8)

    return sig, codegen


_X86 = kernels.SIMD != "generic"
_YIELD = sys.platform != "win32"


@intrinsic
def _spin_pause(typingctx, rounds):  # noqa: ANN001, ANN202, ARG001
    """One round of a spin wait: the CPU's pause hint (x86); every 4096th round gives the
    core away (``sched_yield``), so that a member waiting for one whose thread lost its
    core to another process lets that thread run."""
    sig = types.int64(types.int64)

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        if _X86:
            fn = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), []), "llvm.x86.sse2.pause")
            builder.call(fn, [])
        if _YIELD:
            every = builder.icmp_signed("==", builder.and_(args[0], ir.Constant(
                ir.IntType(64), 4095)), ir.Constant(ir.IntType(64), 4095))
            with builder.if_then(every, likely=False):
                fn = cgutils.get_or_insert_function(
                    builder.module, ir.FunctionType(ir.IntType(32), []), "sched_yield")
                builder.call(fn, [])
        return context.get_constant(types.int64, 0)

    return sig, codegen


# counters: each step's next item and its finished items, a cache line apart
_LINE = 8
_QKV, _PREP, _ATTN, _OUT, _GATE_UP, _DOWN = range(0, 12 * _LINE, 2 * _LINE)


@njit(cache=True, nogil=True)
def _wait(sync, k, total):  # noqa: ANN001, ANN202
    """Until step ``k`` has finished ``total`` items."""
    r = 0
    while _load_acquire(sync, k + _LINE) < total:
        _spin_pause(r)
        r += 1


@njit(cache=True, nogil=True)
def _products(kinds, ws, a32, ak, tbl, outs, items, sync, k):  # noqa: ANN001, ANN202
    """Step ``k``: take row ranges ``items`` of the products until none is left, then wait
    for the others' to finish."""
    total = items.shape[0]
    c = _fetch_add(sync, k)
    while c < total:
        _run_item(kinds, ws, a32, ak, tbl, outs, items, c)
        _fetch_add(sync, k + _LINE)
        c = _fetch_add(sync, k)
    _wait(sync, k, total)


@njit(cache=True, nogil=True)
def _add(x, y, out):  # noqa: ANN001, ANN202
    """out = x + y (T, n) f32, as numpy adds them."""
    for t in range(x.shape[0]):
        for i in range(x.shape[1]):
            out[t, i] = x[t, i] + y[t, i]


@njit(cache=True, nogil=True, error_model="numpy")
def _member(m, x, out, norms, eps, kinds, ws, items, tbl, heads, rot, neox, kt, v, slot,  # noqa: ANN001, ANN202, PLR0913
            pos, window, scale, cap, f16, flash, gelu, shared, sync):
    """Member ``m``'s part of ``layer``; ``shared`` the arrays every member writes into and
    reads, ``sync`` the step counters."""
    attn_norm, q_norm, k_norm, attn_post, ffn_norm, ffn_post = norms
    kinds_qkv, kinds_o, kinds_gu, kinds_d = kinds
    ws_qkv, ws_o, ws_gu, ws_d = ws
    it_qkv, it_o, it_gu, it_d = items
    q, k, vv, qr, a, o, g, u, o2 = shared
    n = x.shape[0]
    n_head, n_kv, d, dv = heads
    # attention: norm, Q K V, (one member) per-head norms, RoPE, storing K V; attention
    h = np.empty_like(x)
    rmsnorm_rows(x, attn_norm, eps, h)
    a32, ak = _activation_sets(kinds_qkv, 3, h)
    _products(kinds_qkv, ws_qkv, a32, ak, tbl, (q, k, vv), it_qkv, sync, _QKV)
    if _fetch_add(sync, _PREP) == 0:
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
        store_rows(kt, v, slot, pos, k3, vv.reshape((n, n_kv, dv)))
        for t in range(n):  # the queries as attention reads them (attention._prepare)
            for e in range(n_head * d):
                qr[t, e // d, e % d] = to_f16(q[t, e]) if f16 else q[t, e]
        _fetch_add(sync, _PREP + _LINE)
    _wait(sync, _PREP, 1)
    total = n * n_kv
    c = _fetch_add(sync, _ATTN)
    while c < total:
        _attend_one(qr, kt, v, slot, pos, window, scale, cap, f16, flash, a, c)
        _fetch_add(sync, _ATTN + _LINE)
        c = _fetch_add(sync, _ATTN)
    _wait(sync, _ATTN, total)
    b32, bk = _activation_sets(kinds_o, 1, a.reshape((n, n_head * dv)))
    _products(kinds_o, ws_o, b32, bk, tbl, (o, o, o), it_o, sync, _OUT)
    x1 = np.empty_like(x)
    if attn_post.shape[0]:
        p = np.empty_like(o)
        rmsnorm_rows(o, attn_post, eps, p)
        _add(x, p, x1)
    else:
        _add(x, o, x1)
    # feed-forward: norm, gate and up, the gated activation, down
    rmsnorm_rows(x1, ffn_norm, eps, h)
    c32, ck = _activation_sets(kinds_gu, 2, h)
    _products(kinds_gu, ws_gu, c32, ck, tbl, (g, u, g), it_gu, sync, _GATE_UP)
    act = np.empty_like(g)
    if gelu:
        geglu(g, u, act)
    else:
        swiglu(g, u, act)
    d32, dk = _activation_sets(kinds_d, 1, act)
    _products(kinds_d, ws_d, d32, dk, tbl, (o2, o2, o2), it_d, sync, _DOWN)
    if m == 0:  # every member has finished with o2
        if ffn_post.shape[0]:
            rmsnorm_rows(o2, ffn_post, eps, o2)
        _add(x1, o2, out)


@njit(cache=True, nogil=True)
def _shared(x, ws, heads):  # noqa: ANN001, ANN202
    n = x.shape[0]
    n_head, n_kv, d, dv = heads
    n_ff = ws[2][0].shape[0]
    return (np.empty((n, n_head * d), np.float32), np.empty((n, n_kv * d), np.float32),
            np.empty((n, n_kv * dv), np.float32), np.empty((n, n_head, d), np.float32),
            np.empty((n, n_head, dv), np.float32), np.empty_like(x),
            np.empty((n, n_ff), np.float32), np.empty((n, n_ff), np.float32),
            np.empty_like(x))


@njit(cache=True, nogil=True)
def _items(ws, n, threads):  # noqa: ANN001, ANN202
    return (_work_items(ws[0], 3, n, threads), _work_items(ws[1], 1, n, threads),
            _work_items(ws[2], 2, n, threads), _work_items(ws[3], 1, n, threads))


@njit(cache=True, nogil=True, parallel=True, error_model="numpy")
def layer_team(x, norms, eps, kinds, ws, tbl, heads, rot, neox, kt, v, slot, pos, window,  # noqa: ANN001, ANN201, PLR0913
               scale, cap, f16, flash, gelu, threads):
    """x (T, n_embd) f32 -> (T, n_embd) f32: ``x + attn(x)``, then ``+ ffn(.)``, on
    ``threads`` members. ``norms``: the attention norm, Q and K head norms, post-attention
    norm, FFN norm and post-FFN norm weights, (n,) f32 or empty (none); ``kinds``/``ws``:
    the type ids and padded weights of Q K V, the output, gate and up, and down (as
    ``blocks.attention_block``/``ffn_block`` take them); the rest as
    ``blocks.attention_block`` takes them; ``gelu``: GeGLU, else SwiGLU."""
    out = np.empty_like(x)
    # the loop body gets plain arrays and flat tuples: numba's parallel loops take no
    # nested or mixed tuples
    q, k, vv, qr, a, o, g, u, o2 = _shared(x, ws, heads)
    it_qkv, it_o, it_gu, it_d = _items(ws, x.shape[0], threads)
    n0, n1, n2, n3, n4, n5 = norms
    k0, k1, k2, k3 = kinds
    w0, w1, w2, w3 = ws
    sync = np.zeros(12 * _LINE, np.int64)
    for m in prange(threads):
        _member(m, x, out, (n0, n1, n2, n3, n4, n5), eps, (k0, k1, k2, k3), (w0, w1, w2, w3),
                (it_qkv, it_o, it_gu, it_d), tbl, heads, rot, neox, kt, v, slot, pos, window,
                scale, cap, f16, flash, gelu, (q, k, vv, qr, a, o, g, u, o2), sync)
    return out


@njit(cache=True, nogil=True, error_model="numpy")
def layer_alone(x, norms, eps, kinds, ws, tbl, heads, rot, neox, kt, v, slot, pos, window,  # noqa: ANN001, ANN201, PLR0913
                scale, cap, f16, flash, gelu):
    """``layer_team`` on this thread (a layer too small to share)."""
    out = np.empty_like(x)
    shared = _shared(x, ws, heads)
    items = _items(ws, x.shape[0], 0)
    sync = np.zeros(12 * _LINE, np.int64)
    _member(0, x, out, norms, eps, kinds, ws, items, tbl, heads, rot, neox, kt, v, slot,
            pos, window, scale, cap, f16, flash, gelu, shared, sync)
    return out


def plans(layer: Any) -> Any:
    """The layer's (attention, FFN) weight plans when both blocks can run compiled, else
    None (``matrix.layer_plan``)."""
    attn = matrix.layer_plan(layer, matrix.ATTENTION_GROUPS)
    ffn = matrix.layer_plan(layer, matrix.FFN_GROUPS)
    return None if attn is None or ffn is None else (attn, ffn)


def run_layer(x: np.ndarray, layer: Any, plan: Any, batch: Any, il: int, config: Any,
          rot: np.ndarray, neox: bool, scale: float, window: int, gelu: bool,
          norms: tuple[np.ndarray | None, ...], cap: float) -> np.ndarray:
    """``layer_team`` (or ``layer_alone`` below ``matrix.PARALLEL_MIN_MACS`` multiply-adds)
    for x (T <= MAX_ROWS, n_embd) in layer ``il`` of ``batch``'s caches; ``plan`` from
    ``plans``; ``norms`` as ``layer_team`` takes them, None for none."""
    c = config
    fixed = blocks._fixed(layer, norms, (c.norm_eps, scale, cap), lambda: (
        tuple(blocks._norm(w) for w in norms),
        np.float32(c.norm_eps), np.float32(scale), np.float32(cap),
        (c.n_head, c.n_head_kv, c.head_dim, c.head_dim_v),
        tuple(p[0] for g in plan for p in g), tuple(p[1] for g in plan for p in g),
        sum(p[2] for g in plan for p in g)))
    norm_ws, eps32, scale32, cap32, heads, kinds, ws, macs = fixed
    x = np.ascontiguousarray(x, dtype=np.float32)
    arena = batch.arena
    _check_build()
    args = (x, norm_ws, eps32, kinds, ws, kernels.F16_TABLE, heads,
            np.ascontiguousarray(rot, dtype=np.complex64), neox, arena.k[il], arena.v[il],
            batch.slot, batch.pos, int(window), scale32, cap32, arena.f16, batch.flash, gelu)
    threads = matrix.threads()
    if threads > 1 and len(x) * (macs + c.n_head * (c.head_dim + c.head_dim_v)
                                 * (batch.span - 1)) >= matrix.PARALLEL_MIN_MACS:
        return layer_team(*args, threads)
    return layer_alone(*args)


_SOURCES_KEY = blocks._SOURCES_KEY  # the team calls the same kernels as the blocks


@njit(cache=True)
def _built_key() -> int:
    return _SOURCES_KEY  # frozen into the cached machine code with the team's


_fresh = False


def _check_build() -> None:
    """Rebuild the team's cached machine code when it was built from other sources (as
    ``blocks._check_build`` does for the blocks)."""
    global _fresh
    if not _fresh:
        blocks._check_build()
        kernels.rebuild_if_stale(_built_key, _SOURCES_KEY,
                                 (_member, _shared, _items, layer_team, layer_alone,
                                  _built_key))
        _fresh = True
