"""The fused layer steps (model/fused.py) against the reference forward they replace.

A model's layers run compiled when the planner can compile them (``executor.plan``), else
through the reference forward (``reference.py``), op by op; the logits must be
bit-identical either way, for every architecture (fused tensors and biases included), in a
prefill, in decode steps and in a batch of two sequences. The reference path is forced by
giving the model a plan that says so.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import gguflm
from gguflm.gguf.types import GGMLType
from gguflm.model import executor, ops
from gguflm.model.batch import ALL, Part
from gguflm.quant import kernels
from tinymodel import declared_tensors, random_tensors, tiny_metadata, write_model

# the tiny models' extra metadata (as in test_archs: windows, soft-caps, partial RoPE)
TINY = {
    "llama": {},
    "qwen2": {},
    "qwen3": {"attention__key_length": 32, "attention__value_length": 32},
    "phi3": {"rope__dimension_count": 8},
    "gemma2": {"attention__sliding_window": 5, "attn_logit_softcapping": 4.0,
               "final_logit_softcapping": 8.0},
    "gemma3": {"attention__sliding_window": 5},
}


def _quantized(md: dict) -> dict[str, GGMLType]:
    """Layer matrices in integer-kernel types, two types mixed in each product group (V and
    up in Q4_1, the rest Q8_0), so that the blocks run their kernels."""
    types = {}
    for name, (shape, _) in declared_tensors(md).items():
        if len(shape) == 2 and name.startswith("blk."):
            q41 = name.endswith(("attn_v.weight", "ffn_up.weight"))
            types[name] = GGMLType.Q4_1 if q41 else GGMLType.Q8_0
    return types


def _run(model, steps: int = 3) -> np.ndarray:
    """Logits of a 9-token prefill, ``steps`` decode steps, then two sequences batched."""
    arena = model.new_arena(32, 2)
    a, b = arena.slots
    out = [model.forward_batch([Part(a, np.arange(3, 12), ALL)])]
    for t in range(steps):
        out.append(model.forward_batch([Part(a, np.array([20 + t]), ALL)]))
    out.append(model.forward_batch([Part(b, np.arange(5, 10), ALL),
                                    Part(a, np.array([40]), ALL)]))
    return np.concatenate(out)


def _reference(monkeypatch: pytest.MonkeyPatch, model) -> np.ndarray:
    with monkeypatch.context() as m:
        m.setattr(model, "plan", executor.Plan(None, "forced by the test"))
        return _run(model)


# every bias a llama.cpp graph of these architectures may load, on every product
BIASES = ("attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_output.bias", "ffn_gate.bias",
          "ffn_up.bias", "ffn_down.bias", "attn_qkv.bias")


@pytest.mark.parametrize("arch", list(TINY))
def test_fused_layers_match_the_reference(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                    arch: str) -> None:
    md = tiny_metadata(arch, **TINY[arch])
    model = gguflm.load_model(write_model(tmp_path / "m.gguf", md, random_tensors(md),
                                          _quantized(md)))
    assert model.plan.compiled, model.plan.describe()  # phi3's fused tensors included
    got = _run(model)
    assert np.isfinite(got).all()
    np.testing.assert_array_equal(got, _reference(monkeypatch, model))


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_biases_run_compiled_and_count(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       arch: str) -> None:
    """Q/K/V (Qwen2) and every other product's biases (Llama's optional ones) take the
    compiled path, with the reference's numbers, and they change the logits."""
    md = tiny_metadata(arch)
    optional = BIASES[:3] if arch == "qwen2" else BIASES[:7]
    tensors = random_tensors(md, with_optional=optional)
    model = gguflm.load_model(write_model(tmp_path / "b.gguf", md, tensors, _quantized(md)))
    assert model.plan.compiled, model.plan.describe()
    assert model.blocks[0].attn.q.b is not None
    got = _run(model)
    np.testing.assert_array_equal(got, _reference(monkeypatch, model))
    plain = gguflm.load_model(write_model(tmp_path / "p.gguf", md, random_tensors(md),
                                          _quantized(md)))
    assert not np.allclose(got, _run(plain), atol=1e-3)


@pytest.mark.parametrize("arch", list(TINY))
def test_f16_weights_run_compiled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                  arch: str) -> None:
    """F16 layer weights (the architectures' reference models), alone and mixed with
    integer types in one product group, take the compiled path with the reference's
    numbers."""
    md = tiny_metadata(arch, **TINY[arch])
    types = {n: GGMLType.F16 if t == GGMLType.Q8_0 else t for n, t in _quantized(md).items()}
    for how, t in (("f16", {n: GGMLType.F16 for n in types}), ("mixed", types)):
        model = gguflm.load_model(write_model(tmp_path / f"{how}.gguf", md,
                                              random_tensors(md), t))
        assert model.plan.compiled, model.plan.describe()
        got = _run(model)
        assert np.isfinite(got).all()
        np.testing.assert_array_equal(got, _reference(monkeypatch, model), err_msg=how)


def test_weights_without_a_compiled_product_take_the_reference_path_and_say_why(
        tmp_path: Path) -> None:
    md = tiny_metadata("qwen2", embedding_length=256, feed_forward_length=256)
    tq2 = {n: GGMLType.TQ2_0 for n in _quantized(md)}  # whole 256-value blocks
    model = gguflm.load_model(write_model(tmp_path / "f.gguf", md, random_tensors(md), tq2))
    assert not model.plan.compiled
    assert "blk.0.attn_q.weight" in model.plan.describe()
    assert "TQ2_0" in model.plan.describe()
    assert np.isfinite(model.logits(np.arange(5))).all()


@pytest.mark.parametrize("which", ["smollm2", "gemma3"])
def test_fused_layers_match_the_reference_on_real_models(request: pytest.FixtureRequest,
                                             monkeypatch: pytest.MonkeyPatch,
                                             which: str) -> None:
    model = gguflm.load_model(request.getfixturevalue(f"{which}_path"))
    assert model.plan.compiled and not model.plan.team_reason, model.plan.describe()
    np.testing.assert_array_equal(_run(model), _reference(monkeypatch, model))


def test_swiglu_is_ggml_silu_times_up() -> None:
    """ggml's lanes (its exp) on whole groups of 8, libm's exp on a row's tail; the twin
    agrees exactly and both are silu(gate) * up to float32 accuracy."""
    rng = np.random.default_rng(3)
    gate = (rng.standard_normal((3, 37)) * 6).astype(np.float32)
    gate[0, :4] = [-200.0, 200.0, 0.0, -0.0]  # exp overflow: silu -> -0; large: x
    up = rng.standard_normal((3, 37)).astype(np.float32)
    got = ops.swiglu(gate, up)
    np.testing.assert_array_equal(got, kernels.twin_swiglu(gate, up))
    g64 = gate.astype(np.float64)
    with np.errstate(over="ignore"):
        exact = g64 / (1 + np.exp(-g64)) * up
    np.testing.assert_allclose(got, exact, rtol=1e-5, atol=1e-30)
    out = gate.copy()
    kernels.swiglu(out, up, out)  # in place
    np.testing.assert_array_equal(out, got)
