"""The gated delta net (``layer.DeltaNet``): the recurrent mixer of Qwen3.5, as llama.cpp's
qwen35 graph (build_layer_attn_linear) and ggml-cpu's ssm_conv and gated_delta_net ops
compute it.

Per sequence of the batch, in position order from the slot's state (``Batch.
recurrent_state``): the causal convolution over the last d_conv inputs, then for each
token the fused delta rule, one float32 step at a time, exactly as ggml's fused op runs it
for prompts and decoding alike (its chunked form is a GPU path). So a sequence's numbers
do not depend on how its prompt was cut into batches or on the other rows of a batch;
the new states are staged and committed with the positions (``Batch.advance``).

``forward`` runs it op by op (the reference path); the fused layers (``fused.delta_net``)
run the same kernels in fewer calls: the per-sequence steps as one (``sequence``), the
gates in numpy between calls (``gates``), which both paths share.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..quant import jitcache  # noqa: F401 - stamps the cached kernels below (before any njit)
from ..quant.glu import silu_par
from . import ops
from .layer import DeltaNet
from .rowkernels import rmsnorm_rows


# reassociation lets the dot products vectorize (8 or 16 partial sums, as ggml's
# vec_dot_f32 keeps); the order is fixed by the code and the head size alone, never by the
# batch. contract: the state update is one fused multiply-add, as ggml's vec_mad_f32.
@njit(cache=True, nogil=True, parallel=True, fastmath={"reassoc", "contract", "nsz"})
def delta_rule(q, k, v, g, beta, state, new_state, out):  # noqa: ANN001, ANN201
    """One sequence's tokens through the delta rule, as ggml_compute_forward_gated_delta_net
    (K = 1, scalar gate): q, k (T, H_k, S), v (T, H_v, S), g and beta (T, H_v) f32; state
    (H_v, S, S) f32, M[j, i] = S[i][j], read and the state after the last token written to
    ``new_state`` (which may be ``state`` itself); out (T, H_v, S) f32. Value head h
    reads key head h % H_k. Per token: M *= exp(g); d_j = (v_j - M[j] . k) * beta;
    M[j] += d_j k; out_j = (M[j] . q) / sqrt(S). Heads in parallel (each its own state)."""
    n_k = q.shape[1]
    s_dim = v.shape[2]
    scale = np.float32(1.0) / np.float32(np.sqrt(np.float32(s_dim)))
    for h in prange(v.shape[1]):
        m = new_state[h]
        kh = h % n_k
        # copied, then updated in place: one code path for every token (loops whose
        # arrays may alias are compiled twice, vectorized or not, with different sums)
        m[:] = state[h]
        for t in range(q.shape[0]):
            decay = np.float32(np.exp(g[t, h]))
            b = beta[t, h]
            kt, qt = k[t, kh], q[t, kh]
            for j in range(s_dim):
                row = m[j]
                acc = np.float32(0.0)
                for i in range(s_dim):  # the decay, then the row's dot with k
                    x = row[i] * decay
                    row[i] = x
                    acc += x * kt[i]
                dj = (v[t, h, j] - acc) * b
                acc = np.float32(0.0)
                for i in range(s_dim):  # the update, then the row's dot with q
                    x = row[i] + kt[i] * dj
                    row[i] = x
                    acc += x * qt[i]
                out[t, h, j] = acc * scale


@njit(cache=True, nogil=True, parallel=True)
def _conv_rows(window, w, out):  # noqa: ANN001, ANN202
    """window (T + d_conv - 1, C), taps w (C, d_conv) f32 -> out (T, C): out[t, c] = the sum
    over taps i in order of window[t + i, c] * w[c, i], each product rounded (no fused
    multiply-add), as ggml_ssm_conv; positions in parallel."""
    taps = w.shape[1]
    wt = np.ascontiguousarray(w.T)
    for t in prange(out.shape[0]):
        for c in range(out.shape[1]):
            out[t, c] = window[t, c] * wt[0, c]
        for i in range(1, taps):
            for c in range(out.shape[1]):
                out[t, c] = out[t, c] + window[t + i, c] * wt[i, c]


@njit(cache=True, nogil=True)
def conv_step(x, prev, w, new_kept, out):  # noqa: ANN001, ANN201
    """ggml's ssm_conv of one sequence's rows in one call: x (T, C) f32 after the kept
    inputs ``prev`` (d_conv - 1, C), taps w (C, d_conv) -> out (T, C) f32 (``_conv_rows``),
    the new kept inputs into ``new_kept``. Needs numba's threads started
    (``matrix.threads()``) before a call loaded from the cache."""
    n, taps = x.shape[0], w.shape[1]
    window = np.empty((n + taps - 1, x.shape[1]), np.float32)
    window[:taps - 1] = prev
    window[taps - 1:] = x
    _conv_rows(window, w, out)
    new_kept[:] = window[n:]


def causal_conv(x: np.ndarray, prev: np.ndarray, w: np.ndarray) -> tuple[np.ndarray,
                                                                          np.ndarray]:
    """ggml's ssm_conv then SiLU: inputs x (T, C) after the kept ``prev`` (d_conv - 1, C),
    taps w (C, d_conv) -> (silu(conv) (T, C), the new kept inputs (d_conv - 1, C)). Each
    output sums its d_conv products in tap order, in float32."""
    n, taps = len(x), w.shape[1]
    window = np.ascontiguousarray(np.concatenate([prev, x]), np.float32)  # (d_conv - 1 + T, C)
    acc = np.empty((n, window.shape[1]), np.float32)
    _conv_rows(window, np.ascontiguousarray(w, np.float32), acc)
    return ops.silu(acc), window[len(window) - (taps - 1):]


def l2_norm(x: np.ndarray, eps: float) -> np.ndarray:
    """x (..., n) / sqrt(sum(x^2) + eps), as llama.cpp's build_gdn_l2_norm: an RMS norm
    with eps / n, times 1 / sqrt(n)."""
    n = x.shape[-1]
    unit = ops.rmsnorm(x, np.ones(n, np.float32), eps / n)
    return unit * np.float32(1.0 / np.sqrt(np.float32(n)))


def gates(beta: np.ndarray, alpha: np.ndarray, d: DeltaNet) -> tuple[np.ndarray, np.ndarray]:
    """The beta and alpha products (T, n_v) -> (the rates sigmoid(beta), the log decays
    g = softplus(alpha + dt) * a), each (T, n_v) f32 and C-contiguous: numpy's exp and
    log1p, which both paths run (numba's float32 exp differs from numpy's on some inputs)."""
    return ops.sigmoid(beta), ops.softplus(alpha + d.dt) * d.a


def l2_constants(s: int, eps: float) -> tuple[np.float32, np.float32]:
    """(the eps of ``l2_norm``'s RMS norm, its scale 1 / sqrt(s)) for heads of s, as
    ``l2_norm`` forms them: what ``sequence`` takes."""
    return np.float32(eps / s), np.float32(1.0 / np.sqrt(np.float32(s)))


@njit(cache=True, nogil=True)
def _l2_heads(x, n_head, s, eps, scale):  # noqa: ANN001, ANN202
    """x (T, n_head s) f32 -> (T, n_head, s) f32: each head ``l2_norm``ed (``rmsnorm_rows``
    with unit weights and eps / s, then times 1 / sqrt(s): ``l2_constants``)."""
    rows = np.ascontiguousarray(x).reshape((x.shape[0] * n_head, s))
    out = np.empty_like(rows)
    rmsnorm_rows(rows, np.ones(s, np.float32), eps, out)
    for r in range(out.shape[0]):
        for i in range(s):
            out[r, i] = out[r, i] * scale
    return out.reshape((x.shape[0], n_head, s))


@njit(cache=True, nogil=True)
def sequence(mixed, prev, w, new_conv, g, beta, ssm, new_ssm, out, n_k, eps, scale):  # noqa: ANN001, ANN201, PLR0913
    """One sequence's rows through ``forward``'s per-sequence steps in one call: mixed
    (T, conv_dim) f32 after the kept inputs ``prev`` (d_conv - 1, conv_dim), taps w
    (conv_dim, d_conv) -> ``causal_conv`` (its kept inputs into ``new_conv``), q and k
    (``n_k`` heads) L2-normed (``_l2_heads``: ``l2_constants``' eps and scale), then
    ``delta_rule`` with g, beta (T, n_v) from ``ssm`` into ``new_ssm`` and out (T, n_v, S).
    The same kernels as the op-by-op steps, on arrays of the same types: the same numbers.
    Its parallel kernels need numba's threads started (``matrix.threads()``) before a call
    loaded from the cache."""
    n, s = mixed.shape[0], out.shape[2]
    acc = np.empty((n, mixed.shape[1]), np.float32)
    conv_step(mixed, prev, w, new_conv, acc)
    x = np.empty_like(acc)
    silu_par(acc, x)
    q = _l2_heads(x[:, :n_k * s], n_k, s, eps, scale)
    k = _l2_heads(x[:, n_k * s:2 * n_k * s], n_k, s, eps, scale)
    v = np.ascontiguousarray(x[:, 2 * n_k * s:]).reshape((n, out.shape[1], s))
    delta_rule(q, k, v, g, beta, ssm, new_ssm, out)


def forward(h: np.ndarray, d: DeltaNet, batch: object, eps: float) -> np.ndarray:
    """Normed input h (T, n_embd) -> (T, n_embd), each sequence of ``batch`` from its
    slot's state, staging the new states; ``eps`` the model's RMS eps (L2 norms, gated
    norm)."""
    n, nk, nv, s = len(h), d.n_k_head, d.n_v_head, d.head_dim
    mixed, z, beta, alpha = ops.linears(h, (d.qkv, d.z, d.beta, d.alpha))
    z = z.reshape(n, nv, s)                                   # mixed (T, conv_dim)
    beta, g = gates(beta, alpha, d)                           # (T, n_v)
    out = np.empty((n, nv, s), np.float32)
    for part, rows in batch.sequences():
        conv_state, ssm, new_conv, new_ssm = batch.recurrent_state(d.index, part)
        x, kept = causal_conv(mixed[rows], conv_state, d.conv)
        new_conv[:] = kept
        q = l2_norm(x[:, :nk * s].reshape(-1, nk, s), eps)
        k = l2_norm(x[:, nk * s:2 * nk * s].reshape(-1, nk, s), eps)
        v = np.ascontiguousarray(x[:, 2 * nk * s:].reshape(-1, nv, s))
        delta_rule(q, k, v, np.ascontiguousarray(g[rows]), np.ascontiguousarray(beta[rows]),
                   ssm, new_ssm, out[rows])
        batch.stage_state(d.index, part)
    gated = ops.rmsnorm(out, d.norm, eps) * ops.silu(z)
    return ops.linear(gated.reshape(n, nv * s), d.out.w, d.out.b)
