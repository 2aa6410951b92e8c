"""Llama: Llama 1-3, TinyLlama, SmolLM, Mistral-style dense models (``general.architecture``
= ``llama``), as llama.cpp's src/models/llama.cpp runs them.

Pre-norm blocks: x += attn(rmsnorm(x)); x += ffn(rmsnorm(x)). RoPE in NORM style (adjacent
pairs: the GGUF converter permutes Q/K rows for it), grouped-query attention, SwiGLU FFN,
output tied to the token embedding when ``output.weight`` is absent.
"""

from __future__ import annotations

import numpy as np

from .. import ops
from ..base import Model
from ..batch import Batch
from ..weights import Weights
from . import register


@register("llama")
class Llama(Model):
    """The Llama family; optional biases and Llama 3's ``rope_freqs`` are honoured."""

    rope_style = "norm"

    # -- tensors ---------------------------------------------------------------------------------
    def load_tensors(self, w: Weights) -> None:
        c = self.config
        c.require_full_rope()  # llama.cpp asserts the same for this architecture
        self.token_embd = w.get("token_embd.weight", (c.n_vocab, c.n_embd))
        self.output_norm = w.get("output_norm.weight", (c.n_embd,))
        self.output = w.get_or("output.weight", (c.n_vocab, c.n_embd), self.token_embd)  # tied
        self.rope_freqs = w.get("rope_freqs.weight", (c.rope_dim // 2,), optional=True)
        # Mixtral-style files (expert_count > 0) have experts in place of the dense FFN
        ffn, ffn_bias = (w.experts(c.n_expert, c.n_embd, c.n_ff), {}) if c.n_expert else ({
            "ffn_gate": (c.n_ff, c.n_embd),
            "ffn_up": (c.n_ff, c.n_embd),
            "ffn_down": (c.n_embd, c.n_ff),
        }, {
            "ffn_gate.bias": (c.n_ff,),
            "ffn_up.bias": (c.n_ff,),
            "ffn_down.bias": (c.n_embd,),
        })
        self.layers = [w.layer(i, {
            "attn_norm": (c.n_embd,),
            "attn_q": (c.n_embd_q, c.n_embd),
            "attn_k": (c.n_embd_k, c.n_embd),
            "attn_v": (c.n_embd_v, c.n_embd),
            "attn_output": (c.n_embd, c.n_head * c.head_dim_v),
            "ffn_norm": (c.n_embd,),
            **ffn,
        }, optional={
            "attn_q.bias": (c.n_embd_q,),
            "attn_k.bias": (c.n_embd_k,),
            "attn_v.bias": (c.n_embd_v,),
            "attn_output.bias": (c.n_embd,),
            **ffn_bias,
        }) for i in range(c.n_layer)]
        # attention is causal; llama ignores any sliding window
        self.blocks = [self.dense_block(layer, "silu") for layer in self.layers]

    # -- forward ---------------------------------------------------------------------------------
    def _forward(self, batch: Batch) -> np.ndarray:
        c = self.config
        rope = ops.rope_table(batch.pos, c.rope_dim, c.rope_base, c.rope_freq_scale,
                              self.rope_freqs)
        x = self.run_layers(self.token_embd.rows(batch.ids), batch, (rope,))
        return ops.rmsnorm(x, self.output_norm, c.norm_eps)  # (rows, n_embd); head: output


@register("llama-embed")
class LlamaEmbed(Llama):
    """llama.cpp's ``llama-embed`` (llama-embed-nemotron): Llama's layers as an embedding
    model, usually with ``attention.causal`` false (bidirectional: ``model/bidirectional.py``)
    and no LM head (the tied fallback is loaded and unused). llama.cpp builds its graph
    without logits, whatever the attention, and without a KV cache: keys and values stay
    float32, so they do here whatever cache type is asked for."""

    is_encoder = True
    kv_type = "f32"

    def use_kv_type(self, kv_type: str) -> None:
        """Check ``kv_type`` as any model does, and keep float32 (see the class)."""
        super().use_kv_type(kv_type)
        self.kv_type = "f32"
