"""The building blocks architectures compose: norms, RoPE, attention, activations.

Thin numpy functions on float32 arrays, each with its shape contract in a comment. Nothing
here knows which architecture calls it: RoPE style, norm placement and activation choice are
made in the architecture's own file. T is the number of tokens in the batch, H the query
heads, H_kv the key/value heads, S the cached positions (including this batch), d a head size.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from gguflm.quant import matrix

# -- products --------------------------------------------------------------------------------


def linear(x: np.ndarray, w: Any, b: np.ndarray | None = None, pause: Any = None
           ) -> np.ndarray:
    """x (T, d_in) @ W.T (+ b) -> (T, d_out); W a QMatrix (d_out, d_in), b (d_out,) or None;
    ``pause`` as ``QMatrix.matmul`` takes it."""
    y = w.matmul(x, pause=pause)
    if b is not None:
        y += b
    return y


def linear_many(x: np.ndarray, ws: tuple[Any, ...], bs: tuple[np.ndarray | None, ...]
                ) -> list[np.ndarray]:
    """``[linear(x, w, b) for w, b in zip(ws, bs)]`` as one product call where the weights
    allow it (``QMatrix`` objects: ``quant.matrix.matmul_many``)."""
    from gguflm.quant.matrix import matmul_many

    ys = matmul_many(ws, x)
    for y, b in zip(ys, bs, strict=True):
        if b is not None:
            y += b
    return ys


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


def rope_table(pos: np.ndarray, n_rot: int, base: float, freq_scale: float = 1.0,
               freq_factors: np.ndarray | None = None) -> np.ndarray:
    """exp(i * theta) (T, n_rot/2) complex64, theta = pos * freq_scale * base^(-2i/n_rot) / ff_i.

    Angles in float64 (llama.cpp uses float32 running products; the two agree to ~1e-6
    relative), then rounded. ``freq_factors`` (n_rot/2,) is Llama 3's ``rope_freqs.weight``,
    dividing each frequency's angle.
    """
    inv_freq = base ** (-np.arange(0, n_rot, 2, dtype=np.float64) / n_rot)
    if freq_factors is not None:
        inv_freq = inv_freq / freq_factors.astype(np.float64)
    theta = np.outer(np.asarray(pos, np.float64) * freq_scale, inv_freq)
    return (np.cos(theta) + 1j * np.sin(theta)).astype(np.complex64)


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
    """x * sigmoid(x), elementwise."""
    with np.errstate(over="ignore"):  # exp(-x) overflows to inf for x << 0: result -0, fine
        return x / (np.float32(1.0) + np.exp(-x))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU, tanh approximation (ggml_gelu, Gemma's gelu_pytorch_tanh), elementwise."""
    c = np.float32(np.sqrt(2.0 / np.pi))
    inner = c * (x + np.float32(0.044715) * (x * x * x))  # x * x * x: float32 x**3 is ~500x slower
    return np.float32(0.5) * x * (np.float32(1.0) + np.tanh(inner))


def swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """silu(gate) * up: the Llama FFN's gated activation. (T, n_ff) x2 -> (T, n_ff).

    One numba pass computing each row as ggml's ggml_vec_swiglu_f32 does (its exp)."""
    return _gated("swiglu", gate, up)


def geglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """gelu_tanh(gate) * up: the Gemma FFN's gated activation. (T, n_ff) x2 -> (T, n_ff).

    One vectorized numba pass (numpy's tanh and temporaries took 10% of a Gemma prompt)."""
    return _gated("geglu", gate, up)


def _gated(kernel: str, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    from gguflm.quant import kernels  # numba: imported when a model runs, not at import

    gate = np.ascontiguousarray(gate, dtype=np.float32)
    up = np.ascontiguousarray(up, dtype=np.float32)
    out = np.empty(gate.shape, np.float32)  # gate and up: the same (T, n_ff)
    getattr(kernels, kernel)(gate.reshape(-1, gate.shape[-1]), up.reshape(-1, up.shape[-1]),
                             out.reshape(-1, out.shape[-1]))
    return out


def softcap(x: np.ndarray, cap: float) -> np.ndarray:
    """cap * tanh(x / cap): Gemma 2's logit soft-capping, elementwise."""
    return np.tanh(x * np.float32(1.0 / cap)) * np.float32(cap)


# -- projections several architectures share ----------------------------------------------------


def qkv(x: np.ndarray, layer: Any, n_head: int, n_head_kv: int, head_dim: int,
        head_dim_v: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q (T, H, d), K (T, H_kv, d), V (T, H_kv, d_v) heads of x (T, n_embd), as llama.cpp's
    build_qkv: ``layer`` holds one fused ``attn_qkv`` (rows [q | k | v]) or separate
    ``attn_q``/``attn_k``/``attn_v``, each with an optional bias added here (before RoPE).
    Load the tensors with ``Weights.layer(i, ..., qkv=config)``."""
    n = len(x)
    n_q, n_k = n_head * head_dim, n_head_kv * head_dim
    fused = getattr(layer, "attn_qkv", None)
    if fused is not None:
        y = linear(x, fused, getattr(layer, "attn_qkv_bias", None))
        q, k, v = y[:, :n_q], y[:, n_q:n_q + n_k], y[:, n_q + n_k:]
    else:
        q, k, v = linear_many(x, (layer.attn_q, layer.attn_k, layer.attn_v),
                              (getattr(layer, "attn_q_bias", None),
                               getattr(layer, "attn_k_bias", None),
                               getattr(layer, "attn_v_bias", None)))
    return (q.reshape(n, n_head, head_dim), k.reshape(n, n_head_kv, head_dim),
            v.reshape(n, n_head_kv, head_dim_v))


def glu_ffn(x: np.ndarray, layer: Any, glu: Callable[[np.ndarray, np.ndarray], np.ndarray]
            ) -> np.ndarray:
    """down(glu(gate(x), up(x))): llama.cpp's build_ffn with a parallel gate. x (T, n_embd)
    -> (T, n_embd); ``glu`` is ``swiglu`` or ``geglu``. Without an ``ffn_gate`` tensor,
    ``ffn_up`` is fused, its rows [gate | up] (Phi-3). Biases are optional throughout."""
    gate = getattr(layer, "ffn_gate", None)
    if gate is None:
        up = linear(x, layer.ffn_up, getattr(layer, "ffn_up_bias", None))  # (T, 2 n_ff)
        n_ff = up.shape[-1] // 2
        g, up = up[:, :n_ff], up[:, n_ff:]
    else:                                                                  # (T, n_ff) each
        g, up = linear_many(x, (gate, layer.ffn_up), (getattr(layer, "ffn_gate_bias", None),
                                                      getattr(layer, "ffn_up_bias", None)))
    return linear(glu(g, up), layer.ffn_down, getattr(layer, "ffn_down_bias", None))


def normed_glu_ffn(x: np.ndarray, norm_w: np.ndarray, eps: float, layer: Any,
                   glu: Callable[[np.ndarray, np.ndarray], np.ndarray],
                   post_norm: np.ndarray | None = None) -> np.ndarray:
    """``glu_ffn(rmsnorm(x, norm_w, eps), layer, glu)`` (then ``rmsnorm(., post_norm,
    eps)`` when ``post_norm`` is given: Gemma's post-FFN norm), the same numbers, as one
    compiled call (``blocks.ffn_block``) when the layer has separate ``ffn_gate``/
    ``ffn_up`` and ``ffn_down`` with integer kernels and no biases. x (T, n_embd) ->
    (T, n_embd)."""
    plan = matrix.layer_plan(layer, matrix.FFN_GROUPS)
    if plan is None or glu not in (swiglu, geglu):
        f = glu_ffn(rmsnorm(x, norm_w, eps), layer, glu)
        return f if post_norm is None else rmsnorm(f, post_norm, eps)
    from . import blocks  # numba: compiled or loaded on first use

    return blocks.ffn(x, norm_w, eps, layer, plan, glu is geglu, post_norm)


def normed_attention(x: np.ndarray, norm_w: np.ndarray, eps: float, layer: Any, batch: Any,
                     il: int, config: Any, rot: np.ndarray, rope_style: str, scale: float, *,
                     q_norm: np.ndarray | None = None, k_norm: np.ndarray | None = None,
                     cap: float = 0.0, window: int = 0, post_norm: np.ndarray | None = None
                     ) -> np.ndarray:
    """llama.cpp's build_attn behind the layer's input norm: x (T, n_embd) -> (T, n_embd).

    ``h = rmsnorm(x, norm_w, eps)``; Q, K, V of h (``qkv``; head counts and sizes from
    ``config``); ``q_norm``/``k_norm`` (d,), when given, RMS-normalize each query/key head
    (Qwen3, Gemma 3); RoPE ``rope_style`` by ``rot`` (``rope_table``); ``batch.attention``
    in layer ``il`` (``scale``, soft-cap ``cap``, sliding ``window``); the output
    projection ``attn_output``, RMS-normalized times ``post_norm`` when given (Gemma).
    One compiled call (``blocks.attention``) when Q, K, V and the output are separate
    integer-kernel matrices without biases, else step by step: the same numbers either
    way."""
    plan = matrix.layer_plan(layer, matrix.ATTENTION_GROUPS)
    if plan is not None:
        from . import blocks  # numba: compiled or loaded on first use

        return blocks.attention(x, norm_w, eps, layer, plan, batch, il, config, rot,
                                rope_style == "neox", scale, q_norm, k_norm, cap, window,
                                post_norm)
    c = config
    q, k, v = qkv(rmsnorm(x, norm_w, eps), layer, c.n_head, c.n_head_kv, c.head_dim,
                  c.head_dim_v)
    if q_norm is not None:
        q = rmsnorm(q, q_norm, eps)
    if k_norm is not None:
        k = rmsnorm(k, k_norm, eps)
    rope = ROPE_STYLES[rope_style]
    a = batch.attention(il, rope(q, rot), rope(k, rot), v, scale, cap, window)
    o = linear(a, layer.attn_output, getattr(layer, "attn_output_bias", None))
    return o if post_norm is None else rmsnorm(o, post_norm, eps)


def decoder_layer(x: np.ndarray, layer: Any, batch: Any, il: int, config: Any,
                  rot: np.ndarray, rope_style: str, scale: float,
                  glu: Callable[[np.ndarray, np.ndarray], np.ndarray], *,
                  rows: np.ndarray | None = None, q_norm: np.ndarray | None = None,
                  k_norm: np.ndarray | None = None, cap: float = 0.0, window: int = 0,
                  attn_post_norm: np.ndarray | None = None,
                  ffn_post_norm: np.ndarray | None = None) -> np.ndarray:
    """One pre-norm decoder layer: x (T, n_embd) -> (T', n_embd).

    ``x + normed_attention(x, layer.attn_norm, ...)`` (``post_norm=attn_post_norm``), of
    which only ``rows`` go on when given (llama.cpp's inp_out_ids, in the last layer: T'
    = len(rows)), then ``+ normed_glu_ffn(., layer.ffn_norm, ..., ffn_post_norm)``."""
    eps = config.norm_eps
    a = normed_attention(x, layer.attn_norm, eps, layer, batch, il, config, rot, rope_style,
                         scale, q_norm=q_norm, k_norm=k_norm, cap=cap, window=window,
                         post_norm=attn_post_norm)
    if rows is not None:
        a, x = a[rows], x[rows]
    x = x + a
    return x + normed_glu_ffn(x, layer.ffn_norm, eps, layer, glu, ffn_post_norm)


def decoder_stack(x: np.ndarray, layers: list, batch: Any, config: Any,
                  ropes: Sequence[np.ndarray], rope_style: str, scale: float,
                  glu: Callable[[np.ndarray, np.ndarray], np.ndarray],
                  params: Callable[[int, Any], dict], *, rows: np.ndarray | None = None,
                  cap: float = 0.0) -> np.ndarray:
    """Every decoder layer of a model: x (T, n_embd) -> (T', n_embd).

    For each layer, ``decoder_layer(x, layer, batch, il, config, ropes[r], rope_style,
    scale, glu, cap=cap, **p)`` with ``p = params(il, layer)``: what varies by layer
    (``q_norm``, ``k_norm``, ``window``, ``attn_post_norm``, ``ffn_post_norm``; ``rope``:
    r, an index into ``ropes``, default 0), worked out once per model; only ``rows`` leave
    the last layer. For a few rows (decoding; a short prompt), one compiled call whose
    threads share every layer (``team.run_stack``); else layer by layer. The same numbers
    either way."""
    from . import team  # numba: compiled or loaded on first use

    if glu in (swiglu, geglu):
        out = team.run_stack(x, layers, batch, config, tuple(ropes), rope_style == "neox",
                             scale, glu is geglu, params, cap)
        if out is not None:  # every row through the last layer: the wanted rows' numbers
            return out if rows is None else out[rows]  # do not depend on the others
    last = len(layers) - 1
    for il, layer in enumerate(layers):
        p = dict(params(il, layer))
        rot = ropes[p.pop("rope", 0)]
        x = decoder_layer(x, layer, batch, il, config, rot, rope_style, scale, glu,
                          rows=rows if il == last else None, cap=cap, **p)
    return x
