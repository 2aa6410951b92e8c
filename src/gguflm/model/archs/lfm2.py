"""LFM2 and LFM2.5 (``general.architecture`` = ``lfm2``: Liquid's LFM2-350M to -2.6B,
LFM2.5-1.2B), as llama.cpp's src/models/lfm2.cpp runs them.

A hybrid: the layers whose ``attention.head_count_kv`` entry is 0 are gated short
convolutions (``layer.ShortConv``, a recurrent mixer whose state per sequence is the last
``shortconv.l_cache`` - 1 inputs of its convolution), the others grouped-query attention
with per-head Q/K RMS norms and NEOX RoPE (over a sliding window on every attention layer
when ``attention.sliding_window`` is set, as llama.cpp's loader decides). Every layer:
x += mixer(rmsnorm(x)); x += SwiGLU(rmsnorm(x)). The final norm is stored as
``token_embd_norm`` (llama.cpp's LLM_TENSOR_OUTPUT_NORM_LFM2); the output is tied to the
token embedding unless the file has ``output.weight``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np

from ...gguf.errors import MetadataError
from .. import ops
from ..base import Model
from ..batch import Batch
from ..config import Meta, ModelConfig, per_layer_kv_heads
from ..kv_cache import KVArena, RecurrentShape
from ..layer import Attention, Block, Linear, ShortConv, glu, qkv
from ..weights import Layer, Shape, Weights
from . import register


@dataclass(frozen=True)
class Lfm2Config(ModelConfig):
    """Adds the layer kinds and the convolution's taps (GGUF key in each comment);
    ``n_head_kv`` is the attention layers' (the largest entry)."""

    per_layer_keys: ClassVar[tuple[str, ...]] = ("attention.head_count_kv",)

    n_head_kv_l: tuple[int, ...]  # {arch}.attention.head_count_kv per layer (0: a short conv)
    l_cache: int                  # {arch}.shortconv.l_cache: the convolution's taps

    @classmethod
    def extra(cls, meta: Meta, common: dict[str, Any]) -> dict[str, Any]:
        l_cache = meta.int("shortconv.l_cache")
        if l_cache < 2:
            raise MetadataError(f"must be at least 2 (a state of l_cache - 1 inputs), got "
                                f"{l_cache}", key=meta.key("shortconv.l_cache"))
        return {"n_head_kv_l": per_layer_kv_heads(meta, common["n_layer"], common["n_head"],
                                           "a short convolution"),
                "l_cache": l_cache}

    @property
    def conv_layers(self) -> tuple[bool, ...]:
        """Which layers are short convolutions (llama.cpp's is_recr: no KV heads)."""
        return tuple(h == 0 for h in self.n_head_kv_l)



@register("lfm2")
class Lfm2(Model):
    """LFM2: gated short convolutions beside grouped-query attention, SwiGLU FFNs."""

    config_class = Lfm2Config
    config: Lfm2Config
    rope_style = "neox"

    def load_tensors(self, w: Weights) -> None:
        c = self.config
        c.require_one_head_size()
        self.token_embd = w.get("token_embd.weight", (c.n_vocab, c.n_embd))
        self.output_norm = w.get("token_embd_norm.weight", (c.n_embd,))
        self.output = w.get_or("output.weight", (c.n_vocab, c.n_embd), self.token_embd)
        self.layers = [self.layer_tensors(w, i) for i in range(c.n_layer)]
        self.blocks = []
        for i, layer in enumerate(self.layers):
            index = sum(c.conv_layers[:i])  # the layer's place among the convolutions
            mixer = (self.short_conv(layer, index) if c.conv_layers[i]
                     else self.attention(layer, c.n_head_kv_l[i]))
            self.blocks.append(Block(layer.attn_norm, mixer, layer.ffn_norm, self.ffn(layer),
                                     c.norm_eps))

    def layer_tensors(self, w: Weights, i: int) -> Layer:
        """Block i's tensors: its mixer's (a short convolution's, or attention's with Q/K/V
        fused or not, as llama.cpp's create_tensor_qkv) and its FFN's."""
        c, e = self.config, self.config.n_embd
        required = {"attn_norm": (e,), "ffn_norm": (e,), **self.ffn_tensors(w, i)}
        if c.conv_layers[i]:
            return w.layer(i, {**required, "shortconv.conv.weight": (e, c.l_cache),
                               "shortconv.in_proj.weight": (3 * e, e),
                               "shortconv.out_proj.weight": (e, e)})
        return w.layer(i, {**required, "attn_q_norm": (c.head_dim,),
                           "attn_k_norm": (c.head_dim,), "attn_output": (e, c.n_embd_q)},
                       qkv=replace(c, n_head_kv=c.n_head_kv_l[i]))

    def ffn_tensors(self, w: Weights, i: int) -> dict[str, Shape]:  # noqa: ARG002
        """Layer i's FFN tensors (a subclass's hook: experts)."""
        c = self.config
        return {"ffn_gate": (c.n_ff, c.n_embd), "ffn_up": (c.n_ff, c.n_embd),
                "ffn_down": (c.n_embd, c.n_ff)}

    def ffn(self, layer: Layer) -> Any:
        """A layer's FFN spec (a subclass's hook)."""
        return glu(layer, "silu")

    def attention(self, layer: Layer, n_head_kv: int) -> Attention:
        c = self.config
        n_kv = n_head_kv * c.head_dim
        q, k, v = qkv(layer, c.n_embd_q, n_kv, n_kv)
        return Attention(q, k, v, Linear.of(layer, "attn_output"), c.n_head, n_head_kv,
                         c.head_dim, c.head_dim_v, scale=1.0 / float(np.sqrt(c.head_dim)),
                         neox=self.rope_style == "neox", window=c.sliding_window,
                         q_norm=layer.attn_q_norm, k_norm=layer.attn_k_norm)

    def short_conv(self, layer: Layer, index: int) -> ShortConv:
        taps = layer.shortconv_conv.rows(np.arange(layer.shortconv_conv.shape[0]))
        return ShortConv(Linear.of(layer, "shortconv_in_proj"), taps,
                         Linear.of(layer, "shortconv_out_proj"), index)

    def kv_arena(self, n_ctx: int, n_slots: int) -> KVArena:
        """Keys and values for the attention layers, and per slot each convolution's last
        l_cache - 1 inputs (``RecurrentShape`` without a matrix state)."""
        c = self.config
        state = RecurrentShape(sum(c.conv_layers), c.l_cache - 1, c.n_embd, 0, 0)
        return KVArena(c.n_layer, n_slots, n_ctx, c.n_head_kv, c.head_dim, c.head_dim_v,
                       kv_type=self.kv_type, recurrent=state if state.n_layer else None,
                       layers=self.kv_shapes())

    def _forward(self, batch: Batch) -> np.ndarray:
        c = self.config
        rope = ops.rope_table(batch.pos, c.rope_dim, c.rope_base, c.rope_freq_scale)
        x = self.run_layers(self.token_embd.rows(batch.ids), batch, (rope,))
        return ops.rmsnorm(x, self.output_norm, c.norm_eps)  # (rows, n_embd)
