"""The Mamba2 mixer (``layer.Mamba2``): the recurrent layer of Granite 4.0-H, as llama.cpp's
build_mamba2_layer and ggml-cpu's ssm_conv and ssm_scan ops compute it.

Per sequence of the batch, in position order from the slot's state (``Batch.
recurrent_state``): the causal convolution over the last d_conv inputs (ggml's ssm_conv:
the taps summed in order, in float32), then the selective scan one token at a time, as
ggml's ssm_scan runs it for prompts and decoding alike (no chunked, state-space-duality
form). So a sequence's numbers do not depend on how its prompt was cut into batches or on
the other rows of a batch; the new states are staged and committed with the positions
(``Batch.advance``).

``forward`` runs it op by op (the reference path); the fused layers
(``fused_recurrent.mamba2``) run the same kernels in fewer calls: a sequence's steps in
one (``sequence``), the softplus of dt in numpy between calls (``dt_rates``), which both
paths share.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..quant import jitcache  # noqa: F401 - stamps the cached kernels below (before any njit)
from ..quant.glu import silu_par
from . import ops
from .deltanet import conv_step
from .layer import Mamba2
from .shortconv import causal_conv


# reassociation lets each row's dot product with C vectorize; its order is fixed by the code
# and d_state alone, never by the batch. No contraction: the state update rounds its two
# products and their sum apart, as ggml's vector MUL, MUL, ADD.
@njit(cache=True, nogil=True, parallel=True, fastmath={"reassoc", "nsz"})
def ssm_scan(x, dt, a, b, c, state, new_state, out):  # noqa: ANN001, ANN201
    """One sequence's tokens through the scan, as ggml_compute_forward_ssm_scan_f32 with a
    scalar decay per head (Mamba-2): x (T, H, P), dt (T, H) (softplus already applied),
    a (H,), b and c (T, G, N) f32; state (H, P, N) f32 read, the state after the last
    token written to ``new_state`` (which may be ``state`` itself); out (T, H, P) f32.
    Head h reads group h // (H / G). Per token: decay = exp(dt a); for each row i of the
    head's state, s = s * decay + B * (x_i dt), out_i = s . C. Heads in parallel."""
    n_head, p_dim, n_state = x.shape[1], x.shape[2], b.shape[2]
    per_group = n_head // b.shape[1]
    for h in prange(n_head):
        m = new_state[h]
        m[:] = state[h]  # copied, then updated in place: one code path for every token
        g = h // per_group
        for t in range(x.shape[0]):
            step = dt[t, h]
            decay = np.float32(np.exp(step * a[h]))
            bt, ct = b[t, g], c[t, g]
            for i in range(p_dim):
                x_dt = x[t, h, i] * step
                row = m[i]
                acc = np.float32(0.0)
                for j in range(n_state):
                    s = row[j] * decay + bt[j] * x_dt
                    row[j] = s
                    acc += s * ct[j]
                out[t, h, i] = acc


def grouped_norm(y: np.ndarray, w: np.ndarray, n_group: int, eps: float) -> np.ndarray:
    """y (T, d_inner) RMS-normed within each of ``n_group`` consecutive groups, times w
    (d_inner,): ggml's rms_norm over rows of d_inner / n_group, then the weight's rows."""
    n, d = y.shape
    unit = ops.rmsnorm(y.reshape(n, n_group, d // n_group), np.ones(d // n_group, np.float32),
                       eps)
    return unit.reshape(n, d) * w


def _scan_inputs(xbc: np.ndarray, m: Mamba2) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The activated convolution's rows (T, conv_dim) split into x (T, H, P), B and C
    (T, G, N), contiguous for the scan."""
    n, d_inner, gn = len(xbc), m.n_head * m.head_dim, m.n_group * m.d_state
    parts = (xbc[:, :d_inner].reshape(n, m.n_head, m.head_dim),
             xbc[:, d_inner:d_inner + gn].reshape(n, m.n_group, m.d_state),
             xbc[:, d_inner + gn:].reshape(n, m.n_group, m.d_state))
    return tuple(np.ascontiguousarray(p, np.float32) for p in parts)


def dt_rates(dt: np.ndarray, m: Mamba2) -> np.ndarray:
    """The dt product (T, n_head) -> softplus(dt + dt_bias), C-contiguous: numpy's exp and
    log1p, which both paths run (numba's float32 exp differs from numpy's on some inputs)."""
    return np.ascontiguousarray(ops.softplus(dt + m.dt_bias))


@njit(cache=True, nogil=True)
def sequence(xbc, prev, w, conv_b, new_conv, dt, a, d, ssm, new_ssm, y):  # noqa: ANN001, ANN201, PLR0913
    """One sequence's rows through ``forward``'s per-sequence steps in one call: xbc (T,
    conv_dim) f32 after the kept inputs ``prev`` (d_conv - 1, conv_dim), taps w (conv_dim,
    d_conv) -> the convolution (its kept inputs into ``new_conv``), plus ``conv_b`` (empty:
    none), SiLU, split into x (T, H, P), B and C (T, G, N) as ``ssm`` (H, P, N) and y (T,
    H, P) give the sizes; ``ssm_scan`` with dt (T, H) (``dt_rates``) and a (H,) from
    ``ssm`` into ``new_ssm``, into y; then y += x * d (H,). The same kernels as the op-by-op
    steps, on arrays of the same types: the same numbers."""
    n, c_dim = xbc.shape
    n_head, p_dim, n_state = ssm.shape
    conv = np.empty((n, c_dim), np.float32)
    conv_step(xbc, prev, w, new_conv, conv)
    if conv_b.shape[0]:
        for t in range(n):
            for i in range(c_dim):
                conv[t, i] = conv[t, i] + conv_b[i]
    act = np.empty_like(conv)
    silu_par(conv, act)
    d_inner = n_head * p_dim
    n_group = (c_dim - d_inner) // (2 * n_state)
    x = np.ascontiguousarray(act[:, :d_inner]).reshape((n, n_head, p_dim))
    b = np.ascontiguousarray(act[:, d_inner:d_inner + n_group * n_state]).reshape(
        (n, n_group, n_state))
    c = np.ascontiguousarray(act[:, d_inner + n_group * n_state:]).reshape(
        (n, n_group, n_state))
    ssm_scan(x, dt, a, b, c, ssm, new_ssm, y)
    for t in range(n):
        for h in range(n_head):
            for i in range(p_dim):
                y[t, h, i] = y[t, h, i] + x[t, h, i] * d[h]


def forward(h: np.ndarray, m: Mamba2, batch: object, eps: float) -> np.ndarray:
    """Normed input h (T, n_embd) -> (T, n_embd), each sequence of ``batch`` from its
    slot's state, staging the new states; ``eps`` the model's RMS eps (the grouped norm)."""
    n, shape = len(h), (m.n_head, m.head_dim, m.d_state)
    z, xbc, dt = ops.linears(h, (m.z, m.xbc, m.dt))
    dt = dt_rates(dt, m)  # (T, H)
    y = np.empty((n, m.n_head, m.head_dim), np.float32)
    for part, rows in batch.sequences():
        conv_state, ssm, new_conv, new_ssm = batch.recurrent_state(m.index, part)
        conv, new_conv[:] = causal_conv(xbc[rows], conv_state, m.conv)
        if m.conv_b is not None:
            conv = conv + m.conv_b
        x, b, c = _scan_inputs(ops.silu(conv), m)
        ssm_scan(x, dt[rows], m.a, b, c, ssm.reshape(shape), new_ssm.reshape(shape), y[rows])
        y[rows] += x * m.d[:, None]  # the D skip, per head
        batch.stage_state(m.index, part)
    gated = ops.swiglu(z, y.reshape(n, -1))  # silu(z) * y
    return ops.linear(grouped_norm(gated, m.norm, m.n_group, eps), m.out.w, m.out.b)
