"""ERNIE 4.5 mixture-of-experts models (``general.architecture`` = ``ernie4_5-moe``:
ERNIE-4.5-21B-A3B, ERNIE-4.5-300B-A47B), as llama.cpp's src/models/ernie4-5-moe.cpp runs
them.

ERNIE 4.5's attention (``ernie4_5.py``: NORM RoPE, head size from ``key_length``, no output
bias). The first ``leading_dense_block_count`` layers have a SwiGLU FFN of
``feed_forward_length``; the others a mixture of ``expert_count`` SwiGLU experts of
``expert_feed_forward_length``: a softmax over the router ``ffn_gate_inp``, the
``expert_used_count`` best by the probabilities plus ``exp_probs_b`` where the file has it
(the bias decides the choice, not the weights), their probabilities renormalised (no
``expert_weights_scale``: llama.cpp's ernie4_5-moe never reads it); plus, with
``expert_shared_feed_forward_length``, one shared SwiGLU of that width added ungated.
llama.cpp's graph puts experts only in layers whose index + 1 is a multiple of
``interleave_moe_layer_step`` while its loader gives every layer after the dense ones
experts, so it runs only a step of 1 (every ERNIE 4.5 MoE file); others are refused.
Experts are grouped where the file has ``expert_group_count`` > 1, as llama.cpp does for
any architecture.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ...gguf.errors import MetadataError
from ..config import Meta, ModelConfig
from ..layer import GLU, Block, Linear
from ..weights import Layer, Shape, Weights
from . import register
from .ernie4_5 import Ernie45
from .glm4moe import _groups


@dataclass(frozen=True)
class Ernie45MoeConfig(ModelConfig):
    """Adds the experts' sizes and the leading dense layers (GGUF key in each comment)."""

    n_ff_exp: int      # {arch}.expert_feed_forward_length (required)
    n_ff_shexp: int    # {arch}.expert_shared_feed_forward_length (default 0: none)
    n_dense_lead: int  # {arch}.leading_dense_block_count (default 0)
    groups: int        # {arch}.expert_group_count (default 0; 0 or 1: no groups)
    groups_used: int   # {arch}.expert_group_used_count

    @classmethod
    def extra(cls, meta: Meta, common: dict[str, Any]) -> dict[str, Any]:
        if not common["n_expert"]:
            raise MetadataError("must be at least 1 for ernie4_5-moe",
                                key=meta.key("expert_count"))
        step = meta.int("interleave_moe_layer_step", minimum=0)
        if step != 1:
            raise MetadataError(f"must be 1 (experts in every layer after the leading dense "
                                f"ones), got {step}: llama.cpp's loader and graph disagree "
                                f"on other steps", key=meta.key("interleave_moe_layer_step"))
        groups, groups_used = _groups(meta, common)
        return dict(n_ff_exp=meta.int("expert_feed_forward_length"),
                    n_ff_shexp=meta.int("expert_shared_feed_forward_length", 0, minimum=0),
                    n_dense_lead=meta.int("leading_dense_block_count", 0, minimum=0),
                    groups=groups, groups_used=groups_used)


@register("ernie4_5-moe")
class Ernie45Moe(Ernie45):
    """ERNIE 4.5 MoE: leading dense layers, then softmax-routed experts with an optional
    selection bias and an optional shared expert."""

    config_class = Ernie45MoeConfig
    config: Ernie45MoeConfig
    ignored_keys = ("attention.sliding_window", "expert_weights_scale",
                    "expert_shared_count")

    def ffn_tensors(self, w: Weights, i: int) -> tuple[dict[str, Shape], dict[str, Shape]]:
        """Block i's FFN: a SwiGLU in the leading dense layers, else the experts, their
        optional selection bias and, where sized, the shared expert."""
        c = self.config
        if i < c.n_dense_lead:
            return super().ffn_tensors(w, i)
        e, f = c.n_embd, c.n_ff_shexp
        shared = {} if not f else {"ffn_gate_shexp": (f, e), "ffn_up_shexp": (f, e),
                                   "ffn_down_shexp": (e, f)}
        return ({**w.experts(c.n_expert, e, c.n_ff_exp), **shared},
                {"exp_probs_b.bias": (c.n_expert,)})

    def block(self, layer: Layer) -> Block:
        b = super().block(layer)
        if not hasattr(layer, "ffn_gate_inp"):  # a leading dense layer
            return b
        c = self.config
        shared = (GLU(Linear.of(layer, "ffn_gate_shexp"), Linear.of(layer, "ffn_up_shexp"),
                      Linear.of(layer, "ffn_down_shexp"), "silu") if c.n_ff_shexp else None)
        return replace(b, ffn=replace(b.ffn, select_bias=layer.exp_probs_b_bias, shared=shared,
                                      groups=c.groups, groups_used=c.groups_used))
