"""SmolLM3 (``general.architecture`` = ``smollm3``: SmolLM3-3B), as llama.cpp's
src/models/smollm3.cpp runs it.

Llama's graph: pre-norm blocks x += attn(rmsnorm(x)); x += ffn(rmsnorm(x)), grouped-query
attention, RoPE in NORM style, a SwiGLU FFN, Q/K/V biases where the file has them, the
output tied to the token embedding when ``output.weight`` is absent. What differs: every
4th layer (3, 7, 11, ...) has no RoPE ("NoPE": its queries and keys are not rotated).
llama.cpp hard-codes that period (``n_no_rope_layer_step`` = 4); no metadata key says it.
Attention scores are scaled by 1/sqrt(head size).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import ops
from ..base import Model
from ..batch import Batch
from ..config import Meta, ModelConfig
from ..layer import no_rope_table
from ..weights import Weights
from . import register

NO_ROPE_PERIOD = 4  # llama.cpp: layer il has no RoPE when (il + 1) % 4 == 0


@dataclass(frozen=True)
class SmolLM3Config(ModelConfig):
    """Adds which layers skip RoPE (no GGUF key: llama.cpp's fixed period)."""

    no_rope: tuple[bool, ...]  # layer il: (il + 1) % NO_ROPE_PERIOD == 0

    @classmethod
    def extra(cls, meta: Meta, common: dict[str, Any]) -> dict[str, Any]:
        return {"no_rope": tuple((il + 1) % NO_ROPE_PERIOD == 0
                                 for il in range(common["n_layer"]))}


@register("smollm3")
class SmolLM3(Model):
    """SmolLM3: Llama's graph with every 4th layer's RoPE left out."""

    config_class = SmolLM3Config
    config: SmolLM3Config
    rope_style = "norm"
    ignored_keys = ("attention.sliding_window",)  # llama.cpp's smollm3 never reads it

    def load_tensors(self, w: Weights) -> None:
        c = self.config
        c.require_one_head_size()  # llama.cpp asserts both for this graph
        c.require_full_rope()
        self.token_embd = w.get("token_embd.weight", (c.n_vocab, c.n_embd))
        self.output_norm = w.get("output_norm.weight", (c.n_embd,))
        self.output = w.get_or("output.weight", (c.n_vocab, c.n_embd), self.token_embd)  # tied
        # + attn_qkv or attn_q/k/v, biases optional (qkv=c: llama.cpp's create_tensor_qkv)
        self.layers = [w.layer(i, {
            "attn_norm": (c.n_embd,),
            "attn_output": (c.n_embd, c.n_embd_q),
            "ffn_norm": (c.n_embd,),
            "ffn_gate": (c.n_ff, c.n_embd),
            "ffn_up": (c.n_ff, c.n_embd),
            "ffn_down": (c.n_embd, c.n_ff),
        }, qkv=c) for i in range(c.n_layer)]
        # the NoPE layers read table 1, rotations by 0 (``no_rope_table``)
        self.blocks = [self.dense_block(layer, "silu", rope=int(c.no_rope[il]))
                       for il, layer in enumerate(self.layers)]

    def rope_tables(self, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The rotating layers' RoPE table and the NoPE layers' (ones) for ``pos``."""
        c = self.config
        return (ops.rope_table(pos, c.rope_dim, c.rope_base, c.rope_freq_scale),
                no_rope_table(len(pos), c.rope_dim))

    def _forward(self, batch: Batch) -> np.ndarray:
        x = self.run_layers(self.token_embd.rows(batch.ids), batch,
                            self.rope_tables(batch.pos))
        return ops.rmsnorm(x, self.output_norm, self.config.norm_eps)  # (rows, n_embd)
