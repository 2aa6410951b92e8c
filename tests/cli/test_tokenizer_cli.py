"""``gguflm tokenize`` and ``gguflm detokenize``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gguflm.cli import main
from gguflm.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def spm_file(reference: Path) -> str:
    return str(reference / "vocab" / "ggml-vocab-llama-spm.gguf")


def test_tokenize_json_and_no_bos(spm_file: str, capsys: pytest.CaptureFixture) -> None:
    tok = Tokenizer.from_file(spm_file)
    assert main(["tokenize", spm_file, "Hello 🦙", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ids"] == tok.encode("Hello 🦙") and out["ids"][0] == tok.bos_id
    assert out["n_tokens"] == len(out["ids"])
    assert out["pieces"][:2] == ["<s>", " Hello"]
    assert main(["tokenize", spm_file, "Hello 🦙", "--ids", "--no-bos"]) == 0
    assert json.loads(capsys.readouterr().out) == tok.encode("Hello 🦙", add_special=False)


def test_tokenize_lines(spm_file: str, capsys: pytest.CaptureFixture) -> None:
    assert main(["tokenize", spm_file, "a\t🦙", "--no-bos"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["263", "->", '"', 'a"']
    assert lines[1].split() == ["12", "->", '"\\t"']
    assert lines[-1].split() == ["156", "->", '"\\x99"']  # the last byte of the llama


def test_tokenize_special_and_file(smollm2_path: Path, tmp_path: Path,
                                   capsys: pytest.CaptureFixture) -> None:
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("<|im_start|>user\nhi<|im_end|>", encoding="utf-8")
    assert main(["tokenize", str(smollm2_path), "-f", str(prompt), "--special", "--ids"]) == 0
    assert json.loads(capsys.readouterr().out) == [1, 4093, 198, 6004, 2]  # llama.cpp


def test_detokenize(smollm2_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["detokenize", str(smollm2_path), "19556", "905", "2"]) == 0
    assert capsys.readouterr().out == "Hello world\n"
    assert main(["detokenize", str(smollm2_path), "[19556,", "905,", "2]", "--special",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "ids": [19556, 905, 2], "text": "Hello world<|im_end|>"}


@pytest.mark.parametrize("ids, message", [
    (["12", "x"], "error: invalid token id 'x': not an integer"),
    (["1.5"], "error: invalid token id '1.5': not an integer"),
    (["-1"], "error: token id -1 is out of range"),
    (["32000"], "error: token id 32000 is out of range"),
])
def test_detokenize_bad_ids(spm_file: str, capsys: pytest.CaptureFixture, ids: list[str],
                            message: str) -> None:
    assert main(["detokenize", spm_file, *ids]) == 1
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1


def test_tokenize_file_without_vocabulary(reference: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["tokenize", str(reference / "quant-zoo" / "quant-zoo.gguf"), "hi"]) == 1
    err = capsys.readouterr().err
    assert "tokenizer.ggml.model" in err and err.count("\n") == 1
