"""The glm4moe architecture (GLM-4.5, GLM-4.5-Air, GLM-4.6, GLM-4.7).

Conformance: the tiny F16 model of shared/reference/arch/glm4moe/ against llama.cpp's
greedy.json, teacher-forced (skipped without the reference data), and what its sigmoid
routing's selection bias is worth there. Tiny random models written by our GGUFWriter
check the rest: the routing against a float64 numpy computation, cached vs uncached
logits, the compiled layers against the reference forward, the MTP block loaded and not
run, and the metadata this implementation refuses.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import gguflm
from gguflm.gguf.errors import MetadataError, TensorInfoError
from gguflm.model import executor, reference
from gguflm.model.layer import GLU, Experts
from refcheck import (
    Steps,
    assert_batch_invariant,
    assert_conforms,
    compare_case,
    load_cases,
    load_tiny,
    teacher_forced_ids,
)
from test_fused import _quantized, _run
from tinymodel import declared_tensors, random_tensors, tiny_metadata, write_model

ARCH = "glm4moe"
IDS = [1, 17, 5, 90, 33, 2, 64, 8, 8, 41, 77, 12, 3, 50, 9, 21]
# GLM-4.5's layout in small: 3 trunk layers (the first dense) and one MTP block; heads of
# 32 (Q 128 wide over n_embd 64) rotating their first 16 dims; 4 experts of 32, 2 used,
# sigmoid scores, renormalised, x2.5, one shared expert
TINY = {"block_count": 4, "nextn_predict_layers": 1, "leading_dense_block_count": 1,
        "attention__key_length": 32, "attention__value_length": 32,
        "rope__dimension_count": 16, "expert_count": 4, "expert_used_count": 2,
        "expert_feed_forward_length": 32, "expert_shared_count": 1, "expert_gating_func": 2,
        "expert_weights_scale": 2.5, "expert_weights_norm": True, "vocab_size": 1024}


def _md(**kw) -> dict:
    return tiny_metadata(ARCH, **{**TINY, **kw})


def _trunk_tensors(md: dict) -> dict[str, np.ndarray]:
    """Every trunk tensor, the optional ones too (Q/K/V biases, Q/K norms, the untied
    output), and none of the MTP block's."""
    n_layer = md[f"{ARCH}.block_count"] - md[f"{ARCH}.nextn_predict_layers"]
    everything = random_tensors(md, with_optional=("",))
    return {k: v for k, v in everything.items() if not k.startswith(f"blk.{n_layer}.")}


def _load(path: Path, md: dict, tensors: dict[str, np.ndarray]) -> gguflm.model.Model:
    """The model of these tensors, its layers' matrices in integer-kernel types (so that
    the attention runs compiled; the 3-D experts stay F32)."""
    model = gguflm.load_model(write_model(path, md, tensors, _quantized(md)))
    model.kv_type = "f32"  # exact float32 attention: evaluation orders agree to ~1e-5
    return model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> gguflm.model.Model:
    md = _md()
    return _load(tmp_path_factory.mktemp(ARCH) / "m.gguf", md, _trunk_tensors(md))


def _with_blocks(model: gguflm.model.Model, blocks: list) -> gguflm.model.Model:
    """``model`` with these layer specs, planned afresh."""
    model.blocks = blocks
    model.plan = executor.plan(blocks)
    return model


# -- conformance against llama.cpp -----------------------------------------------------------


def test_conformance(reference: Path) -> None:
    """prompt_tokens identical; top-1 agrees wherever llama.cpp's margin is >= 0.25; on each
    step's 20 reference ids, de-shifted max <= 0.5 and median-over-steps max |d| <= 0.15.
    The attention runs compiled (the experts op by op, as every expert layer)."""
    model, folder = load_tiny(reference, ARCH)
    assert model.plan.compiled, model.plan.describe()
    assert "mixture of experts" in model.plan.team_reason
    assert model.config.n_layer == 3 and len(model.blocks) == 3
    assert_conforms(model, folder, folder / f"tiny-{ARCH}-f16.gguf")


def test_the_selection_bias_matters_to_llama_cpps_logits(reference: Path) -> None:
    """Choosing the experts by the unbiased sigmoid scores parts from llama.cpp by more
    than the bar on the first case, where the biased choice stays within 0.05."""
    model, folder = load_tiny(reference, ARCH)
    case = load_cases(folder)[0]

    def worst() -> float:
        steps = Steps()
        compare_case(model.logits(teacher_forced_ids(case)), case, steps)
        return max(steps.dev)

    assert worst() < 0.05
    _with_blocks(model, [b if isinstance(b.ffn, GLU) else
                         replace(b, ffn=replace(b.ffn, select_bias=None))
                         for b in model.blocks])
    assert worst() > 0.5


# -- the routing ---------------------------------------------------------------------------------


def _numpy_choice(logits: np.ndarray, e: Experts) -> tuple[np.ndarray, np.ndarray]:
    """build_moe_ffn's sigmoid routing in float64: the n_used best sigmoid scores plus the
    selection bias, weighted by their unbiased scores, renormalised, times the scale."""
    scores = 1.0 / (1.0 + np.exp(-logits.astype(np.float64)))
    chosen = np.argsort(-(scores + e.select_bias), axis=1, kind="stable")[:, :e.n_used]
    w = np.take_along_axis(scores, chosen, axis=1)
    return chosen, w / w.sum(axis=1, keepdims=True) * e.scale


def test_sigmoid_routing_with_a_selection_bias_matches_numpy(tiny) -> None:
    """The loaded spec says sigmoid, renormalised, x2.5 and carries ``exp_probs_b``; the
    choice and the weights are numpy's, and the bias changes the choice."""
    assert isinstance(tiny.blocks[0].ffn, GLU)  # the leading dense block
    e = tiny.blocks[1].ffn
    assert (e.gating, e.norm_weights, e.scale, e.n_used) == ("sigmoid", True, 2.5, 2)
    assert e.shared is not None and e.shared_gate is None
    np.testing.assert_array_equal(e.select_bias, tiny.layers[1].exp_probs_b_bias)
    logits = np.random.default_rng(0).standard_normal((64, 4)).astype(np.float32)
    chosen, w = reference.expert_choice(logits, e)
    want_chosen, want_w = _numpy_choice(logits, e)
    np.testing.assert_array_equal(chosen, want_chosen)
    np.testing.assert_allclose(w, want_w, rtol=1e-6)
    # a bias of 2 on expert 3 picks it over the best score; its weight stays unbiased
    biased = replace(e, select_bias=np.array([0, 0, 0, 2], np.float32))
    row = np.array([[3.0, 2.0, 1.0, -3.0]], np.float32)
    chosen, w = reference.expert_choice(row, biased)
    assert chosen.tolist() == [[3, 0]]
    s = 1 / (1 + np.exp(-np.array([-3.0, 3.0])))
    np.testing.assert_allclose(w[0], s / s.sum() * 2.5, rtol=1e-6)


def test_expert_groups_are_honoured_where_the_file_has_them(tmp_path: Path) -> None:
    """llama.cpp groups any architecture's experts when ``expert_group_count`` > 1: two
    groups of two, one used, so both chosen experts come from one group."""
    md = _md(expert_group_count=2, expert_group_used_count=1)
    e = _load(tmp_path / "g.gguf", md, _trunk_tensors(md)).blocks[1].ffn
    assert (e.groups, e.groups_used) == (2, 1)
    logits = np.random.default_rng(3).standard_normal((64, 4)).astype(np.float32)
    chosen, _ = reference.expert_choice(logits, e)
    assert (chosen // 2 == chosen[:, :1] // 2).all()


def test_the_shared_expert_is_added_ungated(tiny) -> None:
    """The MoE FFN is the routed experts' sum plus the shared expert's output as it is."""
    e = tiny.blocks[1].ffn
    h = np.random.default_rng(1).standard_normal((5, 64)).astype(np.float32)
    routed = reference.experts(h, replace(e, shared=None))
    np.testing.assert_array_equal(reference.experts(h, e), routed + reference.ffn(h, e.shared))


# -- tiny random models ------------------------------------------------------------------------


def test_cached_and_uncached_logits_agree(tiny) -> None:
    """One batch, token by token, and uneven chunks give the same logits."""
    full = tiny.logits(IDS)
    assert full.shape == (len(IDS), tiny.config.n_vocab) and np.isfinite(full).all()
    cache = tiny.new_cache(32)
    one_by_one = np.stack([tiny.forward([t], cache) for t in IDS])
    np.testing.assert_allclose(one_by_one, full, rtol=0, atol=2e-4)
    cache = tiny.new_cache(32)
    parts = [tiny.forward(IDS[a:b], cache, all_logits=True)
             for a, b in ((0, 7), (7, 8), (8, 16))]
    np.testing.assert_allclose(np.concatenate(parts), full, rtol=0, atol=2e-4)
    assert_batch_invariant(tiny, np.array(IDS), 32)


def test_compiled_layers_match_the_reference_forward(tiny, monkeypatch) -> None:
    """The blocks (attention compiled, experts op by op) and the reference forward give
    bit-identical logits; partial RoPE: the table turns 8 of each head's 16 pairs."""
    assert tiny.plan.compiled, tiny.plan.describe()
    assert tiny.config.rope_dim == 16 and tiny.config.head_dim == 32
    compiled = _run(tiny)
    assert np.isfinite(compiled).all()
    monkeypatch.setattr(tiny, "plan", executor.Plan(None, "forced by the test"))
    np.testing.assert_array_equal(_run(tiny), compiled)


def test_the_mtp_block_loads_and_does_not_run(tiny, tmp_path: Path) -> None:
    """``nextn_predict_layers`` blocks are loaded (shapes checked) and not run: the trunk's
    logits are those of the file without them, and the cache holds the trunk's layers."""
    md = _md()
    declared = declared_tensors(md)
    mtp = {k for k in declared if k.startswith("blk.3.")}
    assert all(declared[k][1] for k in mtp)  # every one optional: a trunk-only file loads
    assert {"blk.3.nextn.eh_proj.weight", "blk.3.exp_probs_b.bias",
            "blk.3.ffn_gate_exps.weight", "blk.3.attn_q.weight"} <= mtp
    everything = random_tensors(md, seed=2, with_optional=("",))
    both = _load(tmp_path / "b.gguf", md, {**_trunk_tensors(md),
                                           **{k: everything[k] for k in mtp}})
    assert both.config.n_layer == 3 and len(both.blocks) == 3
    assert len(both.new_arena(8).k) == 3
    np.testing.assert_array_equal(both.logits(IDS), tiny.logits(IDS))
    bad = {**_trunk_tensors(md), "blk.3.nextn.eh_proj.weight": np.zeros((64, 64), np.float32)}
    with pytest.raises(TensorInfoError, match="nextn.eh_proj"):
        gguflm.load_model(write_model(tmp_path / "bad.gguf", md, bad))


@pytest.mark.parametrize(("key", "value", "match"), [
    ("expert_group_count", 2, "2 groups of the 4 experts, 0 used"),
    ("expert_gating_func", 4, "gating function 4"),
    ("rope__dimension_sections", np.array([8, 8, 0, 0], np.int32), "M-RoPE"),
    ("nextn_predict_layers", 4, "leave no trunk"),
])
def test_what_is_refused(key: str, value: object, match: str) -> None:
    """Groups that cannot give the experts used, sqrt-softplus gating, M-RoPE and a file
    of MTP blocks alone."""
    from gguflm.model.archs.glm4moe import Glm4MoeConfig

    with pytest.raises(MetadataError, match=match):
        Glm4MoeConfig.from_metadata(_md(**{key: value}))
