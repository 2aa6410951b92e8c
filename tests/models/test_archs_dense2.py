"""The smollm3, olmo2, exaone4, ernie4_5 and seed_oss architectures.

Conformance: each architecture's tiny F16 model from shared/reference/arch/<arch>/ against
llama.cpp's greedy.json, teacher-forced (skipped without the reference data). Tiny random
models written by our GGUFWriter check the rest: cached vs uncached logits, the compiled
paths (blocks and team) against the reference forward bit for bit (layers without a
pre-norm, Q/K norms across the heads, layers without RoPE), and each architecture's
distinguishing feature.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import gguflm
from gguflm.model import executor, ops, reference, team
from refcheck import assert_conforms, load_tiny
from test_fused import _quantized, _run
from tinymodel import random_tensors, tiny_metadata, write_model

ARCHS = ["smollm3", "olmo2", "exaone4", "ernie4_5", "seed_oss"]
IDS = [1, 17, 5, 90, 33, 2, 64, 8, 8, 41, 77, 12, 3, 50, 9, 21]

# per-architecture metadata for the tiny models (tail of the key, ``__`` for dots)
TINY = {
    "smollm3": {"block_count": 4},                                # layer 3: no RoPE
    "olmo2": {"block_count": 4, "attention__sliding_window": 5},  # OLMo 3: 3 sliding, 1 full
    "exaone4": {"block_count": 64, "attention__sliding_window": 5},  # sliding from 64 layers
    "ernie4_5": {"attention__key_length": 32, "attention__value_length": 32},  # 4 x 32 != 64
    "seed_oss": {"attention__key_length": 32, "attention__value_length": 32},
}


def _tiny_md(arch: str, **kw) -> dict:
    return tiny_metadata(arch, **{**TINY[arch], **kw})


def _load(path: Path, md: dict, tensors: dict | None = None, **kw) -> gguflm.model.Model:
    model = gguflm.load_model(write_model(path, md, random_tensors(md) if tensors is None
                                          else tensors, **kw))
    model.kv_type = "f32"  # exact float32 attention: evaluation orders agree to ~1e-5
    return model


def _replanned(model: gguflm.model.Model, blocks: list) -> gguflm.model.Model:
    """``model`` with these layer specs, planned afresh."""
    model.blocks = blocks
    model.plan = executor.plan(blocks)
    return model


# -- conformance against llama.cpp -----------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
def test_conformance(reference: Path, arch: str) -> None:
    """prompt_tokens identical; top-1 agrees wherever llama.cpp's margin is >= 0.25; on each
    step's 20 reference ids, de-shifted max <= 0.5 and median-over-steps max |d| <= 0.15."""
    model, folder = load_tiny(reference, arch)
    assert model.config.arch == arch
    assert model.plan.compiled and not model.plan.team_reason, model.plan.describe()
    assert_conforms(model, folder, folder / f"tiny-{arch}-f16.gguf")


# -- tiny random models ------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
def test_cached_and_uncached_logits_agree(tmp_path: Path, arch: str) -> None:
    """One batch, token by token, and uneven chunks give the same logits (windows of 5
    crossed many times where the architecture slides)."""
    model = _load(tmp_path / "m.gguf", _tiny_md(arch))
    full = model.logits(IDS)
    assert full.shape == (len(IDS), model.config.n_vocab) and np.isfinite(full).all()
    cache = model.new_cache(32)
    one_by_one = np.stack([model.forward([t], cache) for t in IDS])
    np.testing.assert_allclose(one_by_one, full, rtol=0, atol=2e-4)
    cache = model.new_cache(32)
    parts = [model.forward(IDS[a:b], cache, all_logits=True)
             for a, b in ((0, 7), (7, 8), (8, 16))]
    np.testing.assert_allclose(np.concatenate(parts), full, rtol=0, atol=2e-4)


@pytest.mark.parametrize("arch", ARCHS)
def test_compiled_paths_match_the_reference(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            arch: str) -> None:
    """The team, the fused layers and the reference forward give bit-identical logits."""
    md = _tiny_md(arch)
    model = gguflm.load_model(write_model(tmp_path / "m.gguf", md, random_tensors(md),
                                          _quantized(md)))
    assert model.plan.compiled and not model.plan.team_reason, model.plan.describe()
    by_team = _run(model)
    assert np.isfinite(by_team).all()
    with monkeypatch.context() as m:
        m.setattr(team, "MAX_ROWS", 0)  # layer by layer, through the fused layers
        np.testing.assert_array_equal(_run(model), by_team)
    with monkeypatch.context() as m:
        m.setattr(model, "plan", executor.Plan(None, "forced by the test"))
        np.testing.assert_array_equal(_run(model), by_team)


# -- what each architecture adds -----------------------------------------------------------------


def test_smollm3_every_fourth_layer_has_no_rope(tmp_path: Path) -> None:
    """Layers 3 and 7 of 8 read the table of no rotation (llama.cpp's fixed period, no
    metadata); rotating layer 3 instead changes the logits."""
    md = _tiny_md("smollm3", block_count=8)
    model = _load(tmp_path / "m.gguf", md)
    assert model.config.no_rope == (False, False, False, True) * 2
    assert [b.attn.rope for b in model.blocks] == [0, 0, 0, 1] * 2
    assert np.all(model.rope_tables(np.arange(4))[1] == 1)
    before = model.logits(IDS)
    blocks = list(model.blocks)
    blocks[3] = replace(blocks[3], attn=replace(blocks[3].attn, rope=0))
    assert np.abs(_replanned(model, blocks).logits(IDS) - before).max() > 1e-2


def test_olmo2_has_post_norms_only_and_qk_norms_across_heads(tmp_path: Path) -> None:
    """No pre-norms; Q and K normed over the whole projection, which is not a per-head
    norm; OLMo 3's pattern: layers 0-2 slide (a window of 5, RoPE without frequency
    scaling: table 1), layer 3 sees everything; OLMo 2 files slide nowhere."""
    md = _tiny_md("olmo2", rope__scaling__type="linear", rope__scaling__factor=2.0)
    model = _load(tmp_path / "m.gguf", md)
    c = model.config
    for b in model.blocks:
        assert b.attn_norm is None and b.ffn_norm is None
        assert b.attn_post_norm is not None and b.ffn_post_norm is not None
        assert len(b.attn.q_norm) == c.n_embd_q and len(b.attn.k_norm) == c.n_embd_k
    assert [(b.attn.window, b.attn.rope) for b in model.blocks] == [(5, 1)] * 3 + [(0, 0)]
    full, sliding = model.rope_tables(np.arange(1, 4))
    assert not np.allclose(full, sliding)  # the sliding layers' table is unscaled
    # one norm over the heads is not a norm per head with that head's slice of the weight
    x = np.random.default_rng(0).standard_normal((3, c.n_head, c.head_dim)).astype(np.float32)
    x[:, 0] *= 4  # heads of different sizes
    w = model.blocks[0].attn.q_norm
    per_head = ops.rmsnorm(x, np.ones(c.head_dim, np.float32), c.norm_eps) * w.reshape(
        c.n_head, c.head_dim)
    assert not np.allclose(reference.qk_norm(x, w, c.norm_eps), per_head, atol=1e-2)
    plain = _load(tmp_path / "p.gguf", _tiny_md("olmo2", attention__sliding_window=None))
    assert {(b.attn.window, b.attn.rope) for b in plain.blocks} == {(0, 0)}


def test_exaone4_slides_and_leaves_out_rope_only_at_64_layers(tmp_path: Path) -> None:
    """At 64 layers: three sliding layers with RoPE, then a full one without (table 1 of
    no rotation), and rotating a full layer changes the logits; at any other depth no
    window and RoPE everywhere, as llama.cpp decides from the layer count (not from the
    pattern)."""
    model = _load(tmp_path / "m.gguf", _tiny_md("exaone4"))
    specs = [(b.attn.window, b.attn.rope) for b in model.blocks]
    assert specs == [(5, 0), (5, 0), (5, 0), (0, 1)] * 16
    for b in model.blocks:
        assert b.attn_norm is None and b.ffn_norm is None
        assert len(b.attn.q_norm) == len(b.attn.k_norm) == model.config.head_dim
    before = model.logits(IDS)
    blocks = list(model.blocks)
    blocks[3] = replace(blocks[3], attn=replace(blocks[3].attn, rope=0))
    assert np.abs(_replanned(model, blocks).logits(IDS) - before).max() > 1e-3
    shallow = _load(tmp_path / "s.gguf", _tiny_md("exaone4", block_count=4))
    assert {(b.attn.window, b.attn.rope) for b in shallow.blocks} == {(0, 0)}
    # a pattern without sliding layers still leaves the 64-layer model's RoPE out
    md = _tiny_md("exaone4", attention__sliding_window_pattern=1)
    assert {(b.attn.window, b.attn.rope) for b in _load(tmp_path / "f.gguf", md).blocks} \
        == {(0, 1)}


def test_exaone4_loads_and_skips_its_prediction_blocks(tmp_path: Path) -> None:
    """``nextn_predict_layers`` blocks at the end are loaded (llama.cpp keeps them in the
    file) and not run: the trunk's logits are those of the file without them."""
    md = _tiny_md("exaone4", block_count=3, nextn_predict_layers=1)
    tensors = random_tensors(md)
    trunk = _load(tmp_path / "t.gguf", md, tensors)
    assert trunk.config.n_layer == 2 and len(trunk.blocks) == 2
    d, n = md["exaone4.embedding_length"], md["exaone4.feed_forward_length"]
    rng = np.random.default_rng(1)
    mtp = {f"blk.2.{name}.weight": rng.standard_normal(shape).astype(np.float32)
           for name, shape in (("attn_q", (d, d)), ("attn_k", (32, d)), ("attn_v", (32, d)),
                               ("attn_output", (d, d)), ("ffn_gate", (n, d)),
                               ("ffn_up", (n, d)), ("ffn_down", (d, n)),
                               ("nextn.eh_proj", (d, 2 * d)), ("nextn.enorm", (d,)))}
    both = _load(tmp_path / "b.gguf", md, {**tensors, **mtp})
    np.testing.assert_array_equal(both.logits(IDS), trunk.logits(IDS))


def test_ernie4_5_rotates_adjacent_pairs_and_ignores_the_output_bias(tmp_path: Path) -> None:
    """NORM RoPE; an ``attn_output.bias`` in the file loads and, as in llama.cpp's graph,
    is never added."""
    md = _tiny_md("ernie4_5")
    tensors = random_tensors(md)
    model = _load(tmp_path / "m.gguf", md, tensors)
    assert not any(b.attn.neox for b in model.blocks)
    biased = {**tensors, **{f"blk.{i}.attn_output.bias": np.full(64, 3.0, np.float32)
                            for i in range(2)}}
    with_bias = _load(tmp_path / "b.gguf", md, biased)
    assert with_bias.layers[0].attn_output_bias is not None
    assert with_bias.blocks[0].attn.o.b is None
    np.testing.assert_array_equal(with_bias.logits(IDS), model.logits(IDS))


def test_seed_oss_ffn_norm_is_post_attention_norm(tmp_path: Path) -> None:
    """The FFN's pre-norm is the file's ``post_attention_norm`` (no post-norms), and the
    Q/K/V biases, when the file has them, are added."""
    md = _tiny_md("seed_oss")
    tensors = random_tensors(md, with_optional=(".bias",))
    model = _load(tmp_path / "m.gguf", md, tensors)
    for i, b in enumerate(model.blocks):
        np.testing.assert_array_equal(b.ffn_norm, tensors[f"blk.{i}.post_attention_norm.weight"])
        assert b.attn_post_norm is None and b.ffn_post_norm is None
        assert b.attn.neox and b.attn.q.b is not None
    plain = {n: t for n, t in tensors.items() if not n.endswith(".bias")}
    assert np.abs(_load(tmp_path / "p.gguf", md, plain).logits(IDS)
                  - model.logits(IDS)).max() > 1e-2
