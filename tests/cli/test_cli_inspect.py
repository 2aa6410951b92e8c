"""`gguflm inspect`, `gguflm tensor` and `gguflm edit` on real files."""

from __future__ import annotations

import filecmp
import json
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import gguflm.gguf as gguf
from gguflm.cli import main
from gguflm.gguf import ArrayType, GGUFWarning, GGUFWriter, ValueType


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


# -- inspect -----------------------------------------------------------------------------------

def test_inspect_by_name(capsys, smollm2_path: Path) -> None:
    code, out, _ = run(capsys, "inspect", "smollm2-135m")
    assert code == 0
    with gguf.open(smollm2_path) as f:
        n_params = sum(t.n_elements for t in f.tensors.values())
        n_vocab = len(f["tokenizer.ggml.tokens"])
        assert f"data offset:  {f.data_offset}" in out
        assert f"tensors:      {len(f.tensors)}" in out
    lines = {ln.split("  ")[1].strip(): ln for ln in out.splitlines() if ln.startswith("  ")}
    assert "llama" in lines["architecture"]
    assert f"({n_params:,})" in lines["parameters"]
    assert str(n_vocab) in lines["vocab size"]
    assert "gpt2 (pre: smollm)" in lines["tokenizer"]
    assert "MOSTLY_Q4_1" in lines["file type"] and "yes" in lines["chat template"]
    assert "Q4_1" in out and "tensors" in out
    assert f"+{n_vocab - 5} more" in out  # arrays: first 5 elements
    assert "'<|im_start|>'" in lines["special tokens"]


def test_inspect_json(capsys, gemma3_path: Path) -> None:
    code, out, _ = run(capsys, "inspect", gemma3_path, "--json")
    assert code == 0
    d = json.loads(out)
    with gguf.open(gemma3_path) as f:
        assert (d["version"], d["alignment"], d["data_offset"]) == \
            (f.version, f.alignment, f.data_offset)
        assert d["metadata"]["tokenizer.ggml.tokens"] == f["tokenizer.ggml.tokens"].tolist()
        assert d["metadata"]["tokenizer.ggml.scores"] == f["tokenizer.ggml.scores"].tolist()
        assert d["metadata"]["gemma3.block_count"] == f["gemma3.block_count"]
        assert [t["name"] for t in d["tensors"]] == list(f.tensors)
        for t in d["tensors"]:
            info = f.tensors[t["name"]]
            assert t["type"] == info.type.ggml_name and t["type"].isupper()
            assert (tuple(t["shape"]), t["offset"], t["nbytes"]) == \
                (info.shape, info.offset, info.nbytes)
        s = d["summary"]
        assert s["architecture"] == "gemma3" and s["vocab_size"] == 262144
        assert s["n_params"] == sum(t.n_elements for t in f.tensors.values())
        assert sum(m["count"] for m in s["tensor_types"].values()) == len(f.tensors)
        assert s["special_tokens"]["bos"]["id"] == f["tokenizer.ggml.bos_token_id"]
        assert s["head_count_kv"] == f["gemma3.attention.head_count_kv"]


def test_inspect_tensors_and_query(capsys, reference: Path) -> None:
    path = reference / "quant-zoo" / "quant-zoo.gguf"
    code, out, _ = run(capsys, "inspect", path, "--tensors")
    assert code == 0
    with gguf.open(path) as f:
        for t in f.tensors.values():
            assert any(ln.split()[:2] == [t.name, t.type.ggml_name] for ln in out.splitlines())
    assert "IQ2_XXS" in out and "BF16" in out
    code, out, _ = run(capsys, "inspect", reference / "tiny-llama-f16" / "tiny-llama-f16.gguf",
                       "--query", "rope")
    keys = [ln.split()[0] for ln in out.splitlines() if ln.startswith("  ")]
    assert code == 0 and keys and all("rope" in k for k in keys)
    code, out, _ = run(capsys, "inspect", reference / "tiny-llama-f16" / "tiny-llama-f16.gguf",
                       "--query", "rope", "--json")
    assert code == 0 and all("rope" in k for k in json.loads(out)["metadata"])
    code, _, err = run(capsys, "inspect", path, "--query", "no-such-key")
    assert code == 1 and err.startswith("error:")


def test_inspect_unusual_files(capsys, tmp_path: Path) -> None:
    """Big-endian v2 file with an array of arrays and non-finite floats."""
    w = GGUFWriter(tmp_path / "be.gguf", version=2, byte_order=">")
    w.add("general.architecture", "x")
    w.add("nested", [[1, 2], ["a"]], ArrayType(ArrayType(ValueType.INT32)))
    w.add("floats", np.array([np.inf, -np.inf, np.nan, 1.0], np.float32))
    w.add_tensor("t", np.arange(4, dtype=np.float32))
    w.write()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GGUFWarning)
        code, out, err = run(capsys, "inspect", tmp_path / "be.gguf")
        assert code == 0 and "2 (big-endian)" in out
        assert "array[array[int32]]" in out and "llama.cpp will refuse" in err
        code, out, _ = run(capsys, "inspect", tmp_path / "be.gguf", "--json")
    d = json.loads(out)  # strict JSON: no NaN/Infinity tokens
    assert d["metadata"]["floats"] == ["inf", "-inf", "nan", 1.0]
    assert d["metadata"]["nested"] == [[1, 2], ["a"]]


def test_malformed_file_one_error_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\0\0\0" + b"\xff" * 20)
    for args in (["inspect", str(bad)], ["inspect", "no-such-model"],
                 ["tensor", str(bad), "x", "-o", str(tmp_path / "x.npy")]):
        res = subprocess.run([sys.executable, "-m", "gguflm.cli", *args],
                             capture_output=True, text=True, check=False)
        assert res.returncode == 1, res
        assert res.stdout == ""
        lines = res.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
        assert "Traceback" not in res.stderr


# -- tensor ------------------------------------------------------------------------------------

def test_tensor_plain_and_quantized(capsys, reference: Path, tmp_path: Path) -> None:
    zoo = reference / "quant-zoo" / "quant-zoo.gguf"
    out = tmp_path / "t.npy"
    with gguf.open(zoo) as f:
        for name in ("source.f32", "BF16.q", "F16.q", "Q4_K.q", "IQ2_XXS.q"):
            code, _, err = run(capsys, "tensor", zoo, name, "-o", out)
            assert code == 0, err
            got = np.load(out)
            t = f.tensors[name]
            assert got.shape == t.np_shape
            if name.endswith(".q"):  # ggml's own to_float of the same bytes
                want = f.tensors[name.replace(".q", ".f32")].data
                assert got.dtype == (np.float16 if name == "F16.q" else np.float32)
                assert np.array_equal(got.astype(np.float32), want)
            else:
                assert np.array_equal(got, t.data)
        code, _, _ = run(capsys, "tensor", zoo, "Q4_K.q", "-o", out, "--raw")
        assert code == 0 and np.array_equal(np.load(out), f.tensors["Q4_K.q"].data)


def test_tensor_unknown_name(capsys, reference: Path, tmp_path: Path) -> None:
    code, _, err = run(capsys, "tensor", reference / "quant-zoo" / "quant-zoo.gguf", "Q4_k.q",
                       "-o", tmp_path / "x.npy")
    assert code == 1 and "no tensor named 'Q4_k.q'" in err and "Q4_K.q" in err
    assert not (tmp_path / "x.npy").exists()


# -- edit --------------------------------------------------------------------------------------

def test_edit_without_changes_is_the_round_trip(capsys, reference: Path,
                                                tmp_path: Path) -> None:
    src = reference / "tiny-llama-q4_0" / "tiny-llama-q4_0.gguf"
    code, _, _ = run(capsys, "edit", src, "-o", tmp_path / "same.gguf")
    assert code == 0 and filecmp.cmp(src, tmp_path / "same.gguf", shallow=False)


def test_edit_set_and_delete(capsys, reference: Path, tmp_path: Path) -> None:
    src = reference / "tiny-llama-q4_0" / "tiny-llama-q4_0.gguf"
    out = tmp_path / "e.gguf"
    code, _, err = run(
        capsys, "edit", src, "--set", "general.name=renamed", "--set",
        "llama.context_length=4096", "--set", "my.ratio=0.25", "--type", "f64",
        "--set", "my.ids=[1, 2, 3]", "--type", "array[u16]", "--set", "my.flag=true",
        "--delete", "general.architecture", "--delete", "tokenizer.ggml.scores", "-o", out)
    assert code == 0, err
    with gguf.open(src) as a, gguf.open(out) as b:
        assert b["general.name"] == "renamed"
        assert b["llama.context_length"] == 4096
        assert b.types["llama.context_length"] == a.types["llama.context_length"]
        assert b["my.ratio"] == 0.25 and b.types["my.ratio"] == ValueType.FLOAT64
        assert b["my.ids"].tolist() == [1, 2, 3]
        assert b.types["my.ids"] == ArrayType(ValueType.UINT16)
        assert b["my.flag"] is True
        assert "general.architecture" not in b and "tokenizer.ggml.scores" not in b
        assert list(b)[:len(a) - 2] == [k for k in a if k not in
                                        ("general.architecture", "tokenizer.ggml.scores")]
        assert b["tokenizer.ggml.tokens"] == a["tokenizer.ggml.tokens"]
        for name, t in a.tensors.items():
            assert np.array_equal(b.tensors[name].data, t.data)


@pytest.mark.parametrize("args,text", [
    (["--set", "llama.context_length=abc"], "not an integer"),
    (["--set", "x=1", "--type", "nope"], "unknown type"),
    (["--set", "x=[1", "--type", "array[i32]"], "JSON list"),
    (["--delete", "no.such.key"], "no such key"),
    (["--set", "general.alignment=48"], "power of two"),
    (["--set", "x=300", "--type", "u8"], "does not fit"),
])
def test_edit_errors(capsys, reference: Path, tmp_path: Path, args: list[str],
                     text: str) -> None:
    src = reference / "vocab" / "ggml-vocab-llama-spm.gguf"
    out = tmp_path / "e.gguf"
    code, _, err = run(capsys, "edit", src, *args, "-o", out)
    assert code == 1 and err.startswith("error:") and text in err, err
    assert not out.exists()


def test_edit_refuses_in_place(capsys, tmp_path: Path, reference: Path) -> None:
    copy = tmp_path / "m.gguf"
    copy.write_bytes((reference / "vocab" / "ggml-vocab-llama-spm.gguf").read_bytes())
    before = copy.read_bytes()
    for target in (copy, tmp_path / "." / "m.gguf"):
        code, _, err = run(capsys, "edit", copy, "--set", "a=1", "-o", target)
        assert code == 1 and "in place" in err
    assert copy.read_bytes() == before


# the architectures' tiny reference models (F16) and the two real models (quantized)
_PATH_MODELS = {"llama": "tiny-llama-f16/tiny-llama-f16.gguf",
                "qwen2": "arch/qwen2/tiny-qwen2-f16.gguf",
                "qwen3": "arch/qwen3/tiny-qwen3-f16.gguf",
                "phi3": "arch/phi3/tiny-phi3-f16.gguf",
                "gemma2": "arch/gemma2/tiny-gemma2-f16.gguf"}


@pytest.mark.parametrize("arch", [*_PATH_MODELS, "smollm2-135m", "gemma3-270m"])
def test_inspect_says_every_architecture_runs_compiled(capsys, reference: Path,
                                                       arch: str) -> None:
    """`inspect` shows the path the layers take (text and JSON), and for each of the six
    architectures it is the compiled one: fused tensors, biases, Q/K norms, post norms,
    windows, soft-caps, both GLU kinds and F16 weights included."""
    model = reference / _PATH_MODELS[arch] if arch in _PATH_MODELS else arch
    if isinstance(model, Path) and not model.exists():
        pytest.skip(f"{model} is not in the reference data")
    code, out, _ = run(capsys, "inspect", model)
    assert code == 0
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("layers run"))
    assert "compiled (team for decoding" in line, line
    code, out, _ = run(capsys, "inspect", model, "--json")
    path = json.loads(out)["summary"]["layers_path"]
    assert path["compiled"] is True, path


def test_run_verbose_says_the_path(capsys, reference: Path) -> None:
    """`run -v` names the path the layers take, as inspect does."""
    model = reference / _PATH_MODELS["qwen2"]
    if not model.exists():
        pytest.skip(f"{model} is not in the reference data")
    assert main(["run", str(model), "-p", "hi", "-n", "1", "-v"]) == 0
    err = capsys.readouterr().err
    assert "layers run: compiled (team for decoding" in err, err
