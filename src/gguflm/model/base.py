"""The Model interface every architecture implements, and what they all share.

An architecture subclasses ``Model`` and provides three parts, in its own file:
``config_class`` (a ``ModelConfig`` subclass when it reads extra keys), ``load_tensors``
(declares its tensors and their shapes) and ``_forward`` (one batch through the network).
This class does the rest: checking ids, splitting long batches, advancing the cache.
"""

from __future__ import annotations

import numpy as np

from ..gguf.reader import GGUFFile
from .config import ModelConfig
from .kv_cache import KVCache
from .weights import Weights

# Tokens per forward batch: long prompts are split so the (heads, T, S) attention scores
# stay small (llama.cpp's n_ubatch is 512 too).
MAX_BATCH = 512


class Model:
    """A loaded model: ``forward`` turns token ids into logits, caching keys and values.

    ``kv_f16`` (default True): caches round keys and values to float16, and attention its
    other operands, as llama.cpp's default F16 cache does, which brings the logits closer to
    llama.cpp's; False keeps attention in float32 (exact comparisons between evaluation
    orders, since float16 rounding magnifies last-bit differences into ~1e-3).
    """

    config_class: type[ModelConfig] = ModelConfig
    kv_f16: bool = True

    def __init__(self, gguf: GGUFFile, config: ModelConfig) -> None:
        self.gguf = gguf
        self.config = config

    @classmethod
    def from_gguf(cls, gguf: GGUFFile) -> Model:
        """Read the config, load and check every tensor (errors name the key or tensor)."""
        embd = gguf.tensors.get("token_embd.weight")
        fallback = embd.np_shape[0] if embd is not None and len(embd.shape) == 2 else 0
        config = cls.config_class.from_metadata(gguf.metadata, n_vocab_fallback=fallback)
        model = cls(gguf, config)
        weights = Weights(gguf, config.arch)
        model.load_tensors(weights)
        weights.check_all_used()
        return model

    # -- what an architecture provides ----------------------------------------------------------
    def load_tensors(self, w: Weights) -> None:
        """Fetch every tensor from ``w`` with its declared shape, as attributes."""
        raise NotImplementedError

    def _forward(self, ids: np.ndarray, pos0: int, cache: KVCache, out: slice) -> np.ndarray:
        """Evaluate ids (T,) at positions pos0..pos0+T, storing each layer's keys/values in
        ``cache`` (without advancing it); return logits (len(range(T)[out]), n_vocab) for the
        rows ``out`` selects."""
        raise NotImplementedError

    # -- the interface --------------------------------------------------------------------------
    def new_cache(self, n_ctx: int) -> KVCache:
        """An empty KV cache with room for ``n_ctx`` positions."""
        c = self.config
        return KVCache(c.n_layer, n_ctx, c.n_head_kv, c.head_dim, c.head_dim_v, f16=self.kv_f16)

    def forward(self, ids: list[int] | np.ndarray, cache: KVCache,
                all_logits: bool = False) -> np.ndarray:
        """Evaluate ``ids`` at positions cache.n.. and append them to the cache.

        Returns float32 logits (len(ids), n_vocab) if ``all_logits``, else (n_vocab,) for
        the last id. The ids are one causal batch (split only past MAX_BATCH tokens).
        """
        ids = self._check_ids(ids)
        cache.check_room(len(ids))
        outs = []
        for start in range(0, len(ids), MAX_BATCH):
            chunk = ids[start:start + MAX_BATCH]
            last = start + MAX_BATCH >= len(ids)
            want = slice(None) if all_logits else slice(-1, None) if last else slice(0, 0)
            logits = self._forward(chunk, cache.n, cache, want)
            cache.advance(len(chunk))
            if len(logits):
                outs.append(logits)
        logits = outs[0] if len(outs) == 1 else np.concatenate(outs)
        return logits if all_logits else logits[-1]

    def logits(self, ids: list[int] | np.ndarray) -> np.ndarray:
        """Logits (len(ids), n_vocab) float32 of ``ids`` evaluated from an empty cache."""
        return self.forward(ids, self.new_cache(max(1, len(ids))), all_logits=True)

    def _check_ids(self, ids: list[int] | np.ndarray) -> np.ndarray:
        arr = np.asarray(ids)
        if arr.ndim != 1 or arr.size == 0:
            raise ValueError(f"expected a non-empty 1-D sequence of token ids, got shape "
                             f"{arr.shape}")
        if arr.dtype.kind not in "iu":
            raise ValueError(f"token ids must be integers, got {arr.dtype}")
        bad = (arr < 0) | (arr >= self.config.n_vocab)
        if bad.any():
            raise ValueError(f"token id {int(arr[bad][0])} is outside the vocabulary "
                             f"(0..{self.config.n_vocab - 1})")
        return arr.astype(np.int64, copy=False)

    def __repr__(self) -> str:
        c = self.config
        return (f"{type(self).__name__}({c.arch}, {c.n_layer} layers, n_embd {c.n_embd}, "
                f"{c.n_head}/{c.n_head_kv} heads, vocab {c.n_vocab})")
