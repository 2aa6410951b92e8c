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
from ..weights import Weights
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
            attn_softcap=meta.float("attn_logit_softcapping", DEFAULT_ATTN_SOFTCAP),
            final_softcap=meta.float("final_logit_softcapping", DEFAULT_FINAL_SOFTCAP),
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
        # + attn_qkv or attn_q/k/v, biases optional (qkv=c: llama.cpp's create_tensor_qkv)
        self.layers = [w.layer(i, {
            "attn_norm": (c.n_embd,),
            "attn_output": (c.n_embd, c.n_head * c.head_dim_v),
            "post_attention_norm": (c.n_embd,),
            "ffn_norm": (c.n_embd,),
            "ffn_gate": (c.n_ff, c.n_embd),
            "ffn_up": (c.n_ff, c.n_embd),
            "ffn_down": (c.n_embd, c.n_ff),
            "post_ffw_norm": (c.n_embd,),
        }, qkv=c) for i in range(c.n_layer)]

    # -- forward ---------------------------------------------------------------------------------
    def _forward(self, batch: Batch) -> np.ndarray:
        c = self.config
        pos = batch.pos
        rope = {False: ops.rope_table(pos, c.rope_dim, c.rope_base, c.rope_freq_scale),
                True: ops.rope_table(pos, c.rope_dim, c.rope_base_swa, c.rope_freq_scale)}
        x = self.token_embd.rows(batch.ids) * np.sqrt(np.float32(c.n_embd))  # float32, as sqrtf
        x = ops.decoder_stack(x, self.layers, batch, c, (rope[False], rope[True]),
                              self.rope_style, c.attn_scale, ops.geglu, self.layer_params,
                              rows=batch.out,  # only the wanted rows leave the last layer
                              cap=c.attn_softcap)
        return ops.rmsnorm(x, self.output_norm, c.norm_eps)  # (rows, n_embd)

    def head(self, x: np.ndarray, pause: Any = None) -> np.ndarray:
        logits = self.token_embd.matmul(x, pause=pause)  # (rows, n_vocab)
        return ops.softcap(logits, self.config.final_softcap)

    def layer_params(self, il: int, layer: Any) -> dict:
        """What varies by layer (``ops.decoder_stack``): local (sliding-window) layers
        take the second RoPE table and the window; every layer's attention and FFN output
        pass through their post-norms."""
        local = bool(self.config.swa_layers[il])
        return {"rope": int(local), "window": self.config.sliding_window if local else 0,
                "attn_post_norm": layer.post_attention_norm,
                "ffn_post_norm": layer.post_ffw_norm}
