"""The fused experts (``fused_experts``): a mixture-of-experts FFN as one compiled call a
layer (two around numpy's sigmoid for a sigmoid gating; a shared expert's sigmoid gate
after it) gives the reference path's logits bit for bit (``reference.stack`` forced: the
experts op by op).

The tiny random-weight MoE models of the reference data (F16 experts: the float kernel),
three of them quantized (the integer kernels, one call for every chosen expert's gate and
up, one for the downs), in prefills, decode steps, a last-row prefill and two sequences
batched; the selection's pieces against their numpy twins on ties, grouped selection and
every gating; and each fused piece, perturbed, makes the comparison fail.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

import gguflm
from gguflm.model import executor, team
from gguflm.model.layer import Experts
from refcheck import load_tiny, quantized_tiny
from refcheck import path_batches as _run
from refcheck import reference_batches as _reference

# the tiny MoE models (every gating: softmax, sigmoid, gpt-oss's softmax_weight with its
# clamped SwiGLU and biases), with their shared experts (GLM-4.5's plain, Qwen3.5's
# gated), grouped selection (DeepSeek), selection biases (GLM-4.5, LFM2), and beside
# recurrent or latent mixers
FUSED = ["qwen3moe", "mixtral", "gpt-oss", "glm4moe", "lfm2moe", "deepseek2", "qwen35moe",
         "granitehybrid"]


def _spied(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many times the fused experts run from now on."""
    from gguflm.model import fused

    calls = [0]
    real = fused.experts

    def spy(*args):  # noqa: ANN002, ANN202
        calls[0] += 1
        return real(*args)
    monkeypatch.setattr(fused, "experts", spy)
    return calls


def _check(model, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """Every expert layer fused, run, and the reference path's logits."""
    moe = [il for il, b in enumerate(model.blocks) if isinstance(b.ffn, Experts)]
    assert moe and all(model.plan.paths[il].ffn is None for il in moe), model.plan.describe()
    # layer by layer: the team takes some of these models' decoding (test_team_experts)
    monkeypatch.setattr(team, "MAX_ROWS", 0)
    calls = _spied(monkeypatch)
    got = _run(model)
    assert calls[0] == 6 * len(moe), calls
    assert np.isfinite(got).all()
    np.testing.assert_array_equal(got, _reference(model, monkeypatch))


@pytest.mark.parametrize("arch", FUSED)
def test_fused_experts_give_the_reference_logits(reference: Path, arch: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    model, _ = load_tiny(reference, arch)
    assert "experts, run op by op" not in model.plan.describe(), model.plan.describe()
    _check(model, monkeypatch)


@pytest.fixture(scope="module")
def quantized(reference: Path, tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    """The tiny qwen3moe in Q4_K_M, the tiny GLM-4.5 in Q8_0 (its shared expert too) and
    the tiny gpt-oss in MXFP4_MOE: quantized experts, one integer-kernel call for the
    gates and ups, one for the downs."""
    return quantized_tiny(reference, tmp_path_factory.mktemp("moe"), (
        ("qwen3moe", "Q4_K_M"), ("glm4moe", "Q8_0"), ("gpt-oss", "MXFP4_MOE")))


@pytest.mark.parametrize("arch", ["qwen3moe", "glm4moe", "gpt-oss"])
def test_quantized_fused_experts_give_the_reference_logits(
        quantized, arch: str, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    model = gguflm.load_model(quantized[arch])
    e = next(b.ffn for b in model.blocks if isinstance(b.ffn, Experts))
    assert e.gate_up_all.usable and e.down_all.usable, e.gate_up_all.why
    _check(model, monkeypatch)


def test_the_plan_says_the_experts_are_fused(reference: Path) -> None:
    """``inspect``'s line: the experts fused, why the team does not take them; experts
    the fused step does not take (a sigmoid gating beside the clamped SwiGLU) on the
    reference path, with why, and the logits the reference path's."""
    model = load_tiny(reference, "qwen3moe")[0]
    moe = model.plan.describe()
    assert moe == ("compiled (fused layers for every batch; no team: layer 0's FFN is a "
                   "mixture of experts (fused: the router, the top-k and the chosen experts "
                   "in one compiled call) with float experts, which the team does not "
                   "take)"), moe
    oss = load_tiny(reference, "gpt-oss")[0].plan.describe()
    assert ("the chosen experts in two compiled calls around numpy's clamped SwiGLU) with the "
            "clamped SwiGLU, biases, float experts, which the team does not take)") in oss, oss
    model.blocks = [dataclasses.replace(b, ffn=dataclasses.replace(
        b.ffn, gating="sigmoid", act="swiglu_oai")) for b in model.blocks]
    model.plan = executor.plan(model.blocks)
    assert all(p.ffn is not None for p in model.plan.paths)
    refused = model.plan.describe()
    assert ("layer 0's FFN is a mixture of experts, run op by op (a sigmoid gating beside "
            "the clamped SwiGLU (two numpy steps), which the fused experts do not take): "
            "the router, the top-k, then expert by expert") in refused, refused


def test_a_first_run_compiles_the_fused_experts_too(
        reference: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan names the fused experts' compiled steps (one call, or two around numpy's
    step), and a model whose steps are not in the cache is not compiled yet: its first
    run compiles them (in the background) rather than in its first forward pass."""
    from gguflm.model import base, fused_experts
    from gguflm.quant import jitcache

    steps = {arch: load_tiny(reference, arch)[0].plan.steps
             for arch in ("qwen3moe", "glm4moe", "gpt-oss", "qwen3")}
    assert steps == {"qwen3moe": ("fused_experts.moe_step",),
                     "glm4moe": ("fused_experts.moe_experts", "fused_experts.moe_route"),
                     "gpt-oss": ("fused_experts.moe_back", "fused_experts.moe_front"),
                     "qwen3": ()}, steps
    model = load_tiny(reference, "qwen3moe")[0]
    model.forward([1, 2], model.new_cache(4))  # every step compiled or loaded
    kinds, moe = model.kernel_types(), model.plan.steps
    assert base.compiled(kinds, False, moe) and not base._compile_steps(kinds, True, False, moe)
    real = jitcache.cached
    monkeypatch.setattr(jitcache, "cached", lambda fns: fused_experts.moe_step not in fns
                        and real(fns))  # as if no model had compiled the experts
    assert base.compiled(kinds, False) and not base.compiled(kinds, False, moe)
    assert "decoding" in base._compile_steps(kinds, True, False, moe)


# -- the selection's pieces against numpy --------------------------------------------------


@pytest.mark.parametrize("n", [1, 5, 8, 9, 64, 127, 128, 129, 160, 256, 384, 1000])
def test_pairwise_sum_is_numpys(n: int) -> None:
    from gguflm.model.fused_experts import pairwise_sum

    rng = np.random.default_rng(n)
    for dtype in (np.float32, np.float64):
        for _ in range(20):
            a = (rng.standard_normal(n) * np.exp(3 * rng.standard_normal(n))).astype(dtype)
            assert pairwise_sum(a, 0, n) == a.sum()  # in a's type: float32's rounding


@pytest.mark.parametrize("n", [8, 60, 64, 128, 160, 256])
def test_the_softmax_is_the_reference_paths(n: int) -> None:
    """``softmax_rows`` against ``reference._softmax`` (numpy's row sums), a row and many."""
    from gguflm.model import reference
    from gguflm.model.fused_experts import softmax_rows

    rng = np.random.default_rng(n)
    for rows in (1, 7, 300):
        x = (rng.standard_normal((rows, n)) * 4).astype(np.float32)
        np.testing.assert_array_equal(softmax_rows(x).view(np.uint32),
                                      reference._softmax(x).view(np.uint32))


def _experts(n_expert: int, **kw) -> Experts:  # noqa: ANN003
    """Experts of that many (empty) F16 matrices, for ``reference.expert_choice``."""
    from gguflm.gguf.types import GGMLType
    from gguflm.model.layer import Linear
    from gguflm.quant.matrix import QMatrix

    m = QMatrix(GGMLType.F16, np.zeros((1, 32), np.float16), (1, 32))
    return Experts(Linear(m), (m,) * n_expert, (m,) * n_expert, (m,) * n_expert,
                   act="silu", **kw)


CHOICES = {
    "softmax": dict(n_used=8),
    "softmax, scaled, not renormalised": dict(n_used=4, norm_weights=False, scale=2.5),
    "sigmoid, biased, grouped": dict(n_used=6, gating="sigmoid", groups=8, groups_used=3,
                                     select_bias=True, scale=1.5),
    "sigmoid, groups of one": dict(n_used=3, gating="sigmoid", groups=64, groups_used=5),
    "softmax_weight": dict(n_used=4, gating="softmax_weight", norm_weights=False),
}


@pytest.mark.parametrize("kind", list(CHOICES))
def test_the_choice_is_the_reference_paths(kind: str) -> None:
    """``choose`` against ``reference.expert_choice``: the experts (ties: the lower index;
    the logits rounded to few values, so that ties are many) and their weights, bit for
    bit."""
    from gguflm.model import reference
    from gguflm.model.fused_experts import GATING, choose, softmax_rows

    kw = dict(CHOICES[kind])
    rng = np.random.default_rng(len(kind))
    n_expert = 64
    bias = (rng.standard_normal(n_expert) * 0.5).astype(np.float32)
    if kw.pop("select_bias", False):
        kw["select_bias"] = bias
    e = _experts(n_expert, **kw)
    for rows in (1, 40):
        logits = np.round(rng.standard_normal((rows, n_expert)) * 2, 1).astype(np.float32)
        want_c, want_w = reference.expert_choice(logits, e)
        scores = (softmax_rows(logits) if e.gating == "softmax" else
                  reference.gate_scores(logits, e.gating))
        groups = e.groups if e.groups > 1 else 0
        got_c, got_w = choose(scores, np.zeros(0, np.float32) if e.select_bias is None
                              else e.select_bias, GATING[e.gating], e.n_used, groups,
                              e.groups_used, e.norm_weights,
                              np.float32(e.scale if e.scale not in (0.0, 1.0) else 1.0))
        np.testing.assert_array_equal(got_c, want_c)
        np.testing.assert_array_equal(got_w.view(np.uint32), want_w.view(np.uint32))


# -- the comparisons can fail ------------------------------------------------------------


def _perturbed(model, il: int, **change) -> None:  # noqa: ANN001, ANN003
    """Layer ``il``'s fused experts with ``change`` made to their arguments."""
    layers, stack = model.plan.tables()
    la = layers[il]
    model.plan._tables = (tuple(
        dataclasses.replace(x, experts=dataclasses.replace(x.experts, **change))
        if i == il else x for i, x in enumerate(layers)), stack)
    assert model.plan.tables()[0][il].experts is not la.experts


def _no_renorm(model) -> None:  # noqa: ANN001
    ea = model.plan.tables()[0][0].experts
    _perturbed(model, 0, choice=(*ea.choice[:4], not ea.choice[4]))


def _scaled(model) -> None:  # noqa: ANN001
    _perturbed(model, 0, scale=np.float32(1.0001))


def _unbiased(model) -> None:  # noqa: ANN001
    from gguflm.model.fused import vector

    _perturbed(model, 1, select_bias=vector(None))


def _no_shared(model) -> None:  # noqa: ANN001
    _perturbed(model, 1, shared=None, shared_down=None)


def _plain_swiglu(model) -> None:  # noqa: ANN001
    """gpt-oss's experts through SiLU's SwiGLU, not its clamped one."""
    _perturbed(model, 0, e=dataclasses.replace(model.blocks[0].ffn, act="silu"))


def _float32_softmax_sum(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fused softmax's sum in float32 (not numpy's float64 one)."""
    from gguflm.model import fused_experts

    def softmax(x):  # noqa: ANN001, ANN202
        ex = np.exp(x - x.max(axis=1, keepdims=True))
        return (ex / ex.sum(axis=1, keepdims=True)).astype(np.float32)

    real = fused_experts.moe_step

    def split(x, norm_w, eps, router, par, choice, *rest):  # noqa: ANN001, ANN002, ANN202
        h, logits = fused_experts.moe_route(x, norm_w, eps, router, rest[-2], par, rest[-1])
        out, y = fused_experts.moe_experts(h, softmax(logits), (1, *choice[1:]), *rest[:-3],
                                           eps, *rest[-3:])
        return out, y, h
    monkeypatch.setattr(fused_experts, "moe_step", split)
    assert fused_experts.moe_step is not real


@pytest.mark.parametrize(("arch", "perturb"), [
    ("qwen3moe", lambda model, mp: _no_renorm(model)),
    ("mixtral", lambda model, mp: _scaled(model)),
    ("glm4moe", lambda model, mp: _unbiased(model)),
    ("glm4moe", lambda model, mp: _no_shared(model)),
    ("qwen3moe", lambda model, mp: _float32_softmax_sum(mp)),
    ("gpt-oss", lambda model, mp: _plain_swiglu(model))],
    ids=["renormalised weights", "scale", "selection bias", "shared expert",
         "numpy's softmax", "clamped SwiGLU"])
def test_the_comparison_sees_the_fused_experts_off(
        reference: Path, monkeypatch: pytest.MonkeyPatch, arch: str, perturb) -> None:  # noqa: ANN001
    model, _ = load_tiny(reference, arch)
    want = _reference(model, monkeypatch)
    with monkeypatch.context() as m:
        perturb(model, m)
        got = _run(model)
    assert not np.array_equal(got, want)
