"""The planner decides each part of a layer apart (``executor.plan``, issue 51): a layer
whose mixer, FFN or extra input the fused steps cannot take runs that part on the reference
path and the rest fused; the plan names each part's path, and the logits are the reference
path's bit for bit (``reference.stack`` forced: every part op by op).

The tiny random-weight hybrids of the reference data (a recurrent mixer beside attention),
the tiny Qwen3.5s and LFM2s (every part fused: the gated delta net or short convolution
beside the attention, without the team; a quantized Qwen3.5 with one delta net on the
reference path), the tiny Gemma 4s (their attention fused: values normed, V = K's product,
keys and values shared from an earlier layer; the dense FFN's float16-table GELU fused;
the per-layer inputs and output scale fused; the MoE model's experts beside a dense FFN,
their router reading its own norm of the FFN's input, fused in one call), each with every
part fused, and a tiny model with one weight in a type without a compiled product. The
expert FFNs run fused (``fused_experts``; their own tests: test_fused_experts.py). Each
new fused part, perturbed, makes the comparison fail.
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
from refcheck import path_batches as _run
from refcheck import reference_batches as _reference
from tinymodel import random_tensors, tiny_metadata, write_model

# each hybrid's fused parts, then the first of those on the reference path
HYBRIDS = {
    # the dense FFN of layer 0 and the experts of layers 1-2
    "deepseek2": ("fused: the FFN in layers 0-2; reference (numpy, op by op): in layers 0-2, "
                  "the multi-head latent attention"),
}


def _spied(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How many times the fused attention, FFN and experts steps run from now on."""
    from gguflm.model import fused

    calls = {"attention": 0, "ffn": 0, "delta_net": 0, "short_conv": 0, "experts": 0}
    for name in calls:
        real = getattr(fused, name)

        def spy(*args, _real=real, _name=name):  # noqa: ANN001, ANN002, ANN202
            calls[_name] += 1
            return _real(*args)
        monkeypatch.setattr(fused, name, spy)
    return calls


@pytest.mark.parametrize("arch", list(HYBRIDS))
def test_a_hybrid_runs_its_parts_fused_or_reference_with_the_reference_numbers(
        reference: Path, monkeypatch: pytest.MonkeyPatch, arch: str) -> None:
    model, _ = load_tiny(reference, arch)
    plan = model.plan.describe()
    assert model.plan.compiled and model.plan.mixed, plan
    assert plan.startswith("compiled per part (fused layers for every batch; no team: some "
                           "parts run on the reference path): "), plan
    assert HYBRIDS[arch] in plan, plan
    calls = _spied(monkeypatch)
    got = _run(model)
    fused = HYBRIDS[arch].split("; reference")[0]
    assert (bool(calls["attention"]), bool(calls["ffn"] or calls["experts"]),
            calls["delta_net"], calls["short_conv"]) == (
        "the attention in" in fused, "the FFN in" in fused, 0, 0), calls
    assert np.isfinite(got).all()
    np.testing.assert_array_equal(got, _reference(model, monkeypatch))


@pytest.mark.parametrize("kv_type", ["q8_0", "f32"])
@pytest.mark.parametrize("arch", ["qwen35", "gemma4", "gemma4-moe"])
def test_the_new_fused_attentions_with_other_cache_types(
        reference: Path, monkeypatch: pytest.MonkeyPatch, arch: str, kv_type: str) -> None:
    """The gated attention, the normed values, V = K's product and the shared keys and
    values through a Q8_0 and a float32 cache: the reference path's logits."""
    model, _ = load_tiny(reference, arch)
    model.use_kv_type(kv_type)
    np.testing.assert_array_equal(_run(model), _reference(model, monkeypatch))


def _no_team(mixer: str) -> str:
    return (f"compiled (fused layers for every batch; no team: layer 0 has the gated {mixer} "
            "(a recurrent mixer), which the team does not take)")


# each model's fused calls in ``_run`` (6 batches) by fused step; its fused FFNs' layers
# (dense or experts: ``fused_experts``)
RECURRENT = {
    "qwen35": ("delta net", {"attention": 2 * 6, "ffn": 4 * 6, "delta_net": 2 * 6,
                             "short_conv": 0, "experts": 0}, [0, 1, 2, 3]),
    "qwen35moe": ("delta net", {"attention": 6, "ffn": 0, "delta_net": 6, "short_conv": 0,
                                "experts": 2 * 6}, [0, 1]),
    "lfm2": ("short convolution", {"attention": 2 * 6, "ffn": 6 * 6, "delta_net": 0,
                                   "short_conv": 4 * 6, "experts": 0}, [0, 1, 2, 3, 4, 5]),
    "lfm2moe": ("short convolution", {"attention": 6, "ffn": 6, "delta_net": 0,
                                      "short_conv": 3 * 6, "experts": 3 * 6}, [0, 1, 2, 3]),
}


@pytest.mark.parametrize("arch", list(RECURRENT))
def test_the_recurrent_mixers_run_fused_with_the_reference_numbers(
        reference: Path, monkeypatch: pytest.MonkeyPatch, arch: str) -> None:
    """The gated delta nets (``fused.delta_net``) and short convolutions
    (``fused.short_conv``) fused beside the attention and the FFNs (dense or experts);
    not the team, which takes no recurrent mixer. A prefill, decode steps,
    a last-row prefill, two sequences batched."""
    mixer, calls, dense = RECURRENT[arch]
    model, _ = load_tiny(reference, arch)
    assert model.plan.describe() == _no_team(mixer)
    assert all(p.mixer is None for p in model.plan.paths)
    assert [il for il, p in enumerate(model.plan.paths) if p.ffn is None] == dense
    spied = _spied(monkeypatch)
    got = _run(model)
    assert spied == calls
    assert np.isfinite(got).all()
    np.testing.assert_array_equal(got, _reference(model, monkeypatch))


def _three_sequences(model) -> np.ndarray:  # noqa: ANN001
    """Logits of a prompt, then its next chunk beside a new sequence's prompt (its last row)
    and a one-token new sequence, then a decode step of all three, then two of them."""
    arena = model.new_arena(32, 3)
    a, b, c = arena.slots
    out = [model.forward_batch([Part(a, np.arange(40, 47), ALL)])]
    out.append(model.forward_batch([Part(b, np.arange(9, 14), LAST), Part(a, np.arange(3, 8),
                                    ALL), Part(c, np.array([77]), ALL)]))
    out.append(model.forward_batch([Part(s, np.array([60 + k]), ALL)
                                    for k, s in enumerate((c, a, b))]))
    out.append(model.forward_batch([Part(b, np.array([61, 62]), ALL),
                                    Part(c, np.array([63]), ALL)]))
    return np.concatenate(out)


@pytest.mark.parametrize("arch", list(RECURRENT))
def test_the_fused_recurrent_mixers_with_chunks_and_new_sequences_beside_others(
        reference: Path, monkeypatch: pytest.MonkeyPatch, arch: str) -> None:
    """Each sequence from its own state (a new one from zeros), whatever its neighbours in
    the batch: the reference path's logits."""
    model, _ = load_tiny(reference, arch)
    got = _three_sequences(model)
    with monkeypatch.context() as m:
        m.setattr(model, "plan", executor.Plan(None, "forced by the test"))
        want = _three_sequences(model)
    np.testing.assert_array_equal(got, want)


def test_the_mamba2_mixers_run_fused_with_the_reference_numbers(
        reference: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Granite 4.0-H's Mamba2 mixers (``fused.mamba2``) fused beside the attention and the
    experts, without the team; chunks and new sequences beside others."""
    from gguflm.model import fused

    model, _ = load_tiny(reference, "granitehybrid")
    assert model.plan.describe() == (
        "compiled (fused layers for every batch; no team: layer 0 has the Mamba2 state-space "
        "mixer (a recurrent mixer), which the team does not take)")
    calls = []
    real = fused.mamba2
    monkeypatch.setattr(fused, "mamba2", lambda *a: calls.append(1) or real(*a))
    got = _run(model), _three_sequences(model)
    assert len(calls) == 3 * 6 + 3 * 4, len(calls)
    with monkeypatch.context() as m:
        m.setattr(model, "plan", executor.Plan(None, "forced by the test"))
        want = _run(model), _three_sequences(model)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


def test_the_plan_lists_the_compiled_steps_a_first_run_compiles(reference: Path) -> None:
    """Besides the attention's and the dense FFN's steps (``base._layer_code``), each fused
    mixer's, experts' and per-layer input's: what ``base.compiled`` checks the cache for."""
    from gguflm.model import base

    steps = {arch: load_tiny(reference, arch)[0].plan.steps
             for arch in ("qwen35", "lfm2", "granitehybrid", "gemma4", "gemma4-moe",
                          "qwen3")}
    assert steps == {
        "qwen35": ("deltanet.sequence", "fused_recurrent.delta_in",
                   "fused_recurrent.delta_last"),
        "lfm2": ("fused_recurrent.short_in", "fused_recurrent.short_last",
                 "shortconv.sequence"),
        "granitehybrid": ("fused_experts.moe_step", "fused_recurrent.mamba_in",
                          "fused_recurrent.mamba_last", "mamba2.sequence"),
        "gemma4": ("fused.end_step",), "gemma4-moe": ("fused_experts.dense_moe_step",),
        "qwen3": ()}, steps
    assert len(base._layer_code(False, steps["granitehybrid"])) == 2 + 4


def _quantized(arch: str) -> tuple[dict, dict]:
    """A tiny random Qwen3.5 (4 layers: delta nets in 0 and 2) or LFM2 (3 layers: short
    convolutions in 0 and 2): its metadata, and its 2-D weights' types: Q8_0, layer 0's
    alpha or in_proj F16 (a group of two types, or F16 alone), layer 2's beta or output
    F32 (no compiled product); the convolutions' taps F32."""
    from test_archs_lfm2 import LFM2_TINY
    from test_qwen35 import QWEN35_TINY

    md = (tiny_metadata("qwen35", **QWEN35_TINY, block_count=4) if arch == "qwen35" else
          tiny_metadata("lfm2", **LFM2_TINY))
    odd = ({"blk.0.ssm_alpha.weight": GGMLType.F16, "blk.2.ssm_beta.weight": GGMLType.F32}
           if arch == "qwen35" else {"blk.0.shortconv.in_proj.weight": GGMLType.F16,
                                     "blk.2.shortconv.out_proj.weight": GGMLType.F32})
    return md, odd


@pytest.mark.parametrize(("arch", "step", "want"), [
    ("qwen35", "delta_net", "fused: the attention in layers 1, 3, the gated delta net in layer "
     "0, the FFN in layers 0-3; reference (numpy, op by op): in layer 2, the gated delta net: "
     "blk.2.ssm_beta.weight (beta/alpha) is F32, which has no compiled product"),
    ("lfm2", "short_conv", "fused: the attention in layer 1, the gated short convolution in "
     "layer 0, the FFN in layers 0-2; reference (numpy, op by op): in layer 2, the gated short "
     "convolution: blk.2.shortconv.out_proj.weight (output) is F32, which has no compiled "
     "product")])
def test_quantized_recurrent_mixers_fused_beside_one_on_the_reference_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, arch: str, step: str,
        want: str) -> None:
    """``_quantized``'s model: layer 2's mixer on the reference path, named, layer 0's
    fused; the logits the reference path's."""
    md, odd = _quantized(arch)
    tensors = random_tensors(md, seed=7)
    types = {n: GGMLType.Q8_0 for n, t in tensors.items()
             if n.startswith("blk.") and t.ndim == 2 and "conv" not in n.split(".")[-2]}
    model = gguflm.load_model(write_model(tmp_path / "q.gguf", md, tensors, types | odd))
    plan = model.plan.describe()
    assert model.plan.compiled and model.plan.mixed, plan
    assert want in plan, plan
    spied = _spied(monkeypatch)
    got = _run(model)
    assert spied[step] == 6, spied
    np.testing.assert_array_equal(got, _reference(model, monkeypatch))


def _perturbed_gate(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fused attention's output gate a little off (the reference path's untouched)."""
    from types import SimpleNamespace

    from gguflm.model import fused, ops

    monkeypatch.setattr(fused, "ops", SimpleNamespace(
        sigmoid=lambda g: ops.sigmoid(g) * np.float32(1.0001),
        gelu_f16_table=ops.gelu_f16_table))


def _float32_gelu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fused FFN's GELU in float32, not through ggml's float16 table."""
    from gguflm.model import fused

    monkeypatch.setattr(fused, "GLU_ACTS", {**fused.GLU_ACTS, "gelu_f16": 1})


def _no_value_norm(model) -> None:  # noqa: ANN001
    """The fused attention's values not normed."""
    from gguflm.model import fused

    layers, stack = model.plan.tables()
    model.plan._tables = (tuple(dataclasses.replace(
        la, norms=(*la.norms[:7], fused.vector(None))) for la in layers), stack)


def _layer_end_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fused per-layer input's output scale a little off."""
    from gguflm.model import fused

    real = fused.end_step

    def off(*args):  # noqa: ANN002, ANN202
        return real(*args[:10], args[10] * np.float32(1.001), *args[11:])
    monkeypatch.setattr(fused, "end_step", off)


def _dense_moe_off(model, what: str) -> None:  # noqa: ANN001
    """The fused dense-beside-experts FFN's router input norm (``router_in_norm``), its
    experts' post norm or its dense FFN's post norm a little off (the reference path's
    untouched)."""
    from gguflm.model import fused

    def off(w: np.ndarray) -> np.ndarray:
        return fused.vector(w * np.float32(1.0001))

    def replaced(da):  # noqa: ANN001, ANN202
        ea = da.experts
        if what == "router_in_norm":
            return dataclasses.replace(da, experts=dataclasses.replace(
                ea, router=(*ea.router[:4], off(ea.router[4]), ea.router[5])))
        if what == "experts_post_norm":
            return dataclasses.replace(da, experts=dataclasses.replace(
                ea, norms=(ea.norms[0], off(ea.norms[1]))))
        return dataclasses.replace(da, norms=(da.norms[0], off(da.norms[1]), da.norms[2]))

    layers, stack = model.plan.tables()
    model.plan._tables = (tuple(dataclasses.replace(la, experts=replaced(la.experts))
                                for la in layers), stack)


def _delta_off(model, what: str) -> None:  # noqa: ANN001
    """The fused recurrent mixers' convolution taps, or the delta nets' read-out norm
    weight, a little off (the reference path's untouched)."""
    from gguflm.model import fused

    layers, stack = model.plan.tables()
    model.plan._tables = (tuple(la if la.mixer is None else dataclasses.replace(
        la, mixer=dataclasses.replace(la.mixer, **{what: fused.vector(
            getattr(la.mixer, what) * np.float32(1.0001))})) for la in layers), stack)


def _other_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fused attentions that read layer 1's keys and values read layer 0's (of the
    same shape) instead."""
    from gguflm.model import fused

    real = fused.attention

    def other(x, b, la, batch, il, rot):  # noqa: ANN001, ANN202
        if b.attn.kv_layer == 1:
            b = dataclasses.replace(b, attn=dataclasses.replace(b.attn, kv_layer=0))
        return real(x, b, la, batch, il, rot)
    monkeypatch.setattr(fused, "attention", other)


@pytest.mark.parametrize(("arch", "perturb"), [
    ("qwen35", lambda model, mp: _perturbed_gate(mp)),
    ("gemma4", lambda model, mp: _float32_gelu(mp)),
    ("gemma4-moe", lambda model, mp: _no_value_norm(model)),
    ("gemma4-moe", lambda model, mp: _dense_moe_off(model, "router_in_norm")),
    ("gemma4-moe", lambda model, mp: _dense_moe_off(model, "experts_post_norm")),
    ("gemma4-moe", lambda model, mp: _dense_moe_off(model, "dense_post_norm")),
    ("gemma4", lambda model, mp: _other_cache(mp)),
    ("gemma4", lambda model, mp: _layer_end_off(mp)),
    ("qwen35", lambda model, mp: _delta_off(model, "conv")),
    ("qwen35moe", lambda model, mp: _delta_off(model, "norm")),
    ("lfm2moe", lambda model, mp: _delta_off(model, "conv")),
    ("granitehybrid", lambda model, mp: _delta_off(model, "conv")),
    ("granitehybrid", lambda model, mp: _delta_off(model, "d"))],
    ids=["output gate", "float16-table GELU", "value norm", "router input norm",
         "experts' post norm", "dense post norm beside experts", "shared keys and values",
         "per-layer input", "delta net convolution", "delta net read-out norm",
         "short convolution", "Mamba2 convolution", "Mamba2 D skip"])
def test_the_comparison_sees_a_fused_part_off(reference: Path, monkeypatch: pytest.MonkeyPatch,
                                              arch: str, perturb) -> None:  # noqa: ANN001
    """The checks above can fail: each new fused part, perturbed, changes the logits."""
    model, _ = load_tiny(reference, arch)
    want = _reference(model, monkeypatch)
    with monkeypatch.context() as m:
        perturb(model, m)
        got = _run(model)
    assert not np.array_equal(got, want)


def test_the_experts_beside_a_reference_mixer_are_fused(reference: Path) -> None:
    """An expert FFN beside a reference mixer runs fused (``fused_experts``), and the plan
    says so."""
    moe = load_tiny(reference, "deepseek2")[0].plan.describe()
    assert "fused: the FFN in layers 0-2; reference" in moe, moe
    assert "mixture of experts" not in moe, moe


def test_gemma4_with_its_per_layer_inputs_runs_every_part_fused(
        reference: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tiny Gemma 4 as the file has it: the attention, the FFN and the per-layer input
    with the output scale (``fused.end_step``) fused in every layer."""
    from gguflm.model import fused

    model, _ = load_tiny(reference, "gemma4")
    plan = model.plan.describe()
    assert model.plan.compiled and not model.plan.mixed, plan
    assert plan == ("compiled (fused layers for every batch; no team: layer 0 has values "
                    "RMS-normed, GELU through ggml's float16 table, a per-layer embedding "
                    "input, an output scale, which the team does not take)"), plan
    calls = _spied(monkeypatch)
    ends = []
    real = fused.end_step
    monkeypatch.setattr(fused, "end_step", lambda *a: ends.append(1) or real(*a))
    got = _run(model)
    assert (calls["attention"], calls["ffn"], len(ends)) == (6 * 6,) * 3, (calls, ends)
    np.testing.assert_array_equal(got, _reference(model, monkeypatch))


# the tiny Gemma 4 MoE's plan: every part fused, the FFN in one call a layer
GEMMA4_MOE = ("compiled (fused layers for every batch; no team: layer 0 has values RMS-normed, "
              "GELU through ggml's float16 table, a dense FFN beside a mixture of experts "
              "(fused: the dense FFN, the router, the top-k and the chosen experts in one "
              "compiled call), an output scale, which the team does not take)")


def test_gemma4_moe_runs_every_part_fused(reference: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture) -> None:
    """The tiny Gemma 4 MoE: the attention and the dense FFN beside the experts (their
    router reading rms_norm(x) x scale x ``router_in_norm`` of the FFN's input; each
    branch post-normed, the sum post-normed: ``fused_experts.dense_moe_step``) fused in
    every layer, as ``inspect`` says; the reference path's logits for prompts, decode
    steps, a last-row prefill, chunks beside new sequences."""
    from gguflm.cli import main
    from gguflm.model import fused_experts

    model, folder = load_tiny(reference, "gemma4-moe")
    assert model.plan.compiled and not model.plan.mixed
    assert model.plan.describe() == GEMMA4_MOE
    assert main(["inspect", str(folder / "tiny-gemma4-moe-f16.gguf")]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if "layers run" in ln)
    assert GEMMA4_MOE in line, line
    calls = _spied(monkeypatch)
    steps = []
    real = fused_experts.dense_moe_step
    monkeypatch.setattr(fused_experts, "dense_moe_step", lambda *a: steps.append(1) or real(*a))
    got = _run(model), _three_sequences(model)
    assert calls == {"attention": 3 * 10, "ffn": 0, "delta_net": 0, "short_conv": 0,
                     "experts": 3 * 10}, calls
    assert len(steps) == 3 * 10
    with monkeypatch.context() as m:
        m.setattr(model, "plan", executor.Plan(None, "forced by the test"))
        want = _run(model), _three_sequences(model)
    for g, w in zip(got, want, strict=True):
        assert np.isfinite(g).all()
        np.testing.assert_array_equal(g, w)


def test_a_dense_ffn_beside_experts_the_fused_step_does_not_take_runs_op_by_op(
        reference: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tiny Gemma 4 MoE's experts with a sigmoid gating (two compiled calls around
    numpy's sigmoid, which the one-call step does not take): that FFN on the reference
    path, named, the attention fused; the logits the reference path's."""
    model, _ = load_tiny(reference, "gemma4-moe")
    blocks = [dataclasses.replace(b, ffn=dataclasses.replace(
        b.ffn, experts=dataclasses.replace(b.ffn.experts, gating="sigmoid")))
        for b in model.blocks]
    model.blocks = blocks
    model.plan = executor.plan(blocks)
    plan = model.plan.describe()
    assert model.plan.compiled and model.plan.mixed, plan
    assert plan.endswith(
        "fused: the attention in layers 0-2; reference (numpy, op by op): in layers 0-2, the "
        "FFN, a dense FFN beside experts, op by op: the fused step does not take its "
        "experts: experts in more than one compiled call"), plan
    assert model.plan.steps == ()
    calls = _spied(monkeypatch)
    got = _run(model)
    assert (calls["attention"], calls["experts"]) == (3 * 6, 0), calls
    np.testing.assert_array_equal(got, _reference(model, monkeypatch))


@pytest.fixture(scope="module")
def gemma4_whole(reference: Path):  # noqa: ANN201
    """The tiny Gemma 4 without its per-layer inputs and output scale: every part fused,
    not the team, which does not take its attention and GELU (other numbers than the
    file's: compared path against path)."""
    model, _ = load_tiny(reference, "gemma4")
    blocks = [dataclasses.replace(b, per_layer=None, out_scale=1.0) for b in model.blocks]
    model.blocks = blocks
    model.plan = executor.plan(blocks)
    return model


def test_gemma4_every_part_fused_runs_without_the_team(
        gemma4_whole, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    model = gemma4_whole
    plan = model.plan.describe()
    assert model.plan.compiled and not model.plan.mixed, plan
    assert plan == ("compiled (fused layers for every batch; no team: layer 0 has values "
                    "RMS-normed, GELU through ggml's float16 table, which the team does not "
                    "take)"), plan
    calls = _spied(monkeypatch)
    got = _run(model)
    assert calls == {"attention": 6 * 6, "ffn": 6 * 6, "delta_net": 0, "short_conv": 0,
                     "experts": 0}, calls
    assert np.isfinite(got).all()
    np.testing.assert_array_equal(got, _reference(model, monkeypatch))


def _past_the_window(model) -> np.ndarray:  # noqa: ANN001
    """Logits of a prompt longer than the sliding layers' window (32), then decode steps."""
    arena = model.new_arena(48, 1)
    s = arena.slots[0]
    out = [model.forward_batch([Part(s, np.arange(1, 41), ALL)])]
    out += [model.forward_batch([Part(s, np.array([50 + t]), ALL)]) for t in range(3)]
    return np.concatenate(out)


def test_gemma4_fused_past_the_window(gemma4_whole,  # noqa: ANN001
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    model = gemma4_whole
    assert {b.attn.window for b in model.blocks} == {0, 32}
    got = _past_the_window(model)
    with monkeypatch.context() as m:
        m.setattr(model, "plan", executor.Plan(None, "forced by the test"))
        want = _past_the_window(model)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("arch", ["gemma4", "deepseek2"])
def test_a_pass_without_the_team_stops_between_every_layer(reference: Path, arch: str) -> None:
    """Layer by layer, every part fused (gemma4) or some on the reference path (a mixed
    plan: deepseek2's latent attention, its per-head products in F16)."""
    model, _ = load_tiny(reference, arch)
    assert model.plan.compiled and model.plan.team_reason
    assert model.plan.mixed == (arch == "deepseek2")

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


def test_the_fused_float16_table_gelu_is_its_numpy_twins() -> None:
    """``fused.geglu_f16`` against ``ops.geglu_f16`` bit for bit: every float16, the
    values around the bounds at +-10 (and at the float16 roundings to them), random
    float32s, infinities."""
    from gguflm.model import fused, ops

    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    edges = [np.nextafter(np.float32(c), np.float32(d)) for c in (-10, 10, -9.997, 9.997)
             for d in (-20, 20)]
    rng = np.random.default_rng(5)
    x = np.concatenate([every.astype(np.float32)[np.isfinite(every)], edges,
                        [np.float32(-10), np.float32(10), np.inf, -np.inf],
                        rng.normal(0, 6, 4000).astype(np.float32)]).astype(np.float32)
    x = x[: len(x) - len(x) % 64].reshape(-1, 64)
    up = rng.normal(0, 1, x.shape).astype(np.float32)
    out = np.empty_like(x)
    fused.geglu_f16(x, up, ops.gelu_f16_table(), out)
    want = ops.geglu_f16(x, up)
    np.testing.assert_array_equal(out.view(np.uint32), want.view(np.uint32))
