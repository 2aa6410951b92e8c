"""The planner decides each part of a layer apart (``executor.plan``, issue 51): a layer
whose mixer, FFN or extra input the fused steps cannot take runs that part on the reference
path and the rest fused; the plan names each part's path, and the logits are the reference
path's bit for bit (``reference.stack`` forced: every part op by op).

The tiny random-weight hybrids of the reference data (a recurrent mixer beside attention)
and a Gemma 4 whose values are not normed (its attention fused, its shared-KV attention,
float16-table GELU FFN, per-layer input and output scale on the reference path), and a tiny
model with one weight in a type without a compiled product.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

import gguflm
from gguflm.cli.common import say_if_not_compiled
from gguflm.gguf.types import GGMLType
from gguflm.model import executor
from gguflm.model.batch import ALL, LAST, Part
from gguflm.model.forward_pass import HEAD, LAYER
from refcheck import load_tiny
from tinymodel import random_tensors, tiny_metadata, write_model


def _run(model) -> np.ndarray:  # noqa: ANN001
    """Logits of a prefill, decode steps, a prefill wanting its last row only (``rows``),
    then two sequences batched."""
    arena = model.new_arena(40, 2)
    a, b = arena.slots
    out = [model.forward_batch([Part(a, np.arange(3, 12), ALL)])]
    for t in range(3):
        out.append(model.forward_batch([Part(a, np.array([20 + t]), ALL)]))
    out.append(model.forward_batch([Part(b, np.arange(5, 25), LAST)]))
    out.append(model.forward_batch([Part(b, np.arange(7, 10), ALL),
                                    Part(a, np.array([40]), ALL)]))
    return np.concatenate(out)


def _reference(model, monkeypatch: pytest.MonkeyPatch) -> np.ndarray:  # noqa: ANN001
    with monkeypatch.context() as m:
        m.setattr(model, "plan", executor.Plan(None, "forced by the test"))
        return _run(model)


# each hybrid's fused parts, then the first of those on the reference path
HYBRIDS = {
    "qwen35": ("fused: the FFN in layers 0-3; reference (numpy, op by op): in layers 0, 2, "
               "the gated delta net (a recurrent mixer)"),
    "lfm2": ("fused: the attention in layers 2, 4, the FFN in layers 0-5; reference (numpy, "
             "op by op): in layers 0-1, 3, 5, the gated short convolution"),
    "granitehybrid": ("fused: the attention in layers 2, 4; reference (numpy, op by op): in "
                      "layers 0-1, 3, the Mamba2 state-space mixer"),
    "deepseek2": ("fused: the FFN in layer 0; reference (numpy, op by op): in layers 0-2, "
                  "the multi-head latent attention"),
}


@pytest.mark.parametrize("arch", list(HYBRIDS))
def test_a_hybrid_runs_its_parts_fused_or_reference_with_the_reference_numbers(
        reference: Path, monkeypatch: pytest.MonkeyPatch, arch: str) -> None:
    model, _ = load_tiny(reference, arch)
    plan = model.plan.describe()
    assert model.plan.compiled and model.plan.mixed, plan
    assert plan.startswith("compiled per part (fused layers for every batch; no team: some "
                           "parts run on the reference path): "), plan
    assert HYBRIDS[arch] in plan, plan
    got = _run(model)
    assert np.isfinite(got).all()
    np.testing.assert_array_equal(got, _reference(model, monkeypatch))


def test_the_gated_attention_and_the_experts_are_named_on_the_reference_path(
        reference: Path) -> None:
    """Qwen3.5's gated attention, and an expert FFN beside a reference mixer, are named."""
    plan = load_tiny(reference, "qwen35")[0].plan.describe()
    assert ("in layers 1, 3, the attention, which has what the fused step does not take yet: "
            "an output gate (joint Q+gate rows)") in plan, plan
    moe = load_tiny(reference, "lfm2moe")[0].plan.describe()
    assert "in layers 1-3, the FFN, a mixture of experts, run op by op: the router" in moe


@pytest.fixture(scope="module")
def gemma4_fused_attention(reference: Path):  # noqa: ANN201
    """The tiny Gemma 4 with its values' norm dropped: its own-KV attention (layers 0-2)
    fused, the rest on the reference path (other numbers than the file's: compared path
    against path)."""
    model, _ = load_tiny(reference, "gemma4")
    assert not model.plan.compiled  # as the file is: no part fused
    blocks = [b if b.attn.v_norm is None or b.attn.kv_layer is not None
              else dataclasses.replace(b, attn=dataclasses.replace(b.attn, v_norm=None))
              for b in model.blocks]
    model.blocks = blocks
    model.plan = executor.plan(blocks)
    return model


def test_gemma4_per_layer_inputs_run_after_fused_attention(
        gemma4_fused_attention, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """Per-layer inputs, the output scale and the shared keys and values (stored by the
    fused attention, read by the reference one) give the reference path's logits."""
    model = gemma4_fused_attention
    plan = model.plan.describe()
    assert model.plan.mixed and model.plan.team_reason, plan
    assert ("fused: the attention in layers 0-2; reference (numpy, op by op): in layers 3-5, "
            "the attention, which has what the fused step does not take yet: keys and values "
            "shared from an earlier layer; in layers 0-5, the FFN, which has what the fused "
            "step does not take yet: GELU through ggml's float16 table; in layers 0-5, a "
            "per-layer embedding input; in layers 0-5, an output scale") in plan, plan
    got = _run(model)
    assert np.isfinite(got).all()
    np.testing.assert_array_equal(got, _reference(model, monkeypatch))


def test_a_mixed_pass_stops_between_every_layer(gemma4_fused_attention) -> None:  # noqa: ANN001
    model = gemma4_fused_attention

    def parts() -> list[Part]:
        arena = model.new_arena(16, 2)
        return [Part(s, np.array([5 + k, 9, 17 + k]), LAST) for k, s in enumerate(arena.slots)]

    want = model.forward_batch(parts())
    run = model.forward_steps(parts())
    stops = []
    run.stop()
    for where in run:
        stops.append(where)
        run.stop()
    assert stops == [LAYER] * (len(model.blocks) - 1) + [HEAD]
    np.testing.assert_array_equal(run.logits, want)


def test_a_weight_without_a_compiled_product_sends_its_part_alone_to_the_reference(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture) -> None:
    """Layer 0's Q in TQ2_0: that attention on the reference path, said with the weight's
    name and type; the other parts fused; the logits the reference path's."""
    md = tiny_metadata("qwen2", embedding_length=256, feed_forward_length=256)
    tensors = random_tensors(md)
    types = {n: GGMLType.Q8_0 for n, t in tensors.items() if n.startswith("blk.") and t.ndim == 2}
    model = gguflm.load_model(write_model(tmp_path / "m.gguf", md, tensors,
                                          {**types, "blk.0.attn_q.weight": GGMLType.TQ2_0}))
    plan = model.plan.describe()
    assert model.plan.compiled and model.plan.mixed, plan
    assert ("fused: the attention in layer 1, the FFN in layers 0-1; reference (numpy, op "
            "by op): in layer 0, the attention: blk.0.attn_q.weight (Q/K/V) is TQ2_0, which "
            "has no compiled product (only a dequantizing one)") in plan, plan
    np.testing.assert_array_equal(_run(model), _reference(model, monkeypatch))
    say_if_not_compiled(model)  # a slower part is never taken silently
    assert capsys.readouterr().err == f"note: the layers run {plan}\n"


def test_no_part_compiled_runs_the_reference_path_and_says_why(tmp_path: Path) -> None:
    md = tiny_metadata("qwen2", embedding_length=256, feed_forward_length=256)
    tensors = random_tensors(md)
    types = {n: GGMLType.TQ2_0 for n, t in tensors.items() if n.startswith("blk.") and t.ndim == 2}
    model = gguflm.load_model(write_model(tmp_path / "m.gguf", md, tensors, types))
    assert not model.plan.compiled and not model.plan.mixed
    assert model.plan.describe() == (
        "reference (numpy, op by op): no part of any layer has a fused step: in layers 0-1, "
        "the attention: blk.0.attn_q.weight (Q/K/V) is TQ2_0, which has no compiled product "
        "(only a dequantizing one); in layers 0-1, the FFN: blk.0.ffn_gate.weight (FFN "
        "gate/up) is TQ2_0, which has no compiled product (only a dequantizing one)")


def test_a_plan_without_the_team_needs_only_the_fused_layers(
        reference: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A model the team cannot take (a hybrid, experts) decodes through the fused layers:
    once they are in the cache it is compiled, whether or not any model has compiled the
    team, so a first run's background compilation ends in them instead of waiting for a
    team it never builds."""
    from gguflm.model import base, team
    from gguflm.quant import jitcache

    model = load_tiny(reference, "qwen35")[0]
    assert model.plan.team_reason
    model.forward([1, 2], model.new_cache(4))  # the fused layers compiled or loaded
    real = jitcache.cached
    monkeypatch.setattr(jitcache, "cached", lambda fns: team.stack_team not in fns
                        and real(fns))  # as if no model had compiled the team
    kinds = model.kernel_types()
    assert base.compiled(kinds, False) and not base.compiled(kinds, True)
    assert not base._compile_steps(kinds, True, False).keys() & {"decoding", "prompts"}
    assert "decoding" in base._compile_steps(kinds, True, True)
