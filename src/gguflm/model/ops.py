"""The building blocks architectures compose: norms, RoPE, attention, activations.

Thin numpy functions on float32 arrays, each with its shape contract in a comment. Nothing
here knows which architecture calls it: RoPE style, norm placement and activation choice are
made in the architecture's own file. T is the number of tokens in the batch, H the query
heads, H_kv the key/value heads, S the cached positions (including this batch), d a head size.
"""

from __future__ import annotations

from typing import Any

import numpy as np

# -- products --------------------------------------------------------------------------------


def linear(x: np.ndarray, w: Any, b: np.ndarray | None = None) -> np.ndarray:
    """x (T, d_in) @ W.T (+ b) -> (T, d_out); W a QMatrix (d_out, d_in), b (d_out,) or None."""
    return w.matmul(x, bias=b)


def linears(x: np.ndarray, lins: Any) -> list[np.ndarray]:
    """``[linear(x, l.w, l.b) for l in lins]`` (``layer.Linear``s of the same input), the
    same numbers, the products sharing kernel calls where their types allow
    (``quant.matrix.matmul_many``: x quantized once a call, one parallel region)."""
    from gguflm.quant.matrix import matmul_many

    return matmul_many([lin.w for lin in lins], x, [lin.b for lin in lins])


# -- normalisation -------------------------------------------------------------------------


def rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """x (..., n) scaled to unit root-mean-square, times w (n,) -> (..., n), as ggml's
    rms_norm computes each row (``rowkernels.rmsnorm_rows``)."""
    from .rowkernels import rmsnorm_rows  # numba: compiled or loaded on first use

    n = x.shape[-1]
    rows = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, n)
    out = np.empty(rows.shape, np.float32)
    rmsnorm_rows(rows, np.ascontiguousarray(w, dtype=np.float32), np.float32(eps), out)
    return out.reshape(x.shape)


# -- rotary position embeddings -------------------------------------------------------------


class RopeScaling(float):
    """A RoPE frequency scale (1 / ``rope.scaling.factor``; 1 without scaling) that also
    carries the rest of the file's RoPE scaling, as llama.cpp derives its rope parameters
    (``config.rope_scaling``). It is a float so that every architecture passes it on as
    ``ModelConfig.rope_freq_scale`` to ``rope_table``, which applies all of it: YaRN's
    frequency mix where ``ext_factor`` is not 0, and ``magnitude`` on cos and sin.

    ``n_ctx_orig``, ``beta_fast`` and ``beta_slow``: YaRN's correction range (ggml's
    ``ggml_rope_yarn_corr_dims``); ``magnitude``: the net factor on cos and sin."""

    kind: str
    ext_factor: float
    n_ctx_orig: int
    beta_fast: float
    beta_slow: float
    magnitude: float

    def __new__(cls, freq_scale: float, kind: str = "none", ext_factor: float = 0.0,
                n_ctx_orig: int = 0, beta_fast: float = 32.0, beta_slow: float = 1.0,
                magnitude: float = 1.0) -> RopeScaling:
        self = super().__new__(cls, freq_scale)
        self.kind, self.ext_factor, self.n_ctx_orig = kind, ext_factor, n_ctx_orig
        self.beta_fast, self.beta_slow, self.magnitude = beta_fast, beta_slow, magnitude
        return self

    def __repr__(self) -> str:
        return (f"RopeScaling({float(self)!r}, {self.kind!r}, ext_factor={self.ext_factor}, "
                f"n_ctx_orig={self.n_ctx_orig}, beta={self.beta_fast}/{self.beta_slow}, "
                f"magnitude={self.magnitude})")

    def __reduce__(self) -> tuple:
        return (RopeScaling, (float(self), self.kind, self.ext_factor, self.n_ctx_orig,
                              self.beta_fast, self.beta_slow, self.magnitude))


def rope_table(pos: np.ndarray, n_rot: int, base: float, freq_scale: float = 1.0,
               freq_factors: np.ndarray | None = None) -> np.ndarray:
    """exp(i * theta) (T, n_rot/2) complex64, theta = pos * freq_scale * base^(-2i/n_rot) / ff_i.

    Angles in float64 (llama.cpp uses float32 running products; the two agree to ~1e-6
    relative), then rounded. ``freq_factors`` (n_rot/2,) is Llama 3's ``rope_freqs.weight``,
    dividing each frequency's angle. A ``RopeScaling`` freq_scale with an ``ext_factor``
    makes YaRN's table (``yarn_table``); its ``magnitude`` scales cos and sin.
    """
    if isinstance(freq_scale, RopeScaling) and freq_scale.ext_factor != 0:
        return yarn_table(pos, n_rot, base, freq_scale, freq_factors)
    inv_freq = base ** (-np.arange(0, n_rot, 2, dtype=np.float64) / n_rot)
    if freq_factors is not None:
        inv_freq = inv_freq / freq_factors.astype(np.float64)
    theta = np.outer(np.asarray(pos, np.float64) * freq_scale, inv_freq)
    rot = (np.cos(theta) + 1j * np.sin(theta)).astype(np.complex64)
    if isinstance(freq_scale, RopeScaling) and freq_scale.magnitude != 1.0:
        rot *= np.float32(freq_scale.magnitude)  # ggml's rope: cos and sin times it
    return rot


def yarn_table(pos: np.ndarray, n_rot: int, base: float, scaling: RopeScaling,
               freq_factors: np.ndarray | None = None) -> np.ndarray:
    """``rope_table`` with YaRN's frequency mix, as ggml's rope_yarn: dimension pair i's
    angle blends the interpolated (times the frequency scale) and the extrapolated angle
    by ``ext_factor`` times a ramp between the correction dimensions of ``beta_fast`` and
    ``beta_slow`` turns over ``n_ctx_orig`` positions (``freq_factors`` dividing the
    extrapolated angle first); cos and sin are scaled by ``magnitude``. (T, n_rot/2)
    complex64."""
    freq_scale = float(scaling)

    def corr_dim(turns: float) -> float:
        return n_rot * np.log(scaling.n_ctx_orig / (turns * 2 * np.pi)) / (2 * np.log(base))

    lo = max(0.0, np.floor(corr_dim(scaling.beta_fast)))
    hi = min(n_rot - 1.0, np.ceil(corr_dim(scaling.beta_slow)))
    i = np.arange(0, n_rot, 2, dtype=np.float64)
    ramp = (1.0 - np.clip((i / 2 - lo) / max(0.001, hi - lo), 0.0, 1.0)) * scaling.ext_factor
    inv_freq = base ** (-i / n_rot)
    if freq_factors is not None:
        inv_freq = inv_freq / freq_factors.astype(np.float64)
    extrap = np.outer(np.asarray(pos, np.float64), inv_freq)
    theta = extrap * freq_scale * (1.0 - ramp) + extrap * ramp
    return (scaling.magnitude * (np.cos(theta) + 1j * np.sin(theta))).astype(np.complex64)


def rope_table_f32(pos: np.ndarray, n_rot: int, base: float, freq_scale: float = 1.0,
                   freq_factors: np.ndarray | None = None) -> np.ndarray:
    """``rope_table`` computed as ggml-cpu's rope cache is (ggml_rope_cache_init and
    rope_yarn), in float32: each pair's angle the previous pair's times base^(-2/n_rot),
    starting from the position; YaRN's mix of the interpolated and extrapolated angles and
    its magnitude in float32; cos and sin of the float32 angle. The float64 angles of
    ``rope_table`` differ from these by about 1e-6 relative, which decides float16
    roundings downstream and, through them, near-ties (an architecture whose routing
    hangs on such ties opts in). (T, n_rot/2) complex64."""
    f32 = np.float32
    s = freq_scale if isinstance(freq_scale, RopeScaling) else RopeScaling(freq_scale)
    step = f32(np.float64(f32(base)) ** np.float64(f32(-2.0 / n_rot)))
    extrap = np.empty((len(pos), n_rot // 2), np.float32)
    extrap[:, 0] = np.asarray(pos, np.float32)
    for i in range(1, n_rot // 2):  # ggml's running product, rounded at every step
        extrap[:, i] = extrap[:, i - 1] * step
    if freq_factors is not None:
        extrap = extrap / freq_factors.astype(np.float32)
    theta = f32(s) * extrap
    mscale = f32(s.magnitude)
    if s.ext_factor != 0:
        def corr_dim(turns: float) -> float:
            return n_rot * np.log(s.n_ctx_orig / (turns * 2 * np.pi)) / (2 * np.log(base))

        lo = f32(max(0.0, np.floor(corr_dim(s.beta_fast))))
        hi = f32(min(n_rot - 1.0, np.ceil(corr_dim(s.beta_slow))))
        y = (np.arange(n_rot // 2, dtype=np.float32) - lo) / max(f32(0.001), hi - lo)
        mix = (f32(1) - np.clip(y, f32(0), f32(1))) * f32(s.ext_factor)
        theta = theta * (f32(1) - mix) + extrap * mix
        # llama.cpp hands ggml the magnitude over YaRN's 1 + 0.1 ln(1/freq_scale), which
        # ggml's rope_yarn multiplies back, each in float32
        yarn = f32(f32(1) + f32(0.1) * f32(np.log(f32(1) / f32(s))))
        mscale = f32(f32(s.magnitude) * (f32(1) / yarn)) * yarn
    wide = theta.astype(np.float64)  # cosf/sinf of the float32 angle, rounded once
    cos = np.cos(wide).astype(np.float32) * mscale
    sin = np.sin(wide).astype(np.float32) * mscale
    return (cos + 1j * sin).astype(np.complex64)


def rope_norm(x: np.ndarray, rot: np.ndarray) -> np.ndarray:
    """llama.cpp's NORM RoPE: rotate adjacent pairs (0,1), (2,3), ... of each head's first
    n_rot dims. x (T, H, d) f32, rot (T, n_rot/2) from rope_table -> new (T, H, d)."""
    return _rope(x, rot, False)


def rope_neox(x: np.ndarray, rot: np.ndarray) -> np.ndarray:
    """llama.cpp's NEOX RoPE: rotate pairs (i, i + n_rot/2) of each head's first n_rot dims.
    x (T, H, d) f32, rot (T, n_rot/2) from rope_table -> new (T, H, d)."""
    return _rope(x, rot, True)


def _rope(x: np.ndarray, rot: np.ndarray, neox: bool) -> np.ndarray:
    from .rowkernels import rope_rows  # numba: compiled or loaded on first use

    out = np.array(x, dtype=np.float32, order="C")  # a copy, rotated in place
    rope_rows(out, np.ascontiguousarray(rot, dtype=np.complex64), neox)
    return out


# RoPE pairings by name: llama.cpp's NORM (adjacent dimensions) and NEOX (split halves)
ROPE_STYLES = {"norm": rope_norm, "neox": rope_neox}


# -- attention: see batch.py (Batch.attention) and attention.py (the kernel) -------------


# -- activations ------------------------------------------------------------------------------


def silu(x: np.ndarray) -> np.ndarray:
    """x * sigmoid(x), elementwise f32, as ggml_vec_silu_f32 computes each row (its exp on
    whole groups of 8, libm's on the tail; rows of the last axis in parallel)."""
    from gguflm.quant.kernels import silu_par  # numba: imported when a model runs

    rows = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, x.shape[-1])
    out = np.empty(rows.shape, np.float32)
    silu_par(rows, out)
    return out.reshape(x.shape)


def sigmoid(x: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-x)), elementwise f32 (ggml's sigmoid)."""
    with np.errstate(over="ignore"):
        return (np.float32(1) / (np.float32(1) + np.exp(-x))).astype(np.float32)


def softplus(x: np.ndarray) -> np.ndarray:
    """log(1 + exp(x)), x itself above 20 (ggml's softplus), elementwise f32."""
    with np.errstate(over="ignore"):
        return np.where(x > 20, x, np.log1p(np.exp(x))).astype(np.float32)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU, tanh approximation (ggml_gelu, Gemma's gelu_pytorch_tanh), elementwise."""
    c = np.float32(np.sqrt(2.0 / np.pi))
    inner = c * (x + np.float32(0.044715) * (x * x * x))  # x * x * x: float32 x**3 is ~500x slower
    return np.float32(0.5) * x * (np.float32(1.0) + np.tanh(inner))


def gelu(h: np.ndarray) -> np.ndarray:
    """ggml's GELU (tanh form) of h (T, n), as ``geglu`` evaluates its gate: compiled, rows
    in parallel (each element's numbers its own)."""
    from gguflm.quant.glu import gelu as gelu_rows  # numba: not imported on import

    out = np.empty(h.shape, np.float32)
    gelu_rows(np.ascontiguousarray(h, np.float32), out)
    return out


_GELU_F16: list[np.ndarray] = []  # ggml's table, made on first use


def gelu_f16_table() -> np.ndarray:
    """ggml-cpu's GELU table (65536,) f32: gelu_tanh of every float16 (by its bits),
    computed in float32 and rounded to float16; made once (the fused FFN reads it too)."""
    if not _GELU_F16:
        h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
        v = h.astype(np.float32)
        with np.errstate(all="ignore"):
            inner = np.float32(0.7978845608028654) * v * (np.float32(1.0)
                                                          + np.float32(0.044715) * v * v)
            g = np.float32(0.5) * v * (np.float32(1.0) + np.tanh(inner))
        _GELU_F16.append(g.astype(np.float16).astype(np.float32))
    return _GELU_F16[0]


def gelu_f16(x: np.ndarray) -> np.ndarray:
    """GELU as ggml-cpu computes it (GGML_GELU_FP16): 0 for x <= -10, x for x >= 10, else x
    rounded to float16 and looked up in the table of gelu_tanh, computed in float32 and
    rounded to float16, of every float16. Elementwise, float32."""
    x = np.asarray(x, np.float32)
    y = gelu_f16_table()[x.astype(np.float16).view(np.uint16)]
    return np.where(x <= -10, np.float32(0), np.where(x >= 10, x, y)).astype(np.float32)


def geglu_f16(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """gelu_f16(gate) * up, as ggml_vec_geglu_f32 (GGML_GELU_FP16). (T, n_ff) x2 -> (T, n_ff)."""
    return gelu_f16(gate) * np.asarray(up, np.float32)


def swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """silu(gate) * up: the Llama FFN's gated activation. (T, n_ff) x2 -> (T, n_ff).

    One numba pass computing each row as ggml's ggml_vec_swiglu_f32 does (its exp)."""
    return _gated("swiglu", gate, up)


def geglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """gelu_tanh(gate) * up: the Gemma FFN's gated activation. (T, n_ff) x2 -> (T, n_ff).

    One vectorized numba pass (numpy's tanh and temporaries took 10% of a Gemma prompt)."""
    return _gated("geglu", gate, up)


GATED_PARALLEL_MIN = 1 << 16  # values from which a gated activation runs its rows in parallel


def _gated(kernel: str, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    from gguflm.quant import kernels  # numba: imported when a model runs, not at import

    gate = np.ascontiguousarray(gate, dtype=np.float32)
    up = np.ascontiguousarray(up, dtype=np.float32)
    out = np.empty(gate.shape, np.float32)  # gate and up: the same (T, n_ff)
    # a prompt's rows shared out (each row's numbers are its own), a token's in this thread
    name = kernel + "_par" if gate.size >= GATED_PARALLEL_MIN else kernel
    getattr(kernels, name)(gate.reshape(-1, gate.shape[-1]), up.reshape(-1, up.shape[-1]),
                           out.reshape(-1, out.shape[-1]))
    return out


def softcap(x: np.ndarray, cap: float) -> np.ndarray:
    """cap * tanh(x / cap): Gemma 2's logit soft-capping, elementwise."""
    return np.tanh(x * np.float32(1.0 / cap)) * np.float32(cap)
