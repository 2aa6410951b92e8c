"""IBM Granite 3.x mixture-of-experts models (``general.architecture`` = ``granitemoe``:
granite-3.0/3.1-1b-a400m, -3b-a800m, and GraniteMoeShared files), as llama.cpp's
src/models/granite.cpp runs them (llama_model_granite_moe shares Granite's graph).

Granite's layers and four scales (``granite.py``) with, where the file has ``expert_count``,
an expert FFN in every layer: softmax-routed SwiGLU experts of ``feed_forward_length``,
the ``expert_used_count`` best, their weights renormalised (``expert_weights_scale`` is not
read: llama.cpp's granitemoe never applies one), plus, with
``expert_shared_feed_forward_length``, a shared SwiGLU expert of that width added ungated.
Unlike dense Granite, RoPE is always on: llama.cpp's granitemoe loader never reads
``rope.scaling.finetuned``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ..config import Meta
from ..layer import GLU, Linear
from ..weights import Weights
from . import register
from .granite import Granite, GraniteConfig


@dataclass(frozen=True)
class GraniteMoeConfig(GraniteConfig):
    """Adds the shared expert's width (GGUF key in the comment); ``rope`` is always on."""

    n_ff_shexp: int  # {arch}.expert_shared_feed_forward_length (default 0: none)

    @classmethod
    def extra(cls, meta: Meta, common: dict[str, Any]) -> dict[str, Any]:
        return {**super().extra(meta, common), "rope": True,
                "n_ff_shexp": meta.int("expert_shared_feed_forward_length", 0, minimum=0)}


@register("granitemoe")
class GraniteMoe(Granite):
    """Granite 3.x MoE: Granite's scales, softmax-routed experts, an optional shared expert."""

    config_class = GraniteMoeConfig
    config: GraniteMoeConfig
    ignored_keys = ("rope.scaling.finetuned", "expert_weights_scale")

    def load_tensors(self, w: Weights) -> None:
        super().load_tensors(w)  # experts where expert_count says so (Llama's loader)
        c = self.config
        if not (c.n_expert and c.n_ff_shexp):
            return  # llama.cpp loads the shared expert only beside routed ones
        e, f = c.n_embd, c.n_ff_shexp
        for i, layer in enumerate(self.layers):
            for name, shape in (("ffn_gate_shexp", (f, e)), ("ffn_up_shexp", (f, e)),
                                ("ffn_down_shexp", (e, f))):
                setattr(layer, name, w.get(f"blk.{i}.{name}.weight", shape))
        self.blocks = [replace(b, ffn=replace(b.ffn, shared=GLU(
            Linear.of(layer, "ffn_gate_shexp"), Linear.of(layer, "ffn_up_shexp"),
            Linear.of(layer, "ffn_down_shexp"), "silu")))
            for b, layer in zip(self.blocks, self.layers)]
