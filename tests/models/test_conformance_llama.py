"""Llama-architecture logits against llama.cpp's (teacher-forced over greedy.json's cases).

llama.cpp quantizes activations to 8 bits inside its matrix products, so the bars allow a
few tenths of a logit and compare top-1 only where llama.cpp was decisive; real bugs (RoPE
style or base, GQA mapping, tied output, norm order) miss them by a wide margin. Each case
is one batched pass over prompt + generated tokens.
"""

from __future__ import annotations

from pathlib import Path

import gguflm
from refcheck import Steps, run_reference


def _check(steps: Steps, dev_max: float, raw_median: float, min_margin: float) -> None:
    s = steps.summary()
    assert s["steps"] > 100
    assert s["dev_max"] <= dev_max, s
    assert s["raw_median"] <= raw_median, s
    assert steps.disagreements(min_margin) == []


def _tiny(reference: Path, name: str) -> Steps:
    folder = reference / name
    return run_reference(gguflm.load_model(folder / f"{name}.gguf"), folder)


def test_tiny_llama_f16(reference) -> None:
    """Untied output, GQA, F16 weights: llama.cpp is near-exact here (measured by an
    independent pass: 0.11 worst de-shifted step, 0.04 median)."""
    _check(_tiny(reference, "tiny-llama-f16"), 0.5, 0.15, 0.25)


def test_tiny_llama_q4_0(reference) -> None:
    """Q4_0 matrices and a Q6_K output: random weights magnify llama.cpp's 8-bit activation
    rounding (independent pass: 2.01 / 0.72)."""
    _check(_tiny(reference, "tiny-llama-q4_0"), 4.0, 1.2, 2.0)


def test_smollm2_q4_1(reference, smollm2_path) -> None:
    """SmolLM2-135M Q4_1 (tied output, 9 heads / 3 KV heads, RoPE base 100000): every step
    within 2.5 de-shifted, median step within 0.6, and the full last-prompt logits (minus
    the mean difference) within 2.0 at worst and 1.0 at the 99th percentile."""
    steps = run_reference(gguflm.load_model(smollm2_path), reference / "smollm2-135m-q4_1")
    _check(steps, 2.5, 0.6, 1.0)
    assert len(steps.last_max) == 9
    assert max(steps.last_max) <= 2.0 and max(steps.last_p99) <= 1.0, steps.summary()
