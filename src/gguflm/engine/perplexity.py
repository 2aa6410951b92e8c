"""Perplexity as llama.cpp's ``llama-perplexity`` computes it (its default, non-strided mode).

The text's tokens are cut into ``len // n_ctx`` chunks of ``n_ctx`` tokens; each chunk's
first token becomes BOS when the model adds one, the chunk is evaluated from an empty cache,
and only its second half is scored: the logits at positions n_ctx/2 .. n_ctx-2 against the
token that follows, so every scored token has at least n_ctx/2 tokens of context.
PPL = exp(mean negative log-likelihood over all scored tokens).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class PerplexityResult:
    ppl: float
    ppl_error: float            # llama.cpp's +/- : standard error of the mean NLL, times PPL
    n_ctx: int
    n_chunks: int
    n_scored: int
    running: list[float] = field(default_factory=list)  # PPL after each chunk


def log_softmax_at(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """log p(target) per row: logits (n, n_vocab) f32, targets (n,) -> (n,) float64,
    with the sum of exponentials in float64 as llama.cpp does."""
    x = logits.astype(np.float64)
    x -= x.max(axis=1, keepdims=True)
    lse = np.log(np.exp(x).sum(axis=1))
    return x[np.arange(len(targets)), targets] - lse


def perplexity(model: Any, tokens: Sequence[int], n_ctx: int = 128,
               bos_id: int | None = None, n_chunks: int | None = None,
               progress: Callable[[int, int, float], None] | None = None) -> PerplexityResult:
    """Perplexity of ``model`` over ``tokens`` (the whole text, tokenized as llama.cpp does:
    with BOS if the model adds one). ``bos_id`` replaces each chunk's first token when not
    None. ``progress(chunk, n_chunks, running_ppl)`` is called after each chunk.
    Raises ValueError when the text is shorter than two contexts (as llama.cpp refuses)."""
    if n_ctx < 4:
        raise ValueError(f"the context must be at least 4 tokens, got {n_ctx}")
    tokens = np.asarray(tokens, dtype=np.int64)
    if len(tokens) < 2 * n_ctx:
        raise ValueError(f"perplexity with a context of {n_ctx} needs at least {2 * n_ctx} "
                         f"tokens; the text has only {len(tokens)}")
    total = len(tokens) // n_ctx
    total = total if n_chunks is None else max(1, min(n_chunks, total))
    first = n_ctx // 2
    nll = nll2 = 0.0
    count = 0
    running = []
    for i in range(total):
        chunk = tokens[i * n_ctx:(i + 1) * n_ctx].copy()
        if bos_id is not None:
            chunk[0] = bos_id
        cache = model.new_cache(n_ctx)
        model.forward(chunk[:first], cache)                       # context only: no logits kept
        logits = model.forward(chunk[first:n_ctx - 1], cache, all_logits=True)
        targets = tokens[i * n_ctx + first + 1:(i + 1) * n_ctx]   # the original next tokens
        lp = log_softmax_at(logits, targets)
        nll -= float(lp.sum())
        nll2 += float(np.square(lp).sum())
        count += len(lp)
        running.append(math.exp(nll / count))
        if progress is not None:
            progress(i + 1, total, running[-1])
    mean = nll / count
    var = nll2 / count - mean * mean
    err = math.sqrt(var / (count - 1)) if var > 0 and count > 1 else 0.0
    ppl = math.exp(mean)
    return PerplexityResult(ppl=ppl, ppl_error=err * ppl, n_ctx=n_ctx, n_chunks=total,
                            n_scored=count, running=running)
