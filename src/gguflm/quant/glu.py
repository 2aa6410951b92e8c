"""The gated activations of the feed-forward block, one vectorized pass each: GeGLU
(gelu_tanh(gate) * up) and SwiGLU (silu(gate) * up, as ggml's ggml_vec_swiglu_f32)."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from . import jitcache  # noqa: F401 - stamps the cached kernels below (before any njit)
from .floatbits import expf_ggml, f32_from_bits

# -- GeGLU: gelu_tanh(gate) * up in one vectorized pass -------------------------------------


@njit(cache=True, nogil=True, inline="always")
def _exp_f32(z):  # noqa: ANN001, ANN202
    """e**z for float32 z in [-87, 87] (callers clamp): Cephes expf's range reduction and
    polynomial (1-2 ulp), written without a libm call so that loops over it vectorize."""
    n = np.floor(z * np.float32(1.44269504088896341) + np.float32(0.5))
    r = z - n * np.float32(0.693359375)
    r = r - n * np.float32(-2.12194440e-4)
    p = np.float32(1.9875691500e-4)
    p = p * r + np.float32(1.3981999507e-3)
    p = p * r + np.float32(8.3334519073e-3)
    p = p * r + np.float32(4.1665795894e-2)
    p = p * r + np.float32(1.6666665459e-1)
    p = p * r + np.float32(5.0000001201e-1)
    y = p * (r * r) + r + np.float32(1.0)
    return y * f32_from_bits((np.int32(n) + np.int32(127)) << np.int32(23))


@njit(cache=True, nogil=True, fastmath={"contract"}, error_model="numpy")
def _geglu_flat(x, u, out):  # noqa: ANN001, ANN201
    # the hot loop: x, u, out (N,) f32 contiguous; flat, with selects, so LLVM vectorizes it
    for j in range(x.shape[0]):
        v = x[j]
        y = np.float32(0.7978845608028654) * v * (np.float32(1.0) + np.float32(0.044715) * v * v)
        z = np.float32(-2.0) * y
        z = z if z > np.float32(-87.0) else np.float32(-87.0)
        z = z if z < np.float32(87.0) else np.float32(87.0)
        out[j] = v / (np.float32(1.0) + _exp_f32(z)) * u[j]


@njit(cache=True, nogil=True)
def geglu(gate, up, out):  # noqa: ANN001, ANN201
    """gate (T, F) f32, up (T, F) f32 -> out (T, F) f32 = gelu_tanh(gate) * up (C-contiguous;
    ``out`` may be ``up``). 0.5 x (1 + tanh(y)) is evaluated as x / (1 + e**(-2y)): the same
    function, with y = sqrt(2/pi) x (1 + 0.044715 x**2) as ggml_gelu_f32 forms it."""
    _geglu_flat(gate.reshape(-1), up.reshape(-1), out.reshape(-1))


@njit(cache=True, nogil=True, fastmath={"contract"}, error_model="numpy")
def _gelu_flat(x, out):  # noqa: ANN001, ANN201
    # the hot loop: x, out (N,) f32 contiguous; geglu's gate side alone
    for j in range(x.shape[0]):
        v = x[j]
        y = np.float32(0.7978845608028654) * v * (np.float32(1.0) + np.float32(0.044715) * v * v)
        z = np.float32(-2.0) * y
        z = z if z > np.float32(-87.0) else np.float32(-87.0)
        z = z if z < np.float32(87.0) else np.float32(87.0)
        out[j] = v / (np.float32(1.0) + _exp_f32(z))


@njit(cache=True, nogil=True, parallel=True)
def gelu(x, out):  # noqa: ANN001, ANN201
    """x (T, F) f32 -> out (T, F) f32 = gelu_tanh(x), as ``geglu`` evaluates it (C-contiguous);
    rows in parallel (each element's numbers are its own)."""
    for t in prange(x.shape[0]):
        _gelu_flat(x[t], out[t])


# -- SwiGLU: silu(gate) * up as ggml's ggml_vec_swiglu_f32 ---------------------------------


@njit(cache=True, nogil=True, error_model="numpy")
def _swiglu_flat(x, u, out):  # noqa: ANN001, ANN201
    # the hot loop: x, u, out (N,) f32 contiguous. ggml's SIMD lanes (ggml_v_silu:
    # x / (1 + e**-x) with ggml_v_expf) for whole groups of 8, libm's expf for a row's tail
    n = x.shape[0]
    body = n - n % 8
    for j in range(body):
        v = x[j]
        out[j] = v / (np.float32(1.0) + expf_ggml(-v)) * u[j]
    for j in range(body, n):
        v = x[j]
        out[j] = v / (np.float32(1.0) + np.exp(-v)) * u[j]


@njit(cache=True, nogil=True)
def swiglu(gate, up, out):  # noqa: ANN001, ANN201
    """gate (T, F) f32, up (T, F) f32 -> out (T, F) f32 = silu(gate) * up, each row as
    ggml_vec_swiglu_f32 computes it (C-contiguous; ``out`` may be ``gate`` or ``up``, but
    then the loop cannot vectorize and runs several times slower)."""
    for t in range(gate.shape[0]):
        _swiglu_flat(gate[t], up[t], out[t])


@njit(cache=True, nogil=True, parallel=True)
def swiglu_par(gate, up, out):  # noqa: ANN001, ANN201
    """``swiglu`` with the rows shared out (a prompt's (T, F) outside the compiled layers;
    each row's numbers are its own). ``out`` distinct from ``gate`` and ``up``."""
    for t in prange(gate.shape[0]):
        _swiglu_flat(gate[t], up[t], out[t])


@njit(cache=True, nogil=True, parallel=True)
def geglu_par(gate, up, out):  # noqa: ANN001, ANN201
    """``geglu`` with the rows shared out, as ``swiglu_par``."""
    for t in prange(gate.shape[0]):
        _geglu_flat(gate[t], up[t], out[t])


@njit(cache=True, nogil=True, error_model="numpy")
def _silu_flat(x, out):  # noqa: ANN001, ANN201
    # x, out (N,) f32 contiguous: ggml_vec_silu_f32's lanes (ggml_v_silu) for whole groups
    # of 8, libm's expf for the tail, as _swiglu_flat
    n = x.shape[0]
    body = n - n % 8
    for j in range(body):
        v = x[j]
        out[j] = v / (np.float32(1.0) + expf_ggml(-v))
    for j in range(body, n):
        v = x[j]
        out[j] = v / (np.float32(1.0) + np.exp(-v))


@njit(cache=True, nogil=True, parallel=True)
def silu_par(x, out):  # noqa: ANN001, ANN201
    """x (T, F) f32 -> out (T, F) = x * sigmoid(x) per row as ggml_vec_silu_f32, rows in
    parallel (C-contiguous, ``out`` distinct from ``x``)."""
    for t in prange(x.shape[0]):
        _silu_flat(x[t], out[t])


def twin_silu(x: np.ndarray) -> np.ndarray:
    """Numpy twin of ``silu_par``: ``twin_swiglu`` with up = 1."""
    return twin_swiglu(x, np.ones_like(x, dtype=np.float32))


def twin_swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """Numpy twin of ``swiglu``: silu(gate) * up with ggml's exp (``expf_ggml_twin``) on
    each row's whole groups of 8 and, on the tail, exp in float64 rounded to float32 (as
    glibc's expf, correctly rounded)."""
    from .floatbits import expf_ggml_twin

    gate = np.asarray(gate, np.float32)
    body = gate.shape[-1] - gate.shape[-1] % 8
    e = np.empty_like(gate)
    e[..., :body] = expf_ggml_twin(-gate[..., :body])
    with np.errstate(over="ignore"):
        e[..., body:] = np.exp(-gate[..., body:].astype(np.float64)).astype(np.float32)
    return gate / (np.float32(1.0) + e) * up


def twin_geglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """Numpy twin of ``geglu``, in float64: 0.5 (1 + tanh(y)) as 1 / (1 + e**(-2y)), which
    keeps the far negative tail that 1 + tanh would cancel away."""
    x = gate.astype(np.float64)
    y = np.sqrt(2 / np.pi) * x * (1 + 0.044715 * x * x)
    with np.errstate(over="ignore"):
        return (x / (1 + np.exp(-2 * y)) * up).astype(np.float32)
