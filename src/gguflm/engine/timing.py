"""Timed forward passes for ``gguflm bench`` (llama-bench's pp and tg tests): the model's
products alone, without sampling or scheduling, so that the figures compare with
llama.cpp's. Like every forward pass outside the model, they are run from the engine
package."""

from __future__ import annotations

import time
from typing import Any


def warm(model: Any, prompt: list[int], gen: list[int]) -> float:
    """Load (or compile) the kernels a first prompt and a first decoded token use; returns
    the seconds it took (a start-up cost, timed apart from the runs)."""
    t0 = time.perf_counter()
    model.forward(prompt[:2] or gen[:2], model.new_cache(4))
    model.forward(gen[:1] or prompt[:1], model.new_cache(4))
    return time.perf_counter() - t0


def prefill_seconds(model: Any, prompt: list[int], n_ctx: int, n_batch: int) -> float:
    """Seconds to evaluate ``prompt`` into a fresh cache, ``n_batch`` rows per pass."""
    cache = model.new_cache(n_ctx)
    t0 = time.perf_counter()
    for i in range(0, len(prompt), n_batch):
        model.forward(prompt[i:i + n_batch], cache)
    return time.perf_counter() - t0


def decode_seconds(model: Any, gen: list[int], n_ctx: int) -> float:
    """Seconds to decode ``gen`` one token a pass into a fresh cache."""
    cache = model.new_cache(n_ctx)
    t0 = time.perf_counter()
    for tok in gen:
        model.forward([tok], cache)
    return time.perf_counter() - t0
