"""The decoder layers as one compiled call, run by a team of threads: how tokens are
decoded (``executor.run``).

Decoding runs each layer over one row (a few with several sequences). Layer by layer
(``fused.py``), each layer costs two Python-level calls, their dispatch and boxing, two
numpy adds, and a parallel region for each of its four product steps and for attention:
on a small model a fifth of a token's time (docs/performance.md). Here one call runs
every layer and opens one parallel region. A layer's FFN is a dense GLU or, in a model
whose every layer has one, a mixture of experts (``team_experts``: the router's rows, then
the chosen experts' gate/up and down row ranges as the steps' work items).
Each of its ``threads`` members takes work items (row ranges of the products, (row, KV
head) pairs of attention) from shared counters, one at a time, and waits at a spin
barrier (the count of finished items) before the step that reads their results. The small
steps between the products (the norms, quantizing the activations, the gated activation,
the residual adds) each member computes itself, into its own arrays, rather than one
computing while the rest wait; storing keys and values, which writes the caches, is one
item that one member takes. Each layer has its own shared arrays (a member running ahead
never overwrites what a slower one still reads), so a call holds ``n_layer`` times a
layer's activations: the team takes at most ``MAX_ROWS`` rows and ``MAX_BYTES`` of them.
Those arrays are one block per thread, kept from call to call (``Stack.buffers``).

Members repeat those small steps, which would cost a batch of many rows its time: longer
prompts run layer by layer. The arithmetic is the fused layers' kernels, called on the same
arguments, so the numbers are bit-identical either way (batch invariance).

No member can wait forever when fewer threads than members run (a busy machine, or numba
running iterations one after another): a member waits only for items already claimed,
and whoever claimed one is running it. A member that runs alone does every item of every
layer itself, and those after it find everything done.

The weights reach the compiled code as a table of addresses and shapes (``Stack``): a
tuple of per-layer arrays would compile once per depth, and numba's typed lists compile
at every start. The table's ``Stack`` holds the arrays the addresses point into.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic
from numba.np.arrayobj import populate_array

from gguflm.quant import kernels, matrix
from gguflm.quant.floatbits import to_f16
from gguflm.quant.grouped import activation_sets, run_item, weight_bytes
from gguflm.quant.int_tiles import prepare
from gguflm.quant.kernels import work_items as _work_items

from . import fused, fused_experts, ops
from .attention import _attend_one, store_rows
from .forward_pass import LAYER
from .fused import add_bias, glu_into, pre_norm, qk_heads
from .layer import Block, Experts, Linear
from .rowkernels import rmsnorm_rows
from .spin import LINE, fetch_add, load_acquire, wait
from .team_experts import expert_ffn

MAX_ROWS = 16  # rows up to which the layers run as a team (decoding; a short prompt)
MAX_BYTES = 32 << 20  # the most activation memory a team call holds

# counters: each step's next item and its finished items, a cache line apart; _STOP's
# second word holds the decision whether to stop before the layer (``_member``)
_QKV, _PREP, _ATTN, _OUT, _GATE_UP, _DOWN, _STOP, _ROUTE = range(0, 16 * LINE, 2 * LINE)
_SYNC_WIDTH = 16 * LINE


@njit(cache=True, nogil=True)
def _residual(x, y, bias, post, eps, tmp, out):  # noqa: ANN001, ANN202
    """out = x + y (T, n) f32 as numpy adds them, y first plus ``bias`` and then
    RMS-normalized times ``post`` (into ``tmp``) when those are not empty (a product's
    bias; Gemma's post-norms). ``y`` is shared by the members: never written here."""
    if bias.shape[0]:
        for t in range(y.shape[0]):
            for i in range(y.shape[1]):
                tmp[t, i] = y[t, i] + bias[i]
        y = tmp
    if post.shape[0]:
        rmsnorm_rows(y, post, eps, tmp)
        y = tmp
    for t in range(x.shape[0]):
        for i in range(x.shape[1]):
            out[t, i] = x[t, i] + y[t, i]


# -- the weights as a table: views made in the compiled code from addresses ----------------


def _view(dtype: Any, ndim: int):  # noqa: ANN202 - returns a numba intrinsic
    aryty = types.Array(dtype, ndim, "C", readonly=True)

    @intrinsic
    def view(typingctx, addr, shape):  # noqa: ANN001, ANN202, ARG001
        """A read-only C-ordered array of ``shape`` at address ``addr`` (its owner keeps
        it alive)."""
        sig = aryty(types.int64, types.UniTuple(types.int64, ndim))

        def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
            ary = context.make_array(aryty)(context, builder)
            item = context.get_abi_sizeof(context.get_data_type(dtype))
            dims = cgutils.unpack_tuple(builder, args[1])
            strides, step = [], ir.Constant(ir.IntType(64), item)
            for dim in reversed(dims):
                strides.insert(0, step)
                step = builder.mul(step, dim)
            ptr = builder.inttoptr(args[0], context.get_data_type(dtype).as_pointer())
            populate_array(ary, data=ptr, shape=cgutils.pack_array(builder, dims),
                           strides=cgutils.pack_array(builder, strides),
                           itemsize=context.get_constant(types.intp, item), meminfo=None)
            return ary._getvalue()

        return sig, codegen

    return view


_u8_2d = _view(types.uint8, 2)
_f32_2d = _view(types.float32, 2)
_f32_1d = _view(types.float32, 1)

# the table's matrices, in order (``Stack``: Q, K, V, output, gate, up, down), and the
# product groups (padded as ``kernels.pad_products`` pads them)
_GROUPS = ((0, 1, 2), (3, 3, 3), (4, 5, 4), (6, 6, 6))
_COUNTS = (3, 1, 2, 1)


@njit(cache=True, nogil=True, inline="always")
def _weights(wtab, il, g):  # noqa: ANN001, ANN202
    """Group g's weights (a MAX_FUSED-tuple of (rows, row bytes) u8) in layer il."""
    i, j, k = _GROUPS[g]
    return (_u8_2d(wtab[il, i, 0], (wtab[il, i, 1], wtab[il, i, 2])),
            _u8_2d(wtab[il, j, 0], (wtab[il, j, 1], wtab[il, j, 2])),
            _u8_2d(wtab[il, k, 0], (wtab[il, k, 1], wtab[il, k, 2])))


@njit(cache=True, nogil=True, inline="always")
def _norm(ntab, il, i):  # noqa: ANN001, ANN202
    """Entry i of layer il in a table of vectors (norm weights, biases): (length,) f32."""
    return _f32_1d(ntab[il, i, 0], (ntab[il, i, 1],))


@njit(cache=True, nogil=True, inline="always")
def _biased(y, b, tmp):  # noqa: ANN001, ANN202
    """y + b into this member's ``tmp`` (y is shared: never written), or y itself when b
    is empty."""
    if b.shape[0] == 0:
        return y
    for t in range(y.shape[0]):
        for i in range(y.shape[1]):
            tmp[t, i] = y[t, i] + b[i]
    return tmp


@njit(cache=True, nogil=True)
def stack_items(wtab, n, threads):  # noqa: ANN001, ANN201
    """(items (4 L, most, 3), counts (4 L,)): ``kernels._work_items`` of each layer's four
    product groups for n rows on ``threads`` threads (0: one thread)."""
    n_layer = wtab.shape[0]
    counts = np.zeros(4 * n_layer, np.int64)
    for il in range(n_layer):
        for g in range(4):
            counts[4 * il + g] = _work_items(_weights(wtab, il, g), _COUNTS[g], n,
                                            threads).shape[0]
    items = np.zeros((4 * n_layer, max(1, counts.max()), 3), np.int64)
    for il in range(n_layer):
        for g in range(4):
            it = _work_items(_weights(wtab, il, g), _COUNTS[g], n, threads)
            items[4 * il + g, :it.shape[0]] = it
    return items, counts


# -- the team -------------------------------------------------------------------------------


@njit(cache=True, nogil=True)
def _products(kinds, ws, acts, tbl, outs, items, total, sync, k):  # noqa: ANN001, ANN202
    """Step ``k``: take the products' row ranges ``items[:total]`` until none is left, then
    wait for the others' to finish; ``acts`` the input's ``grouped.activation_sets``."""
    a32, ak, xh, xb = acts
    c = fetch_add(sync, k)
    while c < total:
        run_item(kinds, ws, a32, ak, xh, xb, tbl, outs, items, c)
        fetch_add(sync, k + LINE)
        c = fetch_add(sync, k)
    wait(sync, k, total)


@njit(cache=True, nogil=True, inline="always")
def _attention(x, h, x1, p, wtab, ktab, ntab, btab, itab, icount, tbl, heads, eps, rot, neox,  # noqa: ANN001, ANN202, PLR0913
               window, kt, v, slot, pos, scale, cap, f16, flash, bufs, s, il):
    """Layer il's attention: x1 = x + attn(x) (``h``, ``p`` this member's scratch): the
    norm, Q K V, (one member) the per-head norms, RoPE and storing K V, the attention, the
    output product."""
    q, k, vv, qr, a, o = bufs
    n = x.shape[0]
    n_head, n_kv, d, dv = heads
    pre_norm(x, _norm(ntab, il, 0), eps, h)
    kinds = ktab[4 * il]
    _products(kinds, _weights(wtab, il, 0), activation_sets(kinds, 3, h), tbl, (q, k, vv),
              itab[4 * il], icount[4 * il], s, _QKV)
    if fetch_add(s, _PREP) == 0:
        add_bias(q, _norm(btab, il, 0))
        add_bias(k, _norm(btab, il, 1))
        add_bias(vv, _norm(btab, il, 2))
        _, k3 = qk_heads(q, k, _norm(ntab, il, 1), _norm(ntab, il, 2), eps, rot, neox, heads)
        store_rows(kt, v, slot, pos, k3, vv.reshape((n, n_kv, dv)))
        for t in range(n):  # the queries as attention reads them (attention._prepare)
            for e in range(n_head * d):
                qr[t, e // d, e % d] = to_f16(q[t, e]) if f16 else q[t, e]
        fetch_add(s, _PREP + LINE)
    wait(s, _PREP, 1)
    total = n * n_kv
    c = fetch_add(s, _ATTN)
    while c < total:
        _attend_one(qr, kt, v, slot, pos, window, scale, cap, f16, flash, a, c,
                    _norm(ntab, il, 6))
        fetch_add(s, _ATTN + LINE)
        c = fetch_add(s, _ATTN)
    wait(s, _ATTN, total)
    kinds = ktab[4 * il + 1]
    _products(kinds, _weights(wtab, il, 1),
              activation_sets(kinds, 1, a.reshape((n, n_head * dv))), tbl, (o, o, o),
              itab[4 * il + 1], icount[4 * il + 1], s, _OUT)
    _residual(x, o, _norm(btab, il, 3), _norm(ntab, il, 3), eps, p, x1)


@njit(cache=True, nogil=True, inline="always")
def _dense_ffn(h, wtab, ktab, btab, itab, icount, tbl, act, gelu_tbl, g, u, o2, scratch, s,  # noqa: ANN001, ANN202, PLR0913
               il):
    """Layer il's GLU FFN of its normed input h into the shared ``o2``: gate and up, their
    biases, the gated activation (``act`` as ``fused.glu``), down; ``scratch`` this
    member's (activation, biased gate, biased up) arrays."""
    gated, gb, ub = scratch
    kinds = ktab[4 * il + 2]
    _products(kinds, _weights(wtab, il, 2), activation_sets(kinds, 2, h), tbl, (g, u, g),
              itab[4 * il + 2], icount[4 * il + 2], s, _GATE_UP)
    g1 = _biased(g, _norm(btab, il, 4), gb)
    u1 = _biased(u, _norm(btab, il, 5), ub)
    glu_into(g1, u1, act, gelu_tbl, gated)
    kinds = ktab[4 * il + 3]
    _products(kinds, _weights(wtab, il, 3), activation_sets(kinds, 1, gated), tbl,
              (o2, o2, o2), itab[4 * il + 3], icount[4 * il + 3], s, _DOWN)
    return o2


@njit(cache=True, nogil=True, inline="always")
def _experts(h, wtab, ktab, xtab, btab, ntab, moe, tbl, act, gelu_tbl, gu, lg, d, s, il,  # noqa: ANN001, ANN202, PLR0913
             members):
    """Layer il's mixture of experts of its normed input h (``team_experts.expert_ffn``):
    the router (``wtab``'s eighth entry), the experts' addresses (``xtab``), their shapes
    (``wtab``'s gate and down entries) and types (``ktab``'s FFN groups)."""
    choice, escale = moe
    n_embd = h.shape[1]
    router = _f32_2d(wtab[il, 7, 0], (wtab[il, 7, 1], n_embd))
    mats = (ktab[4 * il + 2, :2], xtab[il, :2], wtab[il, 4, 1:], ktab[4 * il + 3, :1],
            xtab[il, 2:], wtab[il, 6, 1:])
    return expert_ffn(h, router, _norm(btab, il, 7), _norm(ntab, il, 7), choice, escale, mats,
                      act, gelu_tbl, tbl, gu.reshape(-1), lg, d.reshape(-1), s,
                      (_ROUTE, _GATE_UP, _DOWN), members)


@njit(cache=True, nogil=True, error_model="numpy")
def _member(m, x0, out, wtab, ktab, xtab, ntab, btab, itab, icount, tbl, heads, eps, rots,  # noqa: ANN001, ANN202, PLR0913
            rot_sel, neox, windows, k_cache, v_cache, slot, pos, scale, cap, f16, flash, act,
            gelu_tbl, choice, escale, bufs, sync, stop, l0, l1, members):
    """Member ``m``'s part of ``stack_team`` (layers l0:l1, or fewer: ``stop``); ``bufs``
    the per-layer arrays every member writes into and reads, ``sync`` each layer's step
    counters."""
    q_all, k_all, v_all, qr_all, a_all, o_all, g_all, u_all, o2_all = bufs
    n = x0.shape[0]
    x = x0.copy()  # each member's own residual stream: the same numbers in every member
    h = np.empty_like(x)
    x1 = np.empty_like(x)
    p = np.empty_like(x)
    n_ff = wtab[l0, 4, 1]
    scratch = (np.empty((n, n_ff), np.float32),
               np.empty((n, n_ff) if btab[:, 4, 1].max() else (0, 0), np.float32),
               np.empty((n, n_ff) if btab[:, 5, 1].max() else (0, 0), np.float32))
    reached = l1
    for il in range(l0, l1):
        s = sync[il]
        if stop.shape[0] and il > l0:  # stop here when asked: the first member decides
            if fetch_add(s, _STOP) == 0:
                s[_STOP + 1] = 1 if load_acquire(stop, 0) else 0
                fetch_add(s, _STOP + LINE)
            wait(s, _STOP, 1)
            if s[_STOP + 1]:
                reached = il
                break
        _attention(x, h, x1, p, wtab, ktab, ntab, btab, itab, icount, tbl, heads, eps,
                   rots[rot_sel[il]], neox, windows[il], k_cache[il], v_cache[il], slot, pos,
                   scale, cap, f16, flash, (q_all[il], k_all[il], v_all[il], qr_all[il],
                                            a_all[il], o_all[il]), s, il)
        pre_norm(x1, _norm(ntab, il, 4), eps, h)
        if choice[1]:  # experts: n_used of them
            y = _experts(h, wtab, ktab, xtab, btab, ntab, (choice, escale), tbl, act,
                         gelu_tbl, g_all[il], u_all[il], o2_all[il], s, il, members)
        else:
            y = _dense_ffn(h, wtab, ktab, btab, itab, icount, tbl, act, gelu_tbl, g_all[il],
                           u_all[il], o2_all[il], scratch, s, il)
        _residual(x1, y, _norm(btab, il, 6), _norm(ntab, il, 5), eps, p, x)
    if m == 0:
        out[:] = x
        if stop.shape[0]:
            stop[1] = reached


@njit(cache=True, nogil=True, parallel=True, error_model="numpy")
def stack_team(x, wtab, ktab, xtab, ntab, btab, itab, icount, tbl, heads, eps, rots, rot_sel,  # noqa: ANN001, ANN201, PLR0913
               neox, windows, k_cache, v_cache, slot, pos, scale, cap, f16, flash, act,
               gelu_tbl, choice, escale, bufs, sync, stop, l0, l1, threads):
    """x (T, n_embd) f32 -> (T, n_embd) f32 through layers l0:l1, on ``threads`` members,
    or up to the layer ``stop[1]`` where they stopped (``stop``: ``forward_pass.Stops.flag``,
    or empty: no stops):
    ``x + attn(x)``, then ``+ ffn(.)``, in each. ``wtab`` (L, 8, 3) i64: each layer's
    matrices (Q, K, V, output, gate, up, down) as (address, rows, row bytes), an expert
    FFN's gate and down as (0, rows, row bytes) and its F32 router as (address, rows, 0);
    ``ktab`` (4 L, MAX_FUSED) i64 the product groups' type ids; ``xtab`` (L, 3, n_expert)
    i64 the experts' gate, up and down addresses; ``ntab`` (L, 8, 2) i64 the attention,
    Q-head, K-head, post-attention, FFN and post-FFN norm weights, the attention sinks and
    the experts' selection bias as (address, length; 0: none); ``btab`` (L, 8, 2) i64 the
    seven products' biases and the router's likewise; ``itab``/``icount`` from
    ``stack_items``; ``heads`` (H, H_kv, d, d_v); ``rots`` (R, T, n_rot/2) c64 RoPE tables,
    ``rot_sel`` (L,) i64 each layer's; ``neox``: NEOX pairing; ``windows`` (L,) i64;
    ``k_cache``/``v_cache`` the arena's (L, ...) keys and values; the rest as
    ``fused.attention_step`` takes them; ``act`` the gated activation (``fused.glu``'s, its
    GELU table ``gelu_tbl``); ``choice`` (gating, n_used: 0 for a dense FFN, groups, groups
    used, renormalise) and ``escale`` as ``team_experts.expert_ffn`` takes them; ``bufs``
    each layer's shared arrays (``Stack.buffers``)."""
    out = np.empty_like(x)
    # the loop body gets plain arrays and flat tuples: numba's parallel loops take no
    # nested or mixed tuples
    q, k, vv, qr, a, o, g, u, o2 = bufs
    sync[:, :] = 0
    for m in prange(threads):
        # int64: the parallel body's index is unsigned, and _member would compile twice
        _member(np.int64(m), x, out, wtab, ktab, xtab, ntab, btab, itab, icount, tbl, heads,
                eps, rots, rot_sel, neox, windows, k_cache, v_cache, slot, pos, scale, cap,
                f16, flash, act, gelu_tbl, choice, escale, (q, k, vv, qr, a, o, g, u, o2),
                sync, stop, l0, l1, threads)
    return out


@njit(cache=True, nogil=True, error_model="numpy")
def stack_alone(x, wtab, ktab, xtab, ntab, btab, itab, icount, tbl, heads, eps, rots, rot_sel,  # noqa: ANN001, ANN201, PLR0913
                neox, windows, k_cache, v_cache, slot, pos, scale, cap, f16, flash, act,
                gelu_tbl, choice, escale, bufs, sync, stop, l0, l1):
    """``stack_team`` on this thread (layers too small to share)."""
    out = np.empty_like(x)
    sync[:, :] = 0
    _member(0, x, out, wtab, ktab, xtab, ntab, btab, itab, icount, tbl, heads, eps, rots,
            rot_sel, neox, windows, k_cache, v_cache, slot, pos, scale, cap, f16, flash, act,
            gelu_tbl, choice, escale, bufs, sync, stop, l0, l1, 1)
    return out


# -- from Python ----------------------------------------------------------------------------


def _address(a: np.ndarray) -> int:
    return int(a.__array_interface__["data"][0])


def _matrices(b: Block) -> tuple[Linear | None, ...]:
    """A layer's products in the order of the table (``_GROUPS`` index into it); an expert
    FFN's in ``Stack._experts``."""
    a, f = b.attn, b.ffn
    ffn = (None, None, None) if isinstance(f, Experts) else (f.gate, f.up, f.down)
    return (a.q, a.k, a.v, a.o, *ffn)


class Stack:
    """A model's layers as ``stack_team`` takes them, worked out once by the planner
    (``executor.plan``, which checked that every layer has integer kernels, one shape, and
    the same RoPE pairing, scale, soft-cap and activation; experts in every layer or in
    none, chosen alike): the tables, the arrays they point into (held here), and the work
    items per (rows, threads)."""

    def __init__(self, layers: list[Block]) -> None:
        n_layer = len(layers)
        self.wtab = np.zeros((n_layer, 8, 3), np.int64)
        self.ktab = np.zeros((4 * n_layer, kernels.MAX_FUSED), np.int64)
        self.ntab = np.zeros((n_layer, 8, 2), np.int64)
        self.btab = np.zeros((n_layer, 8, 2), np.int64)
        first = layers[0]
        e = first.ffn if isinstance(first.ffn, Experts) else None
        self.xtab = np.zeros((n_layer, 3, len(e.gate) if e else 1), np.int64)
        self.rot_sel = np.array([b.attn.rope for b in layers], np.int64)
        self.windows = np.array([b.attn.window for b in layers], np.int64)
        self.held: list[np.ndarray] = []
        self.macs = 0
        for il, b in enumerate(layers):
            lins = _matrices(b)
            for i, lin in enumerate(lins):
                if lin is not None:
                    raw = self._hold(np.ascontiguousarray(weight_bytes(lin.w.raw)))
                    self.wtab[il, i] = (_address(raw), raw.shape[0], raw.shape[1])
                    self.btab[il, i] = self._vector(lin.b)
            for g, idx in enumerate(_GROUPS if e is None else _GROUPS[:2]):
                self.ktab[4 * il + g] = [int(lins[i].w.type) for i in idx]
            if e is not None:
                self._experts(il, b.ffn)
            norms = (b.attn_norm, b.attn.q_norm, b.attn.k_norm, b.attn_post_norm, b.ffn_norm,
                     b.ffn_post_norm, b.attn.sinks, b.ffn.select_bias if e else None)
            for i, w in enumerate(norms):
                self.ntab[il, i] = self._vector(w)
            self.macs += sum(lin.w.shape[0] * lin.w.shape[1] for lin in lins if lin)
        a = first.attn
        self.heads = (a.n_head, a.n_head_kv, a.head_dim, a.head_dim_v)
        self.eps = np.float32(first.eps)
        self.neox = a.neox
        self.act = fused.GLU_ACTS[first.ffn.act]
        # ggml's float16 GELU table where the activation reads it
        self.gelu_tbl = ops.gelu_f16_table() if self.act == 2 else np.zeros(0, np.float32)
        self.scale, self.cap = np.float32(a.scale), np.float32(a.softcap)
        # ints alike (numba's parallel loop takes no mixed tuple); n_used 0: a dense FFN
        self.choice = ((0, 0, 0, 0, 0) if e is None else
                       tuple(int(v) for v in fused_experts.choice_of(e)))
        self.escale = np.float32(1.0) if e is None else fused_experts.weights_scale(e)
        self.widths = self._widths(first, e)
        self.row_bytes = 4 * n_layer * sum(int(np.prod(w)) for w in self.widths)
        self.attn_macs = a.n_head * (a.head_dim + a.head_dim_v)  # per row and position
        self.local = threading.local()
        self.items: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}

    def _experts(self, il: int, e: Experts) -> None:
        """Layer il's experts into the tables: their addresses, shapes and types, the
        F32 router, its bias, and the work of the chosen ones."""
        gu, dn = e.gate_up_all, e.down_all
        prepare([*gu.kinds, *dn.kinds])
        self.xtab[il] = np.concatenate([gu.ptrs, dn.ptrs])
        self.wtab[il, 4] = (0, *gu.shape)
        self.wtab[il, 5] = (0, *gu.shape)
        self.wtab[il, 6] = (0, *dn.shape)
        self.ktab[4 * il + 2, :2] = gu.kinds
        self.ktab[4 * il + 3, :1] = dn.kinds
        router = self._hold(np.ascontiguousarray(e.router.w.raw, np.float32))
        self.wtab[il, 7] = (_address(router), router.shape[0], 0)
        self.btab[il, 7] = self._vector(e.router.b)
        self.macs += e.n_used * (2 * gu.rows * gu.d_in + dn.rows * dn.d_in)

    @staticmethod
    def _widths(first: Block, e: Experts | None) -> tuple[tuple[int, ...], ...]:
        """Each layer's shared arrays (``buffers``): Q, K, V, the queries as attention reads
        them, attention's output, the output product, then gate, up and down (an expert
        FFN: every chosen expert's gate and up, the router's logits, their downs); floats
        per row."""
        a = first.attn
        n_embd = a.o.rows
        if e is None:
            n_ff = first.ffn.gate.rows
            ffn = ((n_ff,), (n_ff,), (n_embd,))
        else:
            ffn = ((2 * e.n_used * e.gate_up_all.rows,), (len(e.gate),),
                   (e.n_used * n_embd,))
        return ((a.n_head * a.head_dim,), (a.n_head_kv * a.head_dim,),
                (a.n_head_kv * a.head_dim_v,), (a.n_head, a.head_dim),
                (a.n_head, a.head_dim_v), (n_embd,), *ffn)

    def _hold(self, a: np.ndarray) -> np.ndarray:
        a = kernels.read_only(a)
        self.held.append(a)
        return a

    def _vector(self, w: np.ndarray | None) -> tuple[int, int]:
        """A norm weight or bias as a table entry (address, length; 0: none)."""
        v = self._hold(fused.vector(w))
        return _address(v), v.shape[0]

    def work_items(self, n: int, threads: int) -> tuple[np.ndarray, np.ndarray]:
        key = (n, threads)
        got = self.items.get(key)
        if got is None:
            if len(self.items) >= 64:
                self.items.clear()
            got = self.items[key] = stack_items(self.wtab, n, threads)
        return got

    def buffers(self, n: int) -> tuple[tuple[np.ndarray, ...], np.ndarray]:
        """(each layer's shared arrays for ``n`` rows, (L, n, *width) each; the step
        counters), this thread's own and reused call after call. The arrays are carved from
        one block that grows to the most rows seen (``n * row_bytes``, at most
        ``MAX_BYTES``): fresh arrays each call came as fresh pages whenever the allocator
        had given the memory back (SmolLM2 at 8 rows: 1,000 page faults a step, 13% of its
        time). The counters have whole cache lines of their own with room on either side:
        allocated each call, they shared a 64-byte line with the calling thread's own
        arrays in some processes, every counter update by the other member evicted member
        0's data, and steps ran measurably slower. One set per thread, so
        that forwards of this model on other threads never share it."""
        local = self.local
        got = getattr(local, "views", None)
        if got is not None and got[0] == n:  # decoding: the same rows step after step
            return got[1], local.sync
        n_layer = self.wtab.shape[0]
        flat = getattr(local, "flat", None)
        if flat is None or flat.nbytes < n * self.row_bytes:
            flat = local.flat = np.empty(n * self.row_bytes // 4, np.float32)
        views, at = [], 0
        for w in self.widths:
            size = n_layer * n * int(np.prod(w))
            views.append(flat[at:at + size].reshape((n_layer, n, *w)))
            at += size
        local.views = (n, tuple(views))
        if getattr(local, "sync", None) is None:
            raw = np.zeros((n_layer + 2) * _SYNC_WIDTH + LINE, np.int64)
            lead = (-raw.__array_interface__["data"][0] % 64) // 8 + _SYNC_WIDTH
            local.sync = raw[lead:lead + n_layer * _SYNC_WIDTH].reshape((n_layer,
                                                                        _SYNC_WIDTH))
        return local.views[1], local.sync


def run_stack(st: Stack, x: np.ndarray, batch: Any, ropes: tuple) -> np.ndarray | None:
    """Every layer over x (T, n_embd) as one team call (``stack_team``, or ``stack_alone``
    below ``matrix.PARALLEL_MIN_MACS`` multiply-adds per layer; with ``batch.stops``,
    stopping between two layers when their flag asks, for a stop of the pass
    (``forward_pass.Stops``), then going on with another call), or None where the team
    does not apply (more than MAX_ROWS rows or MAX_BYTES of activations)."""
    n = len(x)
    rows = matrix.padded_rows(n)
    if n > MAX_ROWS or rows * st.row_bytes > MAX_BYTES:
        return None
    x = np.ascontiguousarray(x, dtype=np.float32)
    rots = np.ascontiguousarray(np.stack(ropes) if len(ropes) > 1 else ropes[0][None],
                                dtype=np.complex64)
    slot, pos, flash = batch.slot, batch.pos, batch.flash
    if rows > n:
        # 6 or 7 rows past a multiple of 8: the last row again, to make 8 (its products
        # then run as 1x8 tiles, as in QMatrix.matmul). The copy stores the same keys and
        # values at the same place in the cache as the row it copies, and is dropped.
        copy = np.minimum(np.arange(rows), n - 1)
        x, slot, pos, flash = x[copy], slot[copy], pos[copy], flash[copy]
        rots = np.ascontiguousarray(rots[:, copy])  # (R, T, n_rot/2): each row's RoPE
    arena = batch.arena
    threads = matrix.threads()
    n_layer = st.wtab.shape[0]
    attn_macs = st.attn_macs * batch.span
    team = threads > 1 and n * (st.macs // n_layer + attn_macs) >= matrix.PARALLEL_MIN_MACS
    itab, icount = st.work_items(rows, threads if team else 0)
    args = (st.wtab, st.ktab, st.xtab, st.ntab, st.btab, itab, icount, kernels.F16_TABLE,
            st.heads, st.eps, rots, st.rot_sel, st.neox, st.windows, arena.k, arena.v, slot,
            pos, st.scale, st.cap, arena.f16, flash, st.act, st.gelu_tbl, st.choice,
            st.escale)
    stops = batch.stops
    stop = _NO_STOPS if stops is None else stops.flag
    l0 = 0
    while True:
        bufs = st.buffers(rows)  # (again after a stop: another batch may have carved them)
        x = (stack_team(x, *args, *bufs, stop, l0, n_layer, threads) if team
             else stack_alone(x, *args, *bufs, stop, l0, n_layer))
        if stops is None or stop[1] >= n_layer:
            return x[:n]
        l0 = int(stop[1])
        stops.at(LAYER)


_NO_STOPS = np.zeros(0, np.int64)
