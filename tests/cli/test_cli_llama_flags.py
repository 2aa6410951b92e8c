"""`gguflm run` and the shared options with llama.cpp's spellings: -m, -s, -r/--stop, -e,
--display-prompt, --verbose-prompt, --color, the ignored GPU options, usage errors,
--no-bos, --rope-style and --override-kv, timings and stop reasons, progress on a
terminal, model-name suggestions, and bench's lists.

Mostly on the tiny random-weight Llama of the reference data (fast; its text is gibberish,
which is fine: the options are what is tested).
"""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import gguflm
from gguflm.cli import main
from gguflm.cli.run import _context_size
from gguflm.tokenizer import Tokenizer

PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def tiny(reference: Path) -> str:
    return str(reference / "tiny-llama-f16" / "tiny-llama-f16.gguf")


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(["run", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_model_flag_and_seed_flag(tiny: str, capsys: pytest.CaptureFixture[str]) -> None:
    a = _json(capsys, tiny, "-p", PROMPT, "-n", "6", "--seed", "42", "--temp", "1")
    b = _json(capsys, "-m", tiny, "-p", PROMPT, "-n", "6", "-s", "42", "--temp", "1")
    assert a["generated_tokens"] == b["generated_tokens"] and b["seed"] == 42
    with pytest.raises(SystemExit) as e:
        main(["run", tiny, "-m", "other.gguf", "-p", PROMPT])
    assert e.value.code == 2 and "two models" in capsys.readouterr().err


def test_stop_and_reverse_prompt_end_the_text(tiny: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    full = _json(capsys, tiny, "-p", PROMPT, "-n", "16", "--temp", "0")["text"]
    cut = len(full) // 2
    stop = full[cut:cut + 2]
    first = full.index(stop)
    for flag in ("--stop", "-r", "--reverse-prompt"):
        out = _json(capsys, tiny, "-p", PROMPT, "-n", "16", "--temp", "0", flag, stop)
        assert out["text"] == full[:first]
        assert out["stop"] == "stop" and out["stopped_by"] == "stop_string"


def test_escapes_and_verbose_prompt(tiny: str, capsys: pytest.CaptureFixture[str]) -> None:
    tok = Tokenizer.from_file(tiny)
    out = _json(capsys, tiny, "-p", "a\\nb\\tc", "-e", "-n", "1", "--temp", "0")
    assert out["prompt_tokens"] == tok.encode("a\nb\tc")
    out = _json(capsys, tiny, "-p", "a\\nb", "-n", "1", "--temp", "0")  # no -e: literal
    assert out["prompt_tokens"] == tok.encode("a\\nb")
    assert main(["run", tiny, "-p", PROMPT, "-n", "1", "--verbose-prompt"]) == 0
    err = capsys.readouterr().err
    ids = tok.encode(PROMPT)
    assert f"number of tokens in prompt = {len(ids)}" in err
    for tid in ids:
        assert f"{tid:6d} -> " in err


def test_display_prompt_and_color(tiny: str, capsys: pytest.CaptureFixture[str]) -> None:
    gen = _json(capsys, tiny, "-p", PROMPT, "-n", "4", "--temp", "0")["text"]
    assert main(["run", tiny, "-p", PROMPT, "-n", "4", "--temp", "0"]) == 0
    assert capsys.readouterr().out == gen + "\n"  # --no-display-prompt is the default
    assert main(["run", tiny, "-p", PROMPT, "-n", "4", "--temp", "0", "--display-prompt"]) == 0
    assert capsys.readouterr().out == PROMPT + gen + "\n"
    assert main(["run", tiny, "-p", PROMPT, "-n", "4", "--temp", "0", "--display-prompt",
                 "--color"]) == 0
    assert capsys.readouterr().out == f"\033[33m{PROMPT}\033[0m{gen}\n"


def test_gpu_options_are_accepted_and_noted(tiny: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    base = _json(capsys, tiny, "-p", PROMPT, "-n", "4", "--temp", "0")
    # -fa before MODEL must not swallow it; -ngl 99 must not read as -n gl
    out = _json(capsys, "-fa", tiny, "-p", PROMPT, "-n", "4", "--temp", "0", "-ngl", "99",
                "--mlock", "--no-mmap", "--n-gpu-layers", "12", "--flash-attn", "off")
    assert out["generated_tokens"] == base["generated_tokens"]
    assert main(["run", tiny, "-p", PROMPT, "-n", "1", "-ngl", "99", "-fa", "on"]) == 0
    err = capsys.readouterr().err
    notes = [line for line in err.splitlines() if line.startswith("note: ")]
    assert notes == ["note: -ngl 99, -fa on: ignored: gguflm runs on the CPU"]
    assert main(["run", tiny, "-p", PROMPT, "-n", "1", "-ngl", "99", "--log-disable"]) == 0
    assert capsys.readouterr().err == ""  # --log-disable: no note, no timings line


def test_an_unknown_option_prints_the_commands_usage(capsys: pytest.CaptureFixture[str]) -> None:
    for cmd in ("run", "chat", "perplexity", "bench", "embed", "serve", "inspect"):
        with pytest.raises(SystemExit) as e:
            main([cmd, "--no-such-option", *(["-f", "x.txt"] if cmd == "perplexity" else [])])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith(f"usage: gguflm {cmd}")
        assert f"gguflm {cmd}: error: unrecognized arguments: --no-such-option" in err


def test_exit_codes_are_consistent(tiny: str, capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["-t", "0"], ["-c", "-1"], ["--temp", "x"], ["-n", "-5"], ["-ctk", "q9"],
                 ["-ctk", "f32", "-ctv", "f16"], ["--mirostat", "3"], ["--samplers", "bogus"]):
        with pytest.raises(SystemExit) as e:
            main(["run", tiny, "-p", PROMPT, *argv])
        assert e.value.code == 2, argv
        capsys.readouterr()
    assert main(["run", tiny, "-p", PROMPT * 4, "-c", "4"]) == 1  # a runtime limit
    assert capsys.readouterr().err.startswith("error: ")


def test_no_bos_and_override_kv(tiny: str, capsys: pytest.CaptureFixture[str]) -> None:
    tok = Tokenizer.from_file(tiny)
    assert tok.add_bos and tok.bos_id is not None
    with_bos = _json(capsys, tiny, "-p", PROMPT, "-n", "1", "--temp", "0")["prompt_tokens"]
    assert with_bos[0] == tok.bos_id
    for flags in (["--no-bos"], ["--override-kv", "tokenizer.ggml.add_bos_token=bool:false"]):
        out = _json(capsys, tiny, "-p", PROMPT, "-n", "1", "--temp", "0", *flags)
        assert out["prompt_tokens"] == with_bos[1:]
    # a context length fixed at load: the default context follows it
    out = _json(capsys, tiny, "-p", PROMPT, "-n", "40", "--temp", "0",
                "--override-kv", "llama.context_length=int:24,general.name=str:fixed")
    assert out["n_ctx"] == 24 and out["stopped_by"] == "context"
    with pytest.raises(SystemExit) as e:
        main(["run", tiny, "-p", PROMPT, "--override-kv", "llama.context_length=long:5"])
    assert e.value.code == 2 and "TYPE must be one of" in capsys.readouterr().err
    assert main(["run", tiny, "-p", PROMPT, "--override-kv",
                 "llama.context_length=str:long"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "llama.context_length" in err


def test_kv_overrides_and_rope_style_in_the_api(tiny: str, reference: Path) -> None:
    base = gguflm.load_model(tiny)
    ids = Tokenizer.from_file(tiny).encode(PROMPT)
    want = base.logits(ids)
    assert np.array_equal(gguflm.load_model(tiny, rope_style="norm").logits(ids), want)
    neox = gguflm.load_model(tiny, rope_style="neox")
    assert neox.rope_style == "neox" and not np.allclose(neox.logits(ids), want, atol=1e-3)
    # a Qwen2 file is NEOX: forcing NORM changes it, forcing NEOX does not
    qwen = str(reference / "arch" / "qwen2" / "tiny-qwen2-f16.gguf")
    q = gguflm.load_model(qwen)
    ids = [1, 90, 250, 263, 931]  # its vocabulary has 4000 tokens
    assert q.rope_style == "neox"
    assert np.array_equal(gguflm.load_model(qwen, rope_style="neox").logits(ids), q.logits(ids))
    assert not np.allclose(gguflm.load_model(qwen, rope_style="norm").logits(ids), q.logits(ids))
    with pytest.raises(ValueError, match="rope_style"):
        gguflm.load_model(tiny, rope_style="gptj")
    ids = Tokenizer.from_file(tiny).encode(PROMPT)
    llm = gguflm.LLM(tiny, kv_overrides={"llama.context_length": 48,
                                         "tokenizer.ggml.add_bos_token": False}, parallel=1)
    try:
        assert llm.n_ctx == 48 and llm.tokenize(PROMPT) == ids[1:]
    finally:
        llm.close()
    with pytest.raises(gguflm.InvalidRequestError, match="rope_style"):
        gguflm.LLM(tiny, rope_style="bad")


def test_timings_and_the_limit_that_stopped(tiny: str, capsys: pytest.CaptureFixture[str]) -> None:
    out = _json(capsys, tiny, "-p", PROMPT, "-n", "3", "--temp", "0")
    t = out["timings"]
    assert out["stopped_by"] == "max_tokens" and out["stop"] == "length"
    assert t["warmup_seconds"] > 0 and t["prompt_tokens_per_second"] > 0
    assert main(["run", tiny, "-p", PROMPT, "-n", "3", "--temp", "0"]) == 0
    err = capsys.readouterr().err
    assert "stop: length (-n 3)" in err and "warm-up" in err
    assert main(["run", tiny, "-p", PROMPT, "-n", "50", "-c", "10", "--temp", "0"]) == 0
    assert "stop: context full (n_ctx 10)" in capsys.readouterr().err


def test_the_default_context_grows_to_fit_and_says_so() -> None:
    import argparse

    ns = argparse.Namespace(ctx_size=None)
    assert _context_size(ns, 5000, 200, 8192) == (5199, True)
    assert _context_size(ns, 10, 200, 8192) == (4096, False)
    assert _context_size(argparse.Namespace(ctx_size=64), 10, 200, 8192) == (64, False)


def test_a_mistyped_model_name_suggests_the_known_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "smolm2-135m", "-p", PROMPT]) == 1
    assert "did you mean 'smollm2-135m'?" in capsys.readouterr().err
    assert main(["inspect", "gema3-270m"]) == 1
    assert "did you mean 'gemma3-270m'?" in capsys.readouterr().err


def _on_a_terminal(argv: list[str]) -> tuple[int, str, str]:
    """Run ``gguflm`` with stderr on a pseudo-terminal (stdout a pipe)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "gguflm.cli", *argv], stdout=subprocess.PIPE,
                            stderr=slave, stdin=subprocess.DEVNULL)
    os.close(slave)
    err = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        err += chunk
    out = proc.stdout.read() if proc.stdout else b""
    proc.wait(timeout=300)
    os.close(master)
    return proc.returncode, out.decode(), err.decode(errors="replace")


def test_long_prompts_show_progress_on_a_terminal_only(tiny: str, tmp_path: Path) -> None:
    text = tmp_path / "long.txt"
    text.write_text("the cat sat on the mat and " * 120)
    rc, out, err = _on_a_terminal(["run", tiny, "-f", str(text), "-n", "2", "--temp", "0"])
    assert rc == 0, err
    assert "prompt: " in err and " tokens " in err and "%" in err
    rc, out, err = _on_a_terminal(["run", tiny, "-f", str(text), "-n", "2", "--temp", "0",
                                   "--json"])
    assert rc == 0 and "prompt: " not in err and json.loads(out)["generated_tokens"]
    proc = subprocess.run([sys.executable, "-m", "gguflm.cli", "run", tiny, "-f", str(text),
                           "-n", "2"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "prompt: " not in proc.stderr


def test_perplexity_progress_json_and_load_options(tiny: str, reference: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    text = str(reference / "text" / "apache-2.0.txt")
    argv = ["perplexity", tiny, "-f", text, "-c", "32", "--chunks", "3"]
    assert main([*argv, "--json"]) == 0
    out, err = capsys.readouterr()
    res = json.loads(out)
    assert res["n_chunks"] == 3 and len(res["running"]) == 3 and err == ""
    assert main([*argv, "--no-bos", "-ngl", "9"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("PPL = ") and "[3]" in err
    assert float(out.split()[2]) != pytest.approx(res["ppl"])  # no BOS: another text start
    rc, out, err = _on_a_terminal(argv)
    assert rc == 0 and "perplexity: 1/3 chunks" in err and "PPL" in err


def test_bench_lists_print_llama_benchs_table(tiny: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", tiny, "-p", "8,16", "-n", "2", "-r", "1"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split("|")[1:-1] == [
        f" {h.ljust(len(c) - 2) if i not in (1, 2, 4, 5, 6) else h.rjust(len(c) - 2)} "
        for i, (h, c) in enumerate(zip(["model", "size", "params", "backend", "threads",
                                        "test", "t/s"], lines[0].split("|")[1:-1]))]
    rows = [line.split("|")[1:-1] for line in lines[2:5]]
    assert [r[5].strip() for r in rows] == ["pp8", "pp16", "tg2"]
    assert all("±" in r[6] and r[3].strip() == "CPU" and r[1].strip().endswith("MB")
               for r in rows)
    assert main(["bench", tiny, "-p", "8", "-n", "2", "-r", "1", "--json"]) == 0
    single = json.loads(capsys.readouterr().out)
    assert single["n_prompt"] == 8 and single["pp_tps"] > 0 and "tests" not in single
    assert main(["bench", tiny, "-p", "8,16", "-n", "0", "-r", "1", "--json"]) == 0
    many = json.loads(capsys.readouterr().out)
    assert [t["test"] for t in many["tests"]] == ["pp8", "pp16"]


def test_sizes_are_in_one_unit() -> None:
    """MB means 10^6 bytes in pull's progress and list, inspect and bench (and the README)."""
    import io

    from gguflm.cli.pull import StderrProgress, _amount

    assert _amount(126_556_512, 253_113_024) == "126.6/253.1 MB  50%"
    stream = io.StringIO()
    StderrProgress(stream)("extract", 0, 253_113_024)
    assert stream.getvalue() == "extract (253.1 MB)\n"
