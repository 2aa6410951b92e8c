"""Granite 4.0-H hybrid models (``granitehybrid``): Mamba2 state-space layers beside attention
without RoPE, softmax-routed experts plus a shared expert, Granite's scales.

Conformance: shared/reference/arch/granitehybrid/'s tiny random-weight F16 model against
llama.cpp's greedy.json, teacher-forced, with the bars of the other architectures (skipped
when the reference data is absent). The Mamba2 state: bit-identical logits however a
sequence is batched or chunked, a truncated state replayed from a snapshot; the layer kinds
where ``head_count_kv`` puts them; the scan against a float64 numpy twin; a tiny random
model whose heads are not square (head_dim != d_state), dense or with experts, with RoPE.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import gguflm
from gguflm.gguf.errors import MetadataError, TensorInfoError
from gguflm.model import mamba2
from gguflm.model.layer import GLU, Experts, Mamba2
from refcheck import assert_batch_invariant, assert_conforms, greedy_tokens, load_cases, load_tiny
from tinymodel import declared_tensors, random_tensors, tiny_metadata, write_model

ARCH = "granitehybrid"
IDS = np.array([5, 300, 77, 1200, 9, 64, 2000, 31, 450, 12, 88, 1500, 7, 260, 41, 3])


@pytest.fixture(scope="module")
def tiny(reference: Path) -> tuple[gguflm.model.Model, Path]:
    return load_tiny(reference, ARCH)


def test_conformance(tiny) -> None:
    """prompt_tokens identical; top-1 agrees wherever llama.cpp's margin is >= 0.25; on each
    step's 20 reference ids, de-shifted max <= 0.5 and median-over-steps max |d| <= 0.15
    (measured: 0.107 and 0.008 over 527 steps, one top-1 miss at a margin of 0.003)."""
    model, folder = tiny
    assert [type(b.attn).__name__ for b in model.blocks] == ["Mamba2", "Mamba2", "Attention",
                                                              "Mamba2", "Attention"]
    assert all(isinstance(b.ffn, Experts) and isinstance(b.ffn.shared, GLU)
               and b.ffn.shared_gate is None and b.residual_scale == np.float32(0.22)
               for b in model.blocks)
    assert_conforms(model, folder, folder / f"tiny-{ARCH}-f16.gguf")


def test_greedy_continuations_are_llama_cpps(tiny) -> None:
    model, folder = tiny
    for case in load_cases(folder)[:2]:
        assert greedy_tokens(model, case) == case["generated_tokens"], case["id"]


def test_the_mamba2_layers_keep_state_and_the_plan_says_so(tiny, capsys) -> None:
    """head_count_kv's zeros are the Mamba2 layers: they keep state, no keys or values, and
    they run fused (``fused_recurrent.mamba2``) beside the attention, without the team,
    which ``inspect`` says."""
    from gguflm.cli import main

    model, folder = tiny
    assert model.config.mamba_layers == (True, True, False, True, False)
    assert [b.attn.index for b in model.blocks if isinstance(b.attn, Mamba2)] == [0, 1, 2]
    m = model.blocks[0].attn
    assert (m.n_head, m.head_dim, m.d_state, m.n_group, m.d_conv) == (8, 64, 64, 2, 4)
    arena = model.new_arena(16)
    assert [k is None for k in arena.k] == list(model.config.mamba_layers)
    want = ("compiled (fused layers for every batch; no team: layer 0 has the Mamba2 "
            "state-space mixer (a recurrent mixer), which the team does not take)")
    assert model.plan.compiled and not model.plan.mixed
    assert model.plan.describe() == want
    assert main(["inspect", str(folder / f"tiny-{ARCH}-f16.gguf")]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if "layers run" in ln)
    assert want in line
    # 2 attention layers of 2 KV heads of 64, f16, K and V; 3 Mamba2 layers' f32 state:
    # 3 inputs of the 768-channel convolution and 8 heads of 64 x 64
    assert "KV cache (f16)    1,024 bytes/token (attention layers)" in out
    assert f"recurrent state   {3 * (3 * 768 + 8 * 64 * 64) * 4:,} bytes/sequence" in out


def test_batch_invariance(tiny) -> None:
    """Whole, token by token (cached vs uncached), in chunks, and batched with others:
    bit-identical logits."""
    model, _ = tiny
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


def _scan_twin(x, dt, a, b, c, state):  # noqa: ANN001, ANN202
    """The Mamba-2 scan in float64, written from its definition: per token and head h of
    group g = h // (H / G), S_h = S_h exp(dt a_h) + (x_h dt) B_g^T, y_h = S_h C_g."""
    s = state.astype(np.float64).copy()
    n_head, n_group = x.shape[1], b.shape[1]
    out = np.empty(x.shape)
    for t in range(len(x)):
        for h in range(n_head):
            g = h // (n_head // n_group)
            s[h] = s[h] * np.exp(dt[t, h] * a[h]) + np.outer(x[t, h] * dt[t, h], b[t, g])
            out[t, h] = s[h] @ c[t, g]
    return out, s


def test_the_scan_is_the_mamba2_recurrence_and_resumes_from_its_state() -> None:
    """3 heads of 5 rows, d_state 7 (not square), 3 groups; against the float64 twin; the
    state after a first piece carries the second piece to the same numbers bit for bit."""
    rng = np.random.default_rng(1)
    t, h, p, n, g = 6, 3, 5, 7, 3
    x = rng.standard_normal((t, h, p)).astype(np.float32)
    dt = rng.uniform(0.1, 1.0, (t, h)).astype(np.float32)
    a = -rng.uniform(0.5, 2.0, h).astype(np.float32)
    b, c = (rng.standard_normal((t, g, n)).astype(np.float32) for _ in range(2))
    state = rng.standard_normal((h, p, n)).astype(np.float32)
    out, new = np.empty((t, h, p), np.float32), np.empty((h, p, n), np.float32)
    mamba2.ssm_scan(x, dt, a, b, c, state, new, out)
    want, want_state = _scan_twin(x, dt, a, b, c, state)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(new, want_state, rtol=1e-5, atol=1e-5)
    first, mid = np.empty((2, h, p), np.float32), np.empty((h, p, n), np.float32)
    mamba2.ssm_scan(x[:2], dt[:2], a, b[:2], c[:2], state, mid, first)
    rest = np.empty((t - 2, h, p), np.float32)
    mamba2.ssm_scan(x[2:], dt[2:], a, b[2:], c[2:], mid, mid, rest)  # in place
    np.testing.assert_array_equal(np.concatenate([first, rest]), out)
    np.testing.assert_array_equal(mid, new)


def test_the_norm_is_per_group() -> None:
    rng = np.random.default_rng(2)
    y = rng.standard_normal((3, 8)).astype(np.float32)
    y[:, 4:] *= 100  # the second group's scale leaves the first group's numbers alone
    w = rng.standard_normal(8).astype(np.float32)
    got = mamba2.grouped_norm(y, w, 2, 1e-6)
    for k in (0, 4):
        part = y[:, k:k + 4].astype(np.float64)
        want = part / np.sqrt((part ** 2).mean(axis=1, keepdims=True) + 1e-6) * w[k:k + 4]
        np.testing.assert_allclose(got[:, k:k + 4], want, rtol=1e-5)


# 2 heads of 64 over 2 groups of d_state 16 (not square), three layers, RoPE on
TINY = dict(attention__head_count_kv=np.array([0, 2, 0], np.int32), block_count=3,
            vocab_size=1024, ssm__conv_kernel=4, ssm__inner_size=128, ssm__state_size=16,
            ssm__group_count=2, ssm__time_step_rank=2, embedding_scale=12.0,
            residual_scale=0.22, logit_scale=6.0, attention__scale=0.03125)


def _tiny_tensors(md: dict) -> dict[str, np.ndarray]:
    tensors = random_tensors(md, seed=2, with_optional=("ssm_conv1d.bias",))
    for name in tensors:  # decays below 1, as -exp(A_log) gives
        if name.endswith("ssm_a"):
            tensors[name] = -np.exp(tensors[name])
    return tensors


@pytest.mark.parametrize("extra", [
    {},
    {"expert_count": 4, "expert_used_count": 2, "feed_forward_length": 32,
     "expert_shared_feed_forward_length": 48}])
def test_a_tiny_random_model_from_its_declared_tensors(tmp_path, extra) -> None:
    md = tiny_metadata(ARCH, **TINY, **extra)
    tensors = _tiny_tensors(md)
    assert "blk.0.ssm_in.weight" in tensors and "blk.1.attn_q.weight" in tensors
    model = gguflm.load_model(write_model(tmp_path / "m.gguf", md, tensors))
    assert [type(b.attn).__name__ for b in model.blocks] == ["Mamba2", "Attention", "Mamba2"]
    assert model.config.rope and model.blocks[0].attn.conv_b is not None
    assert type(model.blocks[0].ffn) is (Experts if extra else GLU)
    assert_batch_invariant(model, IDS % 1024, 32)
    del tensors["blk.2.ssm_d"]
    with pytest.raises(TensorInfoError, match="blk.2.ssm_d"):
        gguflm.load_model(write_model(tmp_path / "bad.gguf", md, tensors))


@pytest.mark.parametrize(("override", "key"), [
    ({"attention__head_count_kv": np.array([0, 2], np.int32)}, "attention.head_count_kv"),
    ({"attention__head_count_kv": np.array([0, 3, 0], np.int32)}, "attention.head_count_kv"),
    ({"ssm__inner_size": 96}, "ssm.inner_size"),
    ({"ssm__time_step_rank": 3}, "ssm.time_step_rank"),
    ({"ssm__group_count": 4, "ssm__time_step_rank": 2}, "ssm.group_count"),
    ({"ssm__conv_kernel": 1}, "ssm.conv_kernel"),
    ({"ssm__state_size": None}, "ssm.state_size")])
def test_bad_metadata_is_named(override: dict, key: str) -> None:
    md = tiny_metadata(ARCH, **{**TINY, **override})
    with pytest.raises(MetadataError) as e:
        declared_tensors(md)
    assert e.value.key == f"{ARCH}.{key}"
