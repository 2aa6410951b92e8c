"""The generation loop: prompt ids in, generated ids out (text is a separate step).

The prompt is evaluated as one batch, then each sampled token one at a time, as llama.cpp
does. Generation stops after an end-of-generation token (which is yielded, as llama.cpp
reports it), after ``max_tokens`` tokens, or when the context is full.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np

from .sampling import Sampler

if TYPE_CHECKING:
    from ..model.kv_cache import KVCache

__all__ = ["Generation", "PromptTooLongError", "Timings", "generate", "stream_text"]


class PromptTooLongError(ValueError):
    """The prompt does not fit in the context (or is empty)."""


class _Model(Protocol):
    def new_cache(self, n_ctx: int): ...
    def forward(self, ids, cache, all_logits: bool = False) -> np.ndarray: ...


class _Decoder(Protocol):
    def feed(self, token: int) -> str: ...
    def flush(self) -> str: ...


@dataclass
class Timings:
    """Where the time went. Generation time counts sampling and the one-token forward
    passes, not the time the consumer of ``Generation`` spends between tokens."""

    prompt_tokens: int = 0
    prompt_seconds: float = 0.0
    generated_tokens: int = 0
    generation_seconds: float = 0.0

    @property
    def prompt_tokens_per_second(self) -> float:
        return self.prompt_tokens / self.prompt_seconds if self.prompt_seconds else 0.0

    @property
    def generation_tokens_per_second(self) -> float:
        return (self.generated_tokens / self.generation_seconds
                if self.generation_seconds else 0.0)

    def as_dict(self) -> dict[str, float]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "prompt_seconds": round(self.prompt_seconds, 6),
            "prompt_tokens_per_second": round(self.prompt_tokens_per_second, 3),
            "generated_tokens": self.generated_tokens,
            "generation_seconds": round(self.generation_seconds, 6),
            "generation_tokens_per_second": round(self.generation_tokens_per_second, 3),
        }


@dataclass
class Generation:
    """One generation run. Iterate it for the ids as they are sampled; afterwards
    ``tokens`` holds them all, ``stop`` says why it ended ("eos" or "length") and
    ``timings`` how fast it went. It can be iterated once."""

    model: _Model
    prompt_ids: list[int]
    sampler: Sampler
    max_tokens: int = -1  # -1: until an end-of-generation token or the end of the context
    n_ctx: int = 0
    eog_ids: frozenset[int] = frozenset()
    tokens: list[int] = field(default_factory=list)
    stop: str | None = None
    timings: Timings = field(default_factory=Timings)
    # Reuse: an existing cache whose first ``n_reuse`` positions hold this prompt's first
    # tokens (a chat's earlier turns); only the rest of the prompt is evaluated.
    cache: KVCache | None = None
    n_reuse: int = 0
    _started: bool = False

    def __iter__(self) -> Iterator[int]:
        if self._started:
            raise RuntimeError("a Generation can be iterated only once")
        self._started = True
        return self._run()

    def _run(self) -> Iterator[int]:
        cache = self.cache if self.cache is not None else self.model.new_cache(self.n_ctx)
        # keep the reusable prefix, but evaluate at least one token: its logits come next
        keep = max(0, min(self.n_reuse, cache.n, len(self.prompt_ids) - 1))
        cache.truncate(keep)
        t0 = time.perf_counter()
        logits = self.model.forward(self.prompt_ids[keep:], cache)  # (n_vocab,) at the last
        self.sampler.accept_all(self.prompt_ids)  # the penalties see the prompt, as llama.cpp's
        self.timings.prompt_tokens = len(self.prompt_ids) - keep  # the tokens evaluated
        self.timings.prompt_seconds = time.perf_counter() - t0
        while True:
            if 0 <= self.max_tokens <= len(self.tokens):
                self.stop = "length"
                return
            t0 = time.perf_counter()
            token = self.sampler.sample(logits)
            self.sampler.accept(token)
            self.tokens.append(token)
            self.timings.generated_tokens = len(self.tokens)
            done = self._done(token, cache.n)
            if not done:
                logits = self.model.forward([token], cache)
            self.timings.generation_seconds += time.perf_counter() - t0
            yield token
            if done:
                self.stop = done
                return

    def _done(self, token: int, n_cached: int) -> str | None:
        """Why generation ends after ``token`` (None: go on). Checked before evaluating
        ``token``, so that the last token costs no forward pass."""
        if token in self.eog_ids:
            return "eos"
        if 0 <= self.max_tokens <= len(self.tokens) or n_cached >= self.n_ctx:
            return "length"
        return None


def generate(model: _Model, prompt_ids: Iterable[int], sampler: Sampler, *,
             max_tokens: int = -1, n_ctx: int | None = None,
             eog_ids: Iterable[int] = (), cache: KVCache | None = None,
             n_reuse: int = 0) -> Generation:
    """A ``Generation`` (iterate it for the ids) of up to ``max_tokens`` tokens after
    ``prompt_ids``, in a context of ``n_ctx`` positions (default: just enough for the prompt
    and ``max_tokens``; required when ``max_tokens`` is -1).

    With ``cache`` (an existing KV cache; its size is the context) the first ``n_reuse``
    prompt tokens are taken as already cached there; the cache is cut back to them and only
    the rest is evaluated. Afterwards ``cache.n`` positions hold ``(prompt + tokens)[:n]``.
    """
    prompt = [int(t) for t in prompt_ids]
    if cache is not None:
        if n_ctx is not None and n_ctx != cache.n_ctx:
            raise ValueError(f"n_ctx {n_ctx} differs from the given cache's {cache.n_ctx}")
        n_ctx = cache.n_ctx
    if not prompt:
        raise PromptTooLongError("the prompt is empty (no tokens to start from)")
    if max_tokens < -1:
        raise ValueError(f"max_tokens must be >= -1, got {max_tokens}")
    if n_ctx is None:
        if max_tokens < 0:
            raise ValueError("n_ctx is required when max_tokens is -1 (unlimited)")
        # the last generated token is never evaluated, so it needs no cache slot
        n_ctx = len(prompt) + max(max_tokens - 1, 0)
    if n_ctx < 1:
        raise ValueError(f"n_ctx must be at least 1, got {n_ctx}")
    if len(prompt) > n_ctx:
        raise PromptTooLongError(
            f"the prompt is {len(prompt)} tokens, longer than the context of {n_ctx}")
    return Generation(model, prompt, sampler, max_tokens=max_tokens, n_ctx=n_ctx,
                      eog_ids=frozenset(int(t) for t in eog_ids), cache=cache,
                      n_reuse=n_reuse if cache is not None else 0)


def stream_text(ids: Iterable[int], decoder: _Decoder) -> Iterator[str]:
    """Text pieces for ``ids`` as they arrive, through an incremental decoder (which holds
    back incomplete UTF-8), ending with whatever it still holds."""
    for token in ids:
        piece = decoder.feed(token)
        if piece:
            yield piece
    rest = decoder.flush()
    if rest:
        yield rest
