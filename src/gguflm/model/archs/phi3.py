"""Phi-3, Phi-3.5 and Phi-4-mini (``general.architecture`` = ``phi3``), as llama.cpp's
src/models/phi3.cpp runs them.

Pre-norm blocks like Llama's, with three differences: one fused ``attn_qkv`` projection
(rows [q | k | v]; separate ``attn_q``/``attn_k``/``attn_v`` are accepted too, as llama.cpp
does), one fused ``ffn_up`` of 2 x n_ff rows holding the SwiGLU gate then the up projection,
and RoPE in NEOX style, possibly over only part of each head (``rope.dimension_count``).

Long-context files (Phi-3.5, Phi-4-mini: "LongRoPE") carry per-frequency divisors
``rope_factors_long``/``rope_factors_short`` and ``rope.scaling.attn_factor``. llama.cpp
picks the long factors when the context is longer than ``rope.scaling.original_context_length``
and scales RoPE's cos/sin by the attention factor; so do we (the context is the KV
cache's). llama.cpp disables Phi's sliding window (``attention.sliding_window`` is ignored
with a warning), and so do we.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...gguf.errors import MetadataError, TensorInfoError
from .. import ops
from ..base import Model
from ..config import Meta, ModelConfig
from ..kv_cache import KVCache
from ..weights import Weights
from . import register


@dataclass(frozen=True)
class Phi3Config(ModelConfig):
    """Adds LongRoPE's scalars (GGUF key in each comment)."""

    n_ctx_orig: int         # {arch}.rope.scaling.original_context_length (default n_ctx_train)
    rope_attn_factor: float  # {arch}.rope.scaling.attn_factor (default 1): scales cos and sin

    @classmethod
    def extra(cls, meta: Meta, common: dict[str, Any]) -> dict[str, Any]:
        return dict(
            n_ctx_orig=meta.int("rope.scaling.original_context_length", common["n_ctx_train"]),
            rope_attn_factor=meta.float("rope.scaling.attn_factor", 1.0),
        )


@register("phi3")
class Phi3(Model):
    """Phi-3, Phi-3.5 and Phi-4-mini: fused QKV and gate/up projections, LongRoPE."""

    config_class = Phi3Config
    config: Phi3Config
    # llama.cpp disables Phi's sliding window (see the module docstring); `inspect` says so
    ignored_keys = ("attention.sliding_window",)

    # -- tensors ---------------------------------------------------------------------------------
    def load_tensors(self, w: Weights) -> None:
        c = self.config
        if c.head_dim_v != c.head_dim:  # llama.cpp asserts one head size for this graph
            raise MetadataError(f"must equal key_length ({c.head_dim}) for {c.arch}, got "
                                f"{c.head_dim_v}", key=f"{c.arch}.attention.value_length")
        self.token_embd = w.get("token_embd.weight", (c.n_vocab, c.n_embd))
        self.output_norm = w.get("output_norm.weight", (c.n_embd,))
        self.output = w.get("output.weight", (c.n_vocab, c.n_embd), optional=True)
        if self.output is None:  # tied: the embedding doubles as the output projection
            self.output = self.token_embd
        # LongRoPE frequency divisors: both or neither (llama.cpp needs the one it picks)
        n_freq = c.rope_dim // 2
        self.rope_long = w.get("rope_factors_long.weight", (n_freq,), optional=True)
        self.rope_short = w.get("rope_factors_short.weight", (n_freq,), optional=True)
        if (self.rope_long is None) != (self.rope_short is None):
            missing = "rope_factors_short" if self.rope_short is None else "rope_factors_long"
            raise TensorInfoError("missing: LongRoPE needs both long and short factors",
                                  tensor=f"{missing}.weight")
        self.layers = []
        for i in range(c.n_layer):
            qkv, qkv_bias = w.qkv_specs(i, c.n_embd, c.n_embd_q, c.n_embd_k, c.n_embd_v)
            self.layers.append(w.layer(i, {
                "attn_norm": (c.n_embd,),
                **qkv,
                "attn_output": (c.n_embd, c.n_head * c.head_dim_v),
                "ffn_norm": (c.n_embd,),
                "ffn_up": (2 * c.n_ff, c.n_embd),     # [gate | up]
                "ffn_down": (c.n_embd, c.n_ff),
            }, optional=qkv_bias))

    # -- forward ---------------------------------------------------------------------------------
    def rope(self, pos: np.ndarray, n_ctx: int) -> np.ndarray:
        """The RoPE table for positions ``pos`` in a context of ``n_ctx`` positions."""
        c = self.config
        factors = self.rope_long if n_ctx > c.n_ctx_orig else self.rope_short
        rot = ops.rope_table(pos, c.rope_dim, c.rope_base, c.rope_freq_scale, factors)
        if c.rope_attn_factor != 1.0:  # ggml's rope multiplies cos and sin by it
            rot *= np.float32(c.rope_attn_factor)
        return rot

    def _forward(self, ids: np.ndarray, pos0: int, cache: KVCache, out: slice) -> np.ndarray:
        c = self.config
        n_kv = pos0 + len(ids)
        pos = np.arange(pos0, n_kv)
        rope = self.rope(pos, cache.n_ctx)
        mask = ops.attention_mask(pos, n_kv)               # causal: Phi's window is disabled
        x = self.token_embd.rows(ids)                      # (T, n_embd)
        last = len(self.layers) - 1
        for il, layer in enumerate(self.layers):
            h = ops.rmsnorm(x, layer.attn_norm, c.norm_eps)
            a = self.attention(il, layer, h, rope, mask, cache)
            if il == last:  # only the wanted rows go on (llama.cpp's inp_out_ids)
                a, x = a[out], x[out]
            x = x + a
            h = ops.rmsnorm(x, layer.ffn_norm, c.norm_eps)
            x = x + self.ffn(layer, h)
        x = ops.rmsnorm(x, self.output_norm, c.norm_eps)
        return self.output.matmul(x)                       # (rows, n_vocab)

    def attention(self, il: int, layer: Any, h: np.ndarray, rope: np.ndarray,
                  mask: np.ndarray, cache: KVCache) -> np.ndarray:
        """h (T, n_embd) -> attention output (T, n_embd), keys/values stored in the cache."""
        c = self.config
        n = len(h)
        q, k, v = ops.qkv(h, layer, c.n_embd_q, c.n_embd_k)
        q = ops.rope_neox(q.reshape(n, c.n_head, c.head_dim), rope)
        k = ops.rope_neox(k.reshape(n, c.n_head_kv, c.head_dim), rope)
        v = v.reshape(n, c.n_head_kv, c.head_dim_v)
        keys, values = cache.store(il, k, v)               # (H_kv, S, d), (H_kv, S, d_v)
        a = ops.attention(q, keys, values, mask, 1.0 / math.sqrt(c.head_dim))
        return ops.linear(a, layer.attn_output)

    def ffn(self, layer: Any, h: np.ndarray) -> np.ndarray:
        """SwiGLU from one fused projection: down(silu(gate) * up), [gate | up] = ffn_up(h)."""
        n_ff = self.config.n_ff
        gu = ops.linear(h, layer.ffn_up)                   # (T, 2 * n_ff)
        return ops.linear(ops.swiglu(gu[:, :n_ff], gu[:, n_ff:]), layer.ffn_down)
