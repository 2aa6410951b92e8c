"""Multi-head latent attention's per-head products (``mla.per_head``): every head's ``k_b``
(and ``v_b``) in one kernel call (``expert_products``, a head an expert every row chose)
gives each row the numbers of that head's own product of that row alone; the model's
logits are those of the head-by-head loop; and the fused latent attention
(``fused_mla.mla_step``: the whole mixer in one compiled call) gives the reference path's.

The tiny deepseek2 reference keeps its per-head matrices in F16 (no integer kernel: the
loop runs, and the mixer on the reference path); requantized to Q8_0 they take the one
call, and the mixer runs fused.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

import gguflm
from gguflm.model import executor, fused, mla
from gguflm.model.batch import ALL, LAST, Part
from gguflm.quant.quantize_file import quantize_file


@pytest.fixture(scope="module")
def q8_model(reference: Path, tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    src = reference / "arch" / "deepseek2" / "tiny-deepseek2-f16.gguf"
    if not src.is_file():
        pytest.skip(f"{src} not found")
    out = tmp_path_factory.mktemp("mla") / "tiny-deepseek2-q8_0.gguf"
    quantize_file(src, out, "Q8_0", threads=2)
    return gguflm.load_model(out)


def _loop(mats: tuple, x: np.ndarray) -> np.ndarray:
    return np.stack([m.matmul(np.ascontiguousarray(x[:, h])) for h, m in enumerate(mats)],
                    axis=1)


@pytest.mark.parametrize("n", [1, 3, 40])
def test_every_head_in_one_call_gives_each_heads_own_product(q8_model, n: int) -> None:  # noqa: ANN001
    a = q8_model.blocks[0].attn
    assert a.k_b_all.usable and a.v_b_all.usable, (a.k_b_all.why, a.v_b_all.why)
    rng = np.random.default_rng(n)
    for mats, every, k in ((a.k_b, a.k_b_all, a.nope), (a.v_b, a.v_b_all, a.kv_lora)):
        x = rng.standard_normal((n, a.n_head, k)).astype(np.float32)
        x[:, :, :3] *= 30  # outliers: each row quantized on its own
        np.testing.assert_array_equal(mla.per_head(mats, every, x), _loop(mats, x))


def _run(model) -> np.ndarray:  # noqa: ANN001
    """A prefill, a decode step beside a new sequence's prompt, a last-row prefill."""
    arena = model.new_arena(32, 3)
    a, b, c = arena.slots
    out = [model.forward_batch([Part(a, np.arange(3, 15), ALL)]),
           model.forward_batch([Part(a, np.array([20]), ALL), Part(b, np.arange(5, 9), ALL)]),
           model.forward_batch([Part(c, np.arange(30, 41), LAST)])]
    return np.concatenate(out)


def test_the_logits_are_the_head_by_head_loops(q8_model, monkeypatch: pytest.MonkeyPatch  # noqa: ANN001
                                               ) -> None:
    def run() -> np.ndarray:
        with monkeypatch.context() as m:  # the reference path, which calls per_head
            m.setattr(q8_model, "plan", executor.Plan(None, "forced by the test"))
            return _run(q8_model)

    calls = []
    real = mla.per_head
    monkeypatch.setattr(mla, "per_head", lambda m, e, x: calls.append(e.usable) or real(m, e, x))
    got = run()
    assert calls and all(calls), calls
    monkeypatch.setattr(mla, "per_head", lambda m, e, x: _loop(m, x))
    np.testing.assert_array_equal(got, run())


def test_the_fused_latent_attention_gives_the_reference_numbers(
        q8_model, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    plan = q8_model.plan.describe()
    assert "reference" not in plan and "the multi-head latent attention (MLA)" in plan, plan
    calls = []
    real = fused.latent_attention
    monkeypatch.setattr(fused, "latent_attention", lambda *a: calls.append(1) or real(*a))
    got = _run(q8_model)
    assert len(calls) == 3 * len(q8_model.blocks), len(calls)
    with monkeypatch.context() as m:
        m.setattr(q8_model, "plan", executor.Plan(None, "forced by the test"))
        want = _run(q8_model)
    np.testing.assert_array_equal(got, want)
    layers, stack = q8_model.plan.tables()  # the comparison sees the latent's norm off
    with monkeypatch.context() as m:
        m.setattr(q8_model.plan, "_tables", (tuple(dataclasses.replace(la, mixer=(
            dataclasses.replace(la.mixer, kv_a_norm=fused.vector(
                la.mixer.kv_a_norm * np.float32(1.001))))) for la in layers), stack))
        assert not np.array_equal(_run(q8_model), want)
