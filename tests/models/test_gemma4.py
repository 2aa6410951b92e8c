"""Gemma 4 (``gemma4``): dense (E2B/E4B layout) and MoE (26B-A4B layout) in one file.

Conformance: shared/reference/arch/gemma4*/'s tiny random-weight F16 models against
llama.cpp's greedy.json, teacher-forced, with the bars of the other architectures. Batch
invariance: a sequence's logits are bit-identical alone, token by token, in chunks and
beside other sequences (shared KV layers read what their source layer stored in the same
pass). The attention (values normed, V = K's product, shared keys and values), the dense
FFN (the float16-table GELU), the per-layer inputs with the output scale and the experts
beside a dense FFN run fused, and the plan says so.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gguflm.gguf.errors import MetadataError
from gguflm.model.layer import GLU, DenseAndExperts
from refcheck import (
    assert_batch_invariant,
    assert_conforms,
    greedy_tokens,
    load_cases,
    load_tiny,
)
from tinymodel import declared_tensors, tiny_metadata

ARCHS = ["gemma4", "gemma4-moe"]
IDS = np.array([5, 300, 77, 1200, 9, 64, 2000, 31, 450, 12, 88, 1500, 7, 260, 41, 3])


@pytest.mark.parametrize(("arch", "kv_layers", "ffn"), [
    ("gemma4", [None, None, None, 1, 1, 2], GLU),
    ("gemma4-moe", [None, None, None], DenseAndExperts)])
def test_conformance(reference: Path, arch: str, kv_layers: list, ffn: type) -> None:
    """prompt_tokens identical; top-1 agrees wherever llama.cpp's margin is >= 0.25; on each
    step's 20 reference ids, de-shifted max <= 0.5 and median-over-steps max |d| <= 0.15
    (measured: gemma4 0.044 and 0.014, top-1 on 571 of 576 steps; gemma4-moe 0.032 and
    0.007, 575 of 576; every miss at a margin <= 0.01)."""
    model, folder = load_tiny(reference, arch)
    assert [b.attn.kv_layer for b in model.blocks] == kv_layers
    assert all(isinstance(b.ffn, ffn) for b in model.blocks)
    assert_conforms(model, folder, folder / f"tiny-{arch}-f16.gguf")


@pytest.mark.parametrize(("arch", "cases"), [
    ("gemma4", ["capital", "village", "colors", "primes", "french"]),
    ("gemma4-moe", ["capital", "village", "fib", "colors", "moon", "primes", "french",
                    "unicode"])])
def test_greedy_continuations_are_llama_cpps(reference: Path, arch: str, cases: list) -> None:
    """Free-running greedy decoding (the prompt in one batch, then one token at a time, as
    llama.cpp was run) gives llama.cpp's 64 tokens in these cases; the others part at a
    near-tie (top-1/top-2 margin below 0.01)."""
    model, folder = load_tiny(reference, arch)
    for case in load_cases(folder):
        if case["id"] in cases:
            assert greedy_tokens(model, case) == case["generated_tokens"], case["id"]


def test_gelu_is_ggmls_table() -> None:
    """ggml-cpu's GELU: x rounded to float16, its table of float16 results, the tails."""
    from gguflm.model import ops

    x = np.array([-12.0, -10.0, -3.3, -0.5, 0.0, 1e-4, 0.7, 2.25, 9.99, 10.0, 31.0], np.float32)
    h = x.astype(np.float16).astype(np.float64)
    want = 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * h * (1 + 0.044715 * h * h)))
    want = np.where(x <= -10, 0, np.where(x >= 10, x, want.astype(np.float16)))
    np.testing.assert_array_equal(ops.gelu_f16(x), want.astype(np.float32))
    np.testing.assert_array_equal(ops.geglu_f16(x, 2 * x), ops.gelu_f16(x) * (2 * x))


@pytest.mark.parametrize("arch", ARCHS)
def test_batch_invariance(reference: Path, arch: str) -> None:
    model, _ = load_tiny(reference, arch)
    assert_batch_invariant(model, IDS, 48)


def test_longer_than_the_window(reference: Path) -> None:
    """Past the sliding window (32), the shared layers' and their sources' windows agree
    however the sequence is chunked."""
    model, _ = load_tiny(reference, "gemma4")
    ids = np.arange(3, 3 + 45) * 37 % 3000
    alone = model.logits(ids)
    cache = model.new_cache(64)
    parts = [model.forward(ids[a:b], cache, all_logits=True) for a, b in ((0, 30), (30, 45))]
    np.testing.assert_array_equal(np.concatenate(parts), alone)


def test_the_plan_and_the_cache_say_what_runs(reference: Path, capsys) -> None:
    from gguflm.cli import main

    model, folder = load_tiny(reference, "gemma4")
    assert model.plan.compiled and not model.plan.mixed
    want = ("compiled (fused layers for every batch; no team: layer 0 has values RMS-normed, "
            "GELU through ggml's float16 table, a per-layer embedding input, an output "
            "scale, which the team does not take)")
    assert model.plan.describe() == want
    arena = model.new_arena(8)
    assert [k is None for k in arena.k] == [False] * 3 + [True] * 3  # shared: no memory
    assert [k.shape[2:4] for k in arena.k[:3]] == [(1, 64), (1, 64), (1, 128)]
    assert main(["inspect", str(folder / "tiny-gemma4-f16.gguf")]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if "layers run" in ln)
    assert want in line
    # keys and values of layers 0-2 only (one KV head of 64, 64, 128; f16, K and V)
    assert model.cache_bytes() == (2 * 2 * (64 + 64 + 128), 0)


def _md(**kw) -> dict:
    defaults = {"attention__sliding_window": 8, "attention__key_length": 16,
                "attention__value_length": 16, "attention__head_count_kv": 1,
                "attention__sliding_window_pattern": np.array([1, 1, 0, 1], np.bool_),
                "block_count": 4}
    return tiny_metadata("gemma4", **{**defaults, **kw})


def test_tiny_declares_per_layer_tensors() -> None:
    t = declared_tensors(_md(attention__shared_kv_layers=1, embedding_length_per_layer_input=8,
                             feed_forward_length=np.array([32, 32, 32, 64], np.int32)))
    assert t["blk.3.attn_k.weight"] == ((16, 64), True)  # a shared layer: K optional
    assert t["blk.2.attn_k.weight"] == ((16, 64), False)
    assert t["blk.3.ffn_up.weight"][0] == (64, 64)
    assert t["per_layer_token_embd.weight"][0] == (96, 32)
    assert t["rope_freqs.weight"][0] == (8,)


@pytest.mark.parametrize(("kw", "key"), [
    ({"attention__shared_kv_layers": 3}, "gemma4.attention.shared_kv_layers"),
    ({"attention__value_length": 8}, "gemma4.attention.value_length"),
    ({"attention__head_count_kv": np.array([1, 3, 1, 1], np.int32)},
     "gemma4.attention.head_count_kv")])
def test_graph_assumptions_fail_at_load(kw: dict, key: str) -> None:
    with pytest.raises(MetadataError) as e:
        declared_tensors(_md(**kw))
    assert e.value.key == key
