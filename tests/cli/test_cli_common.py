"""cli/common.py: the helpers several commands share (argument types, MODEL, text files)."""

from __future__ import annotations

import argparse
import io
import time

import pytest

from gguflm.cli import CLIError, UsageError
from gguflm.cli.common import (
    Progress,
    add_model_argument,
    finish_model_argument,
    load_model,
    non_negative_int,
    positive_int,
    process_escapes,
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
    def parse(p: argparse.ArgumentParser, argv: list[str]) -> str:
        args = p.parse_args(argv)
        finish_model_argument(args)
        return args.model

    p = argparse.ArgumentParser()
    add_model_argument(p, optional=True)
    assert parse(p, []) == DEFAULT_MODEL
    assert parse(p, ["m.gguf"]) == "m.gguf"
    assert parse(p, ["-m", "m.gguf"]) == parse(p, ["--model", "m.gguf"]) == "m.gguf"
    assert parse(p, ["m.gguf", "-m", "m.gguf"]) == "m.gguf"
    with pytest.raises(UsageError, match="two models"):
        parse(p, ["a.gguf", "-m", "b.gguf"])
    q = argparse.ArgumentParser()
    add_model_argument(q)
    assert parse(q, ["-m", "x.gguf"]) == "x.gguf"
    with pytest.raises(UsageError, match="MODEL is required"):
        parse(q, [])


def test_process_escapes() -> None:
    assert process_escapes(r"a\nb\tc\\d\'\"") == "a\nb\tc\\d'\""
    assert process_escapes(r"caf\xC3\xA9 \x41") == "café A"
    assert process_escapes(r"keep \q and \x4 and end\\") == r"keep \q and \x4 and end" + "\\"


def test_progress_is_silent_off_a_terminal() -> None:
    stream = io.StringIO()
    p = Progress("prompt", 1000, "tokens", stream=stream)
    p.update(500)
    p.close()
    assert stream.getvalue() == ""

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty = Tty()
    p = Progress("prompt", 1000, "tokens", stream=tty)
    time.sleep(0.01)
    p.update(500)
    text = tty.getvalue()
    assert "prompt: 500/1000 tokens 50%" in text and "ETA" in text
    p.close()
    assert tty.getvalue().endswith("\r")
    assert not Progress("x", 10, enabled=False, stream=tty).enabled


def test_kv_override_parsing() -> None:
    from gguflm.model.overrides import KVOverrideError, parse_kv_override

    assert parse_kv_override("a.b=int:5") == ("a.b", 5)
    assert parse_kv_override("a.b=float:1e4") == ("a.b", 1e4)
    assert parse_kv_override("a.b=bool:false") == ("a.b", False)
    assert parse_kv_override("a.b=str:x:y=z") == ("a.b", "x:y=z")
    for bad in ("a.b", "=int:1", "a.b=long:1", "a.b=int:x", "a.b=bool:yes", "a.b=float:nan"):
        with pytest.raises(KVOverrideError):
            parse_kv_override(bad)


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
