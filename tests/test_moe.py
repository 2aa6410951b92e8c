"""Mixture-of-experts models: qwen3moe and Mixtral-style experts in llama files.

Conformance: the tiny random-weight F16 models of shared/reference/arch/<arch>/ against
llama.cpp's greedy.json, teacher-forced, with the bars of the dense architectures. Batch
invariance: a sequence's logits are bit-identical alone, token by token, in chunks and
beside another sequence (rows that chose the same expert run through it together, and no
row's numbers depend on which others did).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import gguflm
from gguflm.gguf.errors import MetadataError
from gguflm.model import executor
from gguflm.model.batch import ALL, Part
from gguflm.model.layer import Experts
from refcheck import load_cases, run_reference
from tinymodel import declared_tensors, tiny_metadata

MOE = ["qwen3moe", "mixtral"]


def _model(reference: Path, arch: str) -> tuple[gguflm.model.Model, Path]:
    folder = reference / "arch" / arch
    path = folder / f"tiny-{arch}-f16.gguf"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    return gguflm.load_model(path), folder


@pytest.mark.parametrize("arch", MOE)
def test_conformance(reference: Path, arch: str) -> None:
    """prompt_tokens identical; top-1 agrees wherever llama.cpp's margin is >= 0.25; on each
    step's 20 reference ids, de-shifted max <= 0.5 and median-over-steps max |d| <= 0.15."""
    model, folder = _model(reference, arch)
    assert all(isinstance(b.ffn, Experts) for b in model.blocks)
    tok = gguflm.Tokenizer.from_file(folder / f"tiny-{arch}-f16.gguf")
    for case in load_cases(folder):
        ids = tok.encode(case["prompt"], add_special=True, parse_special=case["special"])
        assert ids == case["prompt_tokens"], case["id"]
    steps = run_reference(model, folder)
    s = steps.summary()
    assert s["steps"] > 500, s
    assert s["dev_max"] <= 0.5, s
    assert s["raw_median"] <= 0.15, s
    assert steps.disagreements(0.25) == [], s


@pytest.mark.parametrize("arch", MOE)
def test_batch_invariance(reference: Path, arch: str) -> None:
    model, _ = _model(reference, arch)
    ids = np.array([5, 300, 77, 1200, 9, 64, 2000, 31, 450, 12, 88, 1500, 7, 260])
    alone = model.logits(ids)
    cache = model.new_cache(32)
    steps = np.stack([model.forward([int(t)], cache) for t in ids])
    np.testing.assert_array_equal(steps, alone)
    cache = model.new_cache(32)
    chunks = [model.forward(ids[a:b], cache, all_logits=True) for a, b in ((0, 5), (5, 6),
                                                                          (6, 14))]
    np.testing.assert_array_equal(np.concatenate(chunks), alone)
    arena = model.new_arena(32, 2)
    other = np.array([900, 3, 44, 1000, 2, 610, 18])
    both = model.forward_batch([Part(arena.slots[0], other, ALL),
                                Part(arena.slots[1], ids, ALL)])
    np.testing.assert_array_equal(both[len(other):], alone)


def test_inspect_names_the_path(reference: Path, capsys) -> None:
    """Attention compiled, the experts op by op (for now), and the output says so."""
    from gguflm.cli import main

    path = reference / "arch" / "qwen3moe" / "tiny-qwen3moe-f16.gguf"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert ("compiled (blocks for every batch; no team: layer 0's FFN is a mixture of "
            "experts, run op by op") in out
    assert "8 (2 used per token)" in out
    with gguflm.gguf.open(path) as f:
        total = sum(t.n_elements for t in f.tensors.values())
        experts = sum(t.n_elements for n, t in f.tensors.items() if "_exps." in n)
    active = next(ln for ln in out.splitlines() if "active params" in ln)
    assert f"({total - experts + experts // 4:,})" in active, active


@pytest.mark.parametrize("arch", MOE)
def test_compiled_attention_matches_the_reference(reference: Path, arch: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    model, _ = _model(reference, arch)
    assert model.plan.compiled, model.plan.describe()
    ids = np.array([5, 300, 77, 1200, 9, 64, 2000, 31, 450, 12, 88, 1500, 7, 260])
    got = model.logits(ids)
    monkeypatch.setattr(model, "plan", executor.Plan(None, "forced by the test"))
    np.testing.assert_array_equal(got, model.logits(ids))


@pytest.mark.parametrize(("used", "count"), [(3, 2), (0, 8)])
def test_expert_counts_are_checked(used: int, count: int) -> None:
    md = tiny_metadata("qwen3moe", expert_count=count, expert_used_count=used)
    with pytest.raises(MetadataError) as e:
        declared_tensors(md)
    assert e.value.key == "qwen3moe.expert_used_count"
