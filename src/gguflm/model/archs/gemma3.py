"""Gemma 3 text models (``general.architecture`` = ``gemma3``), as llama.cpp's
src/models/gemma3.cpp runs them.

Differences from Llama: the embedding is scaled by sqrt(n_embd) (in float32, as ggml does:
25.2982 for 640, not Hugging Face's bf16-rounded 25.25); Q and K get a per-head RMSNorm
before RoPE; attention and FFN outputs are RMS-normed again before each residual add; the
FFN is GELU(tanh)-gated; RoPE is NEOX style (split halves). Layers alternate between
sliding-window attention with their own RoPE base and full attention with ``rope.freq_base``
(five local, then one global, by default). RMSNorm weights are used as stored: the GGUF
converter already folded Gemma's ``1 + w``.
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

# Without a ``sliding_window_pattern`` key, every 6th layer (5, 11, ...) is global
# (llama.cpp: load_swa_pattern(ml, 6), dense_first = false).
DEFAULT_SWA_PERIOD = 6
# llama.cpp's hparams default when ``rope.freq_base_swa`` is absent.
DEFAULT_ROPE_BASE_SWA = 10000.0


@dataclass(frozen=True)
class Gemma3Config(ModelConfig):
    """Adds the local/global layer pattern and Gemma's scalars (GGUF key in each comment)."""

    swa_layers: tuple[bool, ...]  # {arch}.attention.sliding_window_pattern (period or per layer)
    rope_base_swa: float     # {arch}.rope.freq_base_swa (default 10000): local layers' RoPE base
    attn_scale: float        # 1/sqrt(key_length); 1/sqrt(n_embd/n_head) for the 27B model
    final_softcap: float     # {arch}.final_logit_softcapping (0: none)

    @classmethod
    def extra(cls, meta: Meta, common: dict[str, Any]) -> dict[str, Any]:
        n_layer = common["n_layer"]
        if common["sliding_window"] > 0:
            swa = meta.swa_layers(n_layer, DEFAULT_SWA_PERIOD)
        else:  # no window: every layer is global (llama.cpp's LLAMA_SWA_TYPE_NONE)
            swa = (False,) * n_layer
        # llama.cpp ties the 27B model's query_pre_attn_scalar (n_embd / n_head = 168) to
        # its layer count; every other size scales by the head size.
        if n_layer == 62:
            scale = 1.0 / math.sqrt(common["n_embd"] // common["n_head"])
        else:
            scale = 1.0 / math.sqrt(common["head_dim"])
        return dict(
            swa_layers=swa,
            rope_base_swa=meta.float("rope.freq_base_swa", DEFAULT_ROPE_BASE_SWA),
            attn_scale=scale,
            final_softcap=meta.float("final_logit_softcapping", 0.0, positive=False),
        )


@register("gemma3")
class Gemma3(Model):
    """Gemma 3 (270M to 27B text models): tied output unless ``output.weight`` is given."""

    config_class = Gemma3Config
    config: Gemma3Config
    rope_style = "neox"

    # -- tensors ---------------------------------------------------------------------------------
    def load_tensors(self, w: Weights) -> None:
        c = self.config
        self.token_embd = w.get("token_embd.weight", (c.n_vocab, c.n_embd))
        self.output_norm = w.get("output_norm.weight", (c.n_embd,))
        self.output = w.get_or("output.weight", (c.n_vocab, c.n_embd), self.token_embd)  # tied
        # + attn_qkv or attn_q/k/v, biases optional (qkv=c: llama.cpp's create_tensor_qkv)
        self.layers = [w.layer(i, {
            "attn_norm": (c.n_embd,),
            "attn_q_norm": (c.head_dim,),
            "attn_k_norm": (c.head_dim,),
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
        # local layers: own RoPE base, no frequency scaling (llama.cpp's *_train_swa values)
        rope = {False: ops.rope_table(pos, c.rope_dim, c.rope_base, c.rope_freq_scale),
                True: ops.rope_table(pos, c.rope_dim, c.rope_base_swa)}
        x = self.token_embd.rows(batch.ids) * np.sqrt(np.float32(c.n_embd))  # float32, as sqrtf
        x = ops.decoder_stack(x, self.layers, batch, c, (rope[False], rope[True]),
                              self.rope_style, c.attn_scale, ops.geglu, self.layer_params,
                              rows=batch.out)  # only the wanted rows leave the last layer
        return ops.rmsnorm(x, self.output_norm, c.norm_eps)  # (rows, n_embd)

    def head(self, x: np.ndarray, pause: Any = None) -> np.ndarray:
        logits = self.output.matmul(x, pause=pause)           # (rows, n_vocab)
        if self.config.final_softcap > 0:
            logits = ops.softcap(logits, self.config.final_softcap)
        return logits

    def layer_params(self, il: int, layer: Any) -> dict:
        """What varies by layer (``ops.decoder_stack``): local (sliding-window) layers
        take the second RoPE table and the window; every layer's attention and FFN output
        pass through their post-norms."""
        local = bool(self.config.swa_layers[il])
        return {"rope": int(local), "window": self.config.sliding_window if local else 0,
                "q_norm": layer.attn_q_norm, "k_norm": layer.attn_k_norm,
                "attn_post_norm": layer.post_attention_norm,
                "ffn_post_norm": layer.post_ffw_norm}

