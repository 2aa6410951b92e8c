"""Embeddings: a text's final hidden states pooled into one vector, as llama.cpp computes
them (``llama-embedding``, llama-server's ``/v1/embeddings``).

The hidden states are the output norm's result, before the output projection (llama.cpp's
``t_embd``), for every token of the prompt (BOS included when the model adds it). Pooling
(``{arch}.pooling_type`` in the file, else mean; llama.cpp's ``--pooling``): ``mean`` over
the tokens, ``cls`` the first token's, ``last`` the last token's, ``none`` one vector per
token. Normalization is llama.cpp's ``--embd-normalize``: 2 (default) Euclidean, -1 none,
0 scaled to the int16 range by the largest magnitude, 1 taxicab, p > 2 the p-norm.

An ``EmbedRequest`` goes through the engine like a generation request: its prompt is
evaluated in chunks beside the other sequences (batch-invariant, so its vector does not
depend on what ran beside it), asking the batch for hidden states instead of logits, and
its ``EmbedJob`` ends with ``embedding`` set instead of sampling a token.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..gguf.errors import MetadataError
from ..model.batch import ALL, LAST, NONE
from .sequence import Job, Request

__all__ = ["DEFAULT_POOLING", "POOLINGS", "EmbedRequest", "EmbedJob", "model_pooling",
           "normalize", "pool"]

POOLINGS = ("mean", "cls", "last", "none")
# llama.cpp's enum llama_pooling_type, as ``{arch}.pooling_type`` stores it
POOLING_TYPES = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}
DEFAULT_POOLING = "mean"
DEFAULT_NORMALIZE = 2  # llama.cpp's embd_normalize default: Euclidean


def model_pooling(metadata: Mapping[str, Any]) -> str | None:
    """The pooling a model file asks for (``{arch}.pooling_type``), or None when it does
    not say (absent, or llama.cpp's -1 "unspecified"). ``rank`` is returned as such: a
    reranker, scored by its head (``reranker.py``), not embedded. Any other value is a
    MetadataError naming the key (llama.cpp stops at an unknown pooling type too)."""
    arch = metadata.get("general.architecture")
    key = f"{arch}.pooling_type"
    value = metadata.get(key)
    if value is None:
        return None
    if not isinstance(value, bool) and isinstance(value, int | np.integer):
        if int(value) == -1:
            return None
        if int(value) in POOLING_TYPES:
            return POOLING_TYPES[int(value)]
    known = ", ".join(f"{k} {v}" for k, v in POOLING_TYPES.items())
    raise MetadataError(f"{str(value)[:40]!r} is not a pooling type (-1 unspecified, "
                        f"{known})", key=key)


def pool(hidden: np.ndarray, pooling: str) -> np.ndarray:
    """hidden (n, n_embd) -> (n_embd,), or (n, n_embd) for ``none``. The mean sums in
    float64 in token order, so the result does not depend on how the prompt was chunked."""
    if pooling == "mean":
        return (hidden.sum(axis=0, dtype=np.float64) / len(hidden)).astype(np.float32)
    if pooling == "cls":
        return hidden[0].copy()
    if pooling == "last":
        return hidden[-1].copy()
    if pooling == "none":
        return hidden.copy()
    raise ValueError(f"pooling must be one of {', '.join(POOLINGS)}, got {pooling!r}")


def normalize(v: np.ndarray, mode: int = DEFAULT_NORMALIZE) -> np.ndarray:
    """llama.cpp's common_embd_normalize over the last axis: -1 none, 0 max-abs to the
    int16 range (32760), 2 Euclidean, any other p the p-norm (1: taxicab). A zero vector
    stays zero."""
    x = v.astype(np.float64)
    if mode == -1:
        return v.astype(np.float32)
    if mode == 0:
        norm = np.abs(x).max(axis=-1, keepdims=True) / 32760.0
    elif mode == 2:
        norm = np.sqrt(np.square(x).sum(axis=-1, keepdims=True))
    else:
        norm = np.power(np.power(np.abs(x), mode).sum(axis=-1, keepdims=True), 1.0 / mode)
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.where(norm > 0, 1.0 / norm, 0.0)
    return (x * scale).astype(np.float32)


@dataclass
class EmbedRequest(Request):
    """Embed ``prompt_ids``: ``pooling`` (mean, cls, last, none) and ``normalize``
    (llama.cpp's embd_normalize: 2 Euclidean, -1 none, ...). Nothing is generated.

    ``flash_attn``: attention computed as llama.cpp's CPU flash attention does (online
    softmax, the value sum kept in float16), which ``llama-embedding`` and ``llama-server``
    use by default (``-fa auto``); their vectors are what embeddings are compared with.
    Generation keeps the soft_max-then-product path (llama-cpp-python's default)."""

    pooling: str = DEFAULT_POOLING
    normalize: int = DEFAULT_NORMALIZE
    flash_attn: bool = True

    def __post_init__(self) -> None:
        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {', '.join(POOLINGS)}, got "
                             f"{self.pooling!r}")
        if isinstance(self.normalize, bool) or not isinstance(self.normalize, int) \
                or self.normalize < -1:
            raise ValueError(f"normalize must be an integer of at least -1, got "
                             f"{self.normalize!r}")


class EmbedJob(Job):
    """An embedding being computed: when it ends, ``embedding`` holds the pooled,
    normalized vector (float32; (n_tokens, n_embd) for pooling ``none``)."""

    request: EmbedRequest

    def __init__(self, request: EmbedRequest, *args: Any, **kwargs: Any) -> None:
        super().__init__(request, *args, **kwargs)
        self.embedding: np.ndarray | None = None
        self._hidden: list[np.ndarray] = []

    def hidden_wanted(self, last_chunk: bool) -> str:
        """Which rows of the next prompt chunk this sequence needs the hidden states of."""
        if self.request.pooling == "last":
            return LAST if last_chunk else NONE
        if self.request.pooling == "cls":
            return ALL if self.n_prompt_done == 0 else NONE
        return ALL

    def on_hidden(self, hidden: np.ndarray | None, last_chunk: bool) -> None:
        """Keep a chunk's hidden states; after the last chunk, pool them (engine thread)."""
        if hidden is not None and len(hidden):
            self._hidden.append(hidden)
        if last_chunk:
            rows = np.concatenate(self._hidden) if len(self._hidden) > 1 else self._hidden[0]
            self._hidden = []
            self.embedding = normalize(pool(rows, self.request.pooling),
                                       self.request.normalize)
