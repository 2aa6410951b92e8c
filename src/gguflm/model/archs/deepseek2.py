"""DeepSeek-V2/V3 and the models on their graph (``general.architecture`` = ``deepseek2``:
DeepSeek-V2/V2.5/V3/R1, Kimi-K2, GLM-4.7-Flash, GigaChat3, Kanana-2), as llama.cpp's
src/models/deepseek2.cpp runs them with multi-head latent attention.

Pre-norm blocks: x += mla(rmsnorm(x)); x += ffn(rmsnorm(x)). The attention is MLA
(``layer.LatentAttention``, ``mla.py``), absorbed as llama.cpp runs it: the cache holds
each position's compressed latent, kv_lora_rank + rope.dimension_count numbers, for every
head. Queries through a LoRA (``attn_q_a``, its RMS norm, ``attn_q_b``; the lite models,
without ``attention.q_lora_rank``: ``attn_q``), heads of ``attention.key_length_mla``
(nope dims, then the NORM-rotated ones); values of ``attention.value_length_mla`` per
head out of ``attn_v_b``. Scores times mscale^2 / sqrt(key_length_mla), mscale YaRN's
1 + 0.1 m ln(factor) with m the file's ``rope.scaling.yarn_log_multiplier`` / 0.1 (the
converter writes 0.1 m), while the rotation's own magnitude is 1: llama.cpp's
[TAG_DEEPSEEK2_YARN_LOG_MUL_FIX] (``yarn_magnitude``).

The first ``leading_dense_block_count`` layers have a SwiGLU FFN; the others a mixture
of ``expert_count`` SwiGLU experts (``expert_gating_func``: softmax, or sigmoid with the
``exp_probs_b`` selection bias for V3), chosen from the ``expert_group_used_count`` best
of ``expert_group_count`` groups where the file has groups, renormalised where
``expert_weights_norm``, times ``expert_weights_scale``, plus ``expert_shared_count``
ungated shared experts. The ``nextn_predict_layers`` multi-token-prediction blocks after
the trunk are loaded and not run (llama.cpp's main graph does not run them either).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...gguf.errors import MetadataError
from .. import ops
from ..base import Model
from ..batch import Batch
from ..config import Meta, ModelConfig
from ..layer import GLU, Block, Experts, LatentAttention, Linear, experts, glu
from ..weights import Layer, Shape, Weights
from . import register

# llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE values this graph runs, by name (layer.GATINGS)
GATING_FUNCS = {1: "softmax", 2: "sigmoid", 3: "softmax_weight"}


@dataclass(frozen=True)
class Deepseek2Config(ModelConfig):
    """Adds MLA's sizes, the experts' and the MTP blocks (GGUF key in each comment);
    ``n_layer`` is the trunk: block_count less the MTP blocks. The common ``key_length``
    and ``value_length`` are the absorbed attention's (kv_lora + n_rot, and kv_lora)."""

    n_nextn: int        # {arch}.nextn_predict_layers (default 0)
    q_lora: int         # {arch}.attention.q_lora_rank (0: one attn_q, the lite models)
    kv_lora: int        # {arch}.attention.kv_lora_rank
    head_k_mla: int     # {arch}.attention.key_length_mla: a query head's nope + rope dims
    head_v_mla: int     # {arch}.attention.value_length_mla: a head's value dims
    n_dense_lead: int   # {arch}.leading_dense_block_count (default 0)
    n_ff_exp: int       # {arch}.expert_feed_forward_length
    n_ff_shexp: int     # n_ff_exp x {arch}.expert_shared_count (0: no shared expert)
    gating: str         # {arch}.expert_gating_func (none: softmax, as llama.cpp decides)
    weights_norm: bool  # {arch}.expert_weights_norm (default false)
    weights_scale: float  # {arch}.expert_weights_scale (default 0: none)
    groups: int         # {arch}.expert_group_count (default 0: no groups)
    groups_used: int    # {arch}.expert_group_used_count
    yarn_log_mul: float  # {arch}.rope.scaling.yarn_log_multiplier / 0.1 (0: none)

    @staticmethod
    def yarn_magnitude(factor: float, log_mul: float) -> float:
        """llama.cpp's context for deepseek2: with a log multiplier, mscale and
        mscale_all_dims are both the multiplier (the file's m / 0.1 equals 1, or deepseek2
        takes mscale = mscale_all_dims), so the rotation's net factor is 1 and the
        magnitude goes into the scores' scale instead (``kq_scale``)."""
        return 1.0 if log_mul else ModelConfig.yarn_magnitude(factor, 0.0)

    @classmethod
    def extra(cls, meta: Meta, common: dict[str, Any]) -> dict[str, Any]:
        n_all = common["n_layer"]
        n_nextn = meta.int("nextn_predict_layers", 0, minimum=0)
        if n_nextn >= n_all:
            raise MetadataError(f"{n_nextn} of {n_all} blocks leave no trunk",
                                key=meta.key("nextn_predict_layers"))
        if meta.float("attention.temperature_scale", 0.0, positive=False):
            raise MetadataError("an attention temperature (Mistral Large 3) is not supported "
                                "for deepseek2 yet", key=meta.key("attention.temperature_scale"))
        v = dict(n_nextn=n_nextn, n_layer=n_all - n_nextn, **_attention_sizes(meta, common),
                 **_expert_rule(meta, common, n_all - n_nextn),
                 n_dense_lead=meta.int("leading_dense_block_count", 0, minimum=0),
                 yarn_log_mul=_log_multiplier(meta))
        lite = _is_lite(v["n_layer"], common["n_vocab"])
        v["q_lora"] = 0 if lite else meta.int("attention.q_lora_rank")
        return v


def _attention_sizes(meta: Meta, common: dict[str, Any]) -> dict[str, int]:
    """MLA's sizes; files from before llama.cpp split ``attn_kv_b`` (no key_length_mla)
    are refused: llama.cpp runs those decompressed, without the latent cache."""
    k_mla = meta.int("attention.key_length_mla", 0, minimum=0)
    v_mla = meta.int("attention.value_length_mla", 0, minimum=0)
    if not (k_mla and v_mla):
        raise MetadataError("missing: a deepseek2 file converted before llama.cpp split "
                            "attn_kv_b into attn_k_b and attn_v_b (multi-head latent "
                            "attention); convert it again with a current llama.cpp",
                            key=meta.key("attention.key_length_mla"))
    n_rot = common["rope_dim"]
    if k_mla <= n_rot:
        raise MetadataError(f"{k_mla} leaves no dims beside the {n_rot} rotated ones",
                            key=meta.key("attention.key_length_mla"))
    return {"kv_lora": meta.int("attention.kv_lora_rank"), "head_k_mla": k_mla,
            "head_v_mla": v_mla}


def _expert_rule(meta: Meta, common: dict[str, Any], n_layer: int) -> dict[str, Any]:
    """The experts' sizes, gating, groups and weights, as llama.cpp reads them."""
    n_expert = common["n_expert"]
    if not n_expert:
        raise MetadataError("must be at least 1 for deepseek2", key=meta.key("expert_count"))
    func = meta.int("expert_gating_func", 0, minimum=0)
    if func == 0:  # files without the key (V2, V2.5): llama.cpp's default for them
        func = 2 if n_layer in (47, 48) and common["n_vocab"] == 154880 else 1
    if func not in GATING_FUNCS:
        raise MetadataError(f"{func} is not one of {GATING_FUNCS} (llama.cpp's gating "
                            f"functions this architecture runs)",
                            key=meta.key("expert_gating_func"))
    groups = meta.int("expert_group_count", 0, minimum=0)
    used = meta.int("expert_group_used_count", 0, minimum=0)
    if groups > 1 and not (n_expert % groups == 0 and 0 < used < groups
                           and used * (n_expert // groups) >= common["n_expert_used"]):
        raise MetadataError(f"{groups} groups of the {n_expert} experts, {used} used, "
                            f"cannot give {common['n_expert_used']} experts",
                            key=meta.key("expert_group_used_count"))
    n_ff_exp = meta.int("expert_feed_forward_length")
    return dict(n_ff_exp=n_ff_exp,
                n_ff_shexp=n_ff_exp * meta.int("expert_shared_count", minimum=0),
                gating=GATING_FUNCS[func], groups=groups, groups_used=used,
                weights_norm=meta.bool("expert_weights_norm", False),
                weights_scale=meta.float("expert_weights_scale", 0.0, positive=False))


def _log_multiplier(meta: Meta) -> float:
    """llama.cpp's rope_yarn_log_mul for deepseek2: the file's value over 0.1 (the
    converter multiplies the model's by 0.1), in float32 as llama.cpp divides it."""
    m = meta.float("rope.scaling.yarn_log_multiplier", 0.0, positive=False)
    return float(np.float32(m) / np.float32(0.1))


def _is_lite(n_layer: int, n_vocab: int) -> bool:
    """llama.cpp's rule for the models without a query LoRA (DeepSeek-V2-Lite,
    GigaChat3-10B-A1.8B, Kanana-2-30B-A3B): by depth and vocabulary, not by the keys."""
    return n_layer in (26, 27) or (n_layer == 48 and n_vocab == 128256)


@register("deepseek2")
class Deepseek2(Model):
    """DeepSeek-V2/V3: multi-head latent attention, leading dense layers, then (grouped,
    biased) routed experts plus shared ones."""

    config_class = Deepseek2Config
    config: Deepseek2Config

    def load_tensors(self, w: Weights) -> None:
        c = self.config
        self.token_embd = w.get("token_embd.weight", (c.n_vocab, c.n_embd))
        self.output_norm = w.get("output_norm.weight", (c.n_embd,))
        self.output = w.get_or("output.weight", (c.n_vocab, c.n_embd), self.token_embd)  # tied
        self.layers = [w.layer(i, {**self.attention_tensors(), **self.ffn_tensors(w, i)},
                               {"exp_probs_b.bias": (c.n_expert,)})
                       for i in range(c.n_layer)]
        for i in range(c.n_layer, c.n_layer + c.n_nextn):  # MTP blocks: loaded, not run
            w.layer(i, {}, {**self.attention_tensors(), **self.ffn_tensors(w, i),
                            **self.nextn_tensors(), "exp_probs_b.bias": (c.n_expert,)})
        scale = self.kq_scale()
        self.blocks = [Block(layer.attn_norm, self.attention(layer, scale), layer.ffn_norm,
                             self.ffn(i, layer), c.norm_eps)
                       for i, layer in enumerate(self.layers)]

    def attention_tensors(self) -> dict[str, Shape]:
        """A block's MLA tensors: the query LoRA (or ``attn_q``), the latent's projection
        and norm, the per-head ``attn_k_b``/``attn_v_b``, the output."""
        c = self.config
        d, h, nope = c.n_embd, c.n_head, c.head_k_mla - c.rope_dim
        q = ({"attn_q_a": (c.q_lora, d), "attn_q_a_norm": (c.q_lora,),
              "attn_q_b": (h * c.head_k_mla, c.q_lora)} if c.q_lora
             else {"attn_q": (h * c.head_k_mla, d)})
        return {"attn_norm": (d,), **q, "attn_kv_a_mqa": (c.kv_lora + c.rope_dim, d),
                "attn_kv_a_norm": (c.kv_lora,), "attn_k_b": (h, c.kv_lora, nope),
                "attn_v_b": (h, c.head_v_mla, c.kv_lora),
                "attn_output": (d, h * c.head_v_mla), "ffn_norm": (d,)}

    def ffn_tensors(self, w: Weights, i: int) -> dict[str, Shape]:
        """Block i's FFN: dense for the leading blocks, else the experts (gate and up may
        be one fused tensor, as create_tensor_gate_up_exps) and the shared expert."""
        c = self.config
        d = c.n_embd
        if i < c.n_dense_lead:
            return {"ffn_gate": (c.n_ff, d), "ffn_up": (c.n_ff, d), "ffn_down": (d, c.n_ff)}
        shared = ({"ffn_gate_shexp": (c.n_ff_shexp, d), "ffn_up_shexp": (c.n_ff_shexp, d),
                   "ffn_down_shexp": (d, c.n_ff_shexp)} if c.n_ff_shexp else {})
        return {**w.experts(c.n_expert, d, c.n_ff_exp, fused_at=i), **shared}

    def nextn_tensors(self) -> dict[str, Shape]:
        c = self.config
        return {"nextn.eh_proj.weight": (c.n_embd, 2 * c.n_embd),
                "nextn.enorm.weight": (c.n_embd,), "nextn.hnorm.weight": (c.n_embd,),
                "nextn.embed_tokens.weight": (c.n_vocab, c.n_embd),
                "nextn.shared_head_head.weight": (c.n_vocab, c.n_embd),
                "nextn.shared_head_norm.weight": (c.n_embd,)}

    def kq_scale(self) -> float:
        """The scores' scale, as llama.cpp's deepseek2 graph computes it, in float32:
        mscale^2 / sqrt(key_length_mla), mscale = (the rotation's magnitude before YaRN's
        own factor on it, which llama.cpp hands ggml, times that factor) x (1 + 0.1 m
        ln(factor)), m the log multiplier (``yarn_log_mul``)."""
        c = self.config
        f32 = np.float32
        s = c.rope_freq_scale
        log_f = f32(math.log(f32(1) / f32(float(s))))
        yarn = f32(1) + f32(0.1) * log_f
        handed = f32(s.magnitude) * (f32(1) / yarn) if s.ext_factor != 0 else f32(s.magnitude)
        mscale = handed * yarn * (f32(1) + f32(0.1) * f32(c.yarn_log_mul) * log_f)
        return float(f32(mscale * mscale) / f32(math.sqrt(c.head_k_mla)))

    def attention(self, layer: Layer, scale: float) -> LatentAttention:
        c = self.config
        lora = bool(c.q_lora)
        return LatentAttention(
            Linear.of(layer, "attn_q_a") if lora else None,
            layer.attn_q_a_norm if lora else None,
            Linear.of(layer, "attn_q_b" if lora else "attn_q"),
            Linear.of(layer, "attn_kv_a_mqa"), layer.attn_kv_a_norm, layer.attn_k_b,
            layer.attn_v_b, Linear.of(layer, "attn_output"), c.n_head, c.rope_dim, scale,
            neox=self.rope_style == "neox")

    def ffn(self, i: int, layer: Layer) -> GLU | Experts:
        c = self.config
        if i < c.n_dense_lead:
            return glu(layer, "silu")
        shared = (GLU(Linear.of(layer, "ffn_gate_shexp"), Linear.of(layer, "ffn_up_shexp"),
                      Linear.of(layer, "ffn_down_shexp"), "silu") if c.n_ff_shexp else None)
        return experts(layer, c.n_expert_used, "silu", gating=c.gating,
                       norm_weights=c.weights_norm, scale=c.weights_scale, shared=shared,
                       select_bias=layer.exp_probs_b_bias, groups=c.groups,
                       groups_used=c.groups_used)

    def _forward(self, batch: Batch) -> np.ndarray:
        c = self.config
        # ggml's float32 angles: near-ties between expert groups hang on float16
        # roundings that a float64 table's last bits can turn the other way
        rot = ops.rope_table_f32(batch.pos, c.rope_dim, c.rope_base, c.rope_freq_scale)
        x = self.run_layers(self.token_embd.rows(batch.ids), batch, (rot,))
        return ops.rmsnorm(x, self.output_norm, c.norm_eps)  # (rows, n_embd); head: output
