"""Qwen3.5 dense models (``general.architecture`` = ``qwen35``: Qwen3.5-0.8B to -27B), as
llama.cpp's src/models/qwen35.cpp runs them.

A hybrid: most layers are a gated delta net (``layer.DeltaNet``, a linear-attention
recurrence with a fixed-size state per sequence: ``attention.recurrent_layers``, or every
layer but each ``full_attention_interval``-th), the others gated full attention: Q and an
output gate from one projection (``attn_q``, per head head_dim query rows then head_dim
gate rows), per-head Q/K RMS norms, RoPE on the first ``rope.dimension_count`` dims, the
result times sigmoid(gate) before ``attn_output``. Every layer: x += mixer(rmsnorm(x));
x += SwiGLU(rmsnorm(x)) (``post_attention_norm`` is the FFN's pre-norm). The RoPE is
interleaved multi-section (M-RoPE, ``rope.dimension_sections``); for text llama.cpp gives
the first three sections the token's position and the fourth position 0, so pairs of the
fourth section do not rotate and the rest is NEOX RoPE at the position (``rope_tables``).
The ``nextn_predict_layers`` multi-token-prediction blocks after the trunk are loaded and
not run (llama.cpp's main graph does not run them either).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ...gguf.errors import MetadataError
from .. import ops
from ..base import Model
from ..batch import Batch
from ..config import Meta, ModelConfig
from ..kv_cache import KVArena, RecurrentShape
from ..layer import Attention, Block, DeltaNet, Linear, glu, qkv
from ..weights import Layer, Weights
from . import register


@dataclass(frozen=True)
class Qwen35Config(ModelConfig):
    """Adds the delta net's sizes, the layer kinds and M-RoPE (GGUF key in each comment);
    ``n_layer`` is the trunk: block_count less the MTP blocks."""

    d_conv: int       # {arch}.ssm.conv_kernel
    d_inner: int      # {arch}.ssm.inner_size (n_v_head * d_state)
    d_state: int      # {arch}.ssm.state_size: each delta-net head's size
    n_k_head: int     # {arch}.ssm.group_count
    n_v_head: int     # {arch}.ssm.time_step_rank
    n_nextn: int      # {arch}.nextn_predict_layers (default 0)
    recurrent: tuple[bool, ...]  # {arch}.attention.recurrent_layers, else full_attention_interval
    rope_sections: tuple[int, ...]  # {arch}.rope.dimension_sections (4)

    @classmethod
    def extra(cls, meta: Meta, common: dict[str, Any]) -> dict[str, Any]:
        n_all = common["n_layer"]
        n_nextn = meta.int("nextn_predict_layers", 0, minimum=0)
        if n_nextn >= n_all:
            raise MetadataError(f"{n_nextn} of {n_all} blocks leave no trunk",
                                key=meta.key("nextn_predict_layers"))
        v = dict(d_conv=meta.int("ssm.conv_kernel"), d_inner=meta.int("ssm.inner_size"),
                 d_state=meta.int("ssm.state_size"), n_k_head=meta.int("ssm.group_count"),
                 n_v_head=meta.int("ssm.time_step_rank"), n_nextn=n_nextn,
                 n_layer=n_all - n_nextn, recurrent=_recurrent(meta, n_all, n_nextn),
                 rope_sections=_sections(meta))
        if v["n_v_head"] % v["n_k_head"] or v["d_inner"] != v["n_v_head"] * v["d_state"]:
            raise MetadataError(f"time_step_rank {v['n_v_head']} must be a multiple of "
                                f"group_count {v['n_k_head']}, and inner_size "
                                f"{v['d_inner']} time_step_rank x state_size",
                                key=meta.key("ssm.inner_size"))
        return v


def _recurrent(meta: Meta, n_all: int, n_nextn: int) -> tuple[bool, ...]:
    """Which trunk layers are recurrent, as llama.cpp's load_arch_hparams."""
    key = meta.key("attention.recurrent_layers")
    flags = meta.metadata.get(key)
    if flags is not None:
        if not isinstance(flags, np.ndarray) or flags.dtype.kind not in "biu":
            raise MetadataError("expected an array of per-block flags", key=key)
        flags = tuple(bool(f) for f in flags.reshape(-1))
        if len(flags) != n_all:
            raise MetadataError(f"has {len(flags)} entries for {n_all} blocks", key=key)
        return flags[:n_all - n_nextn]
    period = meta.int("full_attention_interval", 4)
    return tuple((i + 1) % period != 0 for i in range(n_all - n_nextn))


def _sections(meta: Meta) -> tuple[int, ...]:
    key = meta.key("rope.dimension_sections")
    value = meta.metadata.get(key)
    if value is None:
        raise MetadataError("missing, required by the qwen35 architectures", key=key)
    if not isinstance(value, np.ndarray) or value.dtype.kind not in "iu":
        raise MetadataError("expected an array of 4 section sizes", key=key)
    sections = tuple(int(s) for s in value.reshape(-1))
    if len(sections) < 4 or min(sections) < 0 or not 0 < sum(sections[:4]) < 2**20:
        raise MetadataError(f"expected 4 section sizes, not all 0, got {sections}", key=key)
    return sections[:4]


@register("qwen35")
class Qwen35(Model):
    """Qwen3.5 dense: gated delta nets and gated full attention, SwiGLU FFNs."""

    config_class = Qwen35Config
    config: Qwen35Config
    rope_style = "neox"

    def load_tensors(self, w: Weights) -> None:
        c = self.config
        c.require_one_head_size()
        self.token_embd = w.get("token_embd.weight", (c.n_vocab, c.n_embd))
        self.output_norm = w.get("output_norm.weight", (c.n_embd,))
        self.output = w.get_or("output.weight", (c.n_vocab, c.n_embd), self.token_embd)
        norms = {"attn_norm": (c.n_embd,), "post_attention_norm": (c.n_embd,)}
        self.layers = []
        for i in range(c.n_layer):
            mixer, optional = (self.delta_tensors(), {}) if c.recurrent[i] else (
                self.attention_tensors(w, i))
            self.layers.append(w.layer(i, {**norms, **mixer, **self.ffn_tensors(w, i)}, optional))
        for i in range(c.n_layer, c.n_layer + c.n_nextn):  # MTP blocks: loaded, not run
            mixer, optional = self.attention_tensors(w, i)
            w.layer(i, {}, {**norms, **mixer, **optional, **self.ffn_tensors(w, i),
                            **self.nextn_tensors()})
        n_rec = 0
        self.blocks = []
        for i, layer in enumerate(self.layers):
            if c.recurrent[i]:
                layer.ssm_a = w.get(f"blk.{i}.ssm_a", (c.n_v_head,))
            mixer = self.delta_net(layer, n_rec) if c.recurrent[i] else self.attention(layer)
            n_rec += c.recurrent[i]
            self.blocks.append(Block(layer.attn_norm, mixer, layer.post_attention_norm,
                                     self.ffn(layer), c.norm_eps))

    def attention_tensors(self, w: Weights, i: int) -> tuple[dict[str, Any], dict[str, Any]]:
        """Block i's attention tensors (required, optional), as llama.cpp's
        create_tensor_qkv: one ``attn_qkv`` of rows [Q and gate | K | V] when the file has
        it, else ``attn_q`` (Q and gate) / ``attn_k`` / ``attn_v``; biases optional."""
        c = self.config
        rows = {"q": 2 * c.n_embd_q, "k": c.n_embd_k, "v": c.n_embd_v}
        required = {"attn_q_norm": (c.head_dim,), "attn_k_norm": (c.head_dim,),
                    "attn_output": (c.n_embd, c.n_embd_q)}
        if w.has(f"blk.{i}.attn_qkv.weight"):
            n = sum(rows.values())
            return {**required, "attn_qkv": (n, c.n_embd)}, {"attn_qkv.bias": (n,)}
        return ({**required, **{f"attn_{x}": (n, c.n_embd) for x, n in rows.items()}},
                {f"attn_{x}.bias": (n,) for x, n in rows.items()})

    def delta_tensors(self) -> dict[str, Any]:
        c = self.config
        conv_dim = 2 * c.n_k_head * c.d_state + c.d_inner
        return {"attn_qkv": (conv_dim, c.n_embd), "attn_gate": (c.d_inner, c.n_embd),
                "ssm_conv1d": (conv_dim, c.d_conv), "ssm_dt.bias": (c.n_v_head,),
                "ssm_beta": (c.n_v_head, c.n_embd), "ssm_alpha": (c.n_v_head, c.n_embd),
                "ssm_norm": (c.d_state,), "ssm_out": (c.n_embd, c.d_inner)}

    def ffn_tensors(self, w: Weights, i: int) -> dict[str, Any]:  # noqa: ARG002
        """Layer i's FFN tensors (a subclass's hook: experts)."""
        c = self.config
        return {"ffn_gate": (c.n_ff, c.n_embd), "ffn_up": (c.n_ff, c.n_embd),
                "ffn_down": (c.n_embd, c.n_ff)}

    def nextn_tensors(self) -> dict[str, Any]:
        c = self.config
        return {"nextn.eh_proj.weight": (c.n_embd, 2 * c.n_embd),
                "nextn.enorm.weight": (c.n_embd,), "nextn.hnorm.weight": (c.n_embd,),
                "nextn.embed_tokens.weight": (c.n_vocab, c.n_embd),
                "nextn.shared_head_head.weight": (c.n_vocab, c.n_embd),
                "nextn.shared_head_norm.weight": (c.n_embd,)}

    def ffn(self, layer: Layer) -> Any:
        """A layer's FFN spec (a subclass's hook)."""
        return glu(layer, "silu")

    def attention(self, layer: Layer) -> Attention:
        c = self.config
        q, k, v = qkv(layer, 2 * c.n_embd_q, c.n_embd_k, c.n_embd_v)
        return Attention(q, k, v, Linear.of(layer, "attn_output"), c.n_head,
                         c.n_head_kv, c.head_dim, c.head_dim_v,
                         scale=1.0 / float(np.sqrt(c.head_dim)),
                         neox=self.rope_style == "neox", q_norm=layer.attn_q_norm,
                         k_norm=layer.attn_k_norm, q_gate=True)

    def delta_net(self, layer: Layer, index: int) -> DeltaNet:
        c = self.config
        conv = layer.ssm_conv1d.rows(np.arange(layer.ssm_conv1d.shape[0]))  # (conv_dim, d_conv)
        return DeltaNet(Linear.of(layer, "attn_qkv"), Linear.of(layer, "attn_gate"),
                        Linear.of(layer, "ssm_alpha"), Linear.of(layer, "ssm_beta"),
                        layer.ssm_dt_bias, layer.ssm_a, conv,
                        layer.ssm_norm, Linear.of(layer, "ssm_out"), c.n_k_head, c.n_v_head,
                        c.d_state, index)

    def new_arena(self, n_ctx: int, n_slots: int = 1) -> KVArena:
        c = self.config
        shape = RecurrentShape(sum(c.recurrent), c.d_conv - 1,
                               2 * c.n_k_head * c.d_state + c.d_inner, c.n_v_head, c.d_state)
        return KVArena(c.n_layer, n_slots, n_ctx, c.n_head_kv, c.head_dim, c.head_dim_v,
                       kv_type=self.kv_type, recurrent=shape if shape.n_layer else None)

    def rope_table(self, pos: np.ndarray) -> np.ndarray:
        """The text positions' interleaved M-RoPE as one table: pair i is in sector i mod
        sum(sections); sectors 3m, 3m+1, 3m+2 below 3 x sections[0], [1], [2] rotate at the
        position (all three are the token's), every other pair at position 0 (not at all)."""
        c = self.config
        rot = ops.rope_table(pos, c.rope_dim, c.rope_base, c.rope_freq_scale)
        s = c.rope_sections
        sector = np.arange(c.rope_dim // 2) % max(1, sum(s))
        moving = np.zeros(len(sector), bool)
        for m in range(3):
            moving |= (sector % 3 == m) & (sector < 3 * s[m])
        rot[:, ~moving] = 1.0
        return rot

    def _forward(self, batch: Batch) -> np.ndarray:
        x = self.run_layers(self.token_embd.rows(batch.ids), batch, (self.rope_table(batch.pos),))
        return ops.rmsnorm(x, self.output_norm, self.config.norm_eps)  # (rows, n_embd)
