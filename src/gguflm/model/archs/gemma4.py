"""Gemma 4 (``general.architecture`` = ``gemma4``: E2B, E4B, 26B-A4B, 31B), as llama.cpp's
src/models/gemma4.cpp runs it.

Gemma 3's layer (embedding times sqrt(n_embd), norm weights used as stored, post norms on
attention and FFN, NEOX RoPE, GELU-gated FFN, final soft-cap, tied output), and:
- every GELU as llama.cpp's CPU backend computes it, through ggml's float16 table
  (``ops.gelu_f16``: llama.cpp's top-1 at 2 and 3 more of the tiny models' 576 steps);
- sliding layers (``attention.sliding_window_pattern``) and full ones differ in head size
  (``attention.key_length_swa`` / ``key_length``), RoPE dims and base; the full layers
  divide each RoPE frequency by ``rope_freqs`` (proportional RoPE: factors of 1e30 leave
  pairs unrotated);
- attention scale 1 (the Q/K norms set it), values RMS-normed without a weight, KV heads
  and FFN widths per layer (``head_count_kv`` and ``feed_forward_length`` may be arrays);
  a layer without ``attn_v`` uses K's product (before K's norm) as V;
- the last ``attention.shared_kv_layers`` layers store no keys or values: they read the
  last earlier layer's of their kind (llama.cpp's layer reuse);
- per-layer embeddings (``embedding_length_per_layer_input`` d > 0): per token and layer a
  d-vector, (rms_norm(``per_layer_model_proj`` x / sqrt(n_embd)) + ``per_layer_token_embd``
  row x sqrt(d)) / sqrt(2), which each layer gates in after its FFN
  (``layer.PerLayerInput``); then x times ``layer_output_scale``;
- MoE layers (those with ``ffn_gate_inp``): the dense GELU MLP (post-normed) plus GELU
  experts on their own pre-norm (post-normed), summed (``layer.DenseAndExperts``); the
  router reads rms_norm(x) / sqrt(n_embd) x ``ffn_gate_inp.scale``, softmax, top-k,
  renormalised; each expert's output times its ``ffn_down_exps.scale``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ...gguf.errors import MetadataError
from .. import ops
from ..config import Meta, ModelConfig
from ..layer import (
    Attention,
    Block,
    DenseAndExperts,
    Linear,
    PerLayerInput,
    experts,
    glu,
)
from ..weights import Layer, Shape, Weights
from . import register
from .gemma3 import Gemma3

PATTERN = "attention.sliding_window_pattern"


@dataclass(frozen=True)
class Gemma4Config(ModelConfig):
    """Adds the layer kinds' sizes, KV sharing and per-layer inputs (GGUF key in each
    comment); ``head_dim``/``rope_dim``/``rope_base`` are the full layers'."""

    per_layer_keys: ClassVar[tuple[str, ...]] = (
        "feed_forward_length", "attention.head_count_kv", "expert_feed_forward_length")

    swa_layers: tuple[bool, ...]  # {arch}.attention.sliding_window_pattern (per-layer flags)
    n_ff_l: tuple[int, ...]       # {arch}.feed_forward_length, per layer
    n_head_kv_l: tuple[int, ...]  # {arch}.attention.head_count_kv, per layer
    head_dim_swa: int             # {arch}.attention.key_length_swa (= value_length_swa)
    rope_dim_swa: int             # {arch}.rope.dimension_count_swa (default rope's)
    rope_base_swa: float          # {arch}.rope.freq_base_swa (default 10000)
    n_kv_shared: int              # {arch}.attention.shared_kv_layers (default 0)
    n_embd_per_layer: int         # {arch}.embedding_length_per_layer_input (0: none)
    n_ff_exp: int                 # {arch}.expert_feed_forward_length (0 without experts)
    final_softcap: float          # {arch}.final_logit_softcapping (0: none)

    @classmethod
    def extra(cls, meta: Meta, common: dict[str, Any]) -> dict[str, Any]:
        n_layer, n_head = common["n_layer"], common["n_head"]
        if not meta.has(PATTERN):
            raise MetadataError("missing, required by gemma4", key=meta.key(PATTERN))
        head_dim_swa = meta.int("attention.key_length_swa", common["head_dim"])
        for k, v, name in ((common["head_dim"], common["head_dim_v"], "value_length"),
                           (head_dim_swa, meta.int("attention.value_length_swa",
                                                   head_dim_swa), "value_length_swa")):
            if k != v:
                raise MetadataError(f"must equal the key length {k} for gemma4, got {v}",
                                    key=meta.key(f"attention.{name}"))
        v = dict(
            sliding_window=meta.int("attention.sliding_window"),
            swa_layers=meta.swa_layers(n_layer, 0),
            n_ff_l=meta.layers("feed_forward_length", n_layer),
            n_head_kv_l=meta.layers("attention.head_count_kv", n_layer, n_head),
            head_dim_swa=head_dim_swa,
            rope_dim_swa=meta.int("rope.dimension_count_swa", common["rope_dim"]),
            rope_base_swa=meta.float("rope.freq_base_swa", 10000.0),
            n_kv_shared=meta.int("attention.shared_kv_layers", 0, minimum=0),
            n_embd_per_layer=meta.int("embedding_length_per_layer_input", 0, minimum=0),
            n_ff_exp=meta.int("expert_feed_forward_length", 0, minimum=0),
            final_softcap=meta.softcap("final_logit_softcapping", 0.0))
        if any(n_head % h for h in v["n_head_kv_l"]):
            raise MetadataError(f"each must divide attention.head_count ({n_head})",
                                key=meta.key("attention.head_count_kv"))
        if v["rope_dim_swa"] % 2 or v["rope_dim_swa"] > head_dim_swa:
            raise MetadataError(f"must be even and at most {head_dim_swa}",
                                key=meta.key("rope.dimension_count_swa"))
        _check_sharing(meta, n_layer, v["n_kv_shared"], v["swa_layers"])
        return v


def _check_sharing(meta: Meta, n_layer: int, n_shared: int, swa: tuple[bool, ...]) -> None:
    """The shared layers' sources exist and are of their kind (sliding or full)."""
    first = n_layer - n_shared
    if n_shared and (first < 2 or any(swa[kv_source(il, first, swa)] != swa[il]
                                      for il in range(first, n_layer))):
        raise MetadataError(f"{n_shared} of {n_layer} layers: the layers before them must "
                            f"end with a sliding and a full layer whose keys and values "
                            f"they read", key=meta.key("attention.shared_kv_layers"))


def kv_source(il: int, first_shared: int, swa: tuple[bool, ...]) -> int | None:
    """The layer whose keys and values layer ``il`` reads (None: its own), as llama.cpp's
    layer reuse: the last layer before the shared ones (sliding layers: the one before)."""
    if il < first_shared:
        return None
    return first_shared - (2 if swa[il] else 1)


@register("gemma4")
class Gemma4(Gemma3):
    """Gemma 4, dense (E2B/E4B/31B) and MoE (26B-A4B): Gemma 3's head and output."""

    config_class = Gemma4Config
    config: Gemma4Config

    def load_tensors(self, w: Weights) -> None:
        c = self.config
        self.token_embd = w.get("token_embd.weight", (c.n_vocab, c.n_embd))
        self.output_norm = w.get("output_norm.weight", (c.n_embd,))
        self.output = self.output_tensor(w)
        self.rope_freqs = (None if all(c.swa_layers)
                           else w.get("rope_freqs.weight", (c.head_dim // 2,)))
        d = c.n_embd_per_layer
        if d:
            self.per_layer_token_embd = w.get("per_layer_token_embd.weight",
                                              (c.n_vocab, c.n_layer * d))
            self.per_layer_model_proj = w.get("per_layer_model_proj.weight",
                                              (c.n_layer * d, c.n_embd))
            self.per_layer_proj_norm = w.get("per_layer_proj_norm.weight", (d,))
        self.layers = [w.layer(i, *self.layer_tensors(w, i)) for i in range(c.n_layer)]
        self.blocks = [self.block(i, layer) for i, layer in enumerate(self.layers)]

    def head_dim_of(self, il: int) -> int:
        c = self.config
        return c.head_dim_swa if c.swa_layers[il] else c.head_dim

    def kv_source(self, il: int) -> int | None:
        c = self.config
        return kv_source(il, c.n_layer - c.n_kv_shared, c.swa_layers)

    def layer_tensors(self, w: Weights, i: int) -> tuple[dict[str, Shape], dict[str, Shape]]:
        """Layer i's tensors: (required, optional); a shared KV layer's K/V are optional
        (llama.cpp loads them when present and does not use them)."""
        c, e, n_ff = self.config, self.config.n_embd, self.config.n_ff_l[i]
        hd = self.head_dim_of(i)
        n_q, n_kv = c.n_head * hd, c.n_head_kv_l[i] * hd
        required = {"attn_norm": (e,), "attn_q": (n_q, e), "attn_q_norm": (hd,),
                    "attn_output": (e, n_q), "post_attention_norm": (e,), "ffn_norm": (e,),
                    "ffn_gate": (n_ff, e), "ffn_up": (n_ff, e), "ffn_down": (e, n_ff),
                    "post_ffw_norm": (e,)}
        optional = {"attn_v": (n_kv, e), "layer_output_scale": (1,)}
        kv = {"attn_k": (n_kv, e), "attn_k_norm": (hd,)}
        (required if self.kv_source(i) is None else optional).update(kv)
        if d := c.n_embd_per_layer:
            required.update({"inp_gate": (d, e), "proj": (e, d), "post_norm": (e,)})
        if w.has(f"blk.{i}.ffn_gate_inp.weight"):
            if not c.n_expert or not c.n_ff_exp:
                raise MetadataError(f"layer {i} has experts: expert_count and "
                                    f"expert_feed_forward_length must be given",
                                    key=f"{c.arch}.expert_count")
            required.update({**w.experts(c.n_expert, e, c.n_ff_exp),
                             "ffn_gate_inp.scale": (e,), "pre_ffw_norm_2": (e,),
                             "post_ffw_norm_1": (e,), "post_ffw_norm_2": (e,)})
            optional["ffn_down_exps.scale"] = (c.n_expert,)
        return required, optional

    def block(self, il: int, layer: Layer) -> Block:
        c = self.config
        local, hd, src = bool(c.swa_layers[il]), self.head_dim_of(il), self.kv_source(il)
        k = v = None
        if src is None:
            k = Linear.of(layer, "attn_k")
            v = k if layer.attn_v is None else Linear.of(layer, "attn_v")
        attn = Attention(Linear.of(layer, "attn_q"), k, v, Linear.of(layer, "attn_output"),
                         c.n_head, c.n_head_kv_l[il if src is None else src], hd, hd,
                         scale=1.0, neox=True, rope=int(local),
                         window=c.sliding_window if local else 0, q_norm=layer.attn_q_norm,
                         k_norm=layer.attn_k_norm if src is None else None,
                         v_norm=np.ones(hd, np.float32) if src is None else None,
                         kv_layer=src)
        per_layer = (PerLayerInput(Linear.of(layer, "inp_gate"), Linear.of(layer, "proj"),
                                   layer.post_norm, il) if c.n_embd_per_layer else None)
        scale = layer.layer_output_scale
        return Block(layer.attn_norm, attn, layer.ffn_norm, self.ffn(layer), c.norm_eps,
                     layer.post_attention_norm, layer.post_ffw_norm, per_layer,
                     1.0 if scale is None else float(scale[0]))

    def ffn(self, layer: Layer) -> Any:
        """The dense GELU MLP, or beside it the experts (a layer with a router)."""
        dense = glu(layer, "gelu_f16")
        if not hasattr(layer, "ffn_gate_inp"):
            return dense
        c = self.config
        inv_sqrt = float(np.float32(1) / np.sqrt(np.float32(c.n_embd)))  # ggml's, in float32
        moe = experts(layer, c.n_expert_used, "gelu_f16", router_in_norm=layer.ffn_gate_inp_scale,
                      router_in_scale=inv_sqrt, down_scale=layer.ffn_down_exps_scale)
        return DenseAndExperts(dense, layer.post_ffw_norm_1, moe, layer.pre_ffw_norm_2,
                               layer.post_ffw_norm_2)

    # -- forward ---------------------------------------------------------------------------------
    def rope_tables(self, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The full layers' RoPE (its frequencies divided by ``rope_freqs``) and the
        sliding layers'."""
        c = self.config
        factors = None if self.rope_freqs is None else self.rope_freqs[:c.rope_dim // 2]
        return (ops.rope_table(pos, c.rope_dim, c.rope_base, c.rope_freq_scale, factors),
                ops.rope_table(pos, c.rope_dim_swa, c.rope_base_swa))

    def per_layer_inputs(self, ids: np.ndarray, x: np.ndarray) -> np.ndarray | None:
        """Each token's per-layer inputs (T, n_layer, d) from its ids and its scaled
        embedding x, in ggml's order of float32 steps; None without them."""
        c, n = self.config, len(ids)
        d = c.n_embd_per_layer
        if not d:
            return None
        one = np.float32(1)
        tok = self.per_layer_token_embd.rows(ids) * np.sqrt(np.float32(d))
        proj = self.per_layer_model_proj.matmul(x) * (one / np.sqrt(np.float32(c.n_embd)))
        proj = ops.rmsnorm(proj.reshape(n, c.n_layer, d), self.per_layer_proj_norm, c.norm_eps)
        return (proj + tok.reshape(n, c.n_layer, d)) * (one / np.sqrt(np.float32(2)))
