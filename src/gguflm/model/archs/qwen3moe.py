"""Qwen3 mixture-of-experts models (``general.architecture`` = ``qwen3moe``: Qwen3-30B-A3B,
Qwen3-235B-A22B, Qwen3-Coder-30B-A3B), as llama.cpp's src/models/qwen3moe.cpp runs them.

Qwen3's attention (NEOX RoPE, per-head Q/K RMS norms, no biases) with an expert FFN in
every layer: a softmax router ``ffn_gate_inp`` over ``expert_count`` SwiGLU experts of
``expert_feed_forward_length`` (default: feed_forward_length / expert_used_count), the
``expert_used_count`` best per token, their weights renormalised to sum 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...gguf.errors import MetadataError
from ..config import Meta, ModelConfig
from ..weights import Layer, Weights
from . import register
from .qwen2 import Qwen2


@dataclass(frozen=True)
class Qwen3MoeConfig(ModelConfig):
    """Adds the experts' size (GGUF key in the comment)."""

    n_ff_exp: int  # {arch}.expert_feed_forward_length (default n_ff / n_expert_used)

    @classmethod
    def extra(cls, meta: Meta, common: dict[str, Any]) -> dict[str, Any]:
        if not common["n_expert"]:
            raise MetadataError("must be at least 1 for qwen3moe", key=meta.key("expert_count"))
        return {"n_ff_exp": meta.int("expert_feed_forward_length",
                                     max(1, common["n_ff"] // common["n_expert_used"]))}


@register("qwen3moe")
class Qwen3Moe(Qwen2):
    """Qwen3-MoE: Qwen3's attention, an expert FFN in every layer, untied or tied output."""

    config_class = Qwen3MoeConfig
    config: Qwen3MoeConfig
    output_bias_allowed = False

    def extra_layer_tensors(self) -> dict[str, Any]:
        d = self.config.head_dim
        return {"attn_q_norm": (d,), "attn_k_norm": (d,)}

    def ffn_tensors(self, w: Weights) -> dict[str, Any]:
        c = self.config
        return w.experts(c.n_expert, c.n_embd, c.n_ff_exp)

    def attn_extras(self, layer: Layer) -> dict[str, Any]:
        return {"q_norm": layer.attn_q_norm, "k_norm": layer.attn_k_norm}
