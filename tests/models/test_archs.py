"""The qwen2, qwen3, phi3 and gemma2 architectures.

Conformance: each architecture's tiny random-weight F16 model from
shared/reference/arch/<arch>/ against llama.cpp's greedy.json, teacher-forced (F16 weights:
llama.cpp is near-exact, so the bars are tight; injected bugs score 0.8 to 17). Tiny
random models written by our GGUFWriter check what the reference cannot reach: cached vs
uncached logits, fused vs separate projections, errors naming the tensor, LongRoPE.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import gguflm
from gguflm.gguf.errors import TensorInfoError
from gguflm.model import archs
from refcheck import assert_conforms
from tinymodel import declared_tensors, random_tensors, tiny_metadata, write_model

ARCHS = ["qwen2", "qwen3", "phi3", "gemma2"]
IDS = [1, 17, 5, 90, 33, 2, 64, 8, 8, 41, 77, 12, 3, 50, 9, 21]

# per-architecture metadata for the tiny models (tail of the key, ``__`` for dots)
TINY = {
    "qwen2": {},
    "qwen3": {"attention__key_length": 24, "attention__value_length": 24},  # 4 x 24 != 64
    "phi3": {"rope__dimension_count": 8},                                   # partial RoPE
    "gemma2": {"attention__sliding_window": 5, "attn_logit_softcapping": 4.0,
               "final_logit_softcapping": 8.0},
}


def _tiny_md(arch: str, **kw) -> dict:
    return tiny_metadata(arch, **{**TINY[arch], **kw})


# -- conformance against llama.cpp -----------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
def test_conformance(reference: Path, arch: str) -> None:
    """prompt_tokens identical; top-1 agrees wherever llama.cpp's margin is >= 0.25; on each
    step's 20 reference ids, de-shifted max <= 0.5 and median-over-steps max |d| <= 0.15."""
    folder = reference / "arch" / arch
    path = folder / f"tiny-{arch}-f16.gguf"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    model = gguflm.load_model(path)
    assert model.config.arch == arch
    assert_conforms(model, folder, path)


# -- tiny random models ------------------------------------------------------------------------


@pytest.fixture(scope="module", params=ARCHS)
def tiny(request, tmp_path_factory) -> gguflm.model.Model:
    arch = request.param
    md = _tiny_md(arch)
    path = tmp_path_factory.mktemp(arch) / f"tiny-{arch}.gguf"
    model = gguflm.load_model(write_model(path, md, random_tensors(md, seed=1)))
    model.kv_type = "f32"  # exact float32 attention: evaluation orders agree to ~1e-5
    return model


def test_registered() -> None:
    assert set(ARCHS) <= set(archs.supported())


def test_cached_and_uncached_logits_agree(tiny) -> None:
    """One batch, token by token, and uneven chunks give the same logits (for gemma2 the
    window of 5 is crossed many times, by batches and by single tokens)."""
    full = tiny.logits(IDS)
    assert full.shape == (len(IDS), tiny.config.n_vocab) and full.dtype == np.float32
    assert np.isfinite(full).all()
    cache = tiny.new_cache(32)
    one_by_one = np.stack([tiny.forward([t], cache) for t in IDS])
    np.testing.assert_allclose(one_by_one, full, rtol=0, atol=2e-4)
    cache = tiny.new_cache(32)
    parts = [tiny.forward(IDS[a:b], cache, all_logits=True)
             for a, b in ((0, 7), (7, 8), (8, 16))]
    np.testing.assert_allclose(np.concatenate(parts), full, rtol=0, atol=2e-4)
    np.testing.assert_allclose(tiny.forward(IDS, tiny.new_cache(16)), full[-1], atol=1e-5)


def test_order_matters(tiny) -> None:
    a = tiny.logits([7, 9, 5])[-1]
    assert not np.allclose(a, tiny.logits([9, 7, 5])[-1], atol=1e-3)


@pytest.mark.parametrize("arch", ARCHS)
def test_missing_tensor_is_named(tmp_path, arch) -> None:
    md = _tiny_md(arch)
    tensors = random_tensors(md)
    name = next(n for n in tensors if n.startswith("blk.1.attn_"))
    del tensors[name]
    with pytest.raises(TensorInfoError, match=rf"'{name}'.*missing.*'{arch}'"):
        gguflm.load_model(write_model(tmp_path / "m.gguf", md, tensors))


@pytest.mark.parametrize(("arch", "overrides", "key"), [
    ("qwen2", {"attention__value_length": 32}, "qwen2.attention.value_length"),
    ("phi3", {"attention__value_length": 32}, "phi3.attention.value_length"),
    ("qwen2", {"rope__dimension_count": 8}, "qwen2.rope.dimension_count"),
])
def test_graph_assumptions_fail_at_load(arch, overrides, key) -> None:
    """llama.cpp asserts one head size (qwen2, phi3) and full RoPE (qwen2): so do we, naming
    the key, before any tensor is read."""
    from gguflm.gguf.errors import MetadataError

    with pytest.raises(MetadataError) as e:
        declared_tensors(_tiny_md(arch, **overrides))
    assert e.value.key == key


def _fuse(tensors: dict, drop_biases: bool = False) -> dict:
    """The same weights with every layer's Q/K/V as one attn_qkv (rows [q | k | v])."""
    out = dict(tensors)
    for i in range(2):
        parts = [out.pop(f"blk.{i}.attn_{x}.weight") for x in "qkv"]
        out[f"blk.{i}.attn_qkv.weight"] = np.concatenate(parts)
        biases = [out.pop(f"blk.{i}.attn_{x}.bias", None) for x in "qkv"]
        if biases[0] is not None and not drop_biases:
            out[f"blk.{i}.attn_qkv.bias"] = np.concatenate(biases)
    return out


@pytest.mark.parametrize("arch", ["qwen2", "phi3"])
def test_fused_and_separate_qkv_agree(tmp_path, arch) -> None:
    """llama.cpp accepts either layout for every architecture here; qwen2's biases too."""
    md = _tiny_md(arch)
    sep = random_tensors(md, seed=2, with_optional=(".bias",) if arch == "qwen2" else ())
    def logits(name: str, tensors: dict) -> np.ndarray:
        model = gguflm.load_model(write_model(tmp_path / name, md, tensors))
        model.kv_type = "f32"  # exact float32 attention, so the layouts agree to ~1e-5
        return model.logits(IDS)

    a, b = logits("sep.gguf", sep), logits("fused.gguf", _fuse(sep))
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-4)
    if arch == "qwen2":  # and the biases matter
        c = logits("nob.gguf", _fuse(sep, drop_biases=True))
        assert np.abs(c - a).max() > 1e-2


def test_phi3_fused_ffn_is_gate_then_up(tmp_path) -> None:
    """ffn_up (2 n_ff rows) holds the gate first: swapping the halves changes the output."""
    md = _tiny_md("phi3")
    t = random_tensors(md, seed=3)
    a = gguflm.load_model(write_model(tmp_path / "a.gguf", md, t)).logits(IDS)
    n_ff = md["phi3.feed_forward_length"]
    swapped = dict(t)
    for i in range(2):
        w = t[f"blk.{i}.ffn_up.weight"]
        swapped[f"blk.{i}.ffn_up.weight"] = np.concatenate([w[n_ff:], w[:n_ff]])
    b = gguflm.load_model(write_model(tmp_path / "b.gguf", md, swapped)).logits(IDS)
    assert np.abs(a - b).max() > 1e-2


def test_phi3_longrope_factors_follow_the_context(tmp_path) -> None:
    """Short factors while the context fits rope.scaling.original_context_length, long ones
    beyond it; factors of 1 and attn_factor 1 change nothing."""
    md = _tiny_md("phi3", rope__scaling__original_context_length=16)
    t = random_tensors(md, seed=4)
    base = gguflm.load_model(write_model(tmp_path / "base.gguf", md, t))
    n_freq = md["phi3.rope.dimension_count"] // 2
    ones = dict(t, **{"rope_factors_short.weight": np.ones(n_freq, np.float32),
                      "rope_factors_long.weight": np.full(n_freq, 4.0, np.float32)})
    m = gguflm.load_model(write_model(tmp_path / "lr.gguf", md, ones))
    short = m.forward(IDS, m.new_cache(16), all_logits=True)
    np.testing.assert_allclose(short, base.logits(IDS), atol=1e-5)
    long = m.forward(IDS, m.new_cache(32), all_logits=True)
    assert np.abs(long - short).max() > 1e-2
    del ones["rope_factors_long.weight"]
    with pytest.raises(TensorInfoError, match="rope_factors_long"):
        gguflm.load_model(write_model(tmp_path / "half.gguf", md, ones))


# -- the command line ------------------------------------------------------------------------


def test_cli_lists_the_architectures(capsys) -> None:
    from gguflm.cli import main

    assert main(["archs", "--json"]) == 0
    import json

    table = json.loads(capsys.readouterr().out)
    assert set(table) == set(archs.supported()) >= {"llama", "gemma3", *ARCHS}
    assert all(table.values())  # each with a description
    assert main(["archs"]) == 0
    assert capsys.readouterr().out.splitlines()[0].split()[0] == min(table)


def test_unsupported_architecture_fails_at_load(tmp_path, capsys) -> None:
    """One error line naming the architecture and the supported list, exit status 1."""
    from gguflm.cli import main

    path = write_model(tmp_path / "m.gguf", tiny_metadata("mamba9"),
                       random_tensors(tiny_metadata("llama")))
    assert main(["run", str(path), "-p", "hi", "-n", "1"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "unknown architecture 'mamba9'" in err
    assert "supported: " + ", ".join(archs.supported()) in err


def test_inspect_names_window_and_caps(tmp_path, capsys) -> None:
    from gguflm.cli import main

    md = _tiny_md("gemma2")
    path = write_model(tmp_path / "g.gguf", md, random_tensors(md))
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "gemma2 (runs in gguflm)" in out
    assert "grouped-query (2 query heads per KV head)" in out
    assert "sliding window    5 tokens" in out
    assert "soft-capping      attention 4, final logits 8" in out
    md = _tiny_md("phi3", attention__sliding_window=2047)
    path = write_model(tmp_path / "p.gguf", md, random_tensors(md))
    assert main(["inspect", "--json", str(path)]) == 0
    import json

    s = json.loads(capsys.readouterr().out)["summary"]
    assert s["sliding_window"] == 2047 and s["attn_logit_softcapping"] is None
    assert s["ignored_keys"] == ["attention.sliding_window"]
    assert s["architecture_supported"] is True


def test_swa_layer_pattern() -> None:
    """llama.cpp's load_swa_pattern: a period p slides every layer but each p-th (dense
    last), 0 slides all, per-layer flags are taken as they are."""
    from gguflm.gguf.errors import MetadataError
    from gguflm.model.config import Meta

    key = "gemma2.attention.sliding_window_pattern"
    assert Meta({}, "gemma2").swa_layers(4, 2) == (True, False, True, False)
    assert Meta({key: 3}, "gemma2").swa_layers(4, 2) == (True, True, False, True)
    assert Meta({key: 0}, "gemma2").swa_layers(3, 2) == (True, True, True)
    flags = np.array([False, True, True], dtype=bool)
    assert Meta({key: flags}, "gemma2").swa_layers(3, 2) == (False, True, True)
    with pytest.raises(MetadataError, match="2 entries for 3 layers"):
        Meta({key: flags[:2]}, "gemma2").swa_layers(3, 2)
