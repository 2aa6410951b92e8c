"""Q2_K, Q3_K, IQ4_NL, IQ4_XS and BF16 weights take the compiled layers (team and blocks)
with the reference path's numbers, and SmolLM2 requantized to those types runs compiled.

The kernels themselves are held to ggml's recorded dots in test_act_quant and to their
twins in test_kernels; here they run inside whole models.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import gguflm
import gguflm.gguf as gguf
from gguflm.cli import main
from gguflm.gguf.types import GGMLType
from gguflm.gguf.writer import GGUFWriter
from gguflm.model import executor, team
from gguflm.model.batch import ALL, Part
from gguflm.quant.quantize import quantize
from tinymodel import random_tensors, tiny_metadata

T = GGMLType
NEW_TYPES = (T.Q2_K, T.Q3_K, T.IQ4_NL, T.IQ4_XS, T.BF16)


def _write(path: Path, md: dict, tensors: dict[str, np.ndarray], types: dict) -> Path:
    w = GGUFWriter(path)
    for k, v in md.items():
        w.add(k, v)
    for name, x in tensors.items():
        t = types.get(name, T.F32)
        if t in (T.F32, T.BF16):  # BF16: the writer rounds the float values
            w.add_tensor(name, x.astype(np.float32), type=t)
        else:
            w.add_tensor(name, quantize(x, t), type=t)
    return w.write()


def _run(model) -> np.ndarray:  # noqa: ANN001
    """Logits of a 9-token prefill, 3 decode steps, then two sequences batched."""
    arena = model.new_arena(32, 2)
    a, b = arena.slots
    out = [model.forward_batch([Part(a, np.arange(3, 12), ALL)])]
    for t in range(3):
        out.append(model.forward_batch([Part(a, np.array([20 + t]), ALL)]))
    out.append(model.forward_batch([Part(b, np.arange(5, 10), ALL),
                                    Part(a, np.array([40]), ALL)]))
    return np.concatenate(out)


def _three_paths(model, monkeypatch: pytest.MonkeyPatch) -> dict[str, np.ndarray]:  # noqa: ANN001
    got = {"team": _run(model)}
    with monkeypatch.context() as m:
        m.setattr(team, "MAX_ROWS", 0)  # layer by layer, through the blocks
        got["blocks"] = _run(model)
    with monkeypatch.context() as m:
        m.setattr(model, "plan", executor.Plan(None, "forced by the test"))
        got["reference"] = _run(model)
    return got


# each product group mixes the new types (and Q/K/V three of them)
MIXED = {"attn_q": T.Q2_K, "attn_k": T.Q3_K, "attn_v": T.IQ4_XS, "attn_output": T.IQ4_NL,
         "ffn_gate": T.BF16, "ffn_up": T.Q3_K, "ffn_down": T.Q2_K}


@pytest.mark.parametrize("how", ["mixed", *(t.ggml_name for t in NEW_TYPES)])
def test_new_types_run_compiled_with_the_reference_numbers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    """A Llama of 256-wide rows (whole K-quant blocks) with its layer matrices in the new
    types: the plan compiles them, and team, blocks and reference agree bit for bit."""
    md = tiny_metadata("llama", embedding_length=256, feed_forward_length=256)
    tensors = random_tensors(md)
    types = {name: MIXED[name.split(".")[2]] if how == "mixed" else T[how]
             for name in tensors if name.startswith("blk.") and tensors[name].ndim == 2}
    model = gguflm.load_model(_write(tmp_path / "m.gguf", md, tensors, types))
    assert {m.type for b in model.blocks for m in (b.attn.q.w, b.ffn.down.w)} >= (
        {T.Q2_K} if how == "mixed" else {T[how]})
    assert model.plan.compiled and not model.plan.team_reason, model.plan.describe()
    got = _three_paths(model, monkeypatch)
    assert np.isfinite(got["team"]).all()
    for path in ("blocks", "reference"):
        np.testing.assert_array_equal(got[path], got["team"], err_msg=path)


@pytest.fixture(scope="module")
def requantized(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path):  # noqa: ANN201
    """SmolLM2 requantized by ``gguflm quantize`` (llama-quantize's bytes) to a type, once."""
    folder = tmp_path_factory.mktemp("requantized")
    made: dict[str, Path] = {}

    def make(ftype: str) -> Path:
        if ftype not in made:
            out = folder / f"smollm2-{ftype}.gguf"
            assert main(["quantize", "--allow-requantize", str(smollm2_path), str(out),
                         ftype, "2"]) == 0
            made[ftype] = out
        return made[ftype]

    return make


# SmolLM2's 576-wide rows are not whole 256-value blocks: llama-quantize falls back there
# (Q2_K/Q3_K/IQ4_XS to IQ4_NL, Q3_K_M's to Q4_0/Q5_0), so these are the types each file has
# in its layers besides those
IN_FILE = {"Q2_K": T.Q3_K, "Q3_K_M": T.Q4_K, "IQ4_XS": T.IQ4_XS, "IQ4_NL": T.IQ4_NL,
           "BF16": T.BF16}


@pytest.mark.parametrize("ftype", list(IN_FILE))
def test_requantized_smollm2_runs_compiled(requantized, capsys: pytest.CaptureFixture,  # noqa: ANN001
                                          monkeypatch: pytest.MonkeyPatch,
                                          ftype: str) -> None:
    path = requantized(ftype)
    with gguf.open(path) as f:
        types = {t.type for n, t in f.tensors.items() if n.startswith("blk.")}
    assert IN_FILE[ftype] in types
    assert main(["inspect", str(path)]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if "layers run" in ln)
    assert "compiled (team for decoding" in line, line
    model = gguflm.load_model(path)
    got = _three_paths(model, monkeypatch)
    assert np.isfinite(got["team"]).all()
    for path_name in ("blocks", "reference"):
        np.testing.assert_array_equal(got[path_name], got["team"], err_msg=path_name)
