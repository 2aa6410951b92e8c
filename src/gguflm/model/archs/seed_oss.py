"""Seed-OSS (``general.architecture`` = ``seed_oss``: Seed-OSS-36B), as llama.cpp's
src/models/seed-oss.cpp runs it.

Pre-norm blocks: x += attn(rmsnorm(x)); x += ffn(rmsnorm(x)), grouped-query attention
with Q/K/V biases (where the file has them, added before RoPE), RoPE in NEOX style, a
SwiGLU FFN, the output tied to the token embedding when ``output.weight`` is absent. The
head size comes from ``attention.key_length`` (128: n_head x head size need not be
n_embd). The FFN's pre-norm is stored as ``post_attention_norm`` (Hugging Face's name for
it): the same norm in Llama's place, not a post-norm.
"""

from __future__ import annotations

import numpy as np

from .. import ops
from ..base import Model
from ..batch import Batch
from ..weights import Weights
from . import register


@register("seed_oss")
class SeedOss(Model):
    """Seed-OSS: Q/K/V biases, NEOX RoPE, the FFN's norm named ``post_attention_norm``."""

    rope_style = "neox"
    ignored_keys = ("attention.sliding_window",)  # llama.cpp's seed_oss never reads it

    def load_tensors(self, w: Weights) -> None:
        c = self.config
        c.require_one_head_size()  # llama.cpp asserts both for this graph
        c.require_full_rope()
        self.token_embd = w.get("token_embd.weight", (c.n_vocab, c.n_embd))
        self.output_norm = w.get("output_norm.weight", (c.n_embd,))
        self.output = w.get_or("output.weight", (c.n_vocab, c.n_embd), self.token_embd)  # tied
        # + attn_qkv or attn_q/k/v, biases optional (qkv=c: llama.cpp's create_tensor_qkv)
        self.layers = [w.layer(i, {
            "attn_norm": (c.n_embd,),
            "attn_output": (c.n_embd, c.n_embd_q),
            "post_attention_norm": (c.n_embd,),
            "ffn_gate": (c.n_ff, c.n_embd),
            "ffn_up": (c.n_ff, c.n_embd),
            "ffn_down": (c.n_embd, c.n_ff),
        }, qkv=c) for i in range(c.n_layer)]
        for layer in self.layers:  # the FFN's pre-norm, under its file name
            layer.ffn_norm = layer.post_attention_norm
        self.blocks = [self.dense_block(layer, "silu") for layer in self.layers]

    def _forward(self, batch: Batch) -> np.ndarray:
        c = self.config
        rope = ops.rope_table(batch.pos, c.rope_dim, c.rope_base, c.rope_freq_scale)
        x = self.run_layers(self.token_embd.rows(batch.ids), batch, (rope,))
        return ops.rmsnorm(x, self.output_norm, c.norm_eps)  # (rows, n_embd)
