"""ERNIE 4.5 dense models (``general.architecture`` = ``ernie4_5``: ERNIE-4.5-0.3B), as
llama.cpp's src/models/ernie4-5.cpp runs them.

Llama's graph: pre-norm blocks x += attn(rmsnorm(x)); x += ffn(rmsnorm(x)), grouped-query
attention with RoPE in NORM style (adjacent pairs), a SwiGLU FFN, Q/K/V biases where the
file has them, the output tied to the token embedding when ``output.weight`` is absent.
The head size comes from ``attention.key_length`` (128: n_head x head size need not be
n_embd). llama.cpp loads an optional ``attn_output.bias`` but its graph never adds it, and
neither do we.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from .. import ops
from ..base import Model
from ..batch import Batch
from ..layer import Block, Linear
from ..weights import Layer, Shape, Weights
from . import register


@register("ernie4_5")
class Ernie45(Model):
    """ERNIE 4.5 dense: Llama's graph, head size from ``key_length``."""

    rope_style = "norm"
    ignored_keys = ("attention.sliding_window",)  # llama.cpp's ernie4_5 never reads it

    def load_tensors(self, w: Weights) -> None:
        c = self.config
        c.require_one_head_size()  # llama.cpp asserts both for this graph
        c.require_full_rope()
        self.token_embd = w.get("token_embd.weight", (c.n_vocab, c.n_embd))
        self.output_norm = w.get("output_norm.weight", (c.n_embd,))
        self.output = w.get_or("output.weight", (c.n_vocab, c.n_embd), self.token_embd)  # tied
        self.layers = [self.layer_tensors(w, i) for i in range(c.n_layer)]
        self.blocks = [self.block(layer) for layer in self.layers]

    def layer_tensors(self, w: Weights, i: int) -> Layer:
        """Block i's tensors: attn_qkv or attn_q/k/v with optional biases (llama.cpp's
        create_tensor_qkv), the output product, the norms and ``ffn_tensors``."""
        c = self.config
        ffn, ffn_optional = self.ffn_tensors(w, i)
        return w.layer(i, {"attn_norm": (c.n_embd,), "attn_output": (c.n_embd, c.n_embd_q),
                           "ffn_norm": (c.n_embd,), **ffn},
                       {"attn_output.bias": (c.n_embd,), **ffn_optional}, qkv=c)

    def ffn_tensors(self, w: Weights, i: int) -> tuple[dict[str, Shape], dict[str, Shape]]:
        """Block i's FFN tensors as (required, optional) specs: a SwiGLU (the MoE variant
        overrides this)."""
        c = self.config
        return {"ffn_gate": (c.n_ff, c.n_embd), "ffn_up": (c.n_ff, c.n_embd),
                "ffn_down": (c.n_embd, c.n_ff)}, {}

    def block(self, layer: Layer) -> Block:
        """A pre-norm layer whose output product has no bias: llama.cpp's build_attn is
        given none, whatever the file holds."""
        b = self.dense_block(layer, "silu")
        return replace(b, attn=replace(b.attn, o=Linear(layer.attn_output)))

    def _forward(self, batch: Batch) -> np.ndarray:
        c = self.config
        rope = ops.rope_table(batch.pos, c.rope_dim, c.rope_base, c.rope_freq_scale)
        x = self.run_layers(self.token_embd.rows(batch.ids), batch, (rope,))
        return ops.rmsnorm(x, self.output_norm, c.norm_eps)  # (rows, n_embd)
