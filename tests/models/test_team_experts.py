"""The team's mixture-of-experts FFN (``team_experts``): in a model whose every layer is
attention and experts with integer kernels, decoding and short prompts run every layer,
the router, the choice and the chosen experts included, in one team call; its logits are
the fused layers' (``fused_experts.moe_step``) and the reference path's bit for bit,
whether the team has its threads, runs on this thread alone or has more members than
threads; and a perturbed team step makes the comparison fail.

The tiny qwen3moe (softmax gating, renormalised weights) and Mixtral references,
quantized to Q4_K_M and Q8_0.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import gguflm
from gguflm.model import team
from gguflm.quant import matrix
from refcheck import counted, path_batches, quantized_tiny, reference_batches

TEAM = "compiled (team for decoding and short prompts, fused layers for longer batches)"


@pytest.fixture(scope="module")
def quantized(reference: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return quantized_tiny(reference, tmp_path_factory.mktemp("team"),
                          (("qwen3moe", "Q4_K_M"), ("mixtral", "Q8_0")))


def _layer_by_layer(model, monkeypatch: pytest.MonkeyPatch) -> np.ndarray:  # noqa: ANN001
    with monkeypatch.context() as m:
        m.setattr(team, "MAX_ROWS", 0)
        return path_batches(model)


@pytest.mark.parametrize("arch", ["qwen3moe", "mixtral"])
def test_the_team_runs_the_experts_as_the_fused_layers_do(
        quantized: dict[str, Path], monkeypatch: pytest.MonkeyPatch, arch: str) -> None:
    model = gguflm.load_model(quantized[arch])
    assert model.plan.describe() == TEAM, model.plan.describe()
    fused = _layer_by_layer(model, monkeypatch)
    np.testing.assert_array_equal(fused, reference_batches(model, monkeypatch))
    alone = counted(monkeypatch, team, "stack_alone")
    together = counted(monkeypatch, team, "stack_team")
    monkeypatch.setattr(matrix, "PARALLEL_MIN_MACS", 1 << 40)  # too small to share
    got = {"alone": path_batches(model)}
    monkeypatch.setattr(matrix, "PARALLEL_MIN_MACS", 0)
    monkeypatch.setattr(matrix, "threads", lambda: 2)
    got["team"] = path_batches(model)
    monkeypatch.setattr(matrix, "threads", lambda: 5)  # more members than threads
    got["crowded"] = path_batches(model)
    assert alone[0] > 0 and together[0] > 0
    for how, logits in got.items():
        assert np.isfinite(logits).all(), how
        np.testing.assert_array_equal(logits, fused, err_msg=how)


@pytest.mark.parametrize("what", ["scale", "renormalise", "router"])
def test_the_comparison_sees_the_team_experts_off(
        quantized: dict[str, Path], monkeypatch: pytest.MonkeyPatch, what: str) -> None:
    model = gguflm.load_model(quantized["qwen3moe"])
    fused = _layer_by_layer(model, monkeypatch)
    stack = model.plan.tables()[1]
    if what == "scale":
        stack.escale = np.float32(1.0001)
    elif what == "renormalise":
        stack.choice = (*stack.choice[:4], 0)
    else:  # another layer's router
        stack.wtab[0, 7] = stack.wtab[1, 7]
    got = path_batches(model)
    assert not np.array_equal(got, fused)


def test_the_plan_says_why_the_team_does_not_take_experts(reference: Path) -> None:
    """F16 experts (the tiny reference itself), and a shared expert, run fused layer by
    layer, and the plan says why."""
    from refcheck import load_tiny

    f16 = load_tiny(reference, "qwen3moe")[0].plan.describe()
    assert f16 == ("compiled (fused layers for every batch; no team: layer 0's FFN is a "
                   "mixture of experts (fused: the router, the top-k and the chosen experts "
                   "in one compiled call) with float experts, which the team does not "
                   "take)"), f16
    glm = load_tiny(reference, "glm4moe")[0].plan.describe()
    assert "which the team does not take" in glm, glm
