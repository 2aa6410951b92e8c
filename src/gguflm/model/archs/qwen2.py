"""Qwen2 and Qwen2.5 (``general.architecture`` = ``qwen2``), as llama.cpp's
src/models/qwen2.cpp runs them.

Pre-norm blocks like Llama's: x += attn(rmsnorm(x)); x += ffn(rmsnorm(x)), SwiGLU FFN,
grouped-query attention. What differs: RoPE in NEOX style (pairs (i, i + d/2): the GGUF
converter does not permute Q/K rows for Qwen), biases on the Q/K/V projections (added
before RoPE), an optional output bias, and the output tied to the token embedding when
``output.weight`` is absent. llama.cpp ignores any sliding-window key for this
architecture, and so do we.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import ops
from ..base import Model
from ..batch import Batch
from ..forward_pass import output_product
from ..weights import Layer, Shape, Weights
from . import register


@register("qwen2")
class Qwen2(Model):
    """Qwen2 and Qwen2.5 dense models: Q/K/V biases, NEOX RoPE."""

    rope_style = "neox"
    # llama.cpp's qwen2/qwen3 graphs attend causally over the whole context; `inspect` says so
    ignored_keys = ("attention.sliding_window",)
    # llama.cpp's qwen2 loads an optional ``output.bias``; qwen3 does not
    output_bias_allowed = True
    # the file's name for the FFN's pre-norm (Seed-OSS stores it as post_attention_norm)
    ffn_norm_name = "ffn_norm"

    # -- tensors ---------------------------------------------------------------------------------
    def load_tensors(self, w: Weights) -> None:
        c = self.config
        c.require_one_head_size()  # llama.cpp asserts both for this graph
        c.require_full_rope()
        self.token_embd = w.get("token_embd.weight", (c.n_vocab, c.n_embd))
        self.output_norm = w.get("output_norm.weight", (c.n_embd,))
        self.output = w.get_or("output.weight", (c.n_vocab, c.n_embd), self.token_embd)  # tied
        self.output_bias = (w.get("output.bias", (c.n_vocab,), optional=True)
                            if self.output_bias_allowed else None)
        # + attn_qkv or attn_q/k/v, biases optional (qkv=c: llama.cpp's create_tensor_qkv)
        self.layers = [w.layer(i, {
            "attn_norm": (c.n_embd,),
            **self.extra_layer_tensors(),
            "attn_output": (c.n_embd, c.n_head * c.head_dim_v),
            self.ffn_norm_name: (c.n_embd,),
            **self.ffn_tensors(w),
        }, qkv=c) for i in range(c.n_layer)]
        for layer in self.layers:  # the FFN's pre-norm, whatever the file calls it
            layer.ffn_norm = getattr(layer, self.ffn_norm_name)
        # attention is causal only; Q/K/V biases are added before RoPE, as llama.cpp
        self.blocks = [self.dense_block(layer, "silu", **self.attn_extras(layer))
                       for layer in self.layers]

    def extra_layer_tensors(self) -> dict[str, Shape]:
        """Required per-layer tensors beyond Qwen2's (a subclass's hook)."""
        return {}

    def ffn_tensors(self, w: Weights) -> dict[str, Shape]:
        """The FFN's tensors: gate, up and down (a subclass's hook: experts)."""
        c = self.config
        return {"ffn_gate": (c.n_ff, c.n_embd), "ffn_up": (c.n_ff, c.n_embd),
                "ffn_down": (c.n_embd, c.n_ff)}

    # -- forward ---------------------------------------------------------------------------------
    def _forward(self, batch: Batch) -> np.ndarray:
        c = self.config
        rope = ops.rope_table(batch.pos, c.rope_dim, c.rope_base, c.rope_freq_scale)
        x = self.run_layers(self.token_embd.rows(batch.ids), batch, (rope,))
        return ops.rmsnorm(x, self.output_norm, c.norm_eps)  # (rows, n_embd)

    def head(self, x: np.ndarray) -> np.ndarray:
        return output_product(self.output, x, self.output_bias)  # (rows, n_vocab)

    def attn_extras(self, layer: Layer) -> dict[str, Any]:
        """``Attention`` fields beyond Qwen2's (a subclass's hook: Qwen3's Q/K norms)."""
        return {}
