"""LFM2 hybrid models (``lfm2``, ``lfm2moe``): gated short convolutions beside grouped-query
attention; LFM2-MoE's experts chosen by a biased sigmoid score.

Conformance: shared/reference/arch/lfm2*/'s tiny random-weight F16 models against
llama.cpp's greedy.json, teacher-forced, with the bars of the other architectures (skipped
when the reference data is absent). The short convolution's state: bit-identical logits
however a sequence is batched or chunked, a truncated state replayed from a snapshot; the
layer kinds where ``head_count_kv`` puts them; the convolution against a numpy twin.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import gguflm
from gguflm.gguf.errors import MetadataError
from gguflm.model import reference as ref_forward
from gguflm.model import shortconv
from gguflm.model.layer import GLU, Experts, ShortConv
from refcheck import assert_batch_invariant, assert_conforms, greedy_tokens, load_cases, load_tiny
from tinymodel import declared_tensors, random_tensors, tiny_metadata, write_model

IDS = np.array([5, 300, 77, 1200, 9, 64, 2000, 31, 450, 12, 88, 1500, 7, 260, 41, 3])
KINDS = {"lfm2": ["ShortConv", "ShortConv", "Attention", "ShortConv", "Attention",
                  "ShortConv"],
         "lfm2moe": ["ShortConv", "ShortConv", "Attention", "ShortConv"]}


@pytest.fixture(scope="module")
def tiny(reference: Path) -> tuple[gguflm.model.Model, Path]:
    return load_tiny(reference, "lfm2")


@pytest.mark.parametrize("arch", ["lfm2", "lfm2moe"])
def test_conformance(reference: Path, arch: str) -> None:
    """prompt_tokens identical; top-1 agrees wherever llama.cpp's margin is >= 0.25; on each
    step's 20 reference ids, de-shifted max <= 0.5 and median-over-steps max |d| <= 0.15
    (measured: lfm2 0.011 and 0.005, top-1 on all 576 steps; lfm2moe 0.008 and 0.003, one
    miss at a margin of 0.002)."""
    model, folder = load_tiny(reference, arch)
    assert [type(b.attn).__name__ for b in model.blocks] == KINDS[arch]
    if arch == "lfm2moe":  # the leading dense layer, then experts
        assert [type(b.ffn) for b in model.blocks] == [GLU, Experts, Experts, Experts]
        assert all(b.ffn.gating == "sigmoid" and b.ffn.select_bias is not None
                   for b in model.blocks[1:])
    assert_conforms(model, folder, folder / f"tiny-{arch}-f16.gguf")


def test_greedy_continuations_are_llama_cpps(tiny) -> None:
    model, folder = tiny
    for case in load_cases(folder)[:2]:
        assert greedy_tokens(model, case) == case["generated_tokens"], case["id"]


def test_the_conv_layers_are_conv_and_the_plan_says_so(tiny, capsys) -> None:
    """head_count_kv's zeros are the short convolutions: they keep state, no keys or values,
    and they run fused, without the team, which ``inspect`` says."""
    from gguflm.cli import main

    model, folder = tiny
    assert model.config.conv_layers == (True, True, False, True, False, True)
    assert [b.attn.index for b in model.blocks if isinstance(b.attn, ShortConv)] == [0, 1, 2, 3]
    arena = model.new_arena(16)
    assert [k is None for k in arena.k] == list(model.config.conv_layers)
    assert model.plan.compiled and not model.plan.mixed
    plan = ("compiled (fused layers for every batch; no team: layer 0 has the gated short "
            "convolution (a recurrent mixer), which the team does not take)")
    assert model.plan.describe() == plan
    assert main(["inspect", str(folder / "tiny-lfm2-f16.gguf")]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if "layers run" in ln)
    assert plan in line
    # 2 attention layers of 2 KV heads of 64, f16, K and V; 4 convolutions x 2 x 256 f32
    assert "KV cache (f16)    1,024 bytes/token (attention layers)" in out
    assert f"recurrent state   {4 * 2 * 256 * 4:,} bytes/sequence" in out


@pytest.mark.parametrize("arch", ["lfm2", "lfm2moe"])
def test_batch_invariance(reference: Path, arch: str) -> None:
    """Whole, token by token (cached vs uncached), in chunks, and batched with others:
    bit-identical logits."""
    model, _ = load_tiny(reference, arch)
    assert_batch_invariant(model, IDS, 32)


def test_a_truncated_state_returns_to_a_snapshot_and_replays(tiny) -> None:
    model, _ = tiny
    alone = model.logits(IDS)
    cache = model.new_cache(32)
    assert not cache.rewinds
    model.forward(IDS[:10], cache)
    assert cache.reusable(10) == 10 and cache.reusable(6) == 0
    cache.truncate(6)
    np.testing.assert_array_equal(model.forward(IDS[6:], cache, all_logits=True), alone[6:])
    cache.truncate(11)
    np.testing.assert_array_equal(model.forward(IDS[11:], cache, all_logits=True), alone[11:])


def test_the_convolution_is_causal_and_keeps_its_last_inputs() -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((6, 4)).astype(np.float32)
    w = rng.standard_normal((4, 3)).astype(np.float32)
    out, kept = shortconv.causal_conv(x, np.zeros((2, 4), np.float32), w)
    padded = np.concatenate([np.zeros((2, 4)), x])
    want = np.stack([(padded[i:i + 3] * w.T).sum(0) for i in range(6)])
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)  # no activation
    np.testing.assert_array_equal(kept, x[-2:])
    _, first = shortconv.causal_conv(x[:4], np.zeros((2, 4), np.float32), w)
    np.testing.assert_array_equal(shortconv.causal_conv(x[4:], first, w)[0], out[4:])


def test_the_fused_sequence_step_is_causal_conv() -> None:
    """``shortconv.sequence`` (the fused layers' per-sequence call) against
    ``causal_conv``, bit for bit: the output and the new kept inputs."""
    from gguflm.quant import matrix

    matrix.threads()  # numba's threads started: a cached caller of parallel kernels needs them
    rng = np.random.default_rng(3)
    x, prev = (rng.standard_normal((m, 64)).astype(np.float32) for m in (7, 2))
    w = rng.standard_normal((64, 3)).astype(np.float32)
    want, kept = shortconv.causal_conv(x, prev, w)
    got, new_kept = np.empty_like(want), np.empty_like(prev)
    shortconv.sequence(x, prev, w, new_kept, got)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    np.testing.assert_array_equal(new_kept, kept)


def test_the_selection_bias_chooses_the_experts_and_leaves_their_weights(reference) -> None:
    """exp_probs_b ranks sigmoid(logit) + bias; the weights are the unbiased sigmoids of the
    chosen ones, renormalised (llama.cpp's build_moe_ffn)."""
    model, _ = load_tiny(reference, "lfm2moe")
    e = model.blocks[1].ffn
    logits = np.zeros((1, len(e.gate)), np.float32)
    logits[0, :3] = [3.0, 2.0, 1.0]
    bias = np.zeros(len(e.gate), np.float32)
    bias[2] = 1.0  # expert 2 ranks first, expert 0 second
    from dataclasses import replace

    chosen, w = ref_forward.expert_choice(logits, replace(e, select_bias=bias))
    assert chosen.tolist() == [[2, 0]]
    sig = 1 / (1 + np.exp(-np.float32([1.0, 3.0])))
    np.testing.assert_allclose(w[0], sig / sig.sum(), rtol=1e-6)


LFM2_TINY = dict(attention__head_count_kv=np.array([0, 2, 0], np.int32), block_count=3,
                 vocab_size=1024,
                 shortconv__l_cache=3)


@pytest.mark.parametrize(("arch", "extra"), [
    ("lfm2", {}),
    ("lfm2moe", {"expert_count": 4, "expert_used_count": 2, "expert_feed_forward_length": 16,
                 "leading_dense_block_count": 1, "expert_gating_func": 2})])
def test_a_tiny_random_model_from_its_declared_tensors(tmp_path, arch: str, extra) -> None:
    md = tiny_metadata(arch, **LFM2_TINY, **extra)
    tensors = random_tensors(md, seed=2)
    assert "token_embd_norm.weight" in tensors and "blk.0.shortconv.in_proj.weight" in tensors
    model = gguflm.load_model(write_model(tmp_path / "m.gguf", md, tensors))
    assert [type(b.attn).__name__ for b in model.blocks] == ["ShortConv", "Attention",
                                                              "ShortConv"]
    assert_batch_invariant(model, IDS % 1024, 32)
    del tensors["blk.2.shortconv.conv.weight"]
    with pytest.raises(gguflm.gguf.errors.TensorInfoError, match="blk.2.shortconv.conv"):
        gguflm.load_model(write_model(tmp_path / "bad.gguf", md, tensors))


@pytest.mark.parametrize(("arch", "override", "key"), [
    ("lfm2", {"attention__head_count_kv": np.array([0, 2], np.int32)},
     "attention.head_count_kv"),
    ("lfm2", {"attention__head_count_kv": np.array([0, 3, 0], np.int32)},
     "attention.head_count_kv"),
    ("lfm2", {"shortconv__l_cache": 1}, "shortconv.l_cache"),
    ("lfm2", {"shortconv__l_cache": None}, "shortconv.l_cache"),
    ("lfm2moe", {"expert_gating_func": 9, "expert_count": 4, "expert_used_count": 2,
                 "expert_feed_forward_length": 16}, "expert_gating_func"),
    ("lfm2moe", {"expert_gating_func": 2}, "expert_count")])
def test_bad_metadata_is_named(arch: str, override: dict, key: str) -> None:
    md = tiny_metadata(arch, **{**LFM2_TINY, **override})
    with pytest.raises(MetadataError) as e:
        declared_tensors(md)
    assert e.value.key == f"{arch}.{key}"
