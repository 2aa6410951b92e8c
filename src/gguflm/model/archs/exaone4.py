"""EXAONE 4.0 (``general.architecture`` = ``exaone4``: EXAONE-4.0-1.2B and -32B), as
llama.cpp's src/models/exaone4.cpp runs it.

OLMo 2's block (``olmo2.py``): no pre-norms, the attention's and the FFN's outputs
RMS-normed (``post_attention_norm``, ``post_ffw_norm``) before each residual add, a SwiGLU
FFN, NEOX RoPE; but Q and K are RMS-normed per head (``attn_q_norm``/``attn_k_norm`` of
one head's size), RoPE divides its frequencies by Llama 3's ``rope_freqs`` when the file
has them, and the output is tied to the token embedding when ``output.weight`` is absent.

llama.cpp gives sliding windows to the 64-layer model (the 32B) only, from the layer count:
then layers slide a window of ``attention.sliding_window`` (default 4096) as
``attention.sliding_window_pattern`` says (default: three sliding, then one full), only the
sliding layers rotate Q and K, and the full layers have no RoPE. Any other depth attends
causally over the whole context with RoPE in every layer. The last
``nextn_predict_layers`` blocks (multi-token prediction) are loaded and not run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ...gguf.errors import MetadataError
from .. import ops
from ..config import Meta
from ..layer import no_rope_table
from ..weights import Shape, Weights
from . import register
from .olmo2 import DEFAULT_SWA_PERIOD, Olmo2, Olmo2Config

SWA_DEPTH = 64          # llama.cpp: the layer count that has sliding windows (the 32B)
DEFAULT_WINDOW = 4096   # its window when attention.sliding_window is absent


@dataclass(frozen=True)
class Exaone4Config(Olmo2Config):
    """Adds the multi-token prediction blocks (GGUF key in the comment); ``n_layer`` is the
    trunk (block_count less them), ``swa_layers`` and ``sliding_window`` as above."""

    n_nextn: int  # {arch}.nextn_predict_layers (default 0)

    @classmethod
    def extra(cls, meta: Meta, common: dict[str, Any]) -> dict[str, Any]:
        n_all = common["n_layer"]
        n_nextn = meta.int("nextn_predict_layers", 0, minimum=0)
        if n_nextn >= n_all:
            raise MetadataError(f"{n_nextn} of {n_all} blocks leave no trunk",
                                key=meta.key("nextn_predict_layers"))
        n_layer = n_all - n_nextn
        if n_layer != SWA_DEPTH:
            return {"n_layer": n_layer, "n_nextn": n_nextn, "sliding_window": 0,
                    "swa_layers": (False,) * n_layer}
        return {"n_layer": n_layer, "n_nextn": n_nextn,
                "sliding_window": meta.int("attention.sliding_window", DEFAULT_WINDOW),
                "swa_layers": meta.swa_layers(n_all, DEFAULT_SWA_PERIOD)[:n_layer]}


@register("exaone4")
class Exaone4(Olmo2):
    """EXAONE 4.0: OLMo 2's blocks, per-head Q/K norms; at 64 layers, NoPE full layers.

    The 64-layer model's sliding layers rotate Q and K, its full layers do not."""

    config_class = Exaone4Config
    config: Exaone4Config

    def output_tensor(self, w: Weights) -> Any:
        c = self.config
        return w.get_or("output.weight", (c.n_vocab, c.n_embd), self.token_embd)  # tied

    def qk_norm_sizes(self) -> Shape:
        return self.config.head_dim, self.config.head_dim

    def load_more(self, w: Weights) -> None:
        c = self.config
        self.rope_freqs = w.get("rope_freqs.weight", (c.rope_dim // 2,), optional=True)
        for i in range(c.n_layer, c.n_layer + c.n_nextn):  # MTP blocks: loaded, not run
            w.layer(i, {}, self.nextn_tensors())

    def nextn_tensors(self) -> dict[str, Shape]:
        """A multi-token prediction block's tensors (all optional: llama.cpp skips them)."""
        c = self.config
        rows = {"q": c.n_embd_q, "k": c.n_embd_k, "v": c.n_embd_v}
        n_qkv = sum(rows.values())
        projections = {**{f"attn_{x}": (n, c.n_embd) for x, n in rows.items()},
                       **{f"attn_{x}.bias": (n,) for x, n in rows.items()},
                       "attn_qkv": (n_qkv, c.n_embd), "attn_qkv.bias": (n_qkv,)}
        return {**projections, "attn_output": (c.n_embd, c.n_embd_q),
                "post_attention_norm": (c.n_embd,),
                "attn_q_norm": (c.head_dim,), "attn_k_norm": (c.head_dim,),
                "ffn_gate": (c.n_ff, c.n_embd), "ffn_up": (c.n_ff, c.n_embd),
                "ffn_down": (c.n_embd, c.n_ff), "post_ffw_norm": (c.n_embd,),
                "nextn.eh_proj.weight": (c.n_embd, 2 * c.n_embd),
                "nextn.enorm.weight": (c.n_embd,), "nextn.hnorm.weight": (c.n_embd,),
                "nextn.shared_head_norm.weight": (c.n_embd,)}

    def rope_index(self, il: int) -> int:
        """Table 1 (no rotation) for the full layers of a model with sliding windows (at
        64 layers, whatever its pattern: llama.cpp's swa_type decides, not the layer)."""
        c = self.config
        return int(c.sliding_window > 0 and not c.swa_layers[il])

    def rope_tables(self, pos: np.ndarray) -> tuple[np.ndarray, ...]:
        """The rotating layers' RoPE table (divided by ``rope_freqs``), and, with sliding
        layers, the full layers' table of no rotation."""
        c = self.config
        rope = ops.rope_table(pos, c.rope_dim, c.rope_base, c.rope_freq_scale, self.rope_freqs)
        if not c.sliding_window:
            return (rope,)
        return rope, no_rope_table(len(pos), c.rope_dim)
