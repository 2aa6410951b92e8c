"""`gguflm run`: greedy output against llama.cpp's on SmolLM2, streaming, and errors.

A few cases and few tokens keep this fast; the full 9 x 64-token comparison is a script
(scratch-level) measurement, not a test.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gguflm.cli import main


@pytest.fixture(scope="module")
def smollm2_greedy(reference: Path) -> dict[str, dict]:
    data = json.loads((reference / "smollm2-135m-q4_1" / "greedy.json").read_text())
    return {c["id"]: c for c in data["cases"]}


def _run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(["run", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("case_id,n", [("capital", 8), ("chat", 8)])
def test_greedy_matches_llama_cpp_where_it_is_decisive(
        smollm2_path: Path, smollm2_greedy: dict, capsys: pytest.CaptureFixture[str],
        case_id: str, n: int) -> None:
    case = smollm2_greedy[case_id]
    flags = ["--special"] if case["special"] else []
    out = _run_json(capsys, str(smollm2_path), "-p", case["prompt"], "--temp", "0",
                    "-n", str(n), *flags)
    assert out["prompt_tokens"] == case["prompt_tokens"]
    ours, ref = out["generated_tokens"], case["generated_tokens"][:n]
    assert len(ours) == n and out["stop"] == "length"
    for i, (a, b) in enumerate(zip(ours, ref)):
        if a != b:  # after a difference the continuations are unrelated
            top = case["top_logits"][i]
            assert top[0][1] - top[1][1] < 1.0, f"differs at step {i}, llama.cpp decisive"
            break
    t = out["timings"]
    assert t["prompt_tokens"] == len(case["prompt_tokens"]) and t["generated_tokens"] == n
    assert t["prompt_tokens_per_second"] > 0 and t["generation_tokens_per_second"] > 0


def test_streamed_text_equals_json_text_for_the_same_seed(
        reference: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = str(reference / "tiny-llama-f16" / "tiny-llama-f16.gguf")
    args = [model, "-p", "Once upon a time", "-n", "12", "--seed", "42", "--temp", "1.0"]
    out = _run_json(capsys, *args)
    assert out["seed"] == 42 and len(out["generated_tokens"]) == 12
    assert main(["run", *args]) == 0
    streamed = capsys.readouterr()
    assert streamed.out == out["text"] + "\n"
    assert "12 tokens, stop: length" in streamed.err


@pytest.mark.parametrize("argv,message", [
    (["--top-p", "1.5"], "top-p must be between 0 and 1"),
    (["--repeat-penalty", "0"], "repeat-penalty must be > 0"),
    (["--seed", "-2"], "seed must be in"),
    (["-n", "-3"], "-n must be"),
    (["-c", "-1"], "must be at least 0, got -1"),
    (["-ctk", "f32", "-ctv", "f16"], "one type"),
    (["--mirostat", "3"], "mirostat must be 0, 1 or 2"),
])
def test_bad_option_values_are_usage_errors(reference: Path, capsys: pytest.CaptureFixture[str],
                                            argv: list[str], message: str) -> None:
    """A bad option value exits 2 with the command's usage, as argparse's own errors do."""
    model = str(reference / "tiny-llama-f16" / "tiny-llama-f16.gguf")
    with pytest.raises(SystemExit) as e:
        main(["run", model, "-p", "a prompt of several tokens here", *argv])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: gguflm run") and "gguflm run: error: " in err
    assert message in err.splitlines()[-1]


def test_a_prompt_longer_than_the_context_is_one_error_line(
        reference: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = str(reference / "tiny-llama-f16" / "tiny-llama-f16.gguf")
    assert main(["run", model, "-p", "a prompt of several tokens here", "-c", "3"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "longer than the context of 3" in err
    assert err.count("\n") == 1


def test_unparseable_flag_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["run", "-p", "x", "--temp", "warm"])
    assert e.value.code == 2
    assert "invalid float value: 'warm'" in capsys.readouterr().err


@pytest.mark.parametrize("threads", ["0", "two"])
def test_bad_thread_count_is_a_usage_error(capsys: pytest.CaptureFixture[str],
                                           threads: str) -> None:
    with pytest.raises(SystemExit) as e:
        main(["run", "-p", "x", "-t", threads])
    assert e.value.code == 2
    assert "-t/--threads" in capsys.readouterr().err


def test_thread_count_is_applied(reference: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import numba

    model = str(reference / "tiny-llama-f16" / "tiny-llama-f16.gguf")
    before = numba.get_num_threads()
    try:
        assert main(["run", model, "-p", "hello", "-n", "2", "-t", "1", "--temp", "0"]) == 0
        assert numba.get_num_threads() == 1
    finally:
        numba.set_num_threads(before)
