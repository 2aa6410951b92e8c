"""Qwen3.5 hybrid models (``qwen35``, ``qwen35moe``): gated delta nets beside gated full
attention.

Conformance: shared/reference/arch/qwen35*/'s tiny random-weight F16 models against
llama.cpp's greedy.json, teacher-forced, with the bars of the other architectures, and
free-running greedy continuations. The recurrent state: bit-identical logits however a
sequence is batched or chunked; a state that cannot be cut back returns to a snapshot
(the engine's prefix reuse resumes there); a failed forward pass leaves it as it was. The
delta rule's numba kernel against a float64 numpy twin.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import gguflm
from gguflm.engine.sampling import SamplerParams
from gguflm.engine.scheduler import Engine
from gguflm.engine.sequence import Request
from gguflm.model import deltanet
from gguflm.model.layer import DeltaNet, Experts
from gguflm.tokenizer import Tokenizer
from refcheck import (
    assert_batch_invariant,
    assert_conforms,
    greedy_tokens,
    load_cases,
    load_tiny,
)
from tinymodel import random_tensors, tiny_metadata, write_model

IDS = np.array([5, 300, 77, 1200, 9, 64, 2000, 31, 450, 12, 88, 1500, 7, 260, 41, 3])


@pytest.fixture(scope="module")
def tiny(reference: Path) -> tuple[gguflm.model.Model, Path]:
    return load_tiny(reference, "qwen35")


@pytest.mark.parametrize(("arch", "kinds"), [
    ("qwen35", ["DeltaNet", "Attention", "DeltaNet", "Attention"]),
    ("qwen35moe", ["DeltaNet", "Attention"])])
def test_conformance(reference: Path, arch: str, kinds: list[str]) -> None:
    """prompt_tokens identical; top-1 agrees wherever llama.cpp's margin is >= 0.25; on each
    step's 20 reference ids, de-shifted max <= 0.5 and median-over-steps max |d| <= 0.15
    (measured: qwen35 0.031 and 0.005, top-1 on all 537 steps; qwen35moe 0.005 and 0.002,
    top-1 on all 576)."""
    model, folder = load_tiny(reference, arch)
    assert [type(b.attn).__name__ for b in model.blocks] == kinds  # the MTP block not run
    if arch == "qwen35moe":
        assert all(isinstance(b.ffn, Experts) and b.ffn.shared is not None
                   for b in model.blocks)
    assert_conforms(model, folder, folder / f"tiny-{arch}-f16.gguf")


def test_greedy_continuations_are_llama_cpps(tiny) -> None:
    """Free-running greedy decoding (the prompt in one batch, then one token at a time, as
    llama.cpp was run) gives llama.cpp's 64 tokens."""
    model, folder = tiny
    for case in load_cases(folder)[:2]:
        assert greedy_tokens(model, case) == case["generated_tokens"], case["id"]


def test_the_plan_says_how_the_layers_run(tiny, capsys) -> None:
    """The delta nets, the gated attention and every FFN fused; no team (it takes no
    recurrent mixer)."""
    from gguflm.cli import main

    model, folder = tiny
    assert model.plan.compiled and not model.plan.mixed
    plan = ("compiled (fused layers for every batch; no team: layer 0 has the gated delta net "
            "(a recurrent mixer), which the team does not take)")
    assert model.plan.describe() == plan
    assert main(["inspect", str(folder / "tiny-qwen35-f16.gguf")]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if "layers run" in ln)
    assert plan in line
    # keys and values in the 2 attention layers only (2 KV heads of 64, f16, K and V); the
    # state: per delta net 3 x 512 conv inputs and 8 x 32 x 32, f32
    assert "KV cache (f16)    1,024 bytes/token (attention layers)" in out
    assert f"recurrent state   {2 * 4 * (3 * 512 + 8 * 32 * 32):,} bytes/sequence" in out


@pytest.mark.parametrize("arch", ["qwen35", "qwen35moe"])
def test_batch_invariance(reference: Path, arch: str) -> None:
    model, _ = load_tiny(reference, arch)
    assert_batch_invariant(model, IDS, 32)


def test_a_truncated_state_returns_to_a_snapshot_and_replays(tiny) -> None:
    """A recurrent state cannot be cut back: truncation restores the last snapshot at or
    before the cut (one is taken after each batch of several rows) and evaluates the ids
    from there again before the next batch; the logits are those of the uncut sequence."""
    model, _ = tiny
    alone = model.logits(IDS)
    cache = model.new_cache(32)
    assert not cache.rewinds
    model.forward(IDS[:10], cache)
    assert cache.reusable(10) == 10 and cache.reusable(6) == 0
    cache.truncate(6)  # back to the zero state, 6 ids to replay
    assert cache.n == 6 and cache.pending
    np.testing.assert_array_equal(model.forward(IDS[6:], cache, all_logits=True), alone[6:])
    assert cache.reusable(10) == 6 and cache.reusable(16) == 16  # snapshots at 6 and 16
    cache.truncate(11)
    np.testing.assert_array_equal(model.forward(IDS[11:], cache, all_logits=True), alone[11:])
    cache.truncate(0)  # emptied: the next sequence starts from a zero state
    np.testing.assert_array_equal(model.forward(IDS, cache, all_logits=True), alone)


def test_a_failed_forward_pass_leaves_the_state_as_it_was(tiny, monkeypatch) -> None:
    model, _ = tiny
    alone = model.logits(IDS)
    cache = model.new_cache(32)
    model.forward(IDS[:8], cache)
    forward = type(model)._forward

    def fails(self, batch):  # noqa: ANN001, ANN202 - every layer ran, then an error
        forward(self, batch)
        raise RuntimeError("injected")

    monkeypatch.setattr(type(model), "_forward", fails)
    with pytest.raises(RuntimeError, match="injected"):
        model.forward(IDS[8:12], cache)
    monkeypatch.undo()
    assert cache.n == 8
    np.testing.assert_array_equal(model.forward(IDS[8:], cache, all_logits=True), alone[8:])


def test_the_engine_reuses_a_recurrent_cache_up_to_a_snapshot(tiny) -> None:
    """A next turn that extends the slot's tokens reuses them all; a prompt sharing only
    part of them resumes from the last snapshot before the split (here: after the first
    prompt); both give the tokens of a fresh engine."""
    model, folder = tiny
    tok = Tokenizer.from_file(folder / "tiny-qwen35-f16.gguf")
    first = tok.encode("The capital of France is")

    def run(engine: Engine, ids: list[int]) -> list[int]:
        s = engine.submit(Request(ids, SamplerParams(temp=0), max_tokens=6))
        s.wait(300)
        return s.tokens

    engine = Engine(model, tok, n_ctx=128, n_slots=1)
    reply = run(engine, first)
    turn = first + reply + tok.encode(" And of Spain?")
    before = engine.stats.cached_tokens
    second = run(engine, turn)
    reused = engine.stats.cached_tokens - before
    assert reused == len(first) + len(reply) - 1  # the last reply token was never evaluated
    before = engine.stats.cached_tokens
    third = run(engine, turn[:len(first)] + tok.encode(" Paris"))
    assert engine.stats.cached_tokens - before == len(first)  # the first prompt's snapshot
    engine.close()
    fresh = Engine(model, tok, n_ctx=128, n_slots=1)
    assert run(fresh, turn) == second
    fresh.forget()
    assert run(fresh, turn[:len(first)] + tok.encode(" Paris")) == third
    fresh.close()


def _delta_rule_twin(q, k, v, g, beta, state):  # noqa: ANN001, ANN202
    """The delta rule in float64 numpy, one token at a time."""
    m = state.astype(np.float64)
    out = np.empty(v.shape)
    n_k = q.shape[1]
    for t in range(len(q)):
        for h in range(v.shape[1]):
            kk, qq = k[t, h % n_k].astype(np.float64), q[t, h % n_k].astype(np.float64)
            m[h] *= np.exp(np.float64(g[t, h]))
            d = (v[t, h] - m[h] @ kk) * beta[t, h]
            m[h] += np.outer(d, kk)
            out[t, h] = m[h] @ qq / np.sqrt(v.shape[2])
    return out, m


def test_the_delta_rule_kernel_matches_a_float64_twin() -> None:
    rng = np.random.default_rng(0)
    t, n_k, n_v, s = 5, 2, 4, 8
    unit = rng.standard_normal((2, t, n_k, s)).astype(np.float32)
    q, k = unit / np.linalg.norm(unit, axis=-1, keepdims=True)
    v = rng.standard_normal((t, n_v, s)).astype(np.float32)
    g = -rng.random((t, n_v)).astype(np.float32)
    beta = rng.random((t, n_v)).astype(np.float32)
    state = rng.standard_normal((n_v, s, s)).astype(np.float32)
    want_out, want_state = _delta_rule_twin(q, k, v, g, beta, state)
    out = np.empty((t, n_v, s), np.float32)
    new_state = np.empty_like(state)
    deltanet.delta_rule(q, k, v, g, beta, state, new_state, out)
    np.testing.assert_allclose(out, want_out, atol=2e-5)
    np.testing.assert_allclose(new_state, want_state, atol=2e-5)
    again = np.empty_like(out)
    deltanet.delta_rule(q, k, v, g, beta, state, state, again)  # in place: the same numbers
    np.testing.assert_array_equal(again, out)
    np.testing.assert_array_equal(state, new_state)


@pytest.mark.parametrize(("n_k", "n_v", "s", "n"), [(2, 4, 128, 5), (4, 8, 32, 1)])
def test_the_fused_sequence_step_is_the_op_by_op_steps(n_k: int, n_v: int, s: int,
                                                        n: int) -> None:
    """``deltanet.sequence`` (the fused layers' per-sequence call) against ``forward``'s
    steps, convolution, L2 norms and delta rule, bit for bit: the read-out, the new
    convolution inputs and the new state, at Qwen3.5-2B's head size and the tiny one's."""
    from gguflm.quant import matrix

    matrix.threads()  # numba's threads started: a cached caller of parallel kernels needs them
    rng = np.random.default_rng(4)
    c = (2 * n_k + n_v) * s
    mixed, prev = (rng.standard_normal((m, c)).astype(np.float32) for m in (n, 3))
    w = rng.standard_normal((c, 4)).astype(np.float32)
    g = -np.abs(rng.standard_normal((n, n_v))).astype(np.float32)
    beta = rng.uniform(0, 1, (n, n_v)).astype(np.float32)
    ssm = rng.standard_normal((n_v, s, s)).astype(np.float32) * np.float32(0.1)
    x, kept = deltanet.causal_conv(mixed, prev, w)
    want, want_ssm = np.empty((n, n_v, s), np.float32), np.empty_like(ssm)
    q, k = (deltanet.l2_norm(x[:, i * n_k * s:(i + 1) * n_k * s].reshape(n, n_k, s), 1e-6)
            for i in (0, 1))
    deltanet.delta_rule(q, k, np.ascontiguousarray(x[:, 2 * n_k * s:].reshape(n, n_v, s)), g,
                        beta, ssm, want_ssm, want)
    got, got_ssm, got_conv = np.empty_like(want), np.empty_like(ssm), np.empty_like(prev)
    deltanet.sequence(mixed, prev, w, got_conv, g, beta, ssm, got_ssm, got, n_k,
                      *deltanet.l2_constants(s, 1e-6))
    for a, b in ((got, want), (got_ssm, want_ssm), (got_conv, kept)):
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


def test_the_convolution_is_causal_and_keeps_its_last_inputs() -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((6, 3)).astype(np.float32)
    w = rng.standard_normal((3, 4)).astype(np.float32)
    out, kept = deltanet.causal_conv(x, np.zeros((3, 3), np.float32), w)
    padded = np.concatenate([np.zeros((3, 3)), x])
    want = np.stack([(padded[i:i + 4] * w.T).sum(0) for i in range(6)])
    np.testing.assert_allclose(out, want / (1 + np.exp(-want)), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(kept, x[-3:])
    out2, _ = deltanet.causal_conv(x[4:], deltanet.causal_conv(x[:4], np.zeros((3, 3),
                                                                np.float32), w)[1], w)
    np.testing.assert_array_equal(out2, out[4:])


QWEN35_TINY = dict(ssm__conv_kernel=4, ssm__state_size=8, ssm__group_count=2,
                   ssm__time_step_rank=4, ssm__inner_size=32, full_attention_interval=2,
                   rope__dimension_sections=np.array([2, 1, 1, 0], np.int32),
                   rope__dimension_count=8, attention__key_length=16,
                   attention__value_length=16)


@pytest.mark.parametrize(("arch", "extra"), [
    ("qwen35", {}),
    ("qwen35moe", {"expert_count": 4, "expert_used_count": 2, "feed_forward_length": None,
                   "expert_feed_forward_length": 16,
                   "expert_shared_feed_forward_length": 24})])
def test_a_tiny_random_model_from_its_declared_tensors(tmp_path, arch: str, extra) -> None:
    """tinymodel's recorder sees the architecture's tensors; the file loads and runs, its
    recurrent layers where full_attention_interval puts them; a missing tensor is named."""
    md = tiny_metadata(arch, **QWEN35_TINY, block_count=4, **extra)
    tensors = random_tensors(md, seed=2)
    model = gguflm.load_model(write_model(tmp_path / "q.gguf", md, tensors))
    assert [isinstance(b.attn, DeltaNet) for b in model.blocks] == [True, False, True, False]
    logits = model.logits(IDS[:6] % 96)
    assert logits.shape == (6, 96) and np.isfinite(logits).all()
    del tensors["blk.2.ssm_a"]
    with pytest.raises(gguflm.gguf.errors.TensorInfoError, match="blk.2.ssm_a"):
        gguflm.load_model(write_model(tmp_path / "m.gguf", md, tensors))


@pytest.mark.parametrize(("override", "key"), [
    ({"rope__dimension_sections": np.zeros(4, np.int32)}, "rope.dimension_sections"),
    ({"rope__dimension_sections": None}, "rope.dimension_sections"),
    ({"attention__recurrent_layers": np.array([True, False, True])}, "attention.recurrent_layers"),
    ({"ssm__inner_size": 30}, "ssm.inner_size"),
    ({"ssm__time_step_rank": 3}, "ssm.inner_size"),
    ({"nextn_predict_layers": 4}, "nextn_predict_layers")])
def test_bad_metadata_is_named(override: dict, key: str) -> None:
    from gguflm.gguf.errors import MetadataError
    from tinymodel import declared_tensors

    md = tiny_metadata("qwen35", **{**QWEN35_TINY, "block_count": 4, **override})
    with pytest.raises(MetadataError) as e:
        declared_tensors(md)
    assert e.value.key == f"qwen35.{key}"


def test_fused_attention_projections_give_the_same_logits(tmp_path) -> None:
    """An attention layer's Q (with its gate), K and V fused into one ``attn_qkv`` (as
    llama.cpp's create_tensor_qkv accepts), with biases, computes what the separate ones do."""
    md = tiny_metadata("qwen35", **QWEN35_TINY, block_count=4)
    tensors = random_tensors(md, seed=3, with_optional=("attn_q.bias", "attn_k.bias",
                                                        "attn_v.bias"))
    assert "blk.1.attn_q.bias" in tensors
    separate = gguflm.load_model(write_model(tmp_path / "s.gguf", md, tensors))
    for il in (1, 3):
        parts = [tensors.pop(f"blk.{il}.attn_{x}.{kind}") for kind in ("weight", "bias")
                 for x in "qkv"]
        tensors[f"blk.{il}.attn_qkv.weight"] = np.concatenate(parts[:3])
        tensors[f"blk.{il}.attn_qkv.bias"] = np.concatenate(parts[3:])
    fused = gguflm.load_model(write_model(tmp_path / "f.gguf", md, tensors))
    np.testing.assert_array_equal(fused.logits(IDS[:9] % 96), separate.logits(IDS[:9] % 96))


def test_fused_expert_gate_and_up_give_the_same_logits(tmp_path) -> None:
    """A qwen35moe layer's experts with gate and up as one ``ffn_gate_up_exps`` (each
    expert's rows [gate | up], as llama.cpp's create_tensor_gate_up_exps accepts) compute
    what the separate tensors do; other layers of the file may keep them apart."""
    md = tiny_metadata("qwen35moe", **QWEN35_TINY, block_count=4, expert_count=4,
                       expert_used_count=2, feed_forward_length=None,
                       expert_feed_forward_length=16, expert_shared_feed_forward_length=24)
    tensors = random_tensors(md, seed=5)
    separate = gguflm.load_model(write_model(tmp_path / "s.gguf", md, tensors))
    for il in (0, 3):
        gate, up = (tensors.pop(f"blk.{il}.ffn_{x}_exps.weight") for x in ("gate", "up"))
        tensors[f"blk.{il}.ffn_gate_up_exps.weight"] = np.concatenate((gate, up), axis=1)
    fused = gguflm.load_model(write_model(tmp_path / "f.gguf", md, tensors))
    e = fused.blocks[0].ffn
    assert isinstance(e, Experts) and e.gate[1].shape == e.up[1].shape == (16, 64)
    np.testing.assert_array_equal(fused.logits(IDS[:9] % 96), separate.logits(IDS[:9] % 96))
