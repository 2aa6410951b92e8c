"""`gguflm chat` as a new user drives it: the commands (/help, /set, /show, /bye), quoted
multi-line input, unknown commands kept from the model, the default reply limit, replies
cut off and marked, the oldest turns dropped when the context fills, a note for a model
without a chat template, `run -cnv` handing over, a pseudo-terminal session; and the
Python API's llama-cpp-python names.
"""

from __future__ import annotations

import io
import os
import pty
import re
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

import gguflm
from gguflm.cli import main
from gguflm.cli.chat import DEFAULT_N_PREDICT, default_args, read_message


def _chat(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], stdin: str,
          *argv: str) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    rc = main(["chat", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_commands_settings_and_multiline(smollm2_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    stdin = ('/help\n/set temperature 0\n/set max_tokens 3\n/set verbose\n'
             'What is 2 + 2?\n/nonsense with words\n'
             '"""\nline one\nline two\n"""\n'
             '/set top_p 7\n/set bogus 1\n/show\n/bye\nnever read\n')
    rc, out, err = _chat(monkeypatch, capsys, stdin, str(smollm2_path), "-c", "512")
    assert rc == 0
    assert "/set NAME VALUE" in err and "/bye, /exit, /quit" in err  # /help
    assert "[temperature 0.0]" in err and "[max_tokens 3]" in err and "[verbose on]" in err
    assert "[unknown command /nonsense; /help lists the commands]" in err
    stats = re.findall(r"\[(\d+) tokens, stop: (\w+); prompt (\d+) tokens", err)
    assert len(stats) == 2  # the question, and the three quoted lines as one message
    assert all(int(n) <= 3 for n, _, _ in stats)
    assert err.count("[reply cut off at the limit of 3 tokens") == sum(
        1 for _, stop, _ in stats if stop == "max_tokens")
    assert "top_p must be between 0 and 1" in err and "unknown setting 'bogus'" in err
    assert "max_tokens 3" in err and "temperature 0.0" in err  # /show
    # a quoted message is one user message: its prompt holds both lines
    first, second = int(stats[0][2]), int(stats[1][2])
    assert second > first


def test_quoted_input_and_commands_are_told_apart() -> None:
    def feed(*lines: str):
        it = iter(lines)
        return read_message(False, read=lambda prompt: next(it))

    assert feed("hello") == ("hello", False)
    assert feed('"""one line"""') == ("one line", True)
    assert feed('"""', "/not a command", "second", '"""') == ("/not a command\nsecond", True)
    assert feed('"""first', 'last"""') == ("first\nlast", True)

    def eof(prompt: str) -> str:
        raise EOFError

    assert read_message(False, read=eof) is None


def test_default_reply_limit_and_penalties() -> None:
    args = default_args()
    assert args.n_predict == DEFAULT_N_PREDICT == 512
    assert args.sampling_repeat_penalty is None  # llama.cpp's default (1.0) applies
    assert args.model == "smollm2-135m"


def test_context_fills_oldest_turns_are_dropped(smollm2_path: Path,
                                                monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    question = "Please tell me one interesting fact about the history of the city number {}."
    stdin = "".join(question.format(i) + "\n" for i in range(6)) + "/exit\n"
    rc, out, err = _chat(monkeypatch, capsys, stdin, str(smollm2_path), "-c", "160", "-n", "16",
                         "--temp", "0", "--system", "You are a helpful assistant.", "-v")
    assert rc == 0
    assert "[the context is full: dropped the" in err and "(the system message stays)" in err
    stats = re.findall(r"prompt (\d+) tokens: (\d+) new", err)
    assert len(stats) == 6 and all(int(total) + 16 <= 160 for total, _ in stats)
    assert "longer than" not in err and "error" not in err.lower()


def test_a_model_without_a_chat_template_is_named(gemma3_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _chat(monkeypatch, capsys, "/bye\n", str(gemma3_path), "-c", "256")
    assert rc == 0
    assert "has no chat template" in err and "built-in gemma" in err


def test_run_conversation_mode_hands_over_to_chat(smollm2_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    for flag in ("-cnv", "-i"):
        monkeypatch.setattr(sys, "stdin", io.StringIO("/show\n/bye\n"))
        rc = main(["run", str(smollm2_path), flag, "-p", "You are terse.", "-n", "4",
                   "--temp", "0", "-c", "256"])
        out, err = capsys.readouterr()
        assert rc == 0 and "gguflm chat: " in err and out.startswith("> ")
        assert "max_tokens 4" in err and "system: 'You are terse.'" in err


def test_a_chat_on_a_pseudo_terminal(smollm2_path: Path) -> None:
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "gguflm.cli", "chat", str(smollm2_path),
                             "-c", "256", "-n", "4", "--temp", "0", "--color"],
                            stdin=slave, stdout=slave, stderr=slave)
    os.close(slave)
    seen = b""

    def read_until(marker: bytes, timeout: float = 180) -> None:
        nonlocal seen
        deadline = time.monotonic() + timeout
        while marker not in seen and time.monotonic() < deadline:
            try:
                seen += os.read(master, 4096)
            except OSError:
                break
        assert marker in seen, seen.decode(errors="replace")

    try:
        read_until(b"> ")
        os.write(master, b"/help\n")
        read_until(b"/set NAME VALUE")
        os.write(master, b"Hi!\n")
        read_until(b"[reply cut off at the limit of 4 tokens")
        os.write(master, b"/bye\n")
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    assert proc.returncode == 0
    assert b"\x1b[1;32m" in seen  # --color on a terminal: the input is green


# --- the Python API's llama-cpp-python names ----------------------------------------------

def test_llama_cpp_python_names(reference: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tiny = str(reference / "tiny-llama-f16" / "tiny-llama-f16.gguf")
    assert "LLM" in dir(gguflm) and "load_model" in dir(gguflm)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the defaults of the ignored options warn of nothing
        llm = gguflm.LLM(model_path=tiny, n_ctx=64, n_threads=1, seed=7, verbose=True,
                         n_gpu_layers=0, use_mmap=True, n_batch=512, embedding=True)
    try:
        assert "gguflm: loaded tiny-llama-f16.gguf" in capsys.readouterr().err
        assert llm.n_ctx == 64 and llm.threads == 1
        a = llm("Once upon", max_tokens=6, temperature=1.0)  # __call__: create_completion
        b = llm.create_completion("Once upon", max_tokens=6, temperature=1.0)
        c = llm.generate("Once upon", max_tokens=6, temperature=1.0, seed=7)
        assert a["choices"][0]["text"] == b["choices"][0]["text"] == c["choices"][0]["text"]
    finally:
        llm.close()
    with pytest.warns(UserWarning, match="n_gpu_layers"):
        gguflm.LLM(tiny, n_gpu_layers=99, parallel=1).close()
    with pytest.raises(TypeError, match="n_gpux"):
        gguflm.LLM(tiny, n_gpux=1)
    with pytest.raises(TypeError, match="not both"):
        gguflm.LLM(tiny, model_path=tiny)
    with pytest.raises(gguflm.InvalidRequestError, match="seed"):
        gguflm.LLM(tiny, seed=2**40)
