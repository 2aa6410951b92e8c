"""OLMo 2 and OLMo 3 (``general.architecture`` = ``olmo2``), as llama.cpp's
src/models/olmo2.cpp runs them.

No pre-norms: the attention and the FFN read the residual stream itself, and their outputs
are RMS-normed (``post_attention_norm``, ``post_ffw_norm``) before each residual add:
x += rmsnorm(attn(x)); x += rmsnorm(ffn(x)). Q and K are RMS-normed over the whole
projection (``attn_q_norm`` of n_head x head size, ``attn_k_norm`` of n_head_kv x head
size: one norm across the heads, not one per head) before RoPE in NEOX style. A SwiGLU
FFN, grouped-query attention scaled by 1/sqrt(head size), an untied output.

OLMo 3 files set ``attention.sliding_window``: then layers slide a window over the keys
as ``attention.sliding_window_pattern`` says (default: three sliding, then one full), and
the sliding layers' RoPE takes no scaling, linear or YaRN (llama.cpp rotates them with
freq_scale 1, ext_factor 0, attn_factor 1 and the model's one ``rope.freq_base``;
``rope.freq_base_swa`` is read and unused).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import ops
from ..base import Model
from ..batch import Batch
from ..config import Meta, ModelConfig
from ..layer import Attention, Block, Linear, glu, qkv
from ..weights import Layer, Shape, Weights
from . import register

DEFAULT_SWA_PERIOD = 4  # llama.cpp: load_swa_pattern(ml, 4): layers 3, 7, ... see all


@dataclass(frozen=True)
class Olmo2Config(ModelConfig):
    """Adds the sliding layers (GGUF key in the comment)."""

    # {arch}.attention.sliding_window_pattern (default period 4) when
    # {arch}.attention.sliding_window > 0; else no layer slides
    swa_layers: tuple[bool, ...]

    @classmethod
    def extra(cls, meta: Meta, common: dict[str, Any]) -> dict[str, Any]:
        n_layer = common["n_layer"]
        if common["sliding_window"] > 0:
            return {"swa_layers": meta.swa_layers(n_layer, DEFAULT_SWA_PERIOD)}
        return {"swa_layers": (False,) * n_layer}


@register("olmo2")
class Olmo2(Model):
    """OLMo 2/3: post-norms only, Q/K norms across the heads, optional sliding layers."""

    config_class = Olmo2Config
    config: Olmo2Config
    rope_style = "neox"

    # -- tensors ---------------------------------------------------------------------------------
    def load_tensors(self, w: Weights) -> None:
        c = self.config
        c.require_one_head_size()  # llama.cpp asserts both for this graph
        c.require_full_rope()
        self.token_embd = w.get("token_embd.weight", (c.n_vocab, c.n_embd))
        self.output_norm = w.get("output_norm.weight", (c.n_embd,))
        self.output = self.output_tensor(w)
        q_norm, k_norm = self.qk_norm_sizes()
        # + attn_qkv or attn_q/k/v, biases optional (qkv=c: llama.cpp's create_tensor_qkv)
        self.layers = [w.layer(i, {
            "attn_output": (c.n_embd, c.n_embd_q),
            "attn_q_norm": (q_norm,),
            "attn_k_norm": (k_norm,),
            "post_attention_norm": (c.n_embd,),
            "ffn_gate": (c.n_ff, c.n_embd),
            "ffn_up": (c.n_ff, c.n_embd),
            "ffn_down": (c.n_embd, c.n_ff),
            "post_ffw_norm": (c.n_embd,),
        }, qkv=c) for i in range(c.n_layer)]
        self.load_more(w)
        self.blocks = [self.block(il, layer) for il, layer in enumerate(self.layers)]

    def output_tensor(self, w: Weights) -> Any:
        """The output projection: required (a subclass's hook: tied when absent)."""
        c = self.config
        return w.get("output.weight", (c.n_vocab, c.n_embd))

    def qk_norm_sizes(self) -> Shape:
        """The Q and K norms' lengths: the whole projections (a subclass's hook)."""
        return self.config.n_embd_q, self.config.n_embd_k

    def load_more(self, w: Weights) -> None:
        """Tensors beyond OLMo 2's (a subclass's hook)."""

    def block(self, il: int, layer: Layer) -> Block:
        """Layer il: no pre-norms, post-norms after the attention and the FFN."""
        c = self.config
        q, k, v = qkv(layer, c.n_embd_q, c.n_embd_k, c.n_embd_v)
        window = c.sliding_window if c.swa_layers[il] else 0
        attn = Attention(q, k, v, Linear.of(layer, "attn_output"), c.n_head, c.n_head_kv,
                         c.head_dim, c.head_dim_v, scale=1.0 / float(np.sqrt(c.head_dim)),
                         neox=self.rope_style == "neox", rope=self.rope_index(il),
                         window=window, q_norm=layer.attn_q_norm, k_norm=layer.attn_k_norm)
        return Block(None, attn, None, glu(layer, "silu"), c.norm_eps,
                     attn_post_norm=layer.post_attention_norm,
                     ffn_post_norm=layer.post_ffw_norm)

    # -- forward ---------------------------------------------------------------------------------
    def rope_index(self, il: int) -> int:
        """Which of ``rope_tables`` layer il rotates by: the sliding layers' own."""
        return int(self.config.swa_layers[il])

    def rope_tables(self, pos: np.ndarray) -> tuple[np.ndarray, ...]:
        """The full layers' RoPE table and the sliding layers' (unscaled)."""
        c = self.config
        full = ops.rope_table(pos, c.rope_dim, c.rope_base, c.rope_freq_scale)
        if not any(c.swa_layers):
            return (full,)
        return full, ops.rope_table(pos, c.rope_dim, c.rope_base)

    def _forward(self, batch: Batch) -> np.ndarray:
        x = self.run_layers(self.token_embd.rows(batch.ids), batch,
                            self.rope_tables(batch.pos))
        return ops.rmsnorm(x, self.output_norm, self.config.norm_eps)  # (rows, n_embd)
