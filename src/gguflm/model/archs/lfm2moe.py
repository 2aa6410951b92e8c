"""LFM2-MoE (``general.architecture`` = ``lfm2moe``: Liquid's LFM2-8B-A1B, LFM2-24B-A2B), as
llama.cpp's src/models/lfm2moe.cpp runs it (lfm2.cpp's graph).

LFM2's trunk (gated short convolutions beside grouped-query attention: ``lfm2.py``); the
first ``leading_dense_block_count`` layers have a dense SwiGLU FFN, the others
``expert_count`` SwiGLU experts of ``expert_feed_forward_length``, scored by
``expert_gating_func`` (LFM2-MoE: a sigmoid of the router ``ffn_gate_inp``), the
``expert_used_count`` best by score plus ``exp_probs_b`` chosen, weighted by their
unbiased scores renormalised to sum 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...gguf.errors import MetadataError
from ..config import Meta
from ..layer import experts, glu
from ..weights import Layer, Shape, Weights
from . import register
from .lfm2 import Lfm2, Lfm2Config

# llama.cpp's llama_expert_gating_func_type values, by name (layer.GATINGS)
GATING_FUNCS = {1: "softmax", 2: "sigmoid", 3: "softmax_weight"}


@dataclass(frozen=True)
class Lfm2MoeConfig(Lfm2Config):
    """Adds the experts' size and routing (GGUF key in each comment)."""

    n_dense_lead: int  # {arch}.leading_dense_block_count (default 0)
    n_ff_exp: int      # {arch}.expert_feed_forward_length
    gating: str        # {arch}.expert_gating_func (1 softmax, 2 sigmoid, 3 softmax_weight)

    @classmethod
    def extra(cls, meta: Meta, common: dict[str, Any]) -> dict[str, Any]:
        v = super().extra(meta, common)
        n_dense = meta.int("leading_dense_block_count", 0, minimum=0)
        if n_dense < common["n_layer"] and not common["n_expert"]:
            raise MetadataError(f"must be at least 1: layers {n_dense}.. have experts",
                                key=meta.key("expert_count"))
        func = meta.int("expert_gating_func", minimum=0)
        if func not in GATING_FUNCS:
            raise MetadataError(f"{func} is not one of {GATING_FUNCS} (llama.cpp's "
                                f"gating functions this architecture runs)",
                                key=meta.key("expert_gating_func"))
        return {**v, "n_dense_lead": n_dense, "gating": GATING_FUNCS[func],
                "n_ff_exp": meta.int("expert_feed_forward_length")}


@register("lfm2moe")
class Lfm2Moe(Lfm2):
    """LFM2-MoE: LFM2's hybrid trunk, dense leading layers, then biased-choice experts."""

    config_class = Lfm2MoeConfig
    config: Lfm2MoeConfig

    def ffn_tensors(self, w: Weights, i: int) -> dict[str, Shape]:
        c = self.config
        if i < c.n_dense_lead:
            return super().ffn_tensors(w, i)
        return {**w.experts(c.n_expert, c.n_embd, c.n_ff_exp), "exp_probs_b.bias": (c.n_expert,)}

    def ffn(self, layer: Layer) -> Any:
        if not hasattr(layer, "ffn_gate_inp"):
            return glu(layer, "silu")
        c = self.config
        return experts(layer, c.n_expert_used, "silu", gating=c.gating,
                       select_bias=layer.exp_probs_b_bias)
