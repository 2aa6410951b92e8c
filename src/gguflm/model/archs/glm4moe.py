"""GLM-4.5 mixture-of-experts models (``general.architecture`` = ``glm4moe``: GLM-4.5,
GLM-4.5-Air, GLM-4.6, GLM-4.7), as llama.cpp's src/models/glm4-moe.cpp runs them.

Pre-norm blocks: x += attn(rmsnorm(x)); x += ffn(rmsnorm(x)), the FFN's pre-norm stored
as ``post_attention_norm``. Attention: grouped-query, Q/K/V biases (added before RoPE),
per-head Q/K RMS norms where the file has them, NEOX RoPE on the first
``rope.dimension_count`` dims of each head (partial rotary: 64 of 128). The first
``leading_dense_block_count`` layers have a SwiGLU FFN; the others a mixture of
``expert_count`` SwiGLU experts of ``expert_feed_forward_length``: sigmoid scores of the
router ``ffn_gate_inp``, the ``expert_used_count`` best by score plus ``exp_probs_b``
(the bias decides the choice, not the weights), their unbiased scores renormalised
(``expert_weights_norm``) and times ``expert_weights_scale`` (the experts grouped as
DeepSeek-V3's where a file has ``expert_group_count`` > 1, as llama.cpp does for any
architecture); plus ``expert_shared_count``
ungated shared experts (one SwiGLU of that many times the experts' width) that every
token runs. The ``nextn_predict_layers`` multi-token-prediction blocks after the trunk
are loaded and not run (llama.cpp's main graph does not run them either). The output is
tied to the token embedding when ``output.weight`` is absent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ...gguf.errors import MetadataError
from .. import ops
from ..base import Model
from ..batch import Batch
from ..config import Meta, ModelConfig
from ..layer import GLU, Attention, Block, Experts, Linear, experts, glu, qkv
from ..weights import Layer, Shape, Weights
from . import register

# llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE values (``expert_gating_func``); none (0)
# means sigmoid for this architecture, as GLM-4.5's router is
GATING_FUNCS = {0: "sigmoid", 1: "softmax", 2: "sigmoid", 3: "softmax_weight"}


@dataclass(frozen=True)
class Glm4MoeConfig(ModelConfig):
    """Adds the experts' sizes and routing and the MTP blocks (GGUF key in each comment);
    ``n_layer`` is the trunk: block_count less the MTP blocks."""

    needs_n_ff: ClassVar[bool] = False

    n_nextn: int         # {arch}.nextn_predict_layers (default 0)
    n_dense_lead: int    # {arch}.leading_dense_block_count (default 0)
    n_ff_exp: int        # {arch}.expert_feed_forward_length (0: n_ff / n_expert_used)
    n_ff_shexp: int      # n_ff_exp x {arch}.expert_shared_count (0: no shared expert)
    gating: str          # {arch}.expert_gating_func (default sigmoid)
    weights_norm: bool   # {arch}.expert_weights_norm (default false)
    weights_scale: float  # {arch}.expert_weights_scale (default 0: none)
    groups: int          # {arch}.expert_group_count (default 0; 0 or 1: no groups)
    groups_used: int     # {arch}.expert_group_used_count

    @classmethod
    def extra(cls, meta: Meta, common: dict[str, Any]) -> dict[str, Any]:
        n_all = common["n_layer"]
        n_nextn = meta.int("nextn_predict_layers", 0, minimum=0)
        if n_nextn >= n_all:
            raise MetadataError(f"{n_nextn} of {n_all} blocks leave no trunk",
                                key=meta.key("nextn_predict_layers"))
        if not common["n_expert"]:
            raise MetadataError("must be at least 1 for glm4moe", key=meta.key("expert_count"))
        _refuse_mrope(meta)
        n_dense_lead = meta.int("leading_dense_block_count", 0, minimum=0)
        if n_dense_lead and not common["n_ff"]:
            raise MetadataError("missing, and the leading dense blocks need it",
                                key=meta.key("feed_forward_length"))
        n_ff_exp = (meta.int("expert_feed_forward_length", minimum=0)
                    or common["n_ff"] // common["n_expert_used"])
        if not n_ff_exp:
            raise MetadataError("0, and feed_forward_length does not size the experts",
                                key=meta.key("expert_feed_forward_length"))
        groups, groups_used = _groups(meta, common)
        return dict(n_nextn=n_nextn, n_layer=n_all - n_nextn, n_dense_lead=n_dense_lead,
                    n_ff_exp=n_ff_exp, groups=groups, groups_used=groups_used,
                    n_ff_shexp=n_ff_exp * meta.int("expert_shared_count", minimum=0),
                    gating=_gating(meta),
                    weights_norm=meta.bool("expert_weights_norm", False),
                    weights_scale=meta.float("expert_weights_scale", 0.0, positive=False))


def _gating(meta: Meta) -> str:
    """The router's scoring function by name (``layer.GATINGS``)."""
    value = meta.int("expert_gating_func", 0, minimum=0)
    if value not in GATING_FUNCS:
        raise MetadataError(f"gating function {value} is not supported (supported: "
                            f"{', '.join(f'{k} ({v})' for k, v in GATING_FUNCS.items())})",
                            key=meta.key("expert_gating_func"))
    return GATING_FUNCS[value]


def _groups(meta: Meta, common: dict[str, Any]) -> tuple[int, int]:
    """(expert groups, groups used): llama.cpp's build_moe_ffn groups the experts of any
    architecture whose file has more than one group (GLM-4.5's have one: none)."""
    groups = meta.int("expert_group_count", 0, minimum=0)
    used = meta.int("expert_group_used_count", 0, minimum=0)
    n_expert = common["n_expert"]
    if groups > 1 and not (n_expert % groups == 0 and 0 < used < groups
                           and used * (n_expert // groups) >= common["n_expert_used"]):
        raise MetadataError(f"{groups} groups of the {n_expert} experts, {used} used, cannot "
                            f"give {common['n_expert_used']} experts",
                            key=meta.key("expert_group_used_count"))
    return groups, used


def _refuse_mrope(meta: Meta) -> None:
    """A MetadataError for multi-section RoPE (llama.cpp's use_mrope: a vision model's
    conversion), which this file does not make tables for."""
    sections = np.ravel(meta.metadata.get(meta.key("rope.dimension_sections"), []))
    if sections.dtype.kind in "iu" and len(sections) >= 2 and min(sections[:2]) > 0:
        raise MetadataError("multi-section RoPE (M-RoPE, a vision model's conversion) is "
                            "not supported for glm4moe",
                            key=meta.key("rope.dimension_sections"))


@register("glm4moe")
class Glm4Moe(Model):
    """GLM-4.5/4.6/4.7: partial NEOX RoPE, Q/K/V biases and norms, leading dense layers,
    then sigmoid-routed experts with a selection bias plus an ungated shared expert."""

    config_class = Glm4MoeConfig
    config: Glm4MoeConfig
    rope_style = "neox"

    def load_tensors(self, w: Weights) -> None:
        c = self.config
        c.require_one_head_size()  # llama.cpp asserts it for this graph
        self.token_embd = w.get("token_embd.weight", (c.n_vocab, c.n_embd))
        self.output_norm = w.get("output_norm.weight", (c.n_embd,))
        self.output = w.get_or("output.weight", (c.n_vocab, c.n_embd), self.token_embd)  # tied
        self.layers = [w.layer(i, {"attn_norm": (c.n_embd,),
                                   "attn_output": (c.n_embd, c.n_embd_q),
                                   "post_attention_norm": (c.n_embd,),
                                   **self.ffn_tensors(i)}, self.qk_norms(), qkv=c)
                       for i in range(c.n_layer)]
        for i in range(c.n_layer, c.n_layer + c.n_nextn):  # MTP blocks: loaded, not run
            self.nextn_block(w, i)
        self.blocks = [Block(layer.attn_norm, self.attention(layer),
                             layer.post_attention_norm, self.ffn(i, layer), c.norm_eps)
                       for i, layer in enumerate(self.layers)]

    def qk_norms(self) -> dict[str, Shape]:
        """The per-head Q/K norms, optional (GLM-4.5 355B's files lack them)."""
        d = self.config.head_dim
        return {"attn_q_norm": (d,), "attn_k_norm": (d,)}

    def ffn_tensors(self, i: int) -> dict[str, Shape]:
        """Block i's FFN: dense for the leading blocks, else the experts, their selection
        bias and the shared expert."""
        c = self.config
        if i < c.n_dense_lead:
            return {"ffn_gate": (c.n_ff, c.n_embd), "ffn_up": (c.n_ff, c.n_embd),
                    "ffn_down": (c.n_embd, c.n_ff)}
        e, d, n = c.n_expert, c.n_embd, c.n_ff_exp
        shared = ({"ffn_gate_shexp": (c.n_ff_shexp, d), "ffn_up_shexp": (c.n_ff_shexp, d),
                   "ffn_down_shexp": (d, c.n_ff_shexp)} if c.n_ff_shexp else {})
        return {"ffn_gate_inp": (e, d), "exp_probs_b.bias": (e,),
                "ffn_gate_exps": (e, n, d), "ffn_up_exps": (e, n, d),
                "ffn_down_exps": (e, d, n), **shared}

    def nextn_block(self, w: Weights, i: int) -> Layer:
        """MTP block i's tensors, every one optional (llama.cpp skips them unless it runs
        the MTP graph; a file may carry the trunk alone), shapes checked where present."""
        c = self.config
        required, optional = w.qkv_specs(i, c)
        nextn = {"eh_proj": (c.n_embd, 2 * c.n_embd), "enorm": (c.n_embd,),
                 "hnorm": (c.n_embd,), "embed_tokens": (c.n_vocab, c.n_embd),
                 "shared_head_head": (c.n_vocab, c.n_embd), "shared_head_norm": (c.n_embd,)}
        return w.layer(i, {}, {
            "attn_norm": (c.n_embd,), **required, **optional, **self.qk_norms(),
            "attn_output": (c.n_embd, c.n_embd_q), "post_attention_norm": (c.n_embd,),
            **self.ffn_tensors(i), **{f"nextn.{k}.weight": s for k, s in nextn.items()}})

    def attention(self, layer: Layer) -> Attention:
        c = self.config
        q, k, v = qkv(layer, c.n_embd_q, c.n_embd_k, c.n_embd_v)
        return Attention(q, k, v, Linear.of(layer, "attn_output"), c.n_head, c.n_head_kv,
                         c.head_dim, c.head_dim_v, scale=1.0 / float(np.sqrt(c.head_dim)),
                         neox=self.rope_style == "neox", q_norm=layer.attn_q_norm,
                         k_norm=layer.attn_k_norm)

    def ffn(self, i: int, layer: Layer) -> GLU | Experts:
        """Block i's FFN spec: SwiGLU, or the routed experts plus the shared one."""
        c = self.config
        if i < c.n_dense_lead:
            return glu(layer, "silu")
        shared = (GLU(Linear.of(layer, "ffn_gate_shexp"), Linear.of(layer, "ffn_up_shexp"),
                      Linear.of(layer, "ffn_down_shexp"), "silu") if c.n_ff_shexp else None)
        return experts(layer, c.n_expert_used, "silu", gating=c.gating,
                       norm_weights=c.weights_norm, scale=c.weights_scale,
                       select_bias=layer.exp_probs_b_bias, groups=c.groups,
                       groups_used=c.groups_used, shared=shared)

    def _forward(self, batch: Batch) -> np.ndarray:
        c = self.config
        rope = ops.rope_table(batch.pos, c.rope_dim, c.rope_base, c.rope_freq_scale)
        x = self.run_layers(self.token_embd.rows(batch.ids), batch, (rope,))
        return ops.rmsnorm(x, self.output_norm, c.norm_eps)  # (rows, n_embd)
