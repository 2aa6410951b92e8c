"""``gguflm quantize``: llama-quantize's file from the command line, and for bad input one
``error:`` line, exit status 1 and no output file."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gguflm import gguf
from gguflm.cli import main
from gguflm.gguf.writer import GGUFWriter


def test_quantize_makes_llama_quantizes_file(reference: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture) -> None:
    src = reference / "arch" / "qwen2" / "tiny-qwen2-f16.gguf"
    want = json.loads((reference / "quantize" / "expected.json").read_text())[
        "models"]["tiny-qwen2-f16.gguf"]["Q5_K_M"]
    out = tmp_path / "q.gguf"
    assert main(["quantize", str(src), str(out), "q5_k_m", "-t", "2"]) == 0
    assert hashlib.sha256(out.read_bytes()).hexdigest() == want["sha256"]
    err = capsys.readouterr().err.splitlines()
    n = len(want["tensors"])
    assert f"[{n}/{n}] blk.3.ffn_up.weight" in err[-2] and "F16 -> Q5_K" in err[-2]
    assert err[-1].startswith(f"wrote {out}: Q5_K_M (general.file_type 17), {n} tensors")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["q.gguf"]


def test_llama_quantizes_positionals_m_and_units(reference: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture) -> None:
    """IN [OUT] TYPE [NTHREADS] as llama-quantize takes them, IN also as -m; OUT's default
    name is llama-quantize's; sizes in MB of 10^6 bytes."""
    src = tmp_path / "model-f16.gguf"
    src.write_bytes((reference / "arch" / "qwen2" / "tiny-qwen2-f16.gguf").read_bytes())
    assert main(["quantize", str(src), "Q8_0", "2"]) == 0
    out = tmp_path / "ggml-model-Q8_0.gguf"
    assert out.is_file()
    last = capsys.readouterr().err.splitlines()[-1]
    sizes = []
    for path in (src, out):
        with gguf.open(path) as f:
            sizes.append(sum(t.nbytes for t in f.tensors.values()) / 1e6)
    assert f"{sizes[0]:.1f} MB -> {sizes[1]:.1f} MB" in last  # 10^6 bytes, not MiB
    again = tmp_path / "again.gguf"
    assert main(["quantize", "-m", str(src), str(again), "Q8_0"]) == 0
    assert again.read_bytes() == out.read_bytes()
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(["quantize", "-m", str(src)])
    assert e.value.code == 2 and "IN [OUT] TYPE [NTHREADS]" in capsys.readouterr().err


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gguflm.cli", "quantize", *args],
                          capture_output=True, text=True, timeout=600)


def odd_model(path: Path) -> Path:
    """A model whose rows (96 values) fit no K-quant block."""
    w = GGUFWriter(path)
    w.add("general.architecture", "llama")
    w.add("llama.block_count", 1)
    rng = np.random.default_rng(0)
    for name in ("token_embd.weight", "output.weight", "blk.0.attn_q.weight"):
        w.add_tensor(name, rng.standard_normal((4, 96)).astype(np.float16))
    return w.write()


@pytest.mark.parametrize("case", ["unknown type", "already quantized", "output is input",
                                  "row fits no block", "missing input"])
def test_bad_input_one_error_line(reference: Path, tmp_path: Path, case: str) -> None:
    f16 = str(reference / "tiny-llama-f16" / "tiny-llama-f16.gguf")
    out = str(tmp_path / "out.gguf")
    args, message = {
        "unknown type": ([f16, out, "Q4_K_X"], "unknown file type 'Q4_K_X'"),
        "already quantized": ([str(reference / "tiny-llama-q4_0" / "tiny-llama-q4_0.gguf"),
                               out, "Q4_K_M"], "already quantized (Q4_0)"),
        "output is input": ([f16, f16, "Q8_0"], "the output file is the input file"),
        "row fits no block": ([str(odd_model(tmp_path / "odd.gguf")), out, "Q4_K_M",
                               "--output-tensor-type", "q6_k"],
                              "'output.weight': row length 96 is not a multiple of the Q6_K"),
        "missing input": ([str(tmp_path / "none.gguf"), out, "Q8_0"], "none.gguf"),
    }[case]
    before = sorted(p.name for p in tmp_path.iterdir())
    res = run_cli(*args)
    assert res.returncode == 1, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines
    assert "Traceback" not in res.stderr and res.stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written
