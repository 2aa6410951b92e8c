"""The deepseek2 architecture: multi-head latent attention (MLA) and grouped expert routing.

Conformance: shared/reference/arch/deepseek2's tiny DeepSeek-V3 layout against llama.cpp's
greedy.json, teacher-forced. A tiny random model written by our GGUFWriter checks the rest:
a sequence's logits are the same bits whole, token by token, in chunks and beside other
sequences; the cache keeps one latent row (kv_lora + rope dims) per position and layer; the
absorbed attention equals the decompressed multi-head one; the grouped routing equals a
plain computation of DeepSeek-V3's rule.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest

import gguflm
from gguflm.model import mla, ops
from gguflm.model.batch import ALL, LAST, Batch, Part
from gguflm.model.layer import Experts, LatentAttention
from gguflm.model.reference import expert_choice
from refcheck import assert_conforms
from tinymodel import random_tensors, tiny_metadata, write_model

IDS = [1, 17, 5, 90, 33, 2, 64, 8, 8, 41, 77, 12, 3, 50, 9, 21, 60, 4, 70, 11]
KV_LORA, N_ROT, NOPE, HEAD_V = 32, 16, 8, 16

TINY = dict(block_count=3, attention__head_count_kv=1,
            attention__key_length=KV_LORA + N_ROT, attention__value_length=KV_LORA,
            attention__key_length_mla=NOPE + N_ROT, attention__value_length_mla=HEAD_V,
            attention__q_lora_rank=32, attention__kv_lora_rank=KV_LORA,
            rope__dimension_count=N_ROT, expert_count=8, expert_used_count=2,
            expert_group_count=4, expert_group_used_count=2, expert_gating_func=2,
            expert_weights_scale=2.5, expert_weights_norm=True,
            expert_feed_forward_length=32, expert_shared_count=1,
            leading_dense_block_count=1, rope__scaling__type="yarn",
            rope__scaling__factor=40.0, rope__scaling__original_context_length=16,
            rope__scaling__yarn_log_multiplier=0.1)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> gguflm.model.Model:
    md = tiny_metadata("deepseek2", **TINY)
    path = tmp_path_factory.mktemp("deepseek2") / "tiny-deepseek2.gguf"
    tensors = random_tensors(md, seed=3, with_optional=("exp_probs_b.bias",))
    return gguflm.load_model(write_model(path, md, tensors))


def test_conformance(reference: Path) -> None:
    """prompt_tokens identical; top-1 agrees wherever llama.cpp's margin is >= 0.25; on each
    step's 20 reference ids, de-shifted max <= 0.5 and median-over-steps max |d| <= 0.15."""
    folder = reference / "arch" / "deepseek2"
    path = folder / "tiny-deepseek2-f16.gguf"
    if not path.is_file():
        pytest.skip(f"{path} not found (the deepseek2 reference model)")
    model = gguflm.load_model(path)
    assert model.config.arch == "deepseek2"
    assert_conforms(model, folder, path)


def test_layers_and_their_plan(tiny) -> None:
    """Every layer is latent attention (layer 0 dense, then grouped, biased experts with
    a shared one); the plan runs the latent attention on the reference path and says why;
    YaRN's magnitude goes into the scores (llama.cpp's deepseek2 rule), not the rotation."""
    blocks = tiny.blocks
    assert all(isinstance(b.attn, LatentAttention) for b in blocks)
    assert not isinstance(blocks[0].ffn, Experts)
    e = blocks[1].ffn
    assert isinstance(e, Experts) and (e.groups, e.groups_used, e.gating) == (4, 2, "sigmoid")
    assert e.select_bias is not None and e.shared is not None and e.shared_gate is None
    plan = tiny.plan.describe()  # (F32 weights: no part fused)
    assert not tiny.plan.compiled and "in layers 0-2, the multi-head latent attention" in plan
    assert tiny.config.rope_freq_scale.magnitude == pytest.approx(1.0, abs=1e-6)
    mscale = 1 + 0.1 * math.log(40.0)  # yarn_log_multiplier 0.1 / 0.1 = 1
    assert blocks[0].attn.scale == pytest.approx(mscale**2 / math.sqrt(NOPE + N_ROT))


def test_cache_holds_the_latent(tiny) -> None:
    """Per position and layer the cache keeps kv_lora + n_rot numbers (the latent and the
    rotated key part, shared by the heads), not keys and values per head."""
    arena = tiny.new_arena(40, 2)
    width = KV_LORA + N_ROT
    assert all(k.shape == (2, 40, width) and k.dtype == np.uint16 for k in arena.k)
    assert all(v is None for v in arena.v)
    assert arena.nbytes == 3 * 2 * 40 * width * 2
    assert tiny.cache_bytes() == (3 * width * 2, 0)
    with pytest.raises(ValueError, match="q8_0"):
        tiny.use_kv_type("q8_0")


def test_whole_token_by_token_and_chunks_are_the_same_bits(tiny) -> None:
    full = tiny.logits(IDS)
    assert full.shape == (len(IDS), 96) and np.isfinite(full).all()
    cache = tiny.new_cache(32)
    assert np.array_equal(np.stack([tiny.forward([t], cache) for t in IDS]), full)
    cache = tiny.new_cache(32)
    chunks = [tiny.forward(IDS[a:b], cache, all_logits=True)
              for a, b in ((0, 7), (7, 8), (8, 17), (17, 20))]
    assert np.array_equal(np.concatenate(chunks), full)
    cache.truncate(5)  # a prefix kept, the rest evaluated again
    assert np.array_equal(tiny.forward(IDS[5:], cache, all_logits=True), full[5:])


def test_a_sequence_beside_others_is_the_same_bits(tiny) -> None:
    full = tiny.logits(IDS)
    arena = tiny.new_arena(32, 3)
    tiny.forward_batch([Part(arena.slots[1], np.array(IDS[3:9]), LAST)])
    mixed = tiny.forward_batch([Part(arena.slots[0], np.array(IDS), ALL),
                                Part(arena.slots[1], np.array([7]), LAST),
                                Part(arena.slots[2], np.array(IDS[::-1][:5]), LAST)])
    assert np.array_equal(mixed[:len(IDS)], full)


def _dense(m) -> np.ndarray:
    return m.rows(np.arange(m.shape[0])).astype(np.float64)


def _decompressed(h: np.ndarray, a: LatentAttention, rot: np.ndarray, eps: float
                  ) -> np.ndarray:
    """MLA as the paper writes it, in float64: per head, keys [k_b^T c | k_pe] and values
    v_b c of every position's latent c, causal softmax attention, then the output."""
    n, lora = len(h), a.kv_lora
    q = ops.rmsnorm(h @ _dense(a.q_a.w).T.astype(np.float32), a.q_a_norm, eps)
    q = (q @ _dense(a.q_b.w).T).reshape(n, a.n_head, -1)
    kv = h @ _dense(a.kv_a.w).T
    c = ops.rmsnorm(kv[:, :lora].astype(np.float32), a.kv_a_norm, eps).astype(np.float64)
    k_pe = ops.rope_norm(kv[:, None, lora:].astype(np.float32), rot)[:, 0]
    q_pe = ops.rope_norm(q[:, :, a.nope:].astype(np.float32), rot)
    out = np.zeros((n, a.n_head, a.head_dim_v))
    for head in range(a.n_head):
        k_nope = c @ _dense(a.k_b[head])       # (n, nope)
        v = c @ _dense(a.v_b[head]).T          # (n, head_dim_v)
        s = (q[:, head, :a.nope] @ k_nope.T + q_pe[:, head] @ k_pe.T) * a.scale
        s[np.triu_indices(n, 1)] = -np.inf
        p = np.exp(s - s.max(axis=1, keepdims=True))
        out[:, head] = (p / p.sum(axis=1, keepdims=True)) @ v
    return out.reshape(n, -1) @ _dense(a.o.w).T


def test_absorbed_attention_equals_the_decompressed_heads(tiny) -> None:
    """Scores against the latent through k_b and the weighted latent through v_b give what
    decompressing every position's keys and values per head gives (float32 cache)."""
    tiny.kv_type = "f32"
    try:
        cache = tiny.new_cache(16)
        h = np.random.default_rng(0).standard_normal((12, 64)).astype(np.float32)
        batch = Batch([Part(cache, np.zeros(12, np.int64))])
        c = tiny.config
        rot = ops.rope_table_f32(batch.pos, c.rope_dim, c.rope_base, c.rope_freq_scale)
        a = tiny.blocks[1].attn
        ours = mla.forward(h, a, batch, 1, rot, c.norm_eps)
    finally:
        tiny.kv_type = "f16"
    np.testing.assert_allclose(ours, _decompressed(h, a, rot, c.norm_eps), rtol=0, atol=1e-5)


def _deepseek_v3_choice(scores: np.ndarray, bias: np.ndarray, groups: int, used: int,
                        n_used: int, scale: float) -> tuple[list[list[int]], np.ndarray]:
    """DeepSeek-V3's routing, row by row in plain Python: groups ranked by the sum of
    their two best biased scores, the best ``used`` kept, the ``n_used`` best biased
    experts among theirs; weights the unbiased scores renormalised, times ``scale``."""
    chosen, weights = [], []
    per = scores.shape[1] // groups
    for s in scores:
        b = s + bias
        group_score = [sum(sorted(b[g * per:(g + 1) * per], reverse=True)[:2])
                       for g in range(groups)]
        best = sorted(range(groups), key=lambda g: -group_score[g])[:used]
        pool = [e for g in best for e in range(g * per, (g + 1) * per)]
        top = sorted(pool, key=lambda e: -b[e])[:n_used]
        w = s[top] / s[top].sum()
        chosen.append(top)
        weights.append(w * scale)
    return chosen, np.array(weights)


def test_grouped_routing_equals_deepseek_v3s_rule(tiny) -> None:
    rng = np.random.default_rng(1)
    e = dataclasses.replace(tiny.blocks[1].ffn, n_used=3,
                            select_bias=(0.3 * rng.standard_normal(8)).astype(np.float32))
    logits = (2 * rng.standard_normal((200, 8))).astype(np.float32)
    chosen, w = expert_choice(logits, e)
    scores = np.float32(1) / (np.float32(1) + np.exp(-logits))
    want, want_w = _deepseek_v3_choice(scores, e.select_bias, 4, 2, 3, 2.5)
    assert chosen.tolist() == want
    np.testing.assert_allclose(w, want_w, rtol=1e-6)
    ungrouped, _ = expert_choice(logits, dataclasses.replace(e, groups=0, groups_used=0))
    assert (ungrouped != chosen).any(), "the groups decide some rows' choice"
