"""benchmarks/bench_layer_kinds.py's files: its small shapes (F16, written here in about a
second each) have the tiny reference's metadata keys, load in gguflm with the layer kinds
where the shape puts them, and give finite logits. The real shapes are the same code with
other numbers; llama.cpp loading them is checked by running the benchmark."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import gguflm
from gguflm.gguf.reader import GGUFFile
from scripts import benchmark_module


def _tool() -> Any:
    return benchmark_module("bench_layer_kinds")


def _kinds(kind: str, s: dict[str, Any]) -> list[str]:
    """The mixer class of each layer the shape describes."""
    if kind == "deepseek2":
        return ["LatentAttention"] * s["n_layer"]
    other = "ShortConv" if kind == "lfm2" else "Mamba2"
    return ["Attention" if i in s["attn"] else other for i in range(s["n_layer"])]


@pytest.mark.parametrize("kind", ["lfm2", "granitehybrid", "deepseek2"])
def test_small_shape_loads_and_runs(kind: str, reference: Path, tmp_path: Path) -> None:
    tool = _tool()
    tool.ARCH = reference / "arch"
    path = tmp_path / f"{kind}.gguf"
    tool.write(path, kind, "small", 7)
    shape = tool.SHAPES[kind]["small"]
    written, tiny = GGUFFile(path), GGUFFile(reference / "arch" / kind / f"tiny-{kind}-f16.gguf")
    assert list(written.metadata) == list(tiny.metadata)
    assert len(written.metadata["tokenizer.ggml.tokens"]) == shape["vocab"]
    model = gguflm.load_model(path)
    assert [type(b.attn).__name__ for b in model.blocks] == _kinds(kind, shape)
    logits = model.logits([1, 200, 33, 2500, 7, 90, 1000, 4])
    assert logits.shape == (8, shape["vocab"]) and np.isfinite(logits).all()
    assert float(logits.std()) > 0.1  # not a dead network
