"""Recurrent mixers in few compiled calls, for the fused layers (``fused.layer``): the gated
delta net (Qwen3.5), the gated short convolution (LFM2) and the Mamba2 state-space mixer
(Granite 4.0-H).

A recurrent mixer's products read the whole batch, but its convolution and scan run per
sequence, from that sequence's state, and the state staging happens in Python between
calls (``Batch.recurrent_state``, ``stage_state``). So a layer runs as one call for the
norm and the input products (``delta_in``, ``short_in``, ``mamba_in``); numpy's exp and
log1p where the reference path takes them (``deltanet.gates``, ``mamba2.dt_rates``:
numba's float32 exp differs from numpy's on some inputs); one call per sequence for its
steps (``deltanet.sequence``, ``shortconv.sequence``, ``mamba2.sequence``), the last
sequence's call also running the read-out and the output product (``delta_last``,
``short_last``, ``mamba_last``). For a batch of one sequence, two compiled calls instead
of about fifteen Python-level steps. The kernels are the reference path's (``forward`` of
each mixer's module), called on arrays of the same types: the same numbers, element for
element.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from numba import njit

from gguflm.quant import kernels, matrix
from gguflm.quant.kernels import silu_par, swiglu, swiglu_par

from . import deltanet, shortconv
from . import mamba2 as _mamba2
from .fused import Group, add_bias, group, part_out, pre_norm, products, vector
from .layer import Block, DeltaNet, Mamba2, ShortConv
from .ops import GATED_PARALLEL_MIN
from .rowkernels import rmsnorm_rows


@njit(cache=True, nogil=True)
def delta_in(x, norm_w, eps, kinds_mz, ws_mz, kinds_ba, ws_ba, tbl, par, threads, biases):  # noqa: ANN001, ANN201, PLR0913
    """x (T, n_embd) f32 -> the gated delta net's products of its normed input (``norm_w``
    as ``pre_norm`` takes it): (mixed (T, conv_dim), z (T, n_v S), beta (T, n_v), alpha
    (T, n_v)) f32, as ``deltanet.forward`` forms them. ``ws_mz``/``kinds_mz``: the qkv and z
    weights, ``ws_ba``/``kinds_ba``: beta's and alpha's (padded as ``kernels.pad_products``
    pads them: MAX_FUSED products a call); ``par`` whether each group runs on ``threads``
    threads; ``biases`` the four products' (their rows,) f32, or empty."""
    n = x.shape[0]
    h = np.empty_like(x)
    pre_norm(x, norm_w, eps, h)
    mixed = np.empty((n, ws_mz[0].shape[0]), np.float32)
    z = np.empty((n, ws_mz[1].shape[0]), np.float32)
    beta = np.empty((n, ws_ba[0].shape[0]), np.float32)
    alpha = np.empty((n, ws_ba[1].shape[0]), np.float32)
    products(kinds_mz, ws_mz, h, tbl, (mixed, z, mixed), 2, par[0], threads)
    products(kinds_ba, ws_ba, h, tbl, (beta, alpha, beta), 2, par[1], threads)
    add_bias(mixed, biases[0])
    add_bias(z, biases[1])
    add_bias(beta, biases[2])
    add_bias(alpha, biases[3])
    return mixed, z, beta, alpha


@njit(cache=True, nogil=True)
def delta_out(o, z, norm, eps, kinds_o, ws_o, tbl, par, threads, b_o, post_norm):  # noqa: ANN001, ANN201, PLR0913
    """The delta rule's read-out o (T, n_v, S) f32 -> (T, n_embd) f32: each head
    RMS-normed times ``norm`` (S,), times silu(z) (z (T, n_v S): ``silu_par`` over rows of
    S, as ``ops.silu`` of z (T, n_v, S)), then the output product and the post norm
    (``part_out``)."""
    n, nv, s = o.shape
    normed = np.empty((n * nv, s), np.float32)
    rmsnorm_rows(o.reshape((n * nv, s)), norm, eps, normed)
    sz = np.empty((n * nv, s), np.float32)
    silu_par(z.reshape((n * nv, s)), sz)
    gated = np.empty((n, nv * s), np.float32)
    flat = gated.reshape((n * nv, s))
    for r in range(n * nv):
        for i in range(s):
            flat[r, i] = normed[r, i] * sz[r, i]
    return part_out(gated, kinds_o, ws_o, tbl, par, threads, b_o, post_norm, eps)


@njit(cache=True, nogil=True)
def delta_last(mixed, prev, w, new_conv, g, beta, ssm, new_ssm, o_rows, n_k, l2, o, z, norm,  # noqa: ANN001, ANN201, PLR0913
               eps, kinds_o, ws_o, tbl, par, threads, b_o, post_norm):
    """The batch's last sequence's ``deltanet.sequence`` (its read-out into ``o_rows``, its
    rows of o; ``l2``: its eps and scale), then ``delta_out`` of every row: one call."""
    deltanet.sequence(mixed, prev, w, new_conv, g, beta, ssm, new_ssm, o_rows, n_k, l2[0],
                      l2[1])
    return delta_out(o, z, norm, eps, kinds_o, ws_o, tbl, par, threads, b_o, post_norm)


@njit(cache=True, nogil=True)
def short_in(x, norm_w, eps, kinds, ws, tbl, par, threads, bias):  # noqa: ANN001, ANN201, PLR0913
    """x (T, n_embd) f32 -> the gated short convolution's (bcx (T, 3 C), b * x (T, C)) f32
    of its normed input (``norm_w`` as ``pre_norm`` takes it), as ``shortconv.forward``
    forms them: ``ws``/``kinds`` in_proj's weight (padded as ``kernels.pad_products`` pads
    it), ``bias`` its bias or empty; ``par`` whether it runs on ``threads`` threads."""
    n = x.shape[0]
    h = np.empty_like(x)
    pre_norm(x, norm_w, eps, h)
    bcx = np.empty((n, ws[0].shape[0]), np.float32)
    products(kinds, ws, h, tbl, (bcx, bcx, bcx), 1, par, threads)
    add_bias(bcx, bias)
    c = bcx.shape[1] // 3
    bx = np.empty((n, c), np.float32)
    for t in range(n):
        for i in range(c):
            bx[t, i] = bcx[t, i] * bcx[t, 2 * c + i]
    return bcx, bx


@njit(cache=True, nogil=True)
def short_out(bcx, conv, kinds_o, ws_o, tbl, par, threads, b_o, post_norm, eps):  # noqa: ANN001, ANN201, PLR0913
    """c * conv (c: bcx's middle C columns, conv (T, C) f32) through the output product
    and the post norm (``part_out``) -> (T, n_embd) f32."""
    n, c = conv.shape
    y = np.empty((n, c), np.float32)
    for t in range(n):
        for i in range(c):
            y[t, i] = bcx[t, c + i] * conv[t, i]
    return part_out(y, kinds_o, ws_o, tbl, par, threads, b_o, post_norm, eps)


@njit(cache=True, nogil=True)
def short_last(bx, prev, w, new_kept, conv_rows, bcx, conv, kinds_o, ws_o, tbl, par, threads,  # noqa: ANN001, ANN201, PLR0913
               b_o, post_norm, eps):
    """The batch's last sequence's ``shortconv.sequence`` (into ``conv_rows``, its rows of
    conv), then ``short_out`` of every row: one call."""
    shortconv.sequence(bx, prev, w, new_kept, conv_rows)
    return short_out(bcx, conv, kinds_o, ws_o, tbl, par, threads, b_o, post_norm, eps)



@dataclass(frozen=True, eq=False)
class DeltaArgs:
    """What a gated delta net's fused steps (``delta_net``) take from call to call."""

    kind: ClassVar[str] = "delta_net"  # ``fused.mixer``'s step

    mixed_z: Group  # the qkv and z products
    beta_alpha: Group  # the beta and alpha products
    out: Group
    conv: np.ndarray  # (conv_dim, d_conv) f32, read-only: the convolution's taps
    norm: np.ndarray  # (S,) f32: the read-out's RMS norm weight
    l2: tuple[np.float32, np.float32]  # ``deltanet.l2_constants``


def delta_args(d: DeltaNet, eps: float) -> DeltaArgs:
    """The ``DeltaArgs`` of delta net ``d`` (its products all compiled types), ``eps`` the
    layer's RMS eps."""
    return DeltaArgs(group((d.qkv, d.z)), group((d.beta, d.alpha)), group((d.out,)),
                     vector(d.conv), vector(d.norm),
                     deltanet.l2_constants(d.head_dim, eps))


@dataclass(frozen=True, eq=False)
class ShortArgs:
    """What a gated short convolution's fused steps (``short_conv``) take."""

    kind: ClassVar[str] = "short_conv"

    in_proj: Group
    out: Group
    conv: np.ndarray  # (C, l_cache) f32, read-only: the convolution's taps


def recurrent_args(a: DeltaNet | ShortConv | Mamba2, eps: float
                   ) -> DeltaArgs | ShortArgs | MambaArgs:
    """The fused steps' arguments of recurrent mixer ``a`` (its products all compiled
    types), ``eps`` the layer's RMS eps."""
    if isinstance(a, ShortConv):
        return ShortArgs(group((a.in_proj,)), group((a.out,)), vector(a.conv))
    if isinstance(a, Mamba2):
        return mamba_args(a)
    return delta_args(a, eps)


def _sequences(batch: Any, index: int, each: Any, last: Any) -> np.ndarray:
    """Every sequence of ``batch`` in order from its slot's state of recurrent layer
    ``index``: ``each(rows, conv, ssm, new_conv, new_ssm)`` for all but the last, ``last``
    (the same arguments) for the last, each sequence's new state staged after its call;
    ``last``'s result."""
    seqs = batch.sequences()
    for i, (part, rows) in enumerate(seqs):
        step = each if i < len(seqs) - 1 else last
        y = step(rows, *batch.recurrent_state(index, part))
        batch.stage_state(index, part)
    return y


def delta_net(x: np.ndarray, b: Block, la: Any, batch: Any) -> np.ndarray:
    """The gated delta net of layer ``b`` behind its norm for x (T, n_embd), as
    ``reference.mixer_part`` runs it (``deltanet.forward``): ``delta_in``; the gates in
    numpy (``deltanet.gates``, the reference path's exp and log1p); per sequence of
    ``batch``, from its slot's state, ``deltanet.sequence``, staging the new state as
    ``deltanet.forward`` does; ``delta_out`` in the last sequence's call (``delta_last``):
    two compiled calls for a batch of one sequence. Each product on all threads from
    ``matrix.PARALLEL_MIN_MACS`` multiply-adds, as the separate products decide."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    n = len(x)
    lim = matrix.PARALLEL_MIN_MACS
    d, dn = b.attn, la.mixer
    mixed, z, beta, alpha = delta_in(
        x, la.norms[0], la.eps, dn.mixed_z.kinds, dn.mixed_z.ws, dn.beta_alpha.kinds,
        dn.beta_alpha.ws, kernels.F16_TABLE, (n * dn.mixed_z.macs >= lim,
                                              n * dn.beta_alpha.macs >= lim),
        matrix.threads(), (*dn.mixed_z.biases, *dn.beta_alpha.biases))
    beta, g = deltanet.gates(beta, alpha, d)
    out = np.empty((n, d.n_v_head, d.head_dim), np.float32)

    def args(rows: slice, conv: np.ndarray, ssm: np.ndarray, new_conv: np.ndarray,
             new_ssm: np.ndarray) -> tuple:
        return (mixed[rows], conv, dn.conv, new_conv, np.ascontiguousarray(g[rows]),
                np.ascontiguousarray(beta[rows]), ssm, new_ssm, out[rows], d.n_k_head)

    return _sequences(
        batch, d.index, lambda *s: deltanet.sequence(*args(*s), *dn.l2),
        lambda *s: delta_last(*args(*s), dn.l2, out, z, dn.norm, la.eps, dn.out.kinds,
                              dn.out.ws, kernels.F16_TABLE, n * dn.out.macs >= lim,
                              matrix.threads(), dn.out.biases[0], la.norms[3]))


def short_conv(x: np.ndarray, b: Block, la: Any, batch: Any) -> np.ndarray:
    """The gated short convolution of layer ``b`` behind its norm for x (T, n_embd), as
    ``reference.mixer_part`` runs it (``shortconv.forward``): ``short_in``; per sequence of
    ``batch``, from its slot's state, ``shortconv.sequence``, staging the new state as
    ``shortconv.forward`` does; ``short_out`` in the last sequence's call (``short_last``):
    two compiled calls for a batch of one sequence. Each product on all threads from
    ``matrix.PARALLEL_MIN_MACS`` multiply-adds, as the separate products decide."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    n = len(x)
    lim = matrix.PARALLEL_MIN_MACS
    s, sa = b.attn, la.mixer
    bcx, bx = short_in(x, la.norms[0], la.eps, sa.in_proj.kinds, sa.in_proj.ws,
                       kernels.F16_TABLE, n * sa.in_proj.macs >= lim, matrix.threads(),
                       sa.in_proj.biases[0])
    conv = np.empty_like(bx)
    return _sequences(
        batch, s.index,
        lambda rows, kept, _, new_kept, __: shortconv.sequence(bx[rows], kept, sa.conv,
                                                               new_kept, conv[rows]),
        lambda rows, kept, _, new_kept, __: short_last(
            bx[rows], kept, sa.conv, new_kept, conv[rows], bcx, conv, sa.out.kinds, sa.out.ws,
            kernels.F16_TABLE, n * sa.out.macs >= lim, matrix.threads(), sa.out.biases[0],
            la.norms[3], la.eps))




@njit(cache=True, nogil=True)
def mamba_in(x, norm_w, eps, kinds, ws, tbl, par, threads, b_z, b_xbc, b_dt):  # noqa: ANN001, ANN201, PLR0913
    """x (T, n_embd) f32 -> Mamba2's products of its normed input (``norm_w`` as
    ``pre_norm`` takes it): (z (T, d_inner), xbc (T, conv_dim), dt (T, n_head)) f32, as
    ``mamba2.forward`` forms them. ``ws``/``kinds`` the three weights (padded as
    ``kernels.pad_products`` pads them); ``par`` whether they run on ``threads`` threads;
    ``b_*`` each product's bias (its rows,) f32, or empty."""
    n = x.shape[0]
    h = np.empty_like(x)
    pre_norm(x, norm_w, eps, h)
    z = np.empty((n, ws[0].shape[0]), np.float32)
    xbc = np.empty((n, ws[1].shape[0]), np.float32)
    dt = np.empty((n, ws[2].shape[0]), np.float32)
    products(kinds, ws, h, tbl, (z, xbc, dt), 3, par, threads)
    add_bias(z, b_z)
    add_bias(xbc, b_xbc)
    add_bias(dt, b_dt)
    return z, xbc, dt


@njit(cache=True, nogil=True)
def mamba_out(y, z, norm, n_group, eps, kinds_o, ws_o, tbl, par, threads, b_o, post_norm):  # noqa: ANN001, ANN201, PLR0913
    """The scan's read-out y (T, H, P) f32 -> (T, n_embd) f32: silu(z) * y (``swiglu``),
    RMS-normed within each of ``n_group`` groups times ``norm`` (d_inner,) (as
    ``mamba2.grouped_norm``), then the output product and the post norm (``part_out``)."""
    n = z.shape[0]
    d = z.shape[1]
    gated = np.empty((n, d), np.float32)
    if n * d >= GATED_PARALLEL_MIN:  # as ``ops.swiglu`` decides (the same numbers)
        swiglu_par(z, y.reshape((n, d)), gated)
    else:
        swiglu(z, y.reshape((n, d)), gated)
    rows = gated.reshape((n * n_group, d // n_group))
    unit = np.empty_like(rows)
    rmsnorm_rows(rows, np.ones(d // n_group, np.float32), eps, unit)
    normed = unit.reshape((n, d))
    for t in range(n):
        for i in range(d):
            normed[t, i] = normed[t, i] * norm[i]
    return part_out(normed, kinds_o, ws_o, tbl, par, threads, b_o, post_norm, eps)


@njit(cache=True, nogil=True)
def mamba_last(xbc, prev, w, conv_b, new_conv, dt, a, d, ssm, new_ssm, y_rows, y, z, norm,  # noqa: ANN001, ANN201, PLR0913
               n_group, eps, kinds_o, ws_o, tbl, par, threads, b_o, post_norm):
    """The batch's last sequence's ``mamba2.sequence`` (into ``y_rows``, its rows of y),
    then ``mamba_out`` of every row: one call."""
    _mamba2.sequence(xbc, prev, w, conv_b, new_conv, dt, a, d, ssm, new_ssm, y_rows)
    return mamba_out(y, z, norm, n_group, eps, kinds_o, ws_o, tbl, par, threads, b_o,
                     post_norm)


@dataclass(frozen=True, eq=False)
class MambaArgs:
    """What a Mamba2 mixer's fused steps (``mamba2``) take from call to call."""

    kind: ClassVar[str] = "mamba2"

    proj: Group  # z, xBC and dt
    out: Group
    conv: np.ndarray  # (conv_dim, d_conv) f32, read-only
    conv_b: np.ndarray  # (conv_dim,) f32 or empty
    a: np.ndarray  # (n_head,) f32
    d: np.ndarray  # (n_head,) f32
    norm: np.ndarray  # (d_inner,) f32


def mamba_args(m: Mamba2) -> MambaArgs:
    """The ``MambaArgs`` of ``m`` (its products all compiled types)."""
    return MambaArgs(group((m.z, m.xbc, m.dt)), group((m.out,)), vector(m.conv),
                     vector(m.conv_b), vector(m.a), vector(m.d), vector(m.norm))


def mamba2(x: np.ndarray, b: Block, la: Any, batch: Any) -> np.ndarray:
    """The Mamba2 mixer of layer ``b`` behind its norm for x (T, n_embd), as
    ``reference.mixer_part`` runs it (``mamba2.forward``): ``mamba_in``; dt's softplus in
    numpy (``mamba2.dt_rates``); per sequence of ``batch``, from its slot's state,
    ``mamba2.sequence``, staging the new state as ``mamba2.forward`` does; ``mamba_out`` in
    the last sequence's call (``mamba_last``). ``la`` the layer's ``fused.LayerArgs`` (its
    norms and eps). Each product on all threads from ``matrix.PARALLEL_MIN_MACS``
    multiply-adds, as the separate products decide."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    n, lim, m, ma = len(x), matrix.PARALLEL_MIN_MACS, b.attn, la.mixer
    z, xbc, dt = mamba_in(x, la.norms[0], la.eps, ma.proj.kinds, ma.proj.ws, kernels.F16_TABLE,
                          n * ma.proj.macs >= lim, matrix.threads(), *ma.proj.biases)
    dt = _mamba2.dt_rates(dt, m)
    y = np.empty((n, m.n_head, m.head_dim), np.float32)
    shape = (m.n_head, m.head_dim, m.d_state)

    def args(rows: slice, conv: np.ndarray, ssm: np.ndarray, new_conv: np.ndarray,
             new_ssm: np.ndarray) -> tuple:
        return (xbc[rows], conv, ma.conv, ma.conv_b, new_conv, dt[rows], ma.a, ma.d,
                ssm.reshape(shape), new_ssm.reshape(shape), y[rows])

    return _sequences(
        batch, m.index, lambda *s: _mamba2.sequence(*args(*s)),
        lambda *s: mamba_last(*args(*s), y, z, ma.norm, m.n_group, la.eps, ma.out.kinds,
                              ma.out.ws, kernels.F16_TABLE, n * ma.out.macs >= lim,
                              matrix.threads(), ma.out.biases[0], la.norms[3]))
