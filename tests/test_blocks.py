"""The compiled layer blocks (model/blocks.py) against the ops they replace, step by step.

A model runs its attention and FFN through one compiled call each when its weights allow
(``matrix.layer_plan``), else op by op; the logits must be bit-identical either way, for
every architecture, in a prefill, in decode steps and in a batch of two sequences. The
step-by-step path is forced by making ``layer_plan`` find no plan.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import gguflm
from gguflm.gguf.types import GGMLType
from gguflm.model import blocks, ops
from gguflm.model.batch import ALL, Part
from gguflm.quant import kernels, matrix
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


def _step_by_step(monkeypatch: pytest.MonkeyPatch, model) -> np.ndarray:
    with monkeypatch.context() as m:
        m.setattr(matrix, "layer_plan", lambda layer, groups: None)
        return _run(model)


@pytest.mark.parametrize("arch", list(TINY))
def test_blocks_match_the_ops(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                              arch: str) -> None:
    md = tiny_metadata(arch, **TINY[arch])
    model = gguflm.load_model(write_model(tmp_path / "m.gguf", md, random_tensors(md),
                                          _quantized(md)))
    layer = model.layers[0]
    assert matrix.layer_plan(layer, matrix.ATTENTION_GROUPS) is not None
    # phi3 has gate and up in one tensor: its FFN runs op by op
    assert (matrix.layer_plan(layer, matrix.FFN_GROUPS) is not None) == (arch != "phi3")
    got = _run(model)
    assert np.isfinite(got).all()
    np.testing.assert_array_equal(got, _step_by_step(monkeypatch, model))


def test_no_block_with_biases_or_float_weights(tmp_path: Path) -> None:
    """Biases and F16 weights have no block: those layers run op by op."""
    md = tiny_metadata("qwen2")
    tensors = random_tensors(md, with_optional=("attn_q.bias", "attn_k.bias", "attn_v.bias"))
    model = gguflm.load_model(write_model(tmp_path / "b.gguf", md, tensors, _quantized(md)))
    assert matrix.layer_plan(model.layers[0], matrix.ATTENTION_GROUPS) is None
    assert matrix.layer_plan(model.layers[0], matrix.FFN_GROUPS) is not None
    f16 = {n: GGMLType.F16 for n in _quantized(md)}
    model = gguflm.load_model(write_model(tmp_path / "f.gguf", md, random_tensors(md), f16))
    assert matrix.layer_plan(model.layers[0], matrix.FFN_GROUPS) is None


@pytest.mark.parametrize("which", ["smollm2", "gemma3"])
def test_blocks_match_the_ops_on_real_models(request: pytest.FixtureRequest,
                                             monkeypatch: pytest.MonkeyPatch,
                                             which: str) -> None:
    model = gguflm.load_model(request.getfixturevalue(f"{which}_path"))
    assert matrix.layer_plan(model.layers[0], matrix.ATTENTION_GROUPS) is not None
    np.testing.assert_array_equal(_run(model), _step_by_step(monkeypatch, model))


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


def test_block_build_key_follows_the_sources() -> None:
    """The blocks' cached machine code carries the key of the sources it inlines: after
    the check, the loaded (or rebuilt) code answers the current key."""
    blocks._check_build()
    assert blocks._built_key() == blocks._SOURCES_KEY
