"""gpt-oss (``general.architecture`` = ``gpt-oss``: gpt-oss-20b and -120b), as llama.cpp's
src/models/openai-moe.cpp runs it.

Pre-norm layers alternating a sliding window (even layers, ``attention.sliding_window``)
and full attention, both with NEOX RoPE under YaRN scaling (``rope.scaling.*``, read and
applied by the shared tables: ``config.rope_scaling``), Q/K/V/O biases and a learned
attention sink per head (``attn_sinks``: a logit in each head's softmax that weights no
value). The FFN is a mixture of experts with biases everywhere:
the router's biased logits pick the ``expert_used_count`` best, their weights a softmax
over those logits alone (not renormalised further), each expert a clamped SwiGLU
(``reference.swiglu_oai``). ``post_attention_norm`` is the FFN's pre-norm; the output is
untied.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ...gguf.errors import MetadataError
from .. import ops
from ..base import Model
from ..batch import Batch
from ..config import Meta, ModelConfig
from ..layer import Attention, Block, Linear, experts, qkv
from ..weights import Layer, Weights
from . import register


@dataclass(frozen=True)
class GptOssConfig(ModelConfig):
    """Adds the experts' size and the window pattern (GGUF key in each comment)."""

    needs_n_ff: ClassVar[bool] = False

    n_ff_exp: int            # {arch}.expert_feed_forward_length
    swa_layers: tuple[bool, ...]  # {arch}.attention.sliding_window_pattern (period 2)
    rope_base_swa: float     # {arch}.rope.freq_base_swa (default: rope.freq_base)

    @classmethod
    def extra(cls, meta: Meta, common: dict[str, Any]) -> dict[str, Any]:
        return dict(
            n_ff_exp=meta.int("expert_feed_forward_length"),
            swa_layers=meta.swa_layers(common["n_layer"], 2),
            rope_base_swa=meta.float("rope.freq_base_swa", common["rope_base"]),
        )


@register("gpt-oss")
class GptOss(Model):
    """gpt-oss: sliding/full attention with sinks, YaRN RoPE, biased clamped-SwiGLU experts."""

    config_class = GptOssConfig
    config: GptOssConfig
    rope_style = "neox"

    def load_tensors(self, w: Weights) -> None:
        c = self.config
        if not c.n_expert:
            raise MetadataError("must be at least 1 for gpt-oss", key=f"{c.arch}.expert_count")
        n_ff, e = c.n_ff_exp, c.n_expert
        self.token_embd = w.get("token_embd.weight", (c.n_vocab, c.n_embd))
        self.output_norm = w.get("output_norm.weight", (c.n_embd,))
        self.output = w.get("output.weight", (c.n_vocab, c.n_embd))
        self.layers = [w.layer(i, {
            "attn_norm": (c.n_embd,),
            "attn_output": (c.n_embd, c.n_head * c.head_dim_v),
            "attn_output.bias": (c.n_embd,),
            "attn_sinks": (c.n_head,),
            "post_attention_norm": (c.n_embd,),
            **w.experts(e, c.n_embd, n_ff),
            "ffn_gate_inp.bias": (e,),
            "ffn_gate_exps.bias": (e, n_ff),
            "ffn_up_exps.bias": (e, n_ff),
            "ffn_down_exps.bias": (e, c.n_embd),
        }, qkv=c) for i in range(c.n_layer)]
        self.blocks = [self.block(il, layer) for il, layer in enumerate(self.layers)]

    def block(self, il: int, layer: Layer) -> Block:
        c = self.config
        local = bool(c.swa_layers[il])
        q, k, v = qkv(layer, c.n_embd_q, c.n_embd_k, c.n_embd_v)
        attn = Attention(q, k, v, Linear.of(layer, "attn_output"), c.n_head, c.n_head_kv,
                         c.head_dim, c.head_dim_v, scale=1.0 / math.sqrt(c.rope_dim),
                         neox=self.rope_style == "neox", rope=int(local),
                         window=c.sliding_window if local else 0, sinks=layer.attn_sinks)
        ffn = experts(layer, c.n_expert_used, "swiglu_oai", gating="softmax_weight",
                      norm_weights=False)
        return Block(layer.attn_norm, attn, layer.post_attention_norm, ffn, c.norm_eps)

    def rope_tables(self, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The full and the sliding layers' RoPE tables, both scaled as the file says
        (YaRN in gpt-oss's files)."""
        c = self.config
        return tuple(ops.rope_table(pos, c.rope_dim, base, c.rope_freq_scale)
                     for base in (c.rope_base, c.rope_base_swa))

    def _forward(self, batch: Batch) -> np.ndarray:
        c = self.config
        x = self.run_layers(self.token_embd.rows(batch.ids), batch, self.rope_tables(batch.pos))
        return ops.rmsnorm(x, self.output_norm, c.norm_eps)  # (rows, n_embd)
