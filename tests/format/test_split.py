"""Split GGUF models: ``gguflm split``/``merge`` write what llama.cpp's ``llama-gguf-split``
writes (byte for byte: sha256s recorded from llama.cpp's tool in
tests/data/gguf_split_smollm2.json, and the tool itself when it is built here), the first
shard loads the whole model (each shard memory-mapped), and a missing or foreign shard is
a clear error."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gguflm import gguf
from gguflm.gguf.split import SplitError

DATA = Path(__file__).resolve().parents[1] / "data" / "gguf_split_smollm2.json"
# llama.cpp's tool, when built here (CI has the recorded sha256s instead)
LLAMA_SPLIT = Path(os.environ.get("LLAMA_GGUF_SPLIT", "/work/llama-build/bin/llama-gguf-split"))


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _gguflm(*argv: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gguflm.cli", *map(str, argv)],
                          capture_output=True, text=True, timeout=600)


def _shards(folder: Path, prefix: str) -> list[Path]:
    return sorted(folder.glob(f"{prefix}-*-of-*.gguf"))


@pytest.fixture(scope="module")
def tiny_q4(reference: Path) -> Path:
    return reference / "tiny-llama-q4_0" / "tiny-llama-q4_0.gguf"


@pytest.fixture(scope="module")
def tiny_split(tiny_q4: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """The tiny model in shards of at most 10 tensors, by ``gguflm split``."""
    out = tmp_path_factory.mktemp("split")
    r = _gguflm("split", "--split-max-tensors", "10", tiny_q4, out / "tiny")
    assert r.returncode == 0, r.stderr
    return _shards(out, "tiny")


def test_split_and_merge_match_llama_gguf_split_recorded(smollm2_path: Path,
                                                          tmp_path: Path) -> None:
    recorded = json.loads(DATA.read_text())
    if _sha256(smollm2_path) != recorded["model_sha256"]:
        pytest.skip(f"{smollm2_path} is not the file the sha256s were recorded from")
    for i, case in enumerate(recorded["splits"]):
        r = _gguflm("split", *case["args"], smollm2_path, tmp_path / f"s{i}")
        assert r.returncode == 0, r.stderr
        got = [_sha256(p) for p in _shards(tmp_path, f"s{i}")]
        assert got == case["shards"], case["args"]
    first = _shards(tmp_path, "s0")[0]  # the --split-max-tensors 100 split
    assert recorded["splits"][0]["args"] == recorded["merge"]["of"]
    r = _gguflm("merge", first, tmp_path / "merged.gguf")
    assert r.returncode == 0, r.stderr
    assert _sha256(tmp_path / "merged.gguf") == recorded["merge"]["sha256"]


@pytest.mark.skipif(not LLAMA_SPLIT.is_file(), reason=f"llama-gguf-split not built "
                    f"({LLAMA_SPLIT}; set LLAMA_GGUF_SPLIT)")
@pytest.mark.parametrize("args", [["--split-max-tensors", "7"], ["--split-max-size", "7M"],
                                  ["--split-max-tensors", "16", "--no-tensor-first-split"]])
def test_split_and_merge_match_llama_gguf_split_run_here(tiny_q4: Path, tmp_path: Path,
                                                         args: list[str]) -> None:
    subprocess.run([LLAMA_SPLIT, "--split", *args, tiny_q4, tmp_path / "ref"], check=True,
                   capture_output=True, timeout=300)
    assert _gguflm("split", *args, tiny_q4, tmp_path / "our").returncode == 0
    ref, our = _shards(tmp_path, "ref"), _shards(tmp_path, "our")
    assert len(ref) > 1 and [_sha256(p) for p in our] == [_sha256(p) for p in ref]
    subprocess.run([LLAMA_SPLIT, "--merge", ref[0], tmp_path / "ref.gguf"], check=True,
                   capture_output=True, timeout=300)
    assert _gguflm("merge", our[0], tmp_path / "our.gguf").returncode == 0
    assert _sha256(tmp_path / "our.gguf") == _sha256(tmp_path / "ref.gguf")


def test_first_shard_opens_the_whole_model_memory_mapped(tiny_q4: Path,
                                                         tiny_split: list[Path]) -> None:
    assert len(tiny_split) == 4  # 39 tensors, 10 a shard
    with gguf.open(tiny_q4) as whole, gguf.open(tiny_split[0]) as split:
        assert list(split.tensors) == list(whole.tensors)
        for name, t in whole.tensors.items():
            s = split.tensors[name]
            assert (s.type, s.shape) == (t.type, t.shape)
            assert np.array_equal(s.data, t.data), name
            assert not s.data.flags.owndata  # a view of the shard's mapping, not a copy
        files = {t._file.path for t in split.tensors.values()}
        assert files == {os.fspath(p) for p in tiny_split}
        assert {k: v for k, v in split.metadata.items() if not k.startswith("split.")} \
            .keys() == whole.metadata.keys()


def test_split_model_generates_what_the_whole_file_does(tiny_q4: Path,
                                                        tiny_split: list[Path]) -> None:
    from gguflm import LLM

    texts = []
    for path in (tiny_q4, tiny_split[0]):
        with LLM(path, n_ctx=64, parallel=1) as llm:
            reply = llm.generate("Hello there", max_tokens=8, temperature=0)
            texts.append(reply["choices"][0]["text"])
    assert texts[0] == texts[1] and texts[0]


def test_inspect_shows_the_whole_model(tiny_split: list[Path]) -> None:
    r = _gguflm("inspect", tiny_split[0])
    assert r.returncode == 0, r.stderr
    assert "tensors:      39" in r.stdout and "shards:       4 files" in r.stdout


def _expect_error(path: Path, *words: str) -> None:
    with pytest.raises(SplitError) as e:
        gguf.open(path)
    for word in words:
        assert word in str(e.value), str(e.value)
    r = _gguflm("inspect", path)
    assert r.returncode == 1 and r.stderr.startswith("error: ") and len(
        r.stderr.strip().splitlines()) == 1, r.stderr
    for word in words:
        assert word in r.stderr


def test_missing_later_and_foreign_shards_are_clear_errors(tiny_q4: Path,
                                                           tiny_split: list[Path],
                                                           tmp_path: Path) -> None:
    # a later shard given: name the first
    _expect_error(tiny_split[1], "shard 2 of 4", os.fspath(tiny_split[0]))
    # a missing shard
    copies = [Path(shutil.copy(p, tmp_path / p.name)) for p in tiny_split]
    copies[2].unlink()
    _expect_error(copies[0], "shard 3 of 4 is missing", copies[2].name)
    # a shard of another split of the same file: other numbering
    other = tmp_path / "other"
    other.mkdir()
    assert _gguflm("split", "--split-max-tensors", "13", tiny_q4, other / "tiny").returncode == 0
    shutil.copy(_shards(other, "tiny")[1], copies[2].with_name("tiny-00002-of-00004.gguf"))
    shutil.copy(tiny_split[2], copies[2])
    _expect_error(copies[0], "expected shard 2 of 4", "shard 2 of 3")
    # the first shard renamed: the others cannot be found
    renamed = tmp_path / "model.gguf"
    shutil.copy(tiny_split[0], renamed)
    _expect_error(renamed, "-00001-of-00004.gguf")


def test_split_refuses_a_limit_that_leaves_a_shard_empty(tiny_q4: Path,
                                                         tmp_path: Path) -> None:
    r = _gguflm("split", "--split-max-size", "1M", tiny_q4, tmp_path / "x")
    assert r.returncode == 1 and "no tensor" in r.stderr
    assert not list(tmp_path.iterdir())
    r = _gguflm("split", "--split-max-size", "12K", tiny_q4, tmp_path / "x")
    assert r.returncode == 2 and "M or G" in r.stderr


def test_merge_refuses_a_file_that_is_not_split_and_an_existing_output(
        tiny_q4: Path, tiny_split: list[Path], tmp_path: Path) -> None:
    r = _gguflm("merge", tiny_q4, tmp_path / "out.gguf")
    assert r.returncode == 1 and "not a shard" in r.stderr
    r = _gguflm("merge", tiny_split[0], tiny_q4)
    assert r.returncode == 2 and "already exists" in r.stderr
