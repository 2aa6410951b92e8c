"""Comparing our logits with llama.cpp's reference data (greedy.json, logits-*.npy).

Used by the conformance tests and by benchmarks/conformance.py, which prints the figures.
Definitions follow the engine issue's bars:
- per generated step, d = ours - llama.cpp's on llama.cpp's 20 top ids; ``dev`` is
  max |d - median(d)| (softmax ignores a uniform shift), ``raw`` is max |d|;
- top-1 agreement is required only where llama.cpp's top-1/top-2 margin is large enough;
- the last prompt position's full logits, minus the mean difference: max and 99th pct.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np


@dataclass
class Steps:
    """Per-step figures pooled over cases."""

    dev: list[float] = field(default_factory=list)      # max |d - median(d)|
    raw: list[float] = field(default_factory=list)      # max |d|
    margin: list[float] = field(default_factory=list)   # llama.cpp's top1 - top2
    agree: list[bool] = field(default_factory=list)     # our argmax == llama.cpp's top-1
    where: list[str] = field(default_factory=list)      # "case:step"
    last_max: list[float] = field(default_factory=list)  # de-meaned full logits, max
    last_p99: list[float] = field(default_factory=list)  # ... 99th percentile

    def disagreements(self, min_margin: float) -> list[str]:
        return [f"{w} (margin {m:.2f})" for w, m, a in zip(self.where, self.margin, self.agree)
                if not a and m >= min_margin]

    def summary(self) -> dict[str, float]:
        return {
            "steps": len(self.dev),
            "dev_max": max(self.dev),
            "dev_median": float(np.median(self.dev)),
            "raw_median": float(np.median(self.raw)),
            "raw_max": max(self.raw),
            "last_max": max(self.last_max) if self.last_max else float("nan"),
            "last_p99": max(self.last_p99) if self.last_p99 else float("nan"),
            "agree": float(np.mean(self.agree)),
        }


def load_cases(folder: Path) -> list[dict[str, Any]]:
    return json.loads((folder / "greedy.json").read_text())["cases"]


def teacher_forced_ids(case: dict[str, Any]) -> list[int]:
    """Prompt then generated tokens: the sequence whose logits llama.cpp's steps saw."""
    return list(case["prompt_tokens"]) + list(case["generated_tokens"])


def compare_case(logits: np.ndarray, case: dict[str, Any], steps: Steps,
                 last_ref: np.ndarray | None = None) -> None:
    """Add one case's figures to ``steps``. ``logits`` (n_prompt + n_gen, n_vocab) are ours
    for ``teacher_forced_ids(case)``; ``last_ref`` is llama.cpp's logits-<id>.npy."""
    n_prompt = len(case["prompt_tokens"])
    for s, top in enumerate(case["top_logits"]):
        ids = np.array([t for t, _ in top])
        ref = np.array([v for _, v in top], dtype=np.float64)
        row = logits[n_prompt - 1 + s].astype(np.float64)
        d = row[ids] - ref
        steps.dev.append(float(np.max(np.abs(d - np.median(d)))))
        steps.raw.append(float(np.max(np.abs(d))))
        steps.margin.append(float(ref[0] - ref[1]))
        steps.agree.append(int(np.argmax(row)) == int(ids[0]))
        steps.where.append(f"{case['id']}:{s}")
    if last_ref is not None:
        d = logits[n_prompt - 1].astype(np.float64) - last_ref.astype(np.float64)
        d = np.abs(d - d.mean())
        steps.last_max.append(float(d.max()))
        steps.last_p99.append(float(np.percentile(d, 99)))


def run_reference(model: Any, folder: Path) -> Steps:
    """Teacher-forced comparison of ``model`` over every case in ``folder``/greedy.json."""
    steps = Steps()
    for case in load_cases(folder):
        if not case["generated_tokens"]:
            continue
        logits = model.logits(teacher_forced_ids(case))
        npy = folder / f"logits-{case['id']}.npy"
        compare_case(logits, case, steps, np.load(npy) if npy.is_file() else None)
    return steps


def assert_conforms(model: Any, folder: Path, path: Path) -> None:
    """The architecture bars: llama.cpp's prompt tokens from our tokenizer; over > 500
    teacher-forced steps, de-shifted max <= 0.5 and median-over-steps max |d| <= 0.15; top-1
    agreement wherever llama.cpp's margin is >= 0.25."""
    from gguflm import Tokenizer

    tok = Tokenizer.from_file(path)
    for case in load_cases(folder):
        ids = tok.encode(case["prompt"], add_special=True, parse_special=case["special"])
        assert ids == case["prompt_tokens"], case["id"]
    steps = run_reference(model, folder)
    s = steps.summary()
    assert s["steps"] > 500, s
    assert s["dev_max"] <= 0.5, s
    assert s["raw_median"] <= 0.15, s
    assert steps.disagreements(0.25) == [], s


def load_tiny(reference: Path, arch: str) -> tuple[Any, Path]:
    """The tiny reference model of ``arch`` (arch/<arch>/tiny-<arch>-f16.gguf) loaded, and
    its folder; the test is skipped when the file is missing."""
    import pytest

    import gguflm

    folder = reference / "arch" / arch
    path = folder / f"tiny-{arch}-f16.gguf"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    return gguflm.load_model(path), folder


def assert_batch_invariant(model: Any, ids: np.ndarray, n_ctx: int) -> None:
    """``ids``' logits are bit-identical alone, token by token, in chunks of 5, 1 and the
    rest, and beside two other sequences in a 3-slot arena (one of them resumed)."""
    from gguflm.model.batch import ALL, LAST, Part

    alone = model.logits(ids)
    cache = model.new_cache(n_ctx)
    steps = np.stack([model.forward([int(t)], cache) for t in ids])
    np.testing.assert_array_equal(steps, alone)
    cache = model.new_cache(n_ctx)
    chunks = [model.forward(ids[a:b], cache, all_logits=True)
              for a, b in ((0, 5), (5, 6), (6, len(ids)))]
    np.testing.assert_array_equal(np.concatenate(chunks), alone)
    arena = model.new_arena(n_ctx, 3)
    other = np.array([900, 3, 44, 1000, 2, 610, 18])
    model.forward_batch([Part(arena.slots[2], other[:3], LAST)])
    both = model.forward_batch([Part(arena.slots[0], other, ALL),
                                Part(arena.slots[1], ids, ALL),
                                Part(arena.slots[2], other[3:], LAST)])
    np.testing.assert_array_equal(both[len(other):len(other) + len(ids)], alone)


def greedy_tokens(model: Any, case: dict[str, Any]) -> list[int]:
    """Free-running greedy decoding of ``case``'s prompt (in one batch, then one token at a
    time, as llama.cpp was run), as many tokens as llama.cpp generated."""
    cache = model.new_cache(128)
    logits = model.forward(case["prompt_tokens"], cache)
    got: list[int] = []
    for _ in range(len(case["generated_tokens"])):
        got.append(int(np.argmax(logits)))
        logits = model.forward([got[-1]], cache)
    return got


def path_batches(model: Any) -> np.ndarray:
    """Logits of a prefill, decode steps, a prefill wanting its last row only (``rows``),
    then two sequences batched: the batches the path comparisons run (``executor.plan``'s
    parts against the reference path)."""
    from gguflm.model.batch import ALL, LAST, Part

    arena = model.new_arena(40, 2)
    a, b = arena.slots
    out = [model.forward_batch([Part(a, np.arange(3, 12), ALL)])]
    for t in range(3):
        out.append(model.forward_batch([Part(a, np.array([20 + t]), ALL)]))
    out.append(model.forward_batch([Part(b, np.arange(5, 25), LAST)]))
    out.append(model.forward_batch([Part(b, np.arange(7, 10), ALL),
                                    Part(a, np.array([40]), ALL)]))
    return np.concatenate(out)


def reference_batches(model: Any, monkeypatch: Any) -> np.ndarray:
    """``path_batches`` with every layer on the reference path (a forced plan)."""
    from gguflm.model import executor

    with monkeypatch.context() as m:
        m.setattr(model, "plan", executor.Plan(None, "forced by the test"))
        return path_batches(model)



def counted(monkeypatch: Any, module: Any, name: str) -> list[int]:
    """How many times ``module.name`` runs from now on (``monkeypatch`` replaces it with
    a counting wrapper)."""
    calls = [0]
    fn = getattr(module, name)

    def counting(*args):  # noqa: ANN002, ANN202
        calls[0] += 1
        return fn(*args)

    monkeypatch.setattr(module, name, counting)
    return calls


def quantized_tiny(reference: Path, folder: Path, pairs: tuple[tuple[str, str], ...]
                   ) -> dict[str, Path]:
    """The tiny reference models of ``pairs`` (arch, quant type) quantized by ``gguflm
    quantize`` into ``folder``: {arch: path}; the test is skipped when one is missing."""
    import pytest

    from gguflm.cli import main

    out = {}
    for arch, qtype in pairs:
        src = reference / "arch" / arch / f"tiny-{arch}-f16.gguf"
        if not src.is_file():
            pytest.skip(f"{src} not found")
        path = folder / f"{arch}-{qtype}.gguf"
        assert main(["quantize", str(src), str(path), qtype]) == 0
        out[arch] = path
    return out


def random_weights(name: str, rows: int, k: int, seed: int,
                   fill: int | None = None) -> np.ndarray:
    """``rows`` rows of ``k`` values of ggml type ``name``: random bytes (or every byte
    ``fill``), with finite float scales (random fp16 of about 0.01; MXFP4's E8M0 exponents
    about 2**-4) where the format has them: the kernels' tests on any bytes."""
    from gguflm.gguf.types import GGMLType
    from gguflm.quant.formats import FORMATS

    fmt = FORMATS[GGMLType[name]]
    rng = np.random.default_rng(seed)
    nb = rows * k // fmt.block_size
    if fill is None:
        blk = rng.integers(0, 256, (nb, fmt.type_size), dtype=np.uint8)
    else:
        blk = np.full((nb, fmt.type_size), fill, np.uint8)
    for f in fmt.fields:
        if f.name in ("d", "dmin", "m") and f.kind == "f16":
            v = (rng.standard_normal(nb) * 0.01).astype("<f2")
            blk[:, f.offset:f.offset + 2] = v.view(np.uint8).reshape(nb, 2)
        elif f.name == "e":
            blk[:, f.offset] = rng.integers(118, 127, nb)
    return blk.reshape(rows, -1)


def run_built_for(simd: str, code: str, cache: Path, timeout: int = 900) -> None:
    """Run ``code`` in a new interpreter whose kernels are built for SIMD flavour ``simd``
    (``GGUFLM_SIMD``) and compiled into ``cache``; the test fails with the child's error
    output if it fails."""
    env = dict(os.environ, GGUFLM_SIMD=simd, NUMBA_CACHE_DIR=str(cache))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=timeout)
    assert r.returncode == 0, r.stderr[-3000:]
