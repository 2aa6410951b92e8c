"""Gemma 2 (``general.architecture`` = ``gemma2``), as llama.cpp's src/models/gemma2.cpp
runs it.

Like Gemma 3 without the Q/K head norms, plus soft-capping: the embedding is scaled by
sqrt(n_embd) (in float32, as ggml's sqrtf); RMSNorm weights are used as stored (the GGUF
converter already folded Gemma's ``1 + w``); attention and FFN outputs are RMS-normed again
before each residual add; the FFN is GELU(tanh)-gated; RoPE is NEOX style. Attention scores
are soft-capped (cap * tanh(s / cap), ``attn_logit_softcapping``, default 50) before the
mask, and so are the final logits (``final_logit_softcapping``, default 30). Layers
alternate: even ones slide a window over the keys (``attention.sliding_window``, default
4096: a key is visible when 0 <= query pos - key pos < window), odd ones see the whole
context. The output is always the token embedding (llama.cpp never loads ``output.weight``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import ops
from ..base import Model
from ..batch import Batch
from ..config import Meta, ModelConfig
from ..layer import Block
from ..weights import Layer, Shape, Weights
from . import register

# llama.cpp's defaults for files that lack the keys
DEFAULT_WINDOW = 4096
DEFAULT_SWA_PERIOD = 2          # load_swa_pattern(ml, 2): layers 0, 2, 4, ... slide
DEFAULT_ATTN_SOFTCAP = 50.0
DEFAULT_FINAL_SOFTCAP = 30.0


@dataclass(frozen=True)
class Gemma2Config(ModelConfig):
    """Adds the local/global layer pattern and Gemma 2's scalars (GGUF key in each comment)."""

    swa_layers: tuple[bool, ...]  # {arch}.attention.sliding_window_pattern (default period 2)
    rope_base_swa: float     # {arch}.rope.freq_base_swa (default: rope.freq_base)
    attn_scale: float        # 1/sqrt(key_length); 1/sqrt(n_embd/n_head) for the 27B model
    attn_softcap: float      # {arch}.attn_logit_softcapping (default 50)
    final_softcap: float     # {arch}.final_logit_softcapping (default 30)

    @classmethod
    def extra(cls, meta: Meta, common: dict[str, Any]) -> dict[str, Any]:
        n_layer = common["n_layer"]
        # llama.cpp sizes the 27B model (46 layers) by query_pre_attn_scalar = n_embd / n_head
        if n_layer == 46:
            scale = 1.0 / math.sqrt(common["n_embd"] // common["n_head"])
        else:
            scale = 1.0 / math.sqrt(common["head_dim"])
        return dict(
            sliding_window=meta.int("attention.sliding_window", DEFAULT_WINDOW),
            swa_layers=meta.swa_layers(n_layer, DEFAULT_SWA_PERIOD),
            rope_base_swa=meta.float("rope.freq_base_swa", common["rope_base"]),
            attn_scale=scale,
            attn_softcap=meta.softcap("attn_logit_softcapping", DEFAULT_ATTN_SOFTCAP,
                                      none=False),
            final_softcap=meta.softcap("final_logit_softcapping", DEFAULT_FINAL_SOFTCAP,
                                       none=False),
        )


@register("gemma2")
class Gemma2(Model):
    """Gemma 2 (2B, 9B, 27B): soft-capped attention and logits, alternating sliding window."""

    config_class = Gemma2Config
    config: Gemma2Config
    rope_style = "neox"

    # -- tensors ---------------------------------------------------------------------------------
    def load_tensors(self, w: Weights) -> None:
        c = self.config
        self.token_embd = w.get("token_embd.weight", (c.n_vocab, c.n_embd))
        self.output_norm = w.get("output_norm.weight", (c.n_embd,))
        self.output = self.output_tensor(w)
        # + attn_qkv or attn_q/k/v, biases optional (qkv=c: llama.cpp's create_tensor_qkv)
        self.layers = [w.layer(i, {
            "attn_norm": (c.n_embd,),
            **self.extra_layer_tensors(),
            "attn_output": (c.n_embd, c.n_head * c.head_dim_v),
            "post_attention_norm": (c.n_embd,),
            "ffn_norm": (c.n_embd,),
            "ffn_gate": (c.n_ff, c.n_embd),
            "ffn_up": (c.n_ff, c.n_embd),
            "ffn_down": (c.n_embd, c.n_ff),
            "post_ffw_norm": (c.n_embd,),
        }, qkv=c) for i in range(c.n_layer)]
        self.blocks = [self.block(il, layer) for il, layer in enumerate(self.layers)]

    def output_tensor(self, w: Weights) -> Any:
        """The output projection: always the token embedding (a subclass's hook)."""
        return self.token_embd

    def extra_layer_tensors(self) -> dict[str, Shape]:
        """Required per-layer tensors beyond Gemma 2's (a subclass's hook)."""
        return {}

    def block(self, il: int, layer: Layer) -> Block:
        """Local (sliding-window) layers take the second RoPE table and the window; every
        layer's attention and FFN output pass through their post-norms."""
        c = self.config
        local = bool(c.swa_layers[il])
        return self.dense_block(layer, "gelu", scale=c.attn_scale, rope=int(local),
                                window=c.sliding_window if local else 0,
                                softcap=c.attn_softcap, attn_post_norm=layer.post_attention_norm,
                                ffn_post_norm=layer.post_ffw_norm, **self.attn_extras(layer))

    def attn_extras(self, layer: Layer) -> dict[str, Any]:
        """``Attention`` fields beyond Gemma 2's (a subclass's hook: Gemma 3's Q/K norms)."""
        return {}

    # -- forward ---------------------------------------------------------------------------------
    def rope_tables(self, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The global and the local layers' RoPE tables for positions ``pos``."""
        c = self.config
        return (ops.rope_table(pos, c.rope_dim, c.rope_base, c.rope_freq_scale),
                ops.rope_table(pos, c.rope_dim, c.rope_base_swa, c.rope_freq_scale))

    def _forward(self, batch: Batch) -> np.ndarray:
        c = self.config
        x = self.token_embd.rows(batch.ids) * np.sqrt(np.float32(c.n_embd))  # float32, as sqrtf
        x = self.run_layers(x, batch, self.rope_tables(batch.pos),
                            self.per_layer_inputs(batch.ids, x))
        return ops.rmsnorm(x, self.output_norm, c.norm_eps)  # (rows, n_embd)

    def per_layer_inputs(self, ids: np.ndarray, x: np.ndarray) -> np.ndarray | None:
        """Per-layer inputs of tokens ``ids`` with embeddings x (a subclass's hook: Gemma
        4's per-layer embeddings); None: none."""
        return None

    def head(self, x: np.ndarray) -> np.ndarray:
        logits = super().head(x)  # (rows, n_vocab)
        if self.config.final_softcap > 0:
            logits = ops.softcap(logits, self.config.final_softcap)
        return logits
