"""IBM Granite 4.0-H hybrid models (``general.architecture`` = ``granitehybrid``: Granite
4.0-H-Micro, -Tiny, -Small), as llama.cpp's src/models/granite-hybrid.cpp runs them.

A hybrid: the layers whose ``attention.head_count_kv`` entry is 0 are Mamba2 state-space
mixers (``layer.Mamba2``: a recurrent layer whose state per sequence is its convolution's
last ``ssm.conv_kernel`` - 1 inputs and its scan's matrices), the others grouped-query
attention, with NORM RoPE unless ``rope.scaling.finetuned`` is false (Granite's switch;
the 4.0-H files have no RoPE). Every layer: x += mixer(rmsnorm(x)); x += FFN(rmsnorm(x)),
the FFN a SwiGLU or, with ``expert_count``, softmax-routed SwiGLU experts (the best
``expert_used_count``, renormalised) plus, with ``expert_shared_feed_forward_length``, a
shared SwiGLU expert added ungated. Granite's scales (``granite.py``): embeddings times
``embedding_scale``, each branch times ``residual_scale`` before its residual add,
attention scores times ``attention.scale``, logits divided by ``logit_scale`` (each
optional here, as llama.cpp reads them for this architecture). The output is tied to the
token embedding unless the file has ``output.weight``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np

from ...gguf.errors import MetadataError
from ..base import Model
from ..batch import Batch
from ..config import Meta, ModelConfig, per_layer_kv_heads
from ..kv_cache import KVArena, RecurrentShape
from ..layer import GLU, Attention, Block, Linear, Mamba2, experts, glu, qkv, split
from ..weights import Layer, Shape, Weights
from . import register
from .granite import scaled_forward


@dataclass(frozen=True)
class GraniteHybridConfig(ModelConfig):
    """Adds the layer kinds, the Mamba2 sizes, the shared expert and Granite's scales (GGUF
    key in each comment; a scale of 0 where llama.cpp's is unset: none). ``n_head_kv`` is
    the attention layers' (the largest entry); ``n_ff`` the experts' size when there are
    experts, else the dense FFN's."""

    per_layer_keys: ClassVar[tuple[str, ...]] = ("attention.head_count_kv",)

    n_head_kv_l: tuple[int, ...]  # {arch}.attention.head_count_kv per layer (0: Mamba2)
    d_conv: int        # {arch}.ssm.conv_kernel
    d_inner: int       # {arch}.ssm.inner_size
    d_state: int       # {arch}.ssm.state_size
    n_ssm_head: int    # {arch}.ssm.time_step_rank
    n_group: int       # {arch}.ssm.group_count
    n_ff_shexp: int    # {arch}.expert_shared_feed_forward_length (default 0: none)
    embedding_scale: float  # {arch}.embedding_scale
    residual_scale: float   # {arch}.residual_scale
    attention_scale: float  # {arch}.attention.scale (0: 1/sqrt(head size))
    logit_scale: float      # {arch}.logit_scale: the logits divided by it
    rope: bool              # {arch}.rope.scaling.finetuned (default true): RoPE on

    @classmethod
    def extra(cls, meta: Meta, common: dict[str, Any]) -> dict[str, Any]:
        def scale(name: str) -> float:  # llama.cpp's unset is 0; else a positive one
            return meta.float(name) if meta.float(name, 0.0, positive=False) else 0.0

        v = dict(n_head_kv_l=per_layer_kv_heads(meta, common["n_layer"], common["n_head"],
                                           "a Mamba2 layer"),
                 d_conv=meta.int("ssm.conv_kernel"), d_inner=meta.int("ssm.inner_size"),
                 d_state=meta.int("ssm.state_size"), n_ssm_head=meta.int("ssm.time_step_rank"),
                 n_group=meta.int("ssm.group_count"),
                 n_ff_shexp=meta.int("expert_shared_feed_forward_length", 0, minimum=0),
                 embedding_scale=scale("embedding_scale"),
                 residual_scale=scale("residual_scale"),
                 attention_scale=scale("attention.scale"), logit_scale=scale("logit_scale"),
                 rope=meta.bool("rope.scaling.finetuned", True))
        _check_ssm(meta, v, common["n_embd"])
        return v

    @property
    def mamba_layers(self) -> tuple[bool, ...]:
        """Which layers are Mamba2 (llama.cpp's is_recr: no KV heads)."""
        return tuple(h == 0 for h in self.n_head_kv_l)

    @property
    def conv_dim(self) -> int:
        """The convolution's channels: x, B and C."""
        return self.d_inner + 2 * self.n_group * self.d_state


def _check_ssm(meta: Meta, v: dict[str, Any], n_embd: int) -> None:
    """The Mamba2 sizes llama.cpp's loader and graph require: d_inner = 2 n_embd (its only
    expansion), heads dividing d_inner, groups dividing the heads."""
    heads, groups, inner = v["n_ssm_head"], v["n_group"], v["d_inner"]
    if inner != 2 * n_embd:
        raise MetadataError(f"must be 2 x embedding_length ({2 * n_embd}), the one expansion "
                            f"llama.cpp runs, got {inner}", key=meta.key("ssm.inner_size"))
    if inner % heads or heads % groups:
        raise MetadataError(f"time_step_rank {heads} must divide inner_size {inner}, and "
                            f"group_count {groups} divide time_step_rank",
                            key=meta.key("ssm.group_count" if inner % heads == 0
                                         else "ssm.time_step_rank"))
    if v["d_conv"] < 2:
        raise MetadataError(f"must be at least 2 (a state of conv_kernel - 1 inputs), got "
                            f"{v['d_conv']}", key=meta.key("ssm.conv_kernel"))



@register("granitehybrid")
class GraniteHybrid(Model):
    """Granite 4.0-H: Mamba2 layers beside attention, experts or a SwiGLU, Granite's scales."""

    config_class = GraniteHybridConfig
    config: GraniteHybridConfig

    def load_tensors(self, w: Weights) -> None:
        c = self.config
        c.require_one_head_size()
        self.token_embd = w.get("token_embd.weight", (c.n_vocab, c.n_embd))
        self.output_norm = w.get("output_norm.weight", (c.n_embd,))
        self.output = w.get_or("output.weight", (c.n_vocab, c.n_embd), self.token_embd)
        self.rope_freqs = w.get("rope_freqs.weight", (c.rope_dim // 2,), optional=True)
        self.layers = [self.layer_tensors(w, i) for i in range(c.n_layer)]
        self.blocks = []
        for i, layer in enumerate(self.layers):
            index = sum(c.mamba_layers[:i])  # the layer's place among the Mamba2 layers
            mixer = (self.mamba2(layer, index) if c.mamba_layers[i]
                     else self.attention(layer, c.n_head_kv_l[i]))
            self.blocks.append(Block(layer.attn_norm, mixer, layer.ffn_norm, self.ffn(layer),
                                     c.norm_eps, residual_scale=c.residual_scale or 1.0))

    def layer_tensors(self, w: Weights, i: int) -> Layer:
        """Block i's tensors: its mixer's (Mamba2's, or attention's with Q/K/V fused or not
        and an optional output bias) and its FFN's."""
        c, e = self.config, self.config.n_embd
        required = {"attn_norm": (e,), "ffn_norm": (e,), **self.ffn_tensors()}
        ffn_biases = {} if c.n_expert else {"ffn_gate.bias": (c.n_ff,), "ffn_up.bias": (c.n_ff,),
                                            "ffn_down.bias": (e,)}
        if c.mamba_layers[i]:
            n_in = 2 * c.d_inner + 2 * c.n_group * c.d_state + c.n_ssm_head
            h = c.n_ssm_head
            layer = w.layer(i, {**required, "ssm_in": (n_in, e),
                                "ssm_conv1d": (c.conv_dim, c.d_conv), "ssm_dt.bias": (h,),
                                "ssm_norm": (c.n_group, c.d_inner // c.n_group),
                                "ssm_out": (e, c.d_inner)},
                            {"ssm_conv1d.bias": (c.conv_dim,), **ffn_biases})
            for name in ("ssm_a", "ssm_d"):  # no ".weight" in these names
                setattr(layer, name, w.get(f"blk.{i}.{name}", (h, 1)))
            return layer
        return w.layer(i, {**required, "attn_output": (e, c.n_embd_q)},
                       {"attn_output.bias": (e,), **ffn_biases},
                       qkv=replace(c, n_head_kv=c.n_head_kv_l[i]))

    def ffn_tensors(self) -> dict[str, Shape]:
        """A layer's required FFN tensors: experts (plus the shared expert), or a SwiGLU
        (whose optional biases ``layer_tensors`` adds)."""
        c = self.config
        if not c.n_expert:
            return {"ffn_gate": (c.n_ff, c.n_embd), "ffn_up": (c.n_ff, c.n_embd),
                    "ffn_down": (c.n_embd, c.n_ff)}
        shared = {} if not c.n_ff_shexp else {
            "ffn_gate_shexp": (c.n_ff_shexp, c.n_embd), "ffn_up_shexp": (c.n_ff_shexp, c.n_embd),
            "ffn_down_shexp": (c.n_embd, c.n_ff_shexp)}
        return {"ffn_gate_inp": (c.n_expert, c.n_embd),
                "ffn_gate_exps": (c.n_expert, c.n_ff, c.n_embd),
                "ffn_up_exps": (c.n_expert, c.n_ff, c.n_embd),
                "ffn_down_exps": (c.n_expert, c.n_embd, c.n_ff), **shared}

    def ffn(self, layer: Layer) -> Any:
        if not self.config.n_expert:
            return glu(layer, "silu")
        shared = (GLU(Linear.of(layer, "ffn_gate_shexp"), Linear.of(layer, "ffn_up_shexp"),
                      Linear.of(layer, "ffn_down_shexp"), "silu")
                  if self.config.n_ff_shexp else None)
        return experts(layer, self.config.n_expert_used, "silu", shared=shared)

    def attention(self, layer: Layer, n_head_kv: int) -> Attention:
        c = self.config
        n_kv = n_head_kv * c.head_dim
        q, k, v = qkv(layer, c.n_embd_q, n_kv, n_kv)
        return Attention(q, k, v, Linear.of(layer, "attn_output"), c.n_head, n_head_kv,
                         c.head_dim, c.head_dim_v,
                         scale=c.attention_scale or 1.0 / math.sqrt(c.head_dim),
                         neox=self.rope_style == "neox")

    def mamba2(self, layer: Layer, index: int) -> Mamba2:
        c = self.config

        def vector(m: Any) -> np.ndarray:  # a small 2-D F32/F16 tensor, all its values
            return m.rows(np.arange(m.shape[0])).reshape(-1).astype(np.float32)

        z, xbc, dt = split(Linear.of(layer, "ssm_in"), (c.d_inner, c.conv_dim, c.n_ssm_head))
        conv = layer.ssm_conv1d.rows(np.arange(c.conv_dim))  # (conv_dim, d_conv)
        return Mamba2(z, xbc, dt, conv, layer.ssm_conv1d_bias, layer.ssm_dt_bias,
                      vector(layer.ssm_a), vector(layer.ssm_d), vector(layer.ssm_norm),
                      Linear.of(layer, "ssm_out"), c.n_ssm_head, c.d_inner // c.n_ssm_head,
                      c.d_state, c.n_group, index)

    def kv_arena(self, n_ctx: int, n_slots: int) -> KVArena:
        """Keys and values for the attention layers, and per slot each Mamba2 layer's last
        d_conv - 1 convolution inputs and its scan state. The scan's (n_head, head_dim,
        d_state) state is declared as n_head x head_dim x d_state ``RecurrentShape`` heads of
        1 x 1 (that class's matrices are square; these need not be): the same bytes, which
        ``mamba2.forward`` reshapes."""
        c = self.config
        n_state = c.d_inner * c.d_state  # n_head x head_dim x d_state
        shape = RecurrentShape(sum(c.mamba_layers), c.d_conv - 1, c.conv_dim, n_state, 1)
        return KVArena(c.n_layer, n_slots, n_ctx, c.n_head_kv, c.head_dim, c.head_dim_v,
                       kv_type=self.kv_type, recurrent=shape if shape.n_layer else None,
                       layers=self.kv_shapes())

    def _forward(self, batch: Batch) -> np.ndarray:
        return scaled_forward(self, batch)

    def head(self, x: np.ndarray) -> np.ndarray:
        """The output projection, then the logits times 1 / ``logit_scale`` when set."""
        logits = super().head(x)
        if not self.config.logit_scale:
            return logits
        return logits * (np.float32(1.0) / np.float32(self.config.logit_scale))
