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

from dataclasses import dataclass
from typing import Any

import numpy as np

from ...gguf.errors import TensorInfoError
from .. import ops
from ..base import Model
from ..batch import Batch
from ..config import Meta, ModelConfig
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
    rope_style = "neox"
    # llama.cpp disables Phi's sliding window (see the module docstring); `inspect` says so
    ignored_keys = ("attention.sliding_window",)

    # -- tensors ---------------------------------------------------------------------------------
    def load_tensors(self, w: Weights) -> None:
        c = self.config
        c.require_one_head_size()  # llama.cpp asserts it for this graph
        self.token_embd = w.get("token_embd.weight", (c.n_vocab, c.n_embd))
        self.output_norm = w.get("output_norm.weight", (c.n_embd,))
        self.output = w.get_or("output.weight", (c.n_vocab, c.n_embd), self.token_embd)  # tied
        # LongRoPE frequency divisors: both or neither (llama.cpp needs the one it picks)
        n_freq = c.rope_dim // 2
        self.rope_long = w.get("rope_factors_long.weight", (n_freq,), optional=True)
        self.rope_short = w.get("rope_factors_short.weight", (n_freq,), optional=True)
        if (self.rope_long is None) != (self.rope_short is None):
            missing = "rope_factors_short" if self.rope_short is None else "rope_factors_long"
            raise TensorInfoError("missing: LongRoPE needs both long and short factors",
                                  tensor=f"{missing}.weight")
        # + attn_qkv or attn_q/k/v, biases optional (qkv=c: llama.cpp's create_tensor_qkv)
        self.layers = [w.layer(i, {
            "attn_norm": (c.n_embd,),
            "attn_output": (c.n_embd, c.n_head * c.head_dim_v),
            "ffn_norm": (c.n_embd,),
            "ffn_up": (2 * c.n_ff, c.n_embd),     # [gate | up]
            "ffn_down": (c.n_embd, c.n_ff),
        }, qkv=c) for i in range(c.n_layer)]
        # attention is causal (Phi's window is disabled); gate and up: the fused ffn_up
        self.blocks = [self.dense_block(layer, "silu") for layer in self.layers]

    # -- forward ---------------------------------------------------------------------------------
    def rope(self, pos: np.ndarray, n_ctx: int) -> np.ndarray:
        """The RoPE table for positions ``pos`` in a context of ``n_ctx`` positions."""
        c = self.config
        factors = self.rope_long if n_ctx > c.n_ctx_orig else self.rope_short
        rot = ops.rope_table(pos, c.rope_dim, c.rope_base, c.rope_freq_scale, factors)
        if c.rope_attn_factor != 1.0:  # ggml's rope multiplies cos and sin by it
            rot *= np.float32(c.rope_attn_factor)
        return rot

    def _forward(self, batch: Batch) -> np.ndarray:
        c = self.config
        rope = self.rope(batch.pos, batch.n_ctx)
        x = self.run_layers(self.token_embd.rows(batch.ids), batch, (rope,))
        return ops.rmsnorm(x, self.output_norm, c.norm_eps)  # (rows, n_embd); head: output
