"""cli/common.py: the helpers several commands share (argument types, MODEL, text files)."""

from __future__ import annotations

import argparse
import io

import pytest

from gguflm.cli import CLIError
from gguflm.cli.common import (
    add_model_argument,
    load_model,
    non_negative_int,
    positive_int,
    read_text,
)
from gguflm.hub import DEFAULT_MODEL


def test_integer_types() -> None:
    assert positive_int("3") == 3 and non_negative_int("0") == 0
    for fn, text, msg in ((positive_int, "0", "at least 1"), (non_negative_int, "-1", "at least 0"),
                          (positive_int, "x", "expected an integer")):
        with pytest.raises(argparse.ArgumentTypeError, match=msg):
            fn(text)


def test_model_argument() -> None:
    p = argparse.ArgumentParser()
    add_model_argument(p, optional=True)
    assert p.parse_args([]).model == DEFAULT_MODEL
    assert p.parse_args(["m.gguf"]).model == "m.gguf"
    q = argparse.ArgumentParser()
    add_model_argument(q)
    with pytest.raises(SystemExit):  # required: a usage error
        q.parse_args([])


def test_read_text(tmp_path, monkeypatch) -> None:
    good = tmp_path / "a.txt"
    good.write_text("héllo\n", encoding="utf-8")
    assert read_text(good) == "héllo\n"
    bad = tmp_path / "b.txt"
    bad.write_bytes(b"ok \xff")
    with pytest.raises(CLIError, match="is not UTF-8 text"):
        read_text(bad)
    assert read_text(bad, errors="surrogateescape") == "ok \udcff"
    with pytest.raises(CLIError, match="cannot read .*none.txt"):
        read_text(tmp_path / "none.txt")
    monkeypatch.setattr("sys.stdin", io.StringIO("from stdin"))
    assert read_text("-") == "from stdin"


def test_load_model(smollm2_path) -> None:
    loaded = load_model(str(smollm2_path))
    assert loaded.path == smollm2_path and loaded.seconds > 0
    assert loaded.model.config.n_vocab == loaded.tokenizer.n_vocab
