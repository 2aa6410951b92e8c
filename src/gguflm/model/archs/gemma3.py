"""Gemma 3 text models (``general.architecture`` = ``gemma3``), as llama.cpp's
src/models/gemma3.cpp runs them.

Differences from Llama: the embedding is scaled by sqrt(n_embd) (in float32, as ggml does:
25.2982 for 640, not Hugging Face's bf16-rounded 25.25); Q and K get a per-head RMSNorm
before RoPE; attention and FFN outputs are RMS-normed again before each residual add; the
FFN is GELU(tanh)-gated; RoPE is NEOX style (split halves). Layers alternate between
sliding-window attention with their own RoPE base and full attention with ``rope.freq_base``
(five local, then one global, by default). RMSNorm weights are used as stored: the GGUF
converter already folded Gemma's ``1 + w``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import ops
from ..config import Meta
from ..weights import Layer, Shape, Weights
from . import register
from .gemma2 import Gemma2, Gemma2Config

# Without a ``sliding_window_pattern`` key, every 6th layer (5, 11, ...) is global
# (llama.cpp: load_swa_pattern(ml, 6), dense_first = false).
DEFAULT_SWA_PERIOD = 6
# llama.cpp's hparams default when ``rope.freq_base_swa`` is absent.
DEFAULT_ROPE_BASE_SWA = 10000.0


@dataclass(frozen=True)
class Gemma3Config(Gemma2Config):
    """Gemma 2's fields with Gemma 3's defaults (GGUF key in each comment): no attention
    soft-cap (``attn_softcap`` 0); ``swa_layers`` from
    {arch}.attention.sliding_window_pattern (period 6); ``rope_base_swa`` from
    {arch}.rope.freq_base_swa (default 10000); ``final_softcap`` from
    {arch}.final_logit_softcapping (0: none)."""

    @classmethod
    def extra(cls, meta: Meta, common: dict[str, Any]) -> dict[str, Any]:
        n_layer = common["n_layer"]
        if common["sliding_window"] > 0:
            swa = meta.swa_layers(n_layer, DEFAULT_SWA_PERIOD)
        else:  # no window: every layer is global (llama.cpp's LLAMA_SWA_TYPE_NONE)
            swa = (False,) * n_layer
        # llama.cpp ties the 27B model's query_pre_attn_scalar (n_embd / n_head = 168) to
        # its layer count; every other size scales by the head size.
        if n_layer == 62:
            scale = 1.0 / math.sqrt(common["n_embd"] // common["n_head"])
        else:
            scale = 1.0 / math.sqrt(common["head_dim"])
        return dict(
            swa_layers=swa,
            rope_base_swa=meta.float("rope.freq_base_swa", DEFAULT_ROPE_BASE_SWA),
            attn_scale=scale,
            attn_softcap=0.0,
            final_softcap=meta.softcap("final_logit_softcapping", 0.0),
        )


@register("gemma3")
class Gemma3(Gemma2):
    """Gemma 3 (270M to 27B text models): tied output unless ``output.weight`` is given."""

    config_class = Gemma3Config
    config: Gemma3Config

    def output_tensor(self, w: Weights) -> Any:
        c = self.config
        return w.get_or("output.weight", (c.n_vocab, c.n_embd), self.token_embd)  # tied

    def extra_layer_tensors(self) -> dict[str, Shape]:
        d = self.config.head_dim
        return {"attn_q_norm": (d,), "attn_k_norm": (d,)}

    def attn_extras(self, layer: Layer) -> dict[str, Any]:
        return {"q_norm": layer.attn_q_norm, "k_norm": layer.attn_k_norm}

    def rope_tables(self, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        # local layers: own RoPE base, no frequency scaling (llama.cpp's *_train_swa values)
        c = self.config
        return (ops.rope_table(pos, c.rope_dim, c.rope_base, c.rope_freq_scale),
                ops.rope_table(pos, c.rope_dim, c.rope_base_swa))
