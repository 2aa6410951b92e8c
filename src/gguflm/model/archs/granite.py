"""IBM Granite 3.x dense models (``general.architecture`` = ``granite``), as llama.cpp's
src/models/granite.cpp runs them.

Llama's layers (NORM RoPE, grouped-query attention, SwiGLU or experts, optional biases and
``rope_freqs``, output tied when ``output.weight`` is absent) with four scalars: the token
embeddings times ``embedding_scale``, each attention and FFN output times
``residual_scale`` before its residual add, attention scores times ``attention.scale``
(instead of 1/sqrt(head size)), and the logits divided by ``logit_scale``. RoPE is on
unless ``rope.scaling.finetuned`` is false (llama.cpp's switch for Granite).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .. import ops
from ..batch import Batch
from ..config import Meta, ModelConfig
from ..layer import no_rope_table
from ..weights import Weights
from . import register
from .llama import Llama


@dataclass(frozen=True)
class GraniteConfig(ModelConfig):
    """Adds Granite's scales (GGUF key in each comment; 0 where llama.cpp's is unset)."""

    embedding_scale: float  # {arch}.embedding_scale (default 0: none)
    residual_scale: float   # {arch}.residual_scale (default 0: none)
    attention_scale: float  # {arch}.attention.scale (default 0: 1/sqrt(head size))
    logit_scale: float      # {arch}.logit_scale (required): the logits divided by it
    rope: bool              # {arch}.rope.scaling.finetuned (default true): RoPE on

    @classmethod
    def extra(cls, meta: Meta, common: dict[str, Any]) -> dict[str, Any]:
        def optional(name: str) -> float:  # llama.cpp's unset is 0; else a positive one
            return meta.float(name) if meta.float(name, 0.0, positive=False) else 0.0

        return dict(embedding_scale=optional("embedding_scale"),
                    residual_scale=optional("residual_scale"),
                    attention_scale=optional("attention.scale"),
                    logit_scale=meta.float("logit_scale"),
                    rope=meta.bool("rope.scaling.finetuned", True))


@register("granite")
class Granite(Llama):
    """Granite 3.x: Llama's layers with embedding, residual, attention and logit scales."""

    config_class = GraniteConfig
    config: GraniteConfig

    def load_tensors(self, w: Weights) -> None:
        super().load_tensors(w)
        c = self.config
        scale = c.attention_scale or 1.0 / math.sqrt(c.head_dim)
        self.blocks = [replace(self.dense_block(layer, "silu", scale=scale),
                               residual_scale=c.residual_scale or 1.0)
                       for layer in self.layers]

    def _forward(self, batch: Batch) -> np.ndarray:
        return scaled_forward(self, batch)

    def head(self, x: np.ndarray) -> np.ndarray:
        """The output projection, then the logits times 1 / ``logit_scale`` (float32, as
        ggml_scale takes it)."""
        return super().head(x) * (np.float32(1.0) / np.float32(self.config.logit_scale))


def scaled_forward(model: Any, batch: Batch) -> np.ndarray:
    """Granite's trunk (granite, granitemoe, granitehybrid): embeddings times
    ``embedding_scale``, RoPE only where ``rope`` (``rope.scaling.finetuned``), the layers,
    the final norm. (rows, n_embd)."""
    c = model.config
    x = model.token_embd.rows(batch.ids)
    if c.embedding_scale:
        x = x * np.float32(c.embedding_scale)
    rope = (ops.rope_table(batch.pos, c.rope_dim, c.rope_base, c.rope_freq_scale,
                           model.rope_freqs) if c.rope
            else no_rope_table(len(batch.pos), c.rope_dim))
    x = model.run_layers(x, batch, (rope,))
    return ops.rmsnorm(x, model.output_norm, c.norm_eps)
