"""The key/value cache: per layer, the keys and values of every position evaluated so far.

With ``f16`` (the default) values are rounded to float16 as in llama.cpp's default F16
cache, but held in float32 so the attention products need no conversion. Preallocated for
``n_ctx`` positions in anonymous memory whose pages are committed only when written, so
memory grows with use (see ``_lazy_zeros``). Layout per layer is (n_head_kv, n_ctx,
head_dim) so each KV head's keys are one contiguous (positions, head_dim) matrix for the
attention products. Positions are absolute: cache slot i holds
position i, which is what causal and sliding-window masks are computed from.
"""

from __future__ import annotations

import mmap

import numpy as np


class ContextFullError(ValueError):
    """More tokens than the cache has room for (a prompt longer than the context)."""


def _lazy_zeros(shape: tuple[int, ...]) -> np.ndarray:
    """A zeroed float32 array whose pages the kernel commits only when they are written.

    Not np.zeros: numpy asks for transparent huge pages on large arrays, and then writing
    a few positions in each (layer, head) slice commits a 2 MiB page per slice, i.e. the
    whole cache at once (a 4096-token SmolLM2 cache: 190 MB resident after one token).
    """
    count = 1
    for d in shape:
        count *= d
    buf = mmap.mmap(-1, max(count * 4, 1))
    return np.frombuffer(buf, np.float32, count=count).reshape(shape)


class KVCache:
    """Keys and values for ``n_layer`` layers and up to ``n_ctx`` positions.

    ``n`` is the number of positions cached. A forward pass ``store``s each layer's new
    keys/values at positions ``n..n+T`` and then ``advance``s by T once all layers are done.
    """

    def __init__(self, n_layer: int, n_ctx: int, n_head_kv: int, head_dim: int,
                 head_dim_v: int, f16: bool = True) -> None:
        if n_ctx < 1:
            raise ValueError(f"n_ctx must be at least 1, got {n_ctx}")
        self.n_ctx = n_ctx
        self.n = 0
        # llama.cpp's default cache type is F16: keys and values are stored rounded to F16
        # (kept in float32 here, so attention needs no conversion), and attention rounds
        # its other operands as ggml does (ops.attention). Measured against llama.cpp's
        # logits: Gemma 3's worst de-shifted step 2.17 -> 1.86, the Q4_0 tiny Llama's
        # 1.31 -> 0.63, SmolLM2's perplexity -0.42% -> +0.004% of llama.cpp's.
        self.f16 = f16
        self.k = _lazy_zeros((n_layer, n_head_kv, n_ctx, head_dim))
        self.v = _lazy_zeros((n_layer, n_head_kv, n_ctx, head_dim_v))

    @property
    def n_free(self) -> int:
        return self.n_ctx - self.n

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def check_room(self, n_new: int) -> None:
        if n_new > self.n_free:
            raise ContextFullError(
                f"{n_new} more tokens do not fit: {self.n} of the context's {self.n_ctx} "
                f"positions are used")

    def store(self, layer: int, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Write k (T, n_head_kv, head_dim) and v (T, n_head_kv, head_dim_v) at positions
        n..n+T of ``layer``; return that layer's keys (n_head_kv, n+T, head_dim) and values
        (n_head_kv, n+T, head_dim_v), views into the cache."""
        end = self.n + len(k)
        if self.f16:
            k, v = k.astype(np.float16), v.astype(np.float16)
        self.k[layer, :, self.n:end] = k.transpose(1, 0, 2)
        self.v[layer, :, self.n:end] = v.transpose(1, 0, 2)
        return self.k[layer, :, :end], self.v[layer, :, :end]

    def advance(self, n_new: int) -> None:
        """Mark n_new more positions as cached (after every layer has stored them)."""
        self.n += n_new

    def truncate(self, n: int) -> None:
        """Forget every position from n on (e.g. to reuse a shared prompt prefix)."""
        if not 0 <= n <= self.n:
            raise ValueError(f"cannot truncate a cache of {self.n} positions to {n}")
        self.n = n

    def clear(self) -> None:
        self.n = 0

    def __repr__(self) -> str:
        return f"KVCache(n={self.n}, n_ctx={self.n_ctx}, {self.nbytes / 2**20:.1f} MiB)"
