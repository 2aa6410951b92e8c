"""Qwen3 dense models (``general.architecture`` = ``qwen3``), as llama.cpp's
src/models/qwen3.cpp runs them.

Qwen2's graph (NEOX RoPE, SwiGLU, optional Q/K/V biases, tied output when ``output.weight``
is absent) plus one change: Q and K each get an RMSNorm per head, one [head_dim] weight
(``attn_q_norm``, ``attn_k_norm``) shared by all heads, after the projection and before
RoPE. The head size comes from ``attention.key_length`` (128 in the real models, so
n_head * head_dim need not equal n_embd).
"""

from __future__ import annotations

from typing import Any

from ..classifier import load_classifier
from ..weights import Layer, Shape, Weights
from . import register
from .qwen2 import Qwen2


@register("qwen3")
class Qwen3(Qwen2):
    """Qwen3 dense models: Qwen2's graph plus per-head Q/K RMSNorm."""

    output_bias_allowed = False

    def load_tensors(self, w: Weights) -> None:
        super().load_tensors(w)
        # Qwen3-Reranker: cls.output holds the LM head's "yes" and "no" rows; the score is
        # P(yes) of a softmax over the two (llama.cpp's build_pooling for qwen3)
        self.classifier = load_classifier(w, self.config, softmax=True, dense=False)

    def extra_layer_tensors(self) -> dict[str, Shape]:
        d = self.config.head_dim
        return {"attn_q_norm": (d,), "attn_k_norm": (d,)}

    def attn_extras(self, layer: Layer) -> dict[str, Any]:
        return {"q_norm": layer.attn_q_norm, "k_norm": layer.attn_k_norm}
