"""Ministral 3, Devstral 2 and the new Mistral Small (``general.architecture`` =
``mistral3``), as llama.cpp's src/models/mistral3.cpp runs them.

Llama's graph (NORM RoPE over the whole head, grouped-query attention, SwiGLU or Mixtral
experts, optional ``rope_freqs``, output tied when ``output.weight`` is absent), under
YaRN with ``rope.scaling.yarn_log_multiplier`` (the shared tables: ``config.rope_scaling``),
plus an attention temperature: with ``attention.temperature_scale`` t, each position p's
rotated queries are multiplied by 1 + t ln(floor(p / n) + 1), n the YaRN original context
(llama.cpp's build_inp_attn_scale). Past n positions that lengthens the queries, sharpening
attention over long contexts; before it the factor is exactly 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ...gguf.errors import MetadataError
from .. import ops
from ..batch import Batch
from ..config import Meta, ModelConfig
from ..weights import Weights
from . import register
from .llama import Llama


@dataclass(frozen=True)
class Mistral3Config(ModelConfig):
    """Adds the attention temperature (GGUF key in the comment)."""

    temperature_scale: float  # {arch}.attention.temperature_scale (default 0: none)

    @classmethod
    def extra(cls, meta: Meta, common: dict[str, Any]) -> dict[str, Any]:
        scale = meta.float("attention.temperature_scale", 0.0, positive=False)
        if scale < 0:
            raise MetadataError(f"must be 0 (none) or positive, got {scale:g}",
                                key=meta.key("attention.temperature_scale"))
        return {"temperature_scale": scale}

    @property
    def temperature_length(self) -> int:
        """Positions per step of the temperature: the YaRN original context, as llama.cpp
        takes it (``rope.scaling.original_context_length``, else the training context)."""
        return self.rope_freq_scale.n_ctx_orig


@register("mistral3")
class Mistral3(Llama):
    """Llama's graph under YaRN, with a per-position temperature on the queries."""

    config_class = Mistral3Config
    config: Mistral3Config

    def load_tensors(self, w: Weights) -> None:
        super().load_tensors(w)
        if self.config.temperature_scale:  # the queries read table 1 (``_forward``)
            self.blocks = [self.dense_block(layer, "silu", q_rope=1) for layer in self.layers]

    def query_table(self, rope: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """The queries' RoPE table: ``rope`` times each position's temperature, as
        llama.cpp computes it (the quotient in float32, the log in float64, the factor
        rounded to float32); ``rope`` itself where every factor is 1, so that such a batch
        runs on the compiled layers (``executor.run``)."""
        c = self.config
        steps = np.floor(np.asarray(pos).astype(np.float32) / np.float32(c.temperature_length))
        factor = (np.log(steps.astype(np.float64) + 1.0) * np.float64(np.float32(
            c.temperature_scale)) + 1.0).astype(np.float32)
        if np.all(factor == 1):
            return rope
        return (rope * factor[:, None]).astype(np.complex64)

    def _forward(self, batch: Batch) -> np.ndarray:
        c = self.config
        rope = ops.rope_table(batch.pos, c.rope_dim, c.rope_base, c.rope_freq_scale,
                              self.rope_freqs)
        ropes = (rope, self.query_table(rope, batch.pos)) if c.temperature_scale else (rope,)
        x = self.run_layers(self.token_embd.rows(batch.ids), batch, ropes)
        return ops.rmsnorm(x, self.output_norm, c.norm_eps)  # (rows, n_embd); head: output
