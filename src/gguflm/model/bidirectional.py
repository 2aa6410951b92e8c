"""Decoders whose attention is bidirectional (``{arch}.attention.causal`` = false): every
token of a sequence attends to every token of that sequence, later ones included, as
llama.cpp builds any architecture's attention mask when that key says so (the
decoder-based embedding models: llama-embed-nemotron and the like).

Such a model computes embeddings only: a token's hidden state depends on the tokens after
it, so there are no next-token logits to sample. Each sequence is evaluated whole, in one
pass (``embed_sequences``), through the architecture's own forward on the reference path
(``executor.BIDIRECTIONAL``): the layer specs, RoPE tables and products are the causal
model's; only ``WholeSequenceBatch.attention`` differs, storing the pass's keys and values
first and letting each row see every position of its sequence.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..gguf.errors import MetadataError
from .batch import ALL, NONE, Batch, Part
from .layer import Attention, Block

GROUP_TOKENS = 2048  # tokens per pass (whole sequences; a longer one alone)


class WholeSequenceBatch(Batch):
    """Whole sequences (each from position 0, all its tokens in this batch) whose rows
    attend over their entire sequence: each row's last visible position is its
    sequence's last (``last``), not its own."""

    def __init__(self, parts: Sequence[Part]) -> None:
        if any(p.cache.n for p in parts):
            raise ValueError("bidirectional attention evaluates each sequence whole, from "
                             "an empty cache")
        super().__init__(parts)
        self.last = np.concatenate([np.full(len(p.ids), len(p.ids) - 1, np.int64)
                                    for p in parts])

    def attention(self, il: int, q: np.ndarray, k: np.ndarray | None, v: np.ndarray | None,
                  scale: float, cap: float = 0.0, window: int = 0,
                  sinks: np.ndarray | None = None) -> np.ndarray:
        """``Batch.attention`` without the causal mask: this batch's k and v are stored
        first (``attention.store_rows``), then every query row attends over positions
        0..last of its sequence with the same kernel (its arithmetic per row unchanged)."""
        from .attention import attend, store_rows  # numba: compiled or loaded on first use

        arena = self.arena
        if k is not None:
            store_rows(arena.k[il], arena.v[il], self.slot, self.pos,
                       np.ascontiguousarray(k, np.float32), np.ascontiguousarray(v, np.float32))
        q = np.ascontiguousarray(q, dtype=np.float32)
        out = np.empty((len(q), q.shape[1], arena.head_dims_v[il]), np.float32)
        attend(q, arena.k[il], arena.v[il], self.slot, self.last, int(window),
               np.float32(scale), np.float32(cap), arena.f16, out, self.flash, None, None,
               sinks)
        return out.reshape(len(q), -1)


def check_layers(blocks: list[Block], arch: str) -> None:
    """A MetadataError (naming ``attention.causal``) unless every layer is attention
    without a sliding window: a recurrent layer is causal by nature, and a window around
    each token is a mask these layers do not build."""
    for il, b in enumerate(blocks):
        if not isinstance(b.attn, Attention) or b.attn.window:
            what = "a sliding window" if isinstance(b.attn, Attention) else "a recurrent layer"
            raise MetadataError(f"false, but layer {il} has {what}: bidirectional attention "
                                f"is supported over whole sequences only",
                                key=f"{arch}.attention.causal")


def embed_sequences(model: Any, seqs: Sequence[Sequence[int]]) -> list[np.ndarray]:
    """The final hidden states (len(ids), n_embd) of each id sequence, each evaluated
    whole through ``model``'s forward, with bidirectional attention unless the model's is
    causal; passes of whole sequences of about GROUP_TOKENS tokens (rows are
    independent: the same numbers)."""
    arrays = [model._check_ids(ids) for ids in seqs]
    out: list[np.ndarray] = []
    group: list[np.ndarray] = []
    for ids in arrays:
        if group and sum(map(len, group)) + len(ids) > GROUP_TOKENS:
            out += _one_pass(model, group)
            group = []
        group.append(ids)
    return out + (_one_pass(model, group) if group else [])


def _one_pass(model: Any, arrays: list[np.ndarray]) -> list[np.ndarray]:
    """One forward over these sequences, each in its own slot of a fresh arena."""
    arena = model.kv_arena(max(map(len, arrays)), len(arrays))
    parts = [Part(cache, ids, logits=NONE, hidden=ALL)
             for cache, ids in zip(arena.slots, arrays, strict=False)]
    batch = Batch(parts) if model.config.causal else WholeSequenceBatch(parts)
    x = model._forward(batch)  # (len(batch.out), n_embd): every row of every part
    return [x[rows] for _, rows in batch.hidden_rows]
