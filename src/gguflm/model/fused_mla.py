"""Multi-head latent attention in one compiled call, for the fused layers (``fused.layer``):
``mla_step`` runs ``mla.forward`` behind its norm (the kv_a and q_a products, their norms,
q_b, RoPE on the rotated parts, every head's k_b in one expert-products call, storing the
batch's latent rows, the attention over the latent, every head's v_b, the output product)
instead of about a dozen Python-level steps. The kernels are the reference path's, called
on arrays of the same types: the same numbers, element for element.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from numba import njit

from gguflm.quant import kernels, matrix
from gguflm.quant.expert_products import threads_for

from . import mla
from .attention import runs_parallel
from .fused import Group, add_bias, group, part_out, pre_norm, products, vector
from .layer import Block, LatentAttention
from .rowkernels import rmsnorm_rows, rope_rows


@njit(cache=True, nogil=True)
def _queries(h, kinds_a, ws_a, n_a, q_a_norm, kinds_qb, ws_qb, eps, tbl, par, threads,  # noqa: ANN001, ANN202, PLR0913
             b_kv, b_qa, b_qb):
    """Normed input h (T, n_embd) -> (kv (T, lora + n_rot), q (T, q_b rows)): kv_a, and
    q_a beside it where ``n_a`` is 2, as ``mla.forward``'s products; q_b of q_a's output
    RMS-normed times ``q_a_norm`` (or of h itself)."""
    n = h.shape[0]
    kv = np.empty((n, ws_a[0].shape[0]), np.float32)
    qa = np.empty((n if n_a == 2 else 0, ws_a[1].shape[0]), np.float32)
    products(kinds_a, ws_a, h, tbl, (kv, qa, kv), n_a, par[0], threads)
    add_bias(kv, b_kv)
    src = h
    if n_a == 2:
        add_bias(qa, b_qa)
        src = np.empty_like(qa)
        rmsnorm_rows(qa, q_a_norm, eps, src)
    q = np.empty((n, ws_qb[0].shape[0]), np.float32)
    products(kinds_qb, ws_qb, src, tbl, (q, q, q), 1, par[1], threads)
    add_bias(q, b_qb)
    return kv, q


@njit(cache=True, nogil=True)
def mla_step(x, norm_w, eps, kinds_a, ws_a, n_a, q_a_norm, kinds_qb, ws_qb, kv_a_norm,  # noqa: ANN001, ANN201, PLR0913
             heads, rot, neox, kb, vb, cache, slot, pos, scale, f16, kinds_o, ws_o, tbl,
             par, threads, biases, post_norm):
    """x (T, n_embd) f32 -> (T, n_embd) f32: ``mla.forward`` behind the norm (``norm_w``
    as ``pre_norm`` takes it). ``heads`` (H, nope, n_rot, lora); ``kb``/``vb`` (kinds,
    ptrs, shape, threads) of every head's k_b and v_b (``ExpertWeights``); ``cache``,
    ``slot``, ``pos``, ``scale``, ``f16`` as ``mla.attend_latent`` takes them; ``par``
    whether kv_a/q_a, q_b, the attention and the output run on ``threads`` threads;
    ``biases`` kv_a's, q_a's, q_b's, o's (or empty); ``post_norm`` as ``part_out``."""
    n = x.shape[0]
    n_head, nope, n_rot, lora = heads
    h = np.empty_like(x)
    pre_norm(x, norm_w, eps, h)
    kv, q = _queries(h, kinds_a, ws_a, n_a, q_a_norm, kinds_qb, ws_qb, eps, tbl, par,
                     threads, biases[0], biases[1], biases[2])
    q3 = q.reshape((n, n_head, nope + n_rot))
    latent = np.empty((n, lora), np.float32)
    rmsnorm_rows(np.ascontiguousarray(kv[:, :lora]), kv_a_norm, eps, latent)
    rows = np.empty((n, lora + n_rot), np.float32)  # the cached rows: [latent | k_pe]
    rows[:, :lora] = latent
    k_pe = np.ascontiguousarray(kv[:, lora:]).reshape((n, 1, n_rot))
    rope_rows(k_pe, rot, neox)
    rows[:, lora:] = k_pe[:, 0]
    q_pe = np.ascontiguousarray(q3[:, :, nope:])
    rope_rows(q_pe, rot, neox)
    absorbed = np.empty((n, n_head, lora + n_rot), np.float32)
    absorbed[:, :, :lora] = mla.heads_product(kb[0], kb[1], kb[2], np.ascontiguousarray(
        q3[:, :, :nope]), tbl, kb[3])
    absorbed[:, :, lora:] = q_pe
    mla.store_latent(cache, slot, pos, rows)
    o = np.empty((n, n_head, lora), np.float32)
    if par[2]:
        mla._attend_par(absorbed, cache, slot, pos, scale, f16, o)
    else:
        mla._attend_serial(absorbed, cache, slot, pos, scale, f16, o)
    out = mla.heads_product(vb[0], vb[1], vb[2], o, tbl, vb[3])
    return part_out(out.reshape((n, -1)), kinds_o, ws_o, tbl, par[3], threads, biases[3],
                   post_norm, eps)


@dataclass(frozen=True, eq=False)
class LatentArgs:
    """What a latent attention's fused step (``latent_attention``) takes from call to
    call."""

    kind: ClassVar[str] = "latent_attention"  # ``fused.mixer``'s step

    a: Group  # kv_a, and q_a beside it
    q_b: Group
    out: Group
    q_a_norm: np.ndarray
    kv_a_norm: np.ndarray
    biases: tuple[np.ndarray, ...]  # kv_a's, q_a's, q_b's, o's
    k_b: tuple  # every head's k_b and v_b as ``mla.heads_product`` takes them
    v_b: tuple


def latent_args(a: LatentAttention) -> LatentArgs:
    """The ``LatentArgs`` of ``a`` (its products all compiled types, k_b and v_b usable
    as ``ExpertWeights``)."""
    first = group((a.kv_a,) if a.q_a is None else (a.kv_a, a.q_a))
    q_b, out = group((a.q_b,)), group((a.o,))
    b_qa = first.biases[1] if a.q_a is not None else vector(None)
    return LatentArgs(first, q_b, out, vector(a.q_a_norm), vector(a.kv_a_norm),
                      (first.biases[0], b_qa, q_b.biases[0], out.biases[0]),
                      mla.heads_args(a.k_b_all), mla.heads_args(a.v_b_all))


def latent_attention(x: np.ndarray, b: Block, la: Any, batch: Any, il: int,
                     rot: np.ndarray) -> np.ndarray:
    """``mla_step`` for x (T, n_embd) in layer ``il`` of ``batch``'s caches; ``la`` the
    layer's ``fused.LayerArgs`` (its norms and eps). Each part on all threads from the
    separate ops' thresholds."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    n, lim, a, ma = len(x), matrix.PARALLEL_MIN_MACS, b.attn, la.mixer
    arena = batch.arena
    work = n * a.n_head * (int(batch.pos.max()) + 1) * (2 * a.kv_lora + a.n_rot)
    par = (n * ma.a.macs >= lim, n * ma.q_b.macs >= lim, runs_parallel(n, 1, work),
           n * ma.out.macs >= lim)
    return mla_step(x, la.norms[0], la.eps, ma.a.kinds, ma.a.ws, ma.a.count, ma.q_a_norm,
                    ma.q_b.kinds, ma.q_b.ws, ma.kv_a_norm,
                    (a.n_head, a.nope, a.n_rot, a.kv_lora),
                    np.ascontiguousarray(rot, dtype=np.complex64), a.neox,
                    (*ma.k_b, threads_for(n * a.n_head * a.kv_lora * a.nope)),
                    (*ma.v_b, threads_for(n * a.n_head * a.head_dim_v * a.kv_lora)), arena.k[il],
                    batch.slot, batch.pos, np.float32(a.scale), arena.f16, ma.out.kinds,
                    ma.out.ws, kernels.F16_TABLE, par, matrix.threads(), ma.biases,
                    la.norms[3])
