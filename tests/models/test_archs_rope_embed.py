"""RoPE scaling for every architecture (YaRN, linear), ``mistral3``, ``granite``, and
decoders whose attention is bidirectional (``attention.causal`` false: ``llama-embed``).

Conformance: the tiny F16 models of shared/reference/arch/{qwen3-yarn, mistral3, granite}
against llama.cpp's greedy.json, teacher-forced, with the architecture bars; llama-embed's
pooled vectors against llama.cpp's (cosine >= 0.9999). Tiny random models written by our
GGUFWriter check the defaults of the rope.scaling keys, that the compiled and reference
paths agree bit for bit where the new parts meet them, and the refusals.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

import gguflm
from gguflm.api import LLM, InvalidRequestError
from gguflm.gguf.errors import MetadataError
from gguflm.model import executor, ops
from refcheck import assert_batch_invariant, load_cases, run_reference
from tinymodel import tiny_metadata, write_tiny

IDS = [1, 17, 5, 90, 33, 2, 64, 8, 8, 41, 77, 12, 3, 50, 9, 21, 60, 7, 11, 4, 88, 30]


def _folder(reference: Path, name: str) -> Path:
    folder = reference / "arch" / name
    if not (folder / f"tiny-{name}-f16.gguf").is_file():
        pytest.skip(f"{folder}/tiny-{name}-f16.gguf not found (the reference data's arch "
                    f"models)")
    return folder


# -- conformance against llama.cpp -----------------------------------------------------------


@pytest.mark.parametrize("name", ["qwen3-yarn", "mistral3", "granite"])
def test_conformance(reference: Path, name: str) -> None:
    """prompt_tokens identical; over the teacher-forced steps (mistral3 stops early on
    end-of-generation: 465), de-shifted max <= 0.5, median-over-steps max |d| <= 0.15,
    top-1 agreement wherever llama.cpp's margin is >= 0.25."""
    folder = _folder(reference, name)
    path = folder / f"tiny-{name}-f16.gguf"
    tok = gguflm.Tokenizer.from_file(path)
    for case in load_cases(folder):
        ids = tok.encode(case["prompt"], add_special=True, parse_special=case["special"])
        assert ids == case["prompt_tokens"], case["id"]
    steps = run_reference(gguflm.load_model(path), folder)
    s = steps.summary()
    assert s["steps"] > 400 and s["dev_max"] <= 0.5 and s["raw_median"] <= 0.15, s
    assert steps.disagreements(0.25) == [], s


@pytest.mark.parametrize(("name", "override"), [
    ("qwen3-yarn", {"qwen3.rope.scaling.type": "none"}),
    ("mistral3", {"mistral3.attention.temperature_scale": 0.0}),
    ("mistral3", {"mistral3.rope.scaling.yarn_log_multiplier": 0.0}),
    ("granite", {"granite.residual_scale": 0.0}),
])
def test_each_feature_matters(reference: Path, name: str, override: dict) -> None:
    """Without the feature the same file misses llama.cpp by far more than the bar."""
    folder = _folder(reference, name)
    model = gguflm.load_model(folder / f"tiny-{name}-f16.gguf", kv_overrides=override)
    assert run_reference(model, folder).summary()["dev_max"] > 2.0


# -- the shared RoPE tables ------------------------------------------------------------------


def _config(**overrides) -> gguflm.model.config.ModelConfig:
    from gguflm.model.config import ModelConfig

    return ModelConfig.from_metadata(tiny_metadata("llama", **overrides))


def test_factor_without_a_type_scales_linearly(tmp_path: Path) -> None:
    """llama.cpp's default rope.scaling.type is linear: a factor alone divides positions."""
    c = _config(rope__scaling__factor=4.0)
    assert float(c.rope_freq_scale) == 0.25 and c.rope_freq_scale.kind == "linear"
    pos = np.arange(40)
    np.testing.assert_array_equal(ops.rope_table(pos, 16, 1e4, c.rope_freq_scale),
                                  ops.rope_table(pos / 4, 16, 1e4))
    def logits(name: str, **kw) -> np.ndarray:
        return gguflm.load_model(write_tiny(tmp_path / name, seed=3, **kw)).logits(IDS)

    alone = logits("a.gguf", rope__scaling__factor=4.0)
    np.testing.assert_array_equal(
        alone, logits("b.gguf", rope__scaling__factor=4.0, rope__scaling__type="linear"))
    assert np.abs(alone - logits("c.gguf")).max() > 1e-2
    assert float(_config(rope__scaling__factor=4.0, rope__scaling__type="none")
                 .rope_freq_scale) == 1.0


def test_yarn_keys_defaults() -> None:
    """Absent keys take llama.cpp's defaults: original context = context_length, beta
    32/1, ext_factor 1, cos and sin times 1 + 0.1 ln f (1 with a log multiplier of 1)."""
    s = _config(rope__scaling__type="yarn", rope__scaling__factor=4.0).rope_freq_scale
    assert (float(s), s.n_ctx_orig, s.beta_fast, s.beta_slow, s.ext_factor) == \
        (0.25, 64, 32.0, 1.0, 1.0)
    assert s.magnitude == pytest.approx(1 + 0.1 * math.log(4), rel=1e-12)
    s = _config(rope__scaling__type="yarn", rope__scaling__factor=4.0,
                rope__scaling__yarn_log_multiplier=1.0,
                rope__scaling__original_context_length=16,
                rope__scaling__yarn_beta_fast=8.0).rope_freq_scale
    assert (s.n_ctx_orig, s.beta_fast, s.magnitude) == (16, 8.0, pytest.approx(1.0, rel=1e-12))
    s = _config(rope__scaling__type="yarn", rope__scaling__factor=4.0,
                rope__scaling__yarn_ext_factor=0.0).rope_freq_scale
    assert s.ext_factor == 0.0 and s.magnitude == 1.0  # interpolation alone: linear
    for bad in ({"rope__scaling__type": "longrope"}, {"rope__scaling__factor": -2.0}):
        with pytest.raises(MetadataError, match="rope.scaling"):
            _config(**bad)


def _ggml_rope_yarn(pos: np.ndarray, n_dims: int, base: float, md: dict,
                    ff: np.ndarray | None) -> np.ndarray:
    """ggml's rope cache as llama.cpp sets it up, written from its source apart from
    ``ops.yarn_table``: llama_context's yarn_attn_factor, ggml_rope_yarn_corr_dims,
    rope_yarn (float64 here)."""
    f = md["factor"]
    fs = 1.0 / f
    def mscale(m: float) -> float:
        return 1.0 if f <= 1 else 0.1 * m * math.log(f) + 1.0

    log_mul = md.get("log_mul", 0.0)
    attn = mscale(1.0) / mscale(log_mul) if log_mul else mscale(1.0)
    attn *= 1.0 / (1.0 + 0.1 * math.log(f)) * md.get("attn_factor", 1.0)
    def corr(beta: float) -> float:
        return n_dims * math.log(md["n_orig"] / (beta * 2 * math.pi)) / (2 * math.log(base))

    lo, hi = max(0.0, math.floor(corr(32.0))), min(n_dims - 1.0, math.ceil(corr(1.0)))
    out = np.empty((len(pos), n_dims // 2), np.complex128)
    for t, p in enumerate(pos):
        for i0 in range(0, n_dims, 2):
            extrap = p * base ** (-i0 / n_dims) / (1.0 if ff is None else ff[i0 // 2])
            ramp = (1 - min(1.0, max(0.0, (i0 // 2 - lo) / max(0.001, hi - lo)))) * md["ext"]
            theta = fs * extrap * (1 - ramp) + extrap * ramp
            m = attn * (1.0 + 0.1 * math.log(1.0 / fs))
            out[t, i0 // 2] = m * complex(math.cos(theta), math.sin(theta))
    return out


@pytest.mark.parametrize("md", [
    {"factor": 4.0, "n_orig": 256, "ext": 1.0},
    {"factor": 16.0, "n_orig": 16, "ext": 1.0, "log_mul": 1.0},
    {"factor": 8.0, "n_orig": 64, "ext": 0.5, "attn_factor": 1.25, "ff": True},
])
def test_yarn_table_is_ggmls(md: dict) -> None:
    c = _config(rope__scaling__type="yarn", rope__scaling__factor=md["factor"],
                rope__scaling__original_context_length=md["n_orig"],
                rope__scaling__yarn_ext_factor=md["ext"],
                rope__scaling__yarn_log_multiplier=md.get("log_mul"),
                rope__scaling__attn_factor=md.get("attn_factor"))
    ff = np.linspace(1.0, 4.0, 8).astype(np.float32) if md.get("ff") else None
    pos = np.arange(0, 3000, 37)
    got = ops.rope_table(pos, 16, 1e4, c.rope_freq_scale, ff)
    np.testing.assert_allclose(got, _ggml_rope_yarn(pos, 16, 1e4, md, ff), rtol=0,
                               atol=2e-6)


def test_gpt_oss_yarn_tables_unchanged() -> None:
    """gpt-oss's YaRN as it was computed before it moved into the shared tables (the
    same expressions), bit for bit."""
    from gguflm.model.config import ModelConfig

    md = tiny_metadata("gpt-oss", rope__scaling__type="yarn", rope__scaling__factor=32.0,
                       rope__scaling__original_context_length=4096, rope__freq_base=150000.0)
    s = ModelConfig.from_metadata(md).rope_freq_scale
    n_rot, base, fs, pos = 64, 150000.0, 1.0 / 32.0, np.arange(300)
    corr = [n_rot * np.log(4096 / (b * 2 * np.pi)) / (2 * np.log(base)) for b in (32.0, 1.0)]
    lo, hi = max(0.0, np.floor(corr[0])), min(n_rot - 1.0, np.ceil(corr[1]))
    i = np.arange(0, n_rot, 2, dtype=np.float64)
    ramp = 1.0 - np.clip((i / 2 - lo) / max(0.001, hi - lo), 0.0, 1.0)
    extrap = np.outer(np.asarray(pos, np.float64), base ** (-i / n_rot))
    theta = extrap * fs * (1.0 - ramp) + extrap * ramp
    old = ((1.0 * (1.0 + 0.1 * np.log(1.0 / fs))) * (np.cos(theta) + 1j * np.sin(theta))
           ).astype(np.complex64)
    np.testing.assert_array_equal(ops.rope_table(pos, n_rot, base, s), old)


# -- mistral3 and granite on every path ------------------------------------------------------


def _reference_plan(model: gguflm.model.Model) -> gguflm.model.Model:
    model.plan = executor.Plan(None, "the test's reference path")
    return model


@pytest.mark.parametrize("name", ["mistral3", "granite"])
def test_compiled_and_reference_paths_agree(reference: Path, name: str) -> None:
    """mistral3's temperature switches a batch to the reference path past 16 positions,
    granite's residual scale runs in the blocks: the logits are bit-identical alone, token
    by token, in chunks and beside other sequences, and to the reference path's."""
    path = _folder(reference, name) / f"tiny-{name}-f16.gguf"
    model = gguflm.load_model(path)
    ids = np.array(IDS)
    assert_batch_invariant(model, ids, 32)
    np.testing.assert_array_equal(_reference_plan(gguflm.load_model(path)).logits(ids),
                                  model.logits(ids))


def test_mistral3_temperature_is_one_before_its_length(reference: Path) -> None:
    model = gguflm.load_model(_folder(reference, "mistral3") / "tiny-mistral3-f16.gguf")
    rope = np.ones((40, 64), np.complex64)
    early = rope[:16]
    assert model.query_table(early, np.arange(16)) is early
    q = model.query_table(rope, np.arange(40))
    want = np.float32(1 + 0.1 * np.log(np.floor(np.arange(40) / 16) + 1))
    np.testing.assert_allclose(q[:, 0].real, want, rtol=1e-6)


# -- bidirectional decoders (llama-embed) ----------------------------------------------------


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


@pytest.fixture(scope="module")
def llama_embed(reference: Path) -> tuple[Path, list[dict]]:
    folder = _folder(reference, "llama-embed")
    cases = json.loads((folder / "embeddings.json").read_text())["cases"]
    return folder / "tiny-llama-embed-f16.gguf", cases


def test_llama_embed_matches_llama_cpp(llama_embed) -> None:
    """LLM.embed (the file's mean pooling, unnormalized) against llama.cpp's pooled
    vectors: the prompt's tokens identical, cosine >= 0.9999 for every prompt."""
    path, cases = llama_embed
    llm = LLM(path)
    try:
        assert llm.pooling == "mean"
        for c in cases:
            assert llm.tokenizer.encode(c["prompt"], add_special=True,
                                        parse_special=c["special"]) == c["prompt_tokens"]
        vectors = llm.embed([c["prompt_tokens"] for c in cases], normalize=False)
        for c, v in zip(cases, vectors, strict=True):
            assert _cosine(v, c["embedding"]) >= 0.9999, c["id"]
        with pytest.raises(InvalidRequestError, match="embedding model.*bidirectional"):
            llm.create_completion("The capital", max_tokens=2)
    finally:
        llm.close()


def test_llama_embed_causal_misses(llama_embed) -> None:
    """The same file run causally (attention.causal overridden) is far from llama.cpp
    (on the reference path: the compiled layers with a float32 cache would be compiled
    for this test alone)."""
    path, cases = llama_embed
    model = _reference_plan(gguflm.load_model(
        path, kv_overrides={"llama-embed.attention.causal": True}))
    hidden = model.embed_batch([c["prompt_tokens"] for c in cases])
    assert min(_cosine(h.mean(axis=0), c["embedding"]) for h, c in zip(hidden, cases)) < 0.9


def test_gguflm_embed_on_llama_embed(llama_embed, capsys) -> None:
    from gguflm.cli import main

    path, cases = llama_embed
    c = cases[0]
    assert main(["embed", str(path), "-p", c["prompt"], "--embd-normalize", "-1",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert _cosine(out["data"][0]["embedding"], c["embedding"]) >= 0.9999
    assert main(["run", str(path), "-p", "hello", "-n", "2"]) == 1
    assert "embedding model" in capsys.readouterr().err


def test_bidirectional_decoder(tmp_path: Path) -> None:
    """attention.causal false on a plain llama: a later token changes an earlier token's
    vector (causally it cannot), a sequence's vectors do not depend on its company, and
    next-token logits are refused."""
    causal = gguflm.load_model(write_tiny(tmp_path / "c.gguf", seed=5))
    both = gguflm.load_model(write_tiny(tmp_path / "b.gguf", seed=5,
                                        attention__causal=False))
    assert both.is_encoder and not both.plan.compiled and "bidirectional" in both.plan.reason
    a, b = [1, 17, 5, 90], [1, 17, 5, 91]
    ca, cb = causal.embed_batch([a, b])
    np.testing.assert_array_equal(ca[:3], cb[:3])
    ba, bb = both.embed_batch([a, b])
    assert np.abs(ba[0] - bb[0]).max() > 1e-4
    np.testing.assert_array_equal(both.embed_batch([IDS, a])[1], ba)
    with pytest.raises(ValueError, match="bidirectional"):
        both.logits([1, 2])


def test_bidirectional_refuses_sliding_windows(tmp_path: Path) -> None:
    path = write_tiny(tmp_path / "g.gguf", arch="gemma2", attention__causal=False,
                      attention__sliding_window=4, attn_logit_softcapping=4.0,
                      final_logit_softcapping=8.0)
    with pytest.raises(MetadataError, match="sliding window") as e:
        gguflm.load_model(path)
    assert e.value.key == "gemma2.attention.causal"
