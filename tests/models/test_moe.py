"""Mixture-of-experts models: qwen3moe, Mixtral-style experts in llama files, gpt-oss.

Conformance: the tiny random-weight F16 models of shared/reference/arch/<arch>/ against
llama.cpp's greedy.json, teacher-forced, with the bars of the dense architectures. Batch
invariance: a sequence's logits are bit-identical alone, token by token, in chunks and
beside another sequence (rows that chose the same expert run through it together, and no
row's numbers depend on which others did).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import gguflm
from gguflm.gguf.errors import MetadataError
from gguflm.gguf.types import GGMLType
from gguflm.model import executor
from gguflm.model.batch import ALL, Part
from gguflm.model.layer import Experts
from refcheck import assert_conforms, load_tiny
from tinymodel import declared_tensors, tiny_metadata

MOE = ["qwen3moe", "mixtral", "gpt-oss"]


def _model(reference: Path, arch: str) -> tuple[gguflm.model.Model, Path]:
    return load_tiny(reference, arch)


@pytest.mark.parametrize("arch", MOE)
def test_conformance(reference: Path, arch: str) -> None:
    """prompt_tokens identical; top-1 agrees wherever llama.cpp's margin is >= 0.25; on each
    step's 20 reference ids, de-shifted max <= 0.5 and median-over-steps max |d| <= 0.15."""
    model, folder = _model(reference, arch)
    assert all(isinstance(b.ffn, Experts) for b in model.blocks)
    assert_conforms(model, folder, folder / f"tiny-{arch}-f16.gguf")


@pytest.mark.parametrize("arch", MOE)
def test_batch_invariance(reference: Path, arch: str) -> None:
    model, _ = _model(reference, arch)
    ids = np.array([5, 300, 77, 1200, 9, 64, 2000, 31, 450, 12, 88, 1500, 7, 260])
    alone = model.logits(ids)
    cache = model.new_cache(32)
    steps = np.stack([model.forward([int(t)], cache) for t in ids])
    np.testing.assert_array_equal(steps, alone)
    cache = model.new_cache(32)
    chunks = [model.forward(ids[a:b], cache, all_logits=True) for a, b in ((0, 5), (5, 6),
                                                                          (6, 14))]
    np.testing.assert_array_equal(np.concatenate(chunks), alone)
    arena = model.new_arena(32, 2)
    other = np.array([900, 3, 44, 1000, 2, 610, 18])
    both = model.forward_batch([Part(arena.slots[0], other, ALL),
                                Part(arena.slots[1], ids, ALL)])
    np.testing.assert_array_equal(both[len(other):], alone)


def test_inspect_names_the_path(reference: Path, capsys) -> None:
    """Attention and experts compiled (the F16 experts through the float kernel), and
    the output says so."""
    from gguflm.cli import main

    path = reference / "arch" / "qwen3moe" / "tiny-qwen3moe-f16.gguf"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert ("compiled (fused layers for every batch; no team: layer 0's FFN is a mixture of "
            "experts (fused: the router, the top-k and the chosen experts in one compiled "
            "call) with float experts, which the team does not take)") in out
    assert "8 (2 used per token)" in out
    with gguflm.gguf.open(path) as f:
        total = sum(t.n_elements for t in f.tensors.values())
        experts = sum(t.n_elements for n, t in f.tensors.items() if "_exps." in n)
    active = next(ln for ln in out.splitlines() if "active params" in ln)
    assert f"({total - experts + experts // 4:,})" in active, active


@pytest.mark.parametrize("arch", MOE)
def test_compiled_attention_matches_the_reference(reference: Path, arch: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    model, _ = _model(reference, arch)
    assert model.plan.compiled, model.plan.describe()
    ids = np.array([5, 300, 77, 1200, 9, 64, 2000, 31, 450, 12, 88, 1500, 7, 260])
    got = model.logits(ids)
    monkeypatch.setattr(model, "plan", executor.Plan(None, "forced by the test"))
    np.testing.assert_array_equal(got, model.logits(ids))


@pytest.mark.parametrize(("used", "count"), [(3, 2), (0, 8)])
def test_expert_counts_are_checked(used: int, count: int) -> None:
    md = tiny_metadata("qwen3moe", expert_count=count, expert_used_count=used)
    with pytest.raises(MetadataError) as e:
        declared_tensors(md)
    assert e.value.key == "qwen3moe.expert_used_count"


def test_attention_sinks_match_a_float64_softmax() -> None:
    """gpt-oss's sinks: each head's sink logit joins the softmax's max and sum and weights
    no value, in the kernel (windowed or not, F32 cache) and its numpy twin."""
    from gguflm.model.attention import attend, attend_twin
    from gguflm.model.kv_cache import KVArena

    rng = np.random.default_rng(4)
    n_head, n_kv, d, n_pos = 4, 2, 8, 40
    arena = KVArena(1, 1, n_pos, n_kv, d, d, kv_type="f32")
    k = rng.standard_normal((n_pos, n_kv, d)).astype(np.float32)
    v = rng.standard_normal((n_pos, n_kv, d)).astype(np.float32)
    arena.store(0, np.zeros(n_pos, np.int64), np.arange(n_pos), k, v)
    q = rng.standard_normal((3, n_head, d)).astype(np.float32)
    pos, slot = np.array([0, 17, 39]), np.zeros(3, np.int64)
    sinks = np.array([2.5, -1.0, 0.0, 6.0], np.float32)
    for window in (0, 5):
        got = np.empty((3, n_head, d), np.float32)
        attend(q, arena.k[0], arena.v[0], slot, pos, window, np.float32(0.4), np.float32(0),
               False, got, sinks=sinks)
        for t, p in enumerate(pos):
            keys = [j for j in range(p + 1) if window == 0 or p - j < window]
            for h in range(n_head):
                sc = 0.4 * k[keys, h // 2].astype(np.float64) @ q[t, h]
                m = max(sc.max(), sinks[h])
                w = np.exp(sc - m) / (np.exp(sc - m).sum() + np.exp(sinks[h] - m))
                np.testing.assert_allclose(got[t, h], w @ v[keys, h // 2], atol=2e-6)
        twin = attend_twin(q, [k.transpose(1, 0, 2)] * 3, [v.transpose(1, 0, 2)] * 3, pos,
                           window, 0.4, 0.0, False, sinks=sinks)
        np.testing.assert_allclose(twin, got, atol=1e-6)


def test_mxfp4_experts_run_and_the_plan_says_how(reference: Path, tmp_path: Path) -> None:
    """gpt-oss's usual file: experts in MXFP4 (our quantizer, as llama-quantize's
    MXFP4_MOE). They run through MXFP4's integer kernel (no dequantizing product named in
    the plan) and agree with the F16 model."""
    from gguflm.cli import main
    from gguflm.quant import matrix

    model, folder = _model(reference, "gpt-oss")
    out = tmp_path / "mxfp4.gguf"
    assert main(["quantize", str(folder / "tiny-gpt-oss-f16.gguf"), str(out),
                 "MXFP4_MOE"]) == 0
    q = gguflm.load_model(out)
    plan = q.plan.describe()
    assert q.plan.compiled and "MXFP4" not in plan and "no compiled product" not in plan, plan
    experts = q.blocks[0].ffn.gate
    assert experts[0].type == GGMLType.MXFP4 and experts[0]._fast is matrix._quantized_kernel
    ids = np.array([5, 300, 77, 1200, 9])
    got, want = q.logits(ids), model.logits(ids)
    assert np.isfinite(got).all()
    assert np.corrcoef(got[-1], want[-1])[0, 1] > 0.9


def test_quantized_experts_run_in_two_calls_with_each_experts_numbers(
        reference: Path, tmp_path: Path) -> None:
    """Quantized experts run as two kernel calls a layer (every chosen expert's gate and
    up, then the downs: ``expert_products``; in the team, the fused experts or op by op). Each
    output is what that expert alone gives that row (the expert-by-expert path, bit for
    bit), and a sequence's logits stay the same alone, token by token and beside another
    sequence."""
    from gguflm.cli import main

    _, folder = _model(reference, "qwen3moe")
    out = tmp_path / "q4km.gguf"
    assert main(["quantize", str(folder / "tiny-qwen3moe-f16.gguf"), str(out), "Q4_K_M"]) == 0
    q = gguflm.load_model(out)
    e = q.blocks[0].ffn
    assert isinstance(e, Experts) and e.gate_up_all.usable and e.down_all.usable, e.gate_up_all.why
    assert q.plan.describe() == ("compiled (team for decoding and short prompts, fused "
                                 "layers for longer batches)"), q.plan.describe()
    ids = np.array([5, 300, 77, 1200, 9, 64, 2000, 31, 450, 12])
    alone = q.logits(ids)
    cache = q.new_cache(32)
    steps = np.stack([q.forward([int(t)], cache) for t in ids])
    np.testing.assert_array_equal(steps, alone)
    arena = q.new_arena(32, 2)
    other = np.array([900, 3, 44, 1000, 2, 610, 18])
    both = q.forward_batch([Part(arena.slots[0], other, ALL), Part(arena.slots[1], ids, ALL)])
    np.testing.assert_array_equal(both[len(other):], alone)
    q.plan = executor.Plan(None, "forced by the test")  # the reference path's experts:
    np.testing.assert_array_equal(q.logits(ids), alone)  # two calls
    for b in q.blocks:  # expert by expert
        b.ffn.gate_up_all.usable = False
    np.testing.assert_array_equal(q.logits(ids), alone)
    none = np.zeros(0, np.int64)  # a step where no row reaches the layer's experts
    assert e.gate_up_all(np.zeros((0, e.gate_up_all.d_in), np.float32), none,
                         np.zeros(1, np.int64)).shape == (2, 0, e.gate_up_all.rows)


def test_a_model_larger_than_memory_is_announced(capsys, reference: Path) -> None:
    from gguflm.cli.common import say_if_larger_than_memory

    path = reference / "arch" / "qwen3moe" / "tiny-qwen3moe-f16.gguf"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    say_if_larger_than_memory(path, available=1000)
    err = capsys.readouterr().err
    assert err.startswith("note: the model (0.0 GB) is larger than the memory available")
    say_if_larger_than_memory(path, available=1 << 40)
    assert capsys.readouterr().err == ""


def test_a_moe_model_through_run_bench_and_the_server(reference: Path, tmp_path: Path,
                                                      capsys) -> None:
    """CLI, API and server unchanged for a mixture of experts: the tiny qwen3moe through
    ``run``, ``bench`` and ``serve`` (continuous batching: two clients of the official
    ``openai`` package at once, one of them held to a JSON schema)."""
    import json
    import threading

    import openai

    from gguflm.cli import main
    from test_hostile_server import _start, _stop

    path = reference / "arch" / "qwen3moe" / "tiny-qwen3moe-f16.gguf"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    assert main(["run", str(path), "-p", "The capital of France is", "-n", "8",
                 "--temp", "0"]) == 0
    assert main(["bench", str(path), "-p", "16", "-n", "4", "-r", "1"]) == 0
    assert "tg4" in capsys.readouterr().out
    proc, url = _start(path, tmp_path / "log.txt", "-np", "2")
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=300)
        schema = {"type": "string", "enum": ["yes", "no"]}
        got: dict[str, object] = {}

        def ask(key: str, **extra: object) -> None:
            got[key] = client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "Is water wet?"}],
                max_tokens=16, temperature=0, **extra)

        threads = [threading.Thread(target=ask, args=("plain",)),
                   threading.Thread(target=ask, args=("schema",), kwargs={"response_format": {
                       "type": "json_schema", "json_schema": {"name": "a", "schema": schema}}})]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert got["plain"].usage.completion_tokens > 0
        assert json.loads(got["schema"].choices[0].message.content) in ("yes", "no")
    finally:
        _stop(proc)
