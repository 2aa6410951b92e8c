"""The llama architecture and the shared model machinery, on tiny random models that our own
GGUFWriter writes: cached vs uncached logits, load-time errors naming the key or tensor,
tied/untied output, and the ops against slow loop-by-loop twins."""

from __future__ import annotations

import numpy as np
import pytest

import gguflm
from gguflm.gguf.errors import GGUFError, MetadataError, TensorInfoError
from gguflm.gguf.types import GGMLType
from gguflm.model import ContextFullError, ops
from tinymodel import declared_tensors, random_tensors, tiny_metadata, write_model, write_tiny

IDS = [1, 17, 5, 90, 33, 2, 64, 8, 8, 41, 77, 12]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> gguflm.model.Model:
    path = tmp_path_factory.mktemp("tiny") / "tiny-llama.gguf"
    return gguflm.load_model(write_tiny(path, "llama"))


def _write(tmp_path, md, tensors, **kw):
    return write_model(tmp_path / "m.gguf", md, tensors, **kw)


# -- forward ------------------------------------------------------------------------------------


def test_config_from_metadata(tiny) -> None:
    c = tiny.config
    assert (c.arch, c.n_layer, c.n_embd, c.n_head, c.n_head_kv) == ("llama", 2, 64, 4, 2)
    assert (c.head_dim, c.rope_dim, c.n_vocab, c.n_ff) == (16, 16, 96, 96)
    assert tiny.output is tiny.token_embd  # no output.weight in the file: tied


def test_cached_and_uncached_logits_agree(tiny) -> None:
    full = tiny.logits(IDS)
    assert full.shape == (len(IDS), 96) and full.dtype == np.float32
    cache = tiny.new_cache(32)
    one_by_one = np.stack([tiny.forward([t], cache) for t in IDS])
    np.testing.assert_allclose(one_by_one, full, rtol=0, atol=2e-4)
    # a prefill batch, then single tokens, then a batch again
    cache = tiny.new_cache(32)
    parts = [tiny.forward(IDS[:5], cache, all_logits=True),
             tiny.forward(IDS[5:6], cache, all_logits=True),
             tiny.forward(IDS[6:], cache, all_logits=True)]
    np.testing.assert_allclose(np.concatenate(parts), full, rtol=0, atol=2e-4)
    assert cache.n == len(IDS)
    # the last-position default equals the last row
    np.testing.assert_allclose(tiny.forward(IDS, tiny.new_cache(16)), full[-1], atol=1e-5)


def test_long_batches_are_split(tiny, monkeypatch) -> None:
    """Past MAX_BATCH tokens a forward pass runs in slices; the logits do not change."""
    from gguflm.model import base

    full = tiny.logits(IDS)
    monkeypatch.setattr(base, "MAX_BATCH", 5)
    np.testing.assert_allclose(tiny.logits(IDS), full, atol=2e-4)
    cache = tiny.new_cache(16)
    np.testing.assert_allclose(tiny.forward(IDS, cache), full[-1], atol=2e-4)
    assert cache.n == len(IDS)


def test_order_matters(tiny) -> None:
    """Attention without positions is blind to order; with RoPE, swapping two earlier
    tokens changes the last logits (and changing them changes it too)."""
    a = tiny.logits([7, 9, 5])[-1]
    assert not np.allclose(a, tiny.logits([9, 7, 5])[-1], atol=1e-3)
    assert not np.allclose(a, tiny.logits([7, 7, 5])[-1], atol=1e-3)


def test_truncate_and_reuse(tiny) -> None:
    cache = tiny.new_cache(32)
    tiny.forward(IDS, cache)
    cache.truncate(4)
    again = tiny.forward(IDS[4:], cache, all_logits=True)
    np.testing.assert_allclose(again, tiny.logits(IDS)[4:], atol=2e-4)


def test_context_full_and_bad_ids(tiny) -> None:
    cache = tiny.new_cache(4)
    tiny.forward([1, 2, 3], cache)
    with pytest.raises(ContextFullError, match="2 more tokens do not fit"):
        tiny.forward([4, 5], cache)
    assert cache.n == 3  # nothing was written
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tiny.logits([1, 96])
    with pytest.raises(ValueError, match="non-empty"):
        tiny.logits([])


def test_untied_output_is_used(tmp_path) -> None:
    md = tiny_metadata("llama")
    tensors = random_tensors(md, seed=1, with_optional=("output.weight",))
    m = gguflm.load_model(_write(tmp_path, md, tensors))
    assert m.output is not m.token_embd
    tied = {k: v for k, v in tensors.items() if k != "output.weight"}
    m2 = gguflm.load_model(write_model(tmp_path / "tied.gguf", md, tied))
    assert not np.allclose(m.logits([3, 4]), m2.logits([3, 4]), atol=1e-3)


def test_biases_when_present(tmp_path) -> None:
    md = tiny_metadata("llama")
    base = random_tensors(md, seed=2)
    biased = random_tensors(md, seed=2, with_optional=(".bias",))
    assert any(k.endswith("attn_q.bias") for k in biased)
    a = gguflm.load_model(write_model(tmp_path / "a.gguf", md, base)).logits([3, 4])
    b = gguflm.load_model(write_model(tmp_path / "b.gguf", md, biased)).logits([3, 4])
    assert not np.allclose(a, b, atol=1e-3)


def test_quantized_weights_stay_quantized(tmp_path) -> None:
    md = tiny_metadata("llama")
    tensors = random_tensors(md, seed=3)
    types = {n: GGMLType.Q8_0 for n, x in tensors.items() if x.ndim == 2}
    types["token_embd.weight"] = GGMLType.F16
    q = gguflm.load_model(_write(tmp_path, md, tensors, types=types))
    f = gguflm.load_model(write_model(tmp_path / "f32.gguf", md, tensors))
    assert q.layers[0].attn_q.type == GGMLType.Q8_0
    assert q.layers[0].attn_q.raw.dtype == np.uint8  # the encoded bytes, not float32
    # Q8_0 weights: logits within ~1% of the float32 model's scale (garbage would be ~100%)
    want = f.logits(IDS)
    np.testing.assert_allclose(q.logits(IDS), want, atol=0.02 * np.abs(want).max())


# -- load-time errors -------------------------------------------------------------------------


def test_missing_tensor_is_named(tmp_path) -> None:
    md = tiny_metadata("llama")
    tensors = random_tensors(md)
    del tensors["blk.1.ffn_up.weight"]
    with pytest.raises(TensorInfoError, match=r"blk\.1\.ffn_up\.weight.*missing"):
        gguflm.load_model(_write(tmp_path, md, tensors))


def test_misshapen_tensor_is_named(tmp_path) -> None:
    md = tiny_metadata("llama")
    tensors = random_tensors(md)
    tensors["blk.0.attn_k.weight"] = tensors["blk.0.attn_q.weight"]  # 4 heads, not 2
    with pytest.raises(TensorInfoError, match=r"blk\.0\.attn_k\.weight.*\[64, 64\].*\[64, 32\]"):
        gguflm.load_model(_write(tmp_path, md, tensors))


def test_unexpected_tensor_is_named(tmp_path) -> None:
    md = tiny_metadata("llama")
    tensors = random_tensors(md)
    tensors["blk.0.attn_q_norm.weight"] = np.ones(16, np.float32)
    with pytest.raises(TensorInfoError, match=r"blk\.0\.attn_q_norm\.weight.*not used"):
        gguflm.load_model(_write(tmp_path, md, tensors))


@pytest.mark.parametrize("overrides, key, what", [
    ({"attention__head_count_kv": 3}, "llama.attention.head_count_kv", "multiple"),
    ({"attention__head_count": 5, "attention__head_count_kv": 5}, "llama.embedding_length",
     "not divisible"),
    ({"block_count": None}, "llama.block_count", "missing"),
    ({"attention__layer_norm_rms_epsilon": -1.0}, "llama.attention.layer_norm_rms_epsilon",
     "positive"),
    ({"rope__dimension_count": 8}, "llama.rope.dimension_count", "head size"),
    ({"rope__scaling__type": "longrope"}, "llama.rope.scaling.type", "not supported"),
    ({"context_length": "long"}, "llama.context_length", "integer"),
])
def test_bad_config_names_key(tmp_path, overrides, key, what) -> None:
    md = tiny_metadata("llama")
    tensors = random_tensors(md)
    md = tiny_metadata("llama", **overrides)
    with pytest.raises(MetadataError, match=what) as e:
        gguflm.load_model(_write(tmp_path, md, tensors))
    assert e.value.key == key


def test_key_length_allows_odd_head_split(tmp_path) -> None:
    """n_embd need not divide by n_head when attention.key_length gives the head size."""
    md = tiny_metadata("llama", attention__head_count=3, attention__head_count_kv=1,
                       attention__key_length=16)
    declared = declared_tensors(md)
    assert declared["blk.0.attn_q.weight"][0] == (48, 64)
    m = gguflm.load_model(_write(tmp_path, md, random_tensors(md)))
    assert m.logits([1, 2]).shape == (2, 96)


def test_unknown_architecture(tmp_path) -> None:
    md = tiny_metadata("llama")
    tensors = random_tensors(md)
    md["general.architecture"] = "mamba9"
    with pytest.raises(MetadataError, match=r"unknown architecture 'mamba9'.*supported:.*llama"):
        gguflm.load_model(_write(tmp_path, md, tensors))


def test_vocab_only_file_is_not_a_model(reference) -> None:
    with pytest.raises(GGUFError, match="vocabulary-only file, not a model"):
        gguflm.load_model(reference / "vocab" / "ggml-vocab-llama-spm.gguf")


# -- ops against slow twins -------------------------------------------------------------------


def _rope_loop(x, pos, base, neox):
    out = x.astype(np.float64).copy()
    n_rot = x.shape[-1]
    for t, p in enumerate(pos):
        for i in range(n_rot // 2):
            theta = p * base ** (-2 * i / n_rot)
            a, b = (i, i + n_rot // 2) if neox else (2 * i, 2 * i + 1)
            x0, x1 = x[t, :, a], x[t, :, b]
            out[t, :, a] = x0 * np.cos(theta) - x1 * np.sin(theta)
            out[t, :, b] = x0 * np.sin(theta) + x1 * np.cos(theta)
    return out


@pytest.mark.parametrize("neox", [False, True])
def test_rope_styles(neox) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 3, 8)).astype(np.float32)
    pos = np.array([0, 1, 2, 7, 30])
    rope = (ops.rope_neox if neox else ops.rope_norm)
    got = rope(x, ops.rope_table(pos, 8, 10000.0))
    np.testing.assert_allclose(got, _rope_loop(x, pos, 10000.0, neox), atol=1e-5)
    np.testing.assert_allclose(got[0], x[0])  # position 0: no rotation
    # partial rotation (rope.dimension_count < head size): the rest passes through
    part = rope(x, ops.rope_table(pos, 4, 10000.0))
    np.testing.assert_allclose(part[..., :4], _rope_loop(x[..., :4], pos, 10000.0, neox),
                               atol=1e-5)
    np.testing.assert_array_equal(part[..., 4:], x[..., 4:])


def test_attention_matches_per_head_loop() -> None:
    """The attention kernel: GQA mapping (query head h reads KV head h // group), causal and
    window masks, soft-cap, two sequences (slots) in one call; and its numpy twin."""
    from gguflm.model.attention import attend, attend_twin
    from gguflm.model.kv_cache import KVArena

    rng = np.random.default_rng(1)
    n_tok, n_head, n_kv, d, past = 4, 6, 2, 8, 70  # past > TILE: keys span two tiles
    n_pos = past + n_tok
    arena = KVArena(1, 2, n_pos, n_kv, d, d, kv_type="f32")
    k = rng.standard_normal((2, n_pos, n_kv, d)).astype(np.float32)   # per slot
    v = rng.standard_normal((2, n_pos, n_kv, d)).astype(np.float32)
    for s in (0, 1):
        arena.store(0, np.full(n_pos, s), np.arange(n_pos), k[s], v[s])
    q = rng.standard_normal((2 * n_tok, n_head, d)).astype(np.float32)
    slot = np.repeat([0, 1], n_tok)
    pos = np.concatenate([np.arange(past, n_pos), np.arange(past - 9, n_pos - 9)])
    for window, cap in ((0, 0.0), (3, 0.0), (0, 2.0)):
        got = np.empty((len(q), n_head, d), np.float32)
        attend(q, arena.k[0], arena.v[0], slot, pos, window, np.float32(0.3), np.float32(cap),
               False, got)
        want = np.zeros((len(q), n_head, d))
        for t, p in enumerate(pos):
            keys = [j for j in range(p + 1) if window == 0 or p - j < window]
            for h in range(n_head):
                kv = h // (n_head // n_kv)
                sc = 0.3 * k[slot[t], keys, kv].astype(np.float64) @ q[t, h]
                if cap:
                    sc = cap * np.tanh(sc / cap)
                w = np.exp(sc - sc.max())
                want[t, h] = (w / w.sum()) @ v[slot[t], keys, kv]
        np.testing.assert_allclose(got, want, atol=1e-5)
        twin = attend_twin(q, [k[s].transpose(1, 0, 2) for s in slot],
                           [v[s].transpose(1, 0, 2) for s in slot], pos, window, 0.3, cap,
                           False)
        np.testing.assert_allclose(got, twin, atol=1e-6)


def test_flash_attention_rows_match_twin_and_softmax() -> None:
    """Rows marked ``flash`` attend as llama.cpp's CPU flash attention (online softmax, the
    value sum kept in float16 with an F16 cache): the kernel equals its numpy twin, stays
    within float16 rounding of the exact softmax, and leaves the other rows of the same call
    bit-identical to a call without flash rows."""
    from gguflm.model.attention import attend, attend_twin
    from gguflm.model.kv_cache import KVArena

    rng = np.random.default_rng(2)
    n_tok, n_head, n_kv, d, past = 4, 4, 2, 64, 70  # d = 64: two 32-wide dot steps
    n_pos = past + n_tok
    for f16 in (True, False):
        arena = KVArena(1, 2, n_pos, n_kv, d, d, kv_type="f16" if f16 else "f32")
        k = rng.standard_normal((2, n_pos, n_kv, d)).astype(np.float32)
        v = rng.standard_normal((2, n_pos, n_kv, d)).astype(np.float32)
        if f16:
            k, v = (a.astype(np.float16).astype(np.float32) for a in (k, v))
        for s in (0, 1):
            arena.store(0, np.full(n_pos, s), np.arange(n_pos), k[s], v[s])
        q = rng.standard_normal((2 * n_tok, n_head, d)).astype(np.float32) * 0.3
        if f16:
            q = q.astype(np.float16).astype(np.float32)
        slot = np.repeat([0, 1], n_tok)
        pos = np.concatenate([np.arange(past, n_pos), np.arange(past - 9, n_pos - 9)])
        flash = np.arange(len(q)) % 2 == 0
        for window, cap in ((0, 0.0), (5, 0.0), (0, 2.0)):
            got = np.empty((len(q), n_head, d), np.float32)
            attend(q, arena.k[0], arena.v[0], slot, pos, window, np.float32(0.125),
                   np.float32(cap), f16, got, flash)
            plain = np.empty_like(got)
            attend(q, arena.k[0], arena.v[0], slot, pos, window, np.float32(0.125),
                   np.float32(cap), f16, plain)
            np.testing.assert_array_equal(got[~flash], plain[~flash])
            assert not np.array_equal(got[flash], plain[flash])  # a different arithmetic
            twin = attend_twin(q, [k[s].transpose(1, 0, 2) for s in slot],
                               [v[s].transpose(1, 0, 2) for s in slot], pos, window, 0.125,
                               cap, f16, flash)
            # the twin's fused steps are float64 sums rounded once more: now and then one
            # float16 step apart
            close = np.isclose(got, twin, rtol=1e-6, atol=1e-6)
            assert close.mean() > 0.99
            np.testing.assert_allclose(got, twin, rtol=2e-3 if f16 else 1e-6, atol=1e-6)
            np.testing.assert_allclose(got, plain, atol=5e-3 if f16 else 1e-5)


def test_ggml_expf_kernel_twin_and_accuracy() -> None:
    """``expf_ggml`` (ggml_v_expf's lanes; checked bit-identical to ggml's AVX2 code on 500k
    inputs when it was written) equals its numpy twin bit for bit and stays within a few
    float32 ulp of exp, 0 for -inf; the softmax sum groups lanes from index 0."""
    from numba import njit

    from gguflm.model.attention import _soft_max_sum, _twin_soft_max_sum
    from gguflm.quant.floatbits import expf_ggml, expf_ggml_twin

    @njit
    def many(x, out):  # noqa: ANN001, ANN202
        for i in range(len(x)):
            out[i] = expf_ggml(x[i])

    rng = np.random.default_rng(3)
    x = np.concatenate([rng.uniform(-100, 0, 20000), rng.uniform(-10, 10, 20000),
                        rng.uniform(-200, 90, 20000), [-np.inf, 0.0, -87.5, -103.0, 88.0]])
    x = x.astype(np.float32)
    got = np.empty_like(x)
    many(x, got)
    np.testing.assert_array_equal(got, expf_ggml_twin(x))
    want = np.exp(x.astype(np.float64))
    normal = (want > 2.0**-126) & (want < 2.0**127)
    assert np.max(np.abs(got[normal] - want[normal]) / want[normal]) < 4 * 2.0**-24
    assert got[-5] == 0.0 and got[-4] == 1.0
    ex = rng.uniform(0, 1, 77).astype(np.float32)
    for lo in (0, 3, 8, 13):
        assert _soft_max_sum(ex, lo, 76) == _twin_soft_max_sum(ex[lo:], lo)
        assert abs(_soft_max_sum(ex, lo, 76) - ex[lo:].astype(np.float64).sum()) < 1e-5


def test_rmsnorm_and_activations() -> None:
    x = np.array([[1.0, -2.0, 3.0, 0.5]], np.float32)
    w = np.array([1.0, 2.0, 0.5, 1.0], np.float32)
    want = x / np.sqrt(np.mean(x.astype(np.float64) ** 2) + 1e-5) * w
    np.testing.assert_allclose(ops.rmsnorm(x, w, 1e-5), want, rtol=1e-6)
    from gguflm.model.rowkernels import rmsnorm_twin

    big = np.random.default_rng(3).standard_normal((3, 5, 576)).astype(np.float32) * 40
    wb = np.random.default_rng(4).standard_normal(576).astype(np.float32)
    got = ops.rmsnorm(big, wb, 1e-6)  # (T, H, d) rows, as per-head norms pass them
    assert got.shape == big.shape
    np.testing.assert_array_equal(got.reshape(-1, 576),
                                  rmsnorm_twin(big.reshape(-1, 576), wb, 1e-6))
    np.testing.assert_array_equal(ops.rmsnorm(big[1, 2], wb, 1e-6), got[1, 2])  # batch-free
    z = np.array([-100.0, -1.0, 0.0, 2.0], np.float32)
    np.testing.assert_allclose(ops.silu(z), z / (1 + np.exp(-z.astype(np.float64))), atol=1e-6)
    assert ops.gelu_tanh(np.float32(0.0)) == 0.0
