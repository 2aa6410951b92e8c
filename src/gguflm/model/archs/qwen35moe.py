"""Qwen3.5 mixture-of-experts models (``general.architecture`` = ``qwen35moe``: Qwen3.5-35B-A3B
and larger), as llama.cpp's src/models/qwen35moe.cpp runs them.

Qwen3.5's trunk (gated delta nets beside gated full attention, interleaved M-RoPE, the
MTP blocks loaded and not run: ``qwen35.py``) with an expert FFN in every layer: a softmax
router ``ffn_gate_inp`` over ``expert_count`` SwiGLU experts of
``expert_feed_forward_length``, the ``expert_used_count`` best per token, their weights
renormalised to sum 1; plus a shared SwiGLU expert of ``expert_shared_feed_forward_length``
(default feed_forward_length) that every token runs, its output times
sigmoid(``ffn_gate_inp_shexp`` . x).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from ...gguf.errors import MetadataError
from ..config import Meta
from ..layer import GLU, Experts, Linear, experts
from ..weights import Layer, Weights
from . import register
from .qwen35 import Qwen35, Qwen35Config


@dataclass(frozen=True)
class Qwen35MoeConfig(Qwen35Config):
    """Adds the experts' sizes (GGUF key in each comment)."""

    needs_n_ff: ClassVar[bool] = False

    n_ff_exp: int    # {arch}.expert_feed_forward_length (default n_ff / n_expert_used)
    n_ff_shexp: int  # {arch}.expert_shared_feed_forward_length (default n_ff)

    @classmethod
    def extra(cls, meta: Meta, common: dict[str, Any]) -> dict[str, Any]:
        if not common["n_expert"]:
            raise MetadataError("must be at least 1 for qwen35moe", key=meta.key("expert_count"))
        n_ff = common["n_ff"]
        fallback = n_ff // common["n_expert_used"] or None
        n_ff_exp = meta.int("expert_feed_forward_length", fallback)
        n_ff_shexp = meta.int("expert_shared_feed_forward_length", n_ff or None)
        if n_ff_exp is None or n_ff_shexp is None:
            raise MetadataError("missing, and feed_forward_length does not size the experts",
                                key=meta.key("expert_feed_forward_length" if n_ff_exp is None
                                             else "expert_shared_feed_forward_length"))
        return {**super().extra(meta, common), "n_ff_exp": n_ff_exp, "n_ff_shexp": n_ff_shexp}


@register("qwen35moe")
class Qwen35Moe(Qwen35):
    """Qwen3.5-MoE: Qwen3.5's hybrid trunk, routed experts plus a gated shared expert."""

    config_class = Qwen35MoeConfig
    config: Qwen35MoeConfig

    def ffn_tensors(self, w: Weights, i: int) -> dict[str, Any]:
        c = self.config  # gate and up may be one fused tensor, as create_tensor_gate_up_exps
        return {**w.experts(c.n_expert, c.n_embd, c.n_ff_exp, fused_at=i),
                "ffn_gate_inp_shexp": (c.n_embd,), "ffn_gate_shexp": (c.n_ff_shexp, c.n_embd),
                "ffn_up_shexp": (c.n_ff_shexp, c.n_embd),
                "ffn_down_shexp": (c.n_embd, c.n_ff_shexp)}

    def ffn(self, layer: Layer) -> Experts:
        shared = GLU(Linear.of(layer, "ffn_gate_shexp"), Linear.of(layer, "ffn_up_shexp"),
                     Linear.of(layer, "ffn_down_shexp"), "silu")
        return experts(layer, self.config.n_expert_used, "silu", shared=shared,
                       shared_gate=layer.ffn_gate_inp_shexp)
