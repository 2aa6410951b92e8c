"""A reranker's scoring head (llama.cpp's ``pooling_type`` rank, ``build_pooling``): the
final hidden states of one sequence pooled into one vector, then a small classifier.

Pooling: the mean over the tokens when ``{arch}.classifier.pooling_type`` says mean (1),
else one token's vector: the last for a causal model (a decoder reranker reads the state
after the whole prompt), the first ([CLS]) for an encoder. Head: ``cls`` (n_embd x n_embd,
bias optional) then an activation (tanh: RoBERTa's classification head) when the file has
it; ``cls.output`` (n_cls_out x n_embd, bias optional) when it has that; a softmax over
the outputs where the architecture asks (Qwen3-Reranker's yes/no rows). The score is the
first output (llama-server's ``embd[0]``). n_cls_out is the length of
``{arch}.classifier.output_labels``, else 1.

Each sequence is scored alone from its own hidden states, so a score never depends on the
sequences beside it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import ops
from .config import ModelConfig
from .weights import Weights

__all__ = ["Classifier", "load_classifier"]

MEAN = 1  # llama.cpp's LLAMA_POOLING_TYPE_MEAN, as classifier.pooling_type stores it


@dataclass(frozen=True)
class Classifier:
    """The tensors and rules of one model's scoring head (see the module docstring)."""

    pooling: str                 # "mean", "first" or "last": the vector the head reads
    dense: Any = None            # cls.weight (n_embd, n_embd) QMatrix, or None
    dense_bias: np.ndarray | None = None
    out: Any = None              # cls.output.weight (n_cls_out, n_embd) QMatrix, or None
    out_bias: np.ndarray | None = None
    softmax: bool = False        # softmax over the outputs (Qwen3-Reranker)

    def pool(self, hidden: np.ndarray) -> np.ndarray:
        """hidden (n_tokens, n_embd) of one sequence -> (n_embd,) float32; the mean sums in
        float64 in token order, so it does not depend on how the prompt was chunked."""
        if self.pooling == "mean":
            return (hidden.sum(axis=0, dtype=np.float64) / len(hidden)).astype(np.float32)
        return np.array(hidden[0 if self.pooling == "first" else -1], np.float32)

    def outputs(self, pooled: np.ndarray) -> np.ndarray:
        """pooled (n_embd,) -> the head's outputs (n_cls_out,) float32."""
        x = np.ascontiguousarray(pooled, np.float32)[None]
        if self.dense is not None:
            x = np.tanh(ops.linear(x, self.dense, self.dense_bias))
        if self.out is not None:
            x = ops.linear(np.ascontiguousarray(x, np.float32), self.out, self.out_bias)
        y = x[0].astype(np.float64)
        if self.softmax:
            y = np.exp(y - y.max())
            y /= y.sum()
        return y.astype(np.float32)

    def score(self, pooled: np.ndarray) -> float:
        """The relevance score of a pooled vector: the head's first output."""
        return float(self.outputs(pooled)[0])


def load_classifier(w: Weights, c: ModelConfig, *, softmax: bool = False,
                    dense: bool = True) -> Classifier | None:
    """The head's tensors from ``w`` (all optional, as llama.cpp loads them), or None when
    the file has neither ``cls`` nor ``cls.output``. ``dense``: whether the architecture
    has the ``cls`` layer (llama.cpp's qwen3 loads only ``cls.output``); ``softmax`` as in
    ``Classifier``."""
    from ..gguf.errors import MetadataError

    gguf = getattr(w, "gguf", None)  # absent where a Weights only records what is asked for
    meta = gguf.metadata if gguf is not None else {}
    labels = meta.get(f"{c.arch}.classifier.output_labels")
    n_out = len(labels) if isinstance(labels, Sequence) and not isinstance(labels, str) \
        and len(labels) else 1
    d = c.n_embd
    layer = w.get("cls.weight", (d, d), optional=True) if dense else None
    bias = w.get("cls.bias", (d,), optional=True) if dense else None
    out = w.get("cls.output.weight", (n_out, d), optional=True)
    out_bias = w.get("cls.output.bias", (n_out,), optional=True)
    if layer is None and out is None:
        return None
    if out is None and n_out != 1:
        raise MetadataError(f"{n_out} output labels but no cls.output.weight",
                            key=f"{c.arch}.classifier.output_labels")
    kind = meta.get(f"{c.arch}.classifier.pooling_type")
    pooling = "mean" if kind == MEAN else "last" if c.causal else "first"
    return Classifier(pooling, layer, bias, out, out_bias, softmax)
