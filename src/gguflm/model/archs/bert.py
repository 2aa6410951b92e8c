"""BERT encoders (``general.architecture`` = ``bert``: all-MiniLM, bge, e5; ``nomic-bert``:
nomic-embed-text), as llama.cpp's src/models/bert.cpp runs them.

Embeddings: token + position (0..T-1) + token type 0, then LayerNorm. Each block, post-norm:
x = LayerNorm(x + attn(x)); x = LayerNorm(x + down(GELU(up(x)))), every product with its
bias, GELU through ggml's float16 table (``encoder.gelu_f16``). Attention is bidirectional
within each sequence (no causal mask, no KV cache), scaled by 1/sqrt(head size). The result
is the last block's output per token (llama.cpp's ``t_embd``); pooling and normalisation
are the embedding step's (engine/embed.py).

The path it runs (``FORWARD_PATH``): this file's numpy forward, the weight products by
``QMatrix.matmul`` (the same kernels as the decoders', rows independent), attention per
sequence in float32 numpy. It does not use the decoders' compiled layer executor, and says
so wherever the model is described. Sequences of a batch share the products but never
their attention, so each vector is the same whatever else is in the batch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import ops
from ..base import Model
from ..classifier import load_classifier
from ..config import Meta, ModelConfig
from ..kv_cache import KVArena
from ..layer import qkv
from ..weights import Weights
from . import register

FORWARD_PATH = ("bert encoder: numpy forward (model/archs/bert.py) with compiled QMatrix "
                "products, layer norms, GELU and per-sequence bidirectional attention "
                "(model/encoder.py), not the compiled decoder layers")


GROUP_TOKENS = 2048  # tokens per forward of a batch (whole sequences; a longer one alone)


@dataclass(frozen=True)
class BertConfig(ModelConfig):
    n_token_types: int = 2  # tokenizer.ggml.token_type_count
    causal: bool = False    # {arch}.attention.causal (only false is supported)

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any], n_vocab_fallback: int = 0
                      ) -> ModelConfig:
        # BERT's norms are LayerNorms: its epsilon is attention.layer_norm_epsilon, kept in
        # the shared field norm_eps (which the decoders read from the RMS key)
        arch = metadata.get("general.architecture")
        eps = metadata.get(f"{arch}.attention.layer_norm_epsilon")
        meta = {**metadata, f"{arch}.attention.layer_norm_rms_epsilon": eps} \
            if eps is not None else metadata
        return super().from_metadata(meta, n_vocab_fallback)

    @classmethod
    def extra(cls, meta: Meta, common: dict[str, Any]) -> dict[str, Any]:
        from ...gguf.errors import MetadataError

        causal = meta.metadata.get(meta.key("attention.causal"), False)
        if causal is not False:
            raise MetadataError("a causal bert is not supported", key=meta.key(
                "attention.causal"))
        types = meta.metadata.get("tokenizer.ggml.token_type_count", 2)
        if isinstance(types, bool) or not isinstance(types, int | np.integer) or types < 1:
            raise MetadataError(f"expected a positive count, got {types!r}",
                                key="tokenizer.ggml.token_type_count")
        return {"n_token_types": int(types), "causal": False}


def layernorm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float,
              residual: np.ndarray | None = None) -> np.ndarray:
    """x (T, n) (plus ``residual`` (T, n), added first) -> (x - mean) / sqrt(var + eps) * w
    + b per row (ggml_norm, then w and b)."""
    from ..encoder import add_layer_norm, layer_norm  # numba: not imported by loading a model

    out = np.empty((len(x), x.shape[1]), np.float32)
    x, w, b = (np.ascontiguousarray(a, np.float32) for a in (x, w, b))
    if residual is None:
        layer_norm(x, w, b, float(eps), out)
    else:
        add_layer_norm(x, np.ascontiguousarray(residual, np.float32), w, b, float(eps), out)
    return out


@register("bert")
class Bert(Model):
    """A BERT encoder: ``embed_batch`` gives each sequence's token vectors."""

    config_class = BertConfig
    is_encoder = True
    forward_path = FORWARD_PATH

    def load_tensors(self, w: Weights) -> None:
        c = self.config
        self.token_embd = w.get("token_embd.weight", (c.n_vocab, c.n_embd))
        self.position_embd = self.position_tensor(w)
        self.token_types = w.get("token_types.weight", (c.n_token_types, c.n_embd),
                                 optional=True)
        self.token_embd_norm = w.get("token_embd_norm.weight", (c.n_embd,))
        self.token_embd_norm_bias = w.get("token_embd_norm.bias", (c.n_embd,))
        ffn, ffn_optional = self.ffn_tensors()
        self.layers = [w.layer(i, {
            "attn_output": (c.n_embd, c.n_embd_q),
            "attn_output_norm": (c.n_embd,), "attn_output_norm.bias": (c.n_embd,),
            **ffn,
            "layer_output_norm": (c.n_embd,), "layer_output_norm.bias": (c.n_embd,),
        }, optional={"attn_output.bias": (c.n_embd,), **ffn_optional}, qkv=c)
            for i in range(c.n_layer)]
        # a cross-encoder's head: cls (dense + tanh) and cls.output, both optional
        self.classifier = load_classifier(w, c)

    def position_tensor(self, w: Weights) -> Any:
        """Learned position embeddings (a subclass's hook: none with RoPE)."""
        c = self.config
        return w.get("position_embd.weight", (c.n_ctx_train, c.n_embd))

    def ffn_tensors(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The FFN's (required, optional) tensors: up and down with optional biases."""
        c = self.config
        return ({"ffn_up": (c.n_ff, c.n_embd), "ffn_down": (c.n_embd, c.n_ff)},
                {"ffn_up.bias": (c.n_ff,), "ffn_down.bias": (c.n_embd,)})

    # -- forward ---------------------------------------------------------------------------------
    def embed_batch(self, seqs: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """The last block's token vectors (len(ids), n_embd) of each id sequence; the
        sequences' tokens share every product, never their attention. Run in groups of
        about GROUP_TOKENS tokens: the same numbers (rows are independent), but a group's
        activations stay in cache and below the allocator's fresh-pages threshold."""
        c = self.config
        arrays = [self._check_ids(ids) for ids in seqs]
        for ids in arrays:
            if len(ids) > c.n_ctx_train:
                raise ValueError(f"{len(ids)} tokens: more than this encoder's "
                                 f"{c.n_ctx_train} positions")
        out: list[np.ndarray] = []
        group: list[np.ndarray] = []
        for ids in arrays:
            if group and sum(map(len, group)) + len(ids) > GROUP_TOKENS:
                out += self._embed_group(group)
                group = []
            group.append(ids)
        return out + (self._embed_group(group) if group else [])

    def _embed_group(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        c = self.config
        spans = np.cumsum([0] + [len(a) for a in arrays]).astype(np.int64)
        ids = np.concatenate(arrays)
        pos = np.concatenate([np.arange(len(a)) for a in arrays])
        x = self._embed(ids, pos)                                     # (T, n_embd)
        if self.token_types is not None:
            x += self.token_types.rows([0])
        x = layernorm(x, self.token_embd_norm, self.token_embd_norm_bias, c.norm_eps)
        rot = self._rope_table(pos)
        for layer in self.layers:
            x = self._block(x, layer, spans, rot)
        return [x[a:b] for a, b in zip(spans[:-1], spans[1:])]

    # what nomic-bert changes (below): positions, RoPE, the FFN
    def _embed(self, ids: np.ndarray, pos: np.ndarray) -> np.ndarray:
        return self.token_embd.rows(ids) + self.position_embd.rows(pos)

    def _rope_table(self, pos: np.ndarray) -> np.ndarray | None:
        return None  # learned positions, no RoPE

    def _ffn(self, x: np.ndarray, layer: Any) -> np.ndarray:
        from ..encoder import gelu_f16  # numba: loading a model does not import it

        # GELU through ggml-cpu's float16 table, as llama.cpp computes it: in float32, a
        # cross-encoder's scores moved 2.5e-3 (relative) away from llama.cpp's
        h = gelu_f16(ops.linear(x, layer.ffn_up), layer.ffn_up_bias)
        return ops.linear(h, layer.ffn_down, layer.ffn_down_bias)

    def _block(self, x: np.ndarray, layer: Any, spans: np.ndarray, rot: np.ndarray | None
               ) -> np.ndarray:
        c = self.config
        n = len(x)
        lq, lk, lv = qkv(layer, c.n_embd_q, c.n_embd_k, c.n_embd_v)  # fused or not
        q, k, v = ops.linears(x, (lq, lk, lv))  # x converted to the weights' type once
        q = q.reshape(n, c.n_head, c.head_dim)                         # (T, H, d)
        k = k.reshape(n, c.n_head_kv, c.head_dim)
        v = v.reshape(n, c.n_head_kv, c.head_dim_v)
        if rot is not None:
            q, k = ops.rope_neox(q, rot), ops.rope_neox(k, rot)
        from ..encoder import encoder_attention  # numba: not imported by loading a model

        att = np.empty((len(x), c.n_head, c.head_dim_v), np.float32)
        encoder_attention(np.ascontiguousarray(q, np.float32),
                          np.ascontiguousarray(k, np.float32),
                          np.ascontiguousarray(v, np.float32), spans,
                          1.0 / math.sqrt(c.head_dim), att)
        y = ops.linear(att.reshape(len(x), -1), layer.attn_output, layer.attn_output_bias)
        x = layernorm(x, layer.attn_output_norm, layer.attn_output_norm_bias, c.norm_eps, y)
        y = self._ffn(x, layer)
        return layernorm(x, layer.layer_output_norm, layer.layer_output_norm_bias, c.norm_eps,
                         y)

    def _forward(self, batch: Any) -> np.ndarray:
        raise ValueError("this is an encoder (bert): it computes embeddings (embed_batch), "
                         "not next-token logits")

    def new_arena(self, n_ctx: int, n_slots: int = 1) -> KVArena:
        """No cache: an encoder sees each text whole. The engine's slots get one position
        each, for their bookkeeping."""
        c = self.config
        return KVArena(c.n_layer, n_slots, 1, c.n_head_kv, c.head_dim, c.head_dim_v,
                       kv_type=self.kv_type)

    def warm_up(self, prompts: bool = False) -> None:
        self.embed_batch([[0, min(1, self.config.n_vocab - 1)]])

    def __repr__(self) -> str:
        return f"{super().__repr__()[:-1]}; {FORWARD_PATH})"


@register("nomic-bert")
class NomicBert(Bert):
    """nomic-embed-text (``nomic-bert``), as llama.cpp's bert.cpp runs it: no learned
    positions but NEOX RoPE on Q and K (``rope.freq_base``), one fused ``attn_qkv``, and a
    SwiGLU FFN ``down(silu(gate(x)) * up(x))`` without biases."""

    def position_tensor(self, w: Weights) -> Any:
        return None  # RoPE

    def ffn_tensors(self) -> tuple[dict[str, Any], dict[str, Any]]:
        c = self.config
        return ({"ffn_up": (c.n_ff, c.n_embd), "ffn_gate": (c.n_ff, c.n_embd),
                 "ffn_down": (c.n_embd, c.n_ff)}, {})

    def _embed(self, ids: np.ndarray, pos: np.ndarray) -> np.ndarray:
        return self.token_embd.rows(ids)

    def _rope_table(self, pos: np.ndarray) -> np.ndarray:
        c = self.config
        return ops.rope_table(pos, c.rope_dim, c.rope_base, c.rope_freq_scale)

    def _ffn(self, x: np.ndarray, layer: Any) -> np.ndarray:
        gate, up = ops.linear(x, layer.ffn_gate), ops.linear(x, layer.ffn_up)
        return ops.linear(ops.swiglu(gate, up), layer.ffn_down)

