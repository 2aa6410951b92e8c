"""The gemma3 architecture on tiny random models that our own GGUFWriter writes: config and
layer pattern from metadata, the forward pass against a slow position-by-position
reference written from llama.cpp's graph, the sliding window's reach, cached vs uncached
logits, per-tensor weight types, and load-time errors naming the tensor or key."""

from __future__ import annotations

import math

import numpy as np
import pytest

import gguflm
from gguflm.gguf.errors import MetadataError, TensorInfoError
from gguflm.gguf.types import GGMLType
from gguflm.model.archs.gemma3 import Gemma3Config
from tinymodel import random_tensors, tiny_metadata, write_model

IDS = [2, 17, 5, 90, 33, 7, 64, 8, 8, 41, 77, 12, 3, 50]


def _md(**overrides):
    return tiny_metadata("gemma3", **overrides)


def _config(**overrides) -> Gemma3Config:
    return Gemma3Config.from_metadata(_md(**overrides))


def _load(tmp_path, name="m.gguf", seed=0, types=None, **overrides):
    md = _md(**overrides)
    return gguflm.load_model(write_model(tmp_path / name, md, random_tensors(md, seed), types))


# -- config -------------------------------------------------------------------------------------


def test_layer_pattern_and_scalars() -> None:
    c = _config(block_count=12, attention__sliding_window=512)
    # llama.cpp: every sixth layer (5, 11) is global, the rest slide
    assert [il for il in range(12) if not c.swa_layers[il]] == [5, 11]
    assert (c.rope_base, c.rope_base_swa, c.final_softcap) == (10000.0, 10000.0, 0.0)
    assert c.attn_scale == pytest.approx(1 / 4)  # 1/sqrt(head_dim 16)
    c = _config(attention__key_length=32, attention__value_length=32, rope__freq_base=1e6,
                rope__freq_base_swa=5e4)
    assert c.attn_scale == pytest.approx(1 / math.sqrt(32))  # from key_length, not n_embd/n_head
    assert (c.rope_base, c.rope_base_swa) == (1e6, 5e4)


def test_pattern_variants() -> None:
    assert _config().swa_layers == (False, False)  # no sliding_window key: all global
    on = {"attention__sliding_window": 8}
    assert _config(**on).swa_layers == (True, True)  # 2 layers, period 6: both local
    assert _config(**on, attention__sliding_window_pattern=2).swa_layers == (True, False)
    assert _config(**on, attention__sliding_window_pattern=0).swa_layers == (True, True)
    flags = np.array([False, True])
    assert _config(**on, attention__sliding_window_pattern=flags).swa_layers == (False, True)


def test_27b_attention_scale() -> None:
    """llama.cpp scales the 62-layer (27B) model's queries by 1/sqrt(n_embd / n_head)."""
    c = _config(block_count=62, attention__key_length=32, attention__value_length=32)
    assert c.attn_scale == pytest.approx(1 / math.sqrt(64 / 4))


@pytest.mark.parametrize("value, what", [
    (np.array([True, False, True]), "3 entries for 2 layers"),
    (-1, "layer period"),
    ("local", "layer period"),
])
def test_bad_pattern_names_key(value, what) -> None:
    with pytest.raises(MetadataError, match=what) as e:
        _config(attention__sliding_window=8, attention__sliding_window_pattern=value)
    assert e.value.key == "gemma3.attention.sliding_window_pattern"


# -- forward against a slow reference -----------------------------------------------------------


def _rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x) + eps) * w


def _rope_neox(x, p, base):
    half = len(x) // 2
    theta = p * base ** (-np.arange(half) * 2.0 / len(x))
    x0, x1 = x[:half], x[half:]
    return np.concatenate([x0 * np.cos(theta) - x1 * np.sin(theta),
                           x0 * np.sin(theta) + x1 * np.cos(theta)])


def _gelu(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def _reference_logits(t: dict[str, np.ndarray], c: Gemma3Config, ids: list[int]) -> np.ndarray:
    """Gemma 3 one position at a time, one head at a time, in float64, from llama.cpp's
    src/models/gemma3.cpp; tied output."""
    eps, d, group = c.norm_eps, c.head_dim, c.n_head // c.n_head_kv
    x = t["token_embd.weight"][ids].astype(np.float64) * math.sqrt(c.n_embd)
    keys = [[[] for _ in range(c.n_head_kv)] for _ in range(c.n_layer)]
    vals = [[[] for _ in range(c.n_head_kv)] for _ in range(c.n_layer)]
    out = []
    for p in range(len(ids)):
        h = x[p]
        for il in range(c.n_layer):
            w = {k.split(".", 2)[2].removesuffix(".weight"): v.astype(np.float64)
                 for k, v in t.items() if k.startswith(f"blk.{il}.")}
            local = c.swa_layers[il]
            base = c.rope_base_swa if local else c.rope_base
            a_in = _rms(h, w["attn_norm"], eps)
            q, k, v = w["attn_q"] @ a_in, w["attn_k"] @ a_in, w["attn_v"] @ a_in
            heads = []
            for j in range(c.n_head_kv):
                kj = _rope_neox(_rms(k[j * d:(j + 1) * d], w["attn_k_norm"], eps), p, base)
                keys[il][j].append(kj)
                vals[il][j].append(v[j * d:(j + 1) * d])
            for hq in range(c.n_head):
                qh = _rope_neox(_rms(q[hq * d:(hq + 1) * d], w["attn_q_norm"], eps), p, base)
                j = hq // group
                seen = [s for s in range(p + 1) if not local or p - s < c.sliding_window]
                scores = np.array([c.attn_scale * qh @ keys[il][j][s] for s in seen])
                pr = np.exp(scores - scores.max())
                heads.append((pr / pr.sum()) @ np.array([vals[il][j][s] for s in seen]))
            h = h + _rms(w["attn_output"] @ np.concatenate(heads), w["post_attention_norm"], eps)
            f_in = _rms(h, w["ffn_norm"], eps)
            f = w["ffn_down"] @ (_gelu(w["ffn_gate"] @ f_in) * (w["ffn_up"] @ f_in))
            h = h + _rms(f, w["post_ffw_norm"], eps)
        out.append(t["token_embd.weight"] @ _rms(h, t["output_norm.weight"], eps))
    return np.array(out)


def test_forward_matches_slow_reference(tmp_path) -> None:
    """A 3-layer model, window 4 (shorter than the 14 ids), layers local/global/local with
    different RoPE bases, 4 query heads sharing 2 KV heads."""
    md = _md(block_count=3, attention__sliding_window=4, rope__freq_base=1e6,
             attention__sliding_window_pattern=np.array([True, False, True]))
    tensors = random_tensors(md, seed=4)
    model = gguflm.load_model(write_model(tmp_path / "m.gguf", md, tensors))
    want = _reference_logits(tensors, model.config, IDS)
    np.testing.assert_allclose(model.logits(IDS), want, atol=2e-4 * np.abs(want).max())


def test_window_bounds_what_a_position_sees(tmp_path) -> None:
    """All layers local with window 3: a query sees itself and 2 earlier positions, so after
    2 layers position p depends on tokens p-4..p only: changing token 0 changes position
    4's logits and leaves positions 5.. exactly as they were."""
    m = _load(tmp_path, attention__sliding_window=3, attention__sliding_window_pattern=0)
    a = m.logits(IDS)
    b = m.logits([IDS[0] + 1] + IDS[1:])
    assert not np.allclose(a[4], b[4], atol=1e-3)
    np.testing.assert_allclose(a[5:], b[5:], atol=1e-5)
    # the same model without the window: every position sees token 0
    g = _load(tmp_path, "g.gguf", attention__sliding_window=3,
              attention__sliding_window_pattern=np.array([False, False]))
    assert not np.allclose(g.logits(IDS)[-1], g.logits([IDS[0] + 1] + IDS[1:])[-1], atol=1e-3)


def test_cached_and_uncached_logits_agree(tmp_path) -> None:
    """Prefill pieces, single tokens and batches that start past the window."""
    m = _load(tmp_path, attention__sliding_window=4,
              attention__sliding_window_pattern=np.array([True, False]))
    full = m.logits(IDS)
    cache = m.new_cache(32)
    one_by_one = np.stack([m.forward([t], cache) for t in IDS])
    np.testing.assert_allclose(one_by_one, full, rtol=0, atol=2e-4)
    cache = m.new_cache(32)
    parts = [m.forward(IDS[:3], cache, all_logits=True),
             m.forward(IDS[3:9], cache, all_logits=True),
             m.forward(IDS[9:10], cache, all_logits=True),
             m.forward(IDS[10:], cache, all_logits=True)]
    np.testing.assert_allclose(np.concatenate(parts), full, rtol=0, atol=2e-4)
    np.testing.assert_allclose(m.forward(IDS, m.new_cache(16)), full[-1], atol=1e-5)
    cache.truncate(6)
    np.testing.assert_allclose(m.forward(IDS[6:], cache, all_logits=True), full[6:], atol=2e-4)


def test_final_logit_softcapping(tmp_path) -> None:
    plain = _load(tmp_path, "a.gguf").logits(IDS[:4])
    capped = _load(tmp_path, "b.gguf", final_logit_softcapping=2.0).logits(IDS[:4])
    np.testing.assert_allclose(capped, 2.0 * np.tanh(plain / 2.0), atol=1e-5)


def test_weight_types_vary_per_tensor(tmp_path) -> None:
    """Each tensor keeps its own encoding (the real file mixes Q8_0/Q5_0 attn_v and
    Q6_K/Q4_K ffn_down by layer) and products dispatch on it."""
    md = _md()
    tensors = random_tensors(md, seed=3)
    types = {"blk.0.attn_v.weight": GGMLType.Q8_0, "blk.1.attn_v.weight": GGMLType.Q5_0,
             "blk.0.ffn_down.weight": GGMLType.Q4_0, "blk.1.ffn_down.weight": GGMLType.F16,
             "blk.0.attn_q.weight": GGMLType.Q5_1, "token_embd.weight": GGMLType.Q8_0}
    q = gguflm.load_model(write_model(tmp_path / "q.gguf", md, tensors, types))
    f = gguflm.load_model(write_model(tmp_path / "f.gguf", md, tensors))
    for name, t in types.items():
        parts = name.split(".")
        obj = q.layers[int(parts[1])] if parts[0] == "blk" else q
        assert getattr(obj, parts[-2]).type == t, name
    want = f.logits(IDS)
    np.testing.assert_allclose(q.logits(IDS), want, atol=0.05 * np.abs(want).max())


def test_fused_qkv_and_biases(tmp_path) -> None:
    """llama.cpp's create_tensor_qkv: one fused attn_qkv (rows [q | k | v]) loads like the
    separate projections; optional biases are honoured."""
    md = _md(attention__sliding_window=4)
    sep = random_tensors(md, seed=5)
    fused = {k: v for k, v in sep.items() if not any(f".attn_{x}." in k for x in "qkv")}
    for i in range(2):
        fused[f"blk.{i}.attn_qkv.weight"] = np.concatenate(
            [sep[f"blk.{i}.attn_{x}.weight"] for x in "qkv"])
    a = gguflm.load_model(write_model(tmp_path / "sep.gguf", md, sep)).logits(IDS)
    b = gguflm.load_model(write_model(tmp_path / "fused.gguf", md, fused)).logits(IDS)
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-4)
    biased = random_tensors(md, seed=5, with_optional=(".bias",))
    assert "blk.1.attn_v.bias" in biased
    c = gguflm.load_model(write_model(tmp_path / "bias.gguf", md, biased)).logits(IDS)
    assert np.abs(c - a).max() > 1e-2


# -- load-time errors ---------------------------------------------------------------------------


def test_missing_tensor_is_named(tmp_path) -> None:
    md = _md()
    tensors = random_tensors(md)
    del tensors["blk.1.post_ffw_norm.weight"]
    with pytest.raises(TensorInfoError, match=r"blk\.1\.post_ffw_norm\.weight.*missing"):
        gguflm.load_model(write_model(tmp_path / "m.gguf", md, tensors))


def test_misshapen_head_norm_is_named(tmp_path) -> None:
    md = _md()
    tensors = random_tensors(md)
    tensors["blk.0.attn_q_norm.weight"] = np.ones(64, np.float32)  # n_embd, not head_dim
    with pytest.raises(TensorInfoError, match=r"blk\.0\.attn_q_norm\.weight.*\[64\].*\[16\]"):
        gguflm.load_model(write_model(tmp_path / "m.gguf", md, tensors))


def test_llama_file_is_not_gemma3(tmp_path) -> None:
    """A llama-shaped tensor set declared as gemma3 fails on the first tensor it lacks."""
    md = tiny_metadata("llama")
    tensors = random_tensors(md)
    md["general.architecture"] = "gemma3"
    md = {k.replace("llama.", "gemma3."): v for k, v in md.items()}
    with pytest.raises(TensorInfoError, match=r"blk\.0\.attn_q_norm\.weight.*missing"):
        gguflm.load_model(write_model(tmp_path / "m.gguf", md, tensors))
