"""llama.cpp's options doing what they do in llama.cpp, end to end through ``gguflm run``:
-c 0, -b/-ub, -ctk/-ctv, -sys/-st, --ignore-eos, --mirostat, --samplers, --no-warmup,
a run without a prompt (a conversation, as llama-cli), and Ctrl-C (a newline and the
timings line, as llama.cpp prints them). The tiny random Llama where the text does not
matter, SmolLM2 (instruct, with a chat template) where it does."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import gguflm
from gguflm.cli import UsageError, main
from gguflm.cli.common import use_kv_cache_type
from test_cli_llama_flags import PROMPT, _json


def test_ctx_0_is_the_models_own_context(tiny_llama: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    n_train = gguflm.load_model(tiny_llama).config.n_ctx_train
    assert _json(capsys, tiny_llama, "-p", PROMPT, "-n", "1", "-c", "0")["n_ctx"] == n_train
    llm = gguflm.LLM(tiny_llama, n_ctx=0, parallel=1)
    try:
        assert llm.n_ctx == n_train
    finally:
        llm.close()


def test_batch_sizes_and_cache_types_keep_the_tokens(tiny_llama: str,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    base = _json(capsys, tiny_llama, "-p", PROMPT * 6, "-n", "8", "--temp", "0")
    # the prompt evaluated 3 rows at a time: the same logits, so the same greedy tokens
    small = _json(capsys, tiny_llama, "-p", PROMPT * 6, "-n", "8", "--temp", "0", "-b", "5",
                  "-ub", "3")
    assert small["generated_tokens"] == base["generated_tokens"]
    f32 = _json(capsys, tiny_llama, "-p", PROMPT * 6, "-n", "8", "--temp", "0", "-ctk", "f32",
                "-ctv", "f32")
    assert len(f32["generated_tokens"]) == 8
    llm = gguflm.LLM(tiny_llama, kv_cache_type="f32", n_batch=3, parallel=1)
    try:
        assert llm.engine.arena.f16 is False and llm.engine.n_batch == 3
    finally:
        llm.close()
    with pytest.raises(gguflm.InvalidRequestError, match="kv_cache_type"):
        gguflm.LLM(tiny_llama, kv_cache_type="q4_0")
    sizes = {}
    for kv in ("f16", "q8_0"):
        llm = gguflm.LLM(tiny_llama, kv_cache_type=kv, n_ctx=256, parallel=2)
        try:
            assert llm.engine.arena.kv_type == kv
            sizes[kv] = llm.engine.arena.nbytes
            done = llm.create_completion(PROMPT, max_tokens=4, temperature=0)
            assert done["usage"]["completion_tokens"] == 4
        finally:
            llm.close()
    assert sizes["q8_0"] / sizes["f16"] == 34 / 64  # a Q8_0 block: 34 bytes per 32 numbers


def test_q8_0_cache_in_run_bench_perplexity_and_serve(
        tiny_llama: str, reference: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """-ctk/-ctv q8_0 is a real Q8_0 cache in every command that takes it, without a note;
    a model whose heads are not whole Q8_0 blocks is a usage error saying so."""
    q8 = ["-ctk", "q8_0", "-ctv", "q8_0"]
    res = _json(capsys, tiny_llama, "-p", PROMPT * 6, "-n", "8", "--temp", "0", *q8)
    assert len(res["generated_tokens"]) == 8
    assert main(["run", tiny_llama, "-p", PROMPT, "-n", "2", "-ctk", "q8_0"]) == 0
    err0 = capsys.readouterr().err
    assert main(["bench", tiny_llama, "-p", "8", "-n", "2", "-r", "1", "--json", *q8]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["tg_tps"] > 0
    text = str(reference / "text" / "apache-2.0.txt")
    assert main(["perplexity", tiny_llama, "-f", text, "-c", "32", "--chunks", "2", "--json",
                 *q8]) == 0
    out, err2 = capsys.readouterr()
    assert json.loads(out)["n_chunks"] == 2
    assert "note: -ctk" not in err0 + err + err2
    log = tmp_path / "serve.txt"
    with open(log, "wb") as f:
        proc = subprocess.Popen([sys.executable, "-m", "gguflm.cli", "serve", tiny_llama,
                                 "--host", "127.0.0.1", "--port", "0", "-c", "256", *q8],
                                stdout=subprocess.DEVNULL, stderr=f)
    try:
        deadline, url = time.monotonic() + 300, None
        while url is None and time.monotonic() < deadline and proc.poll() is None:
            m = re.search(r"listening on (http://127\.0\.0\.1:\d+)", log.read_text())
            url = m.group(1) if m else time.sleep(0.2)
        assert url, log.read_text()
        openai = pytest.importorskip("openai")
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0,
                               timeout=300)
        done = client.completions.create(model="m", prompt=PROMPT, max_tokens=4, temperature=0)
        assert done.usage.completion_tokens == 4
        assert "note: -ctk" not in log.read_text()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    from tinymodel import write_tiny  # heads of 16 numbers: half a Q8_0 block

    small = write_tiny(tmp_path / "tiny16.gguf")
    with pytest.raises(UsageError, match="-ctk/-ctv q8_0: a q8_0 KV cache needs head sizes "
                                         "that are multiples of 32"):
        use_kv_cache_type(gguflm.load_model(small), "q8_0")
    with pytest.raises(gguflm.InvalidRequestError, match="multiples of 32"):
        gguflm.LLM(str(small), kv_cache_type="q8_0")


def test_system_prompt_and_single_turn_use_the_chat_template(
        smollm2_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = str(smollm2_path)
    llm = gguflm.LLM(model, parallel=1)
    try:
        with_system = llm.chat_prompt_ids([{"role": "system", "content": "Be brief."},
                                           {"role": "user", "content": "Hi"}])
        user_only = llm.chat_prompt_ids([{"role": "user", "content": "Hi"}])
    finally:
        llm.close()
    out = _json(capsys, model, "-sys", "Be brief.", "-p", "Hi", "-n", "1", "--temp", "0")
    assert out["prompt_tokens"] == with_system
    out = _json(capsys, model, "-st", "-p", "Hi", "-n", "1", "--temp", "0")
    assert out["prompt_tokens"] == user_only
    # a reply that ends by itself; --ignore-eos keeps going to -n
    short = _json(capsys, model, "-st", "-p", "Say OK.", "-n", "60", "--temp", "0")
    assert short["stopped_by"] == "eos"
    long = _json(capsys, model, "-st", "-p", "Say OK.", "-n", "60", "--temp", "0",
                 "--ignore-eos")
    assert long["stopped_by"] == "max_tokens" and len(long["generated_tokens"]) == 60
    n = len(short["generated_tokens"])
    assert long["generated_tokens"][:n - 1] == short["generated_tokens"][:n - 1]


def test_mirostat_and_samplers_run_and_repeat_with_a_seed(
        smollm2_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = str(smollm2_path)
    argv = ["-p", PROMPT, "-n", "24", "-s", "7"]
    plain = _json(capsys, model, *argv)
    for version in ("1", "2"):
        a = _json(capsys, model, *argv, "--mirostat", version, "--mirostat-ent", "3")
        b = _json(capsys, model, *argv, "--mirostat", version, "--mirostat-ent", "3")
        assert a["generated_tokens"] == b["generated_tokens"]
        assert a["generated_tokens"] != plain["generated_tokens"]
    # temperature alone, no truncation: another text than the default chain's
    wide = _json(capsys, model, *argv, "--samplers", "temperature")
    assert wide["generated_tokens"] != plain["generated_tokens"]
    same = _json(capsys, model, *argv, "--samplers",
                 "penalties;dry;top_n_sigma;top_k;typ_p;top_p;min_p;xtc;temperature")
    assert same["generated_tokens"] == plain["generated_tokens"]
    assert _json(capsys, model, *argv, "--no-warmup")["timings"]["warmup_seconds"] == 0


def test_run_without_a_prompt_is_a_conversation(tiny_llama: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "gguflm.cli", "run", tiny_llama], input="/bye\n",
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "gguflm chat: " in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "gguflm.cli", "run", tiny_llama, "-no-cnv"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "-no-cnv needs a prompt" in proc.stderr


def test_ctrl_c_ends_the_line_and_prints_the_timings(tiny_llama: str) -> None:
    # --context-shift: the run never ends on its own. Ctrl-C as at a terminal: a test run
    # started in the background of a shell has SIGINT ignored, which its children inherit
    # (Python then installs no KeyboardInterrupt at all), so the child's is reset first.
    proc = subprocess.Popen([sys.executable, "-m", "gguflm.cli", "run", tiny_llama, "-p", PROMPT,
                             "-n", "-1", "--ignore-eos", "--context-shift"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.stdout is not None
    os.set_blocking(proc.stdout.fileno(), False)
    out = b""
    deadline = time.monotonic() + 240
    while len(out) < 20 and time.monotonic() < deadline:  # wait for the text to flow
        out += proc.stdout.read() or b""
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    rest, err = proc.communicate(timeout=60)
    out += rest
    assert proc.returncode == 130, err.decode()[-2000:]
    assert out.endswith(b"\n")
    assert "stop: interrupted (Ctrl-C)" in err.decode() and "tok/s" in err.decode()


def test_llama_cpp_spellings_that_gguflm_maps(tiny_llama: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    # -n -2 (until the context is filled) and a quantized cache type gguflm does not have
    # (f16 here, noted)
    assert main(["run", tiny_llama, "-p", PROMPT, "-n", "-2", "-c", "16", "-ctk", "q4_0",
                 "-ctv", "q4_0", "--temp", "0"]) == 0
    err = capsys.readouterr().err
    assert ("note: -ctk/-ctv q4_0: gguflm's KV cache holds f16, f32 or q8_0 numbers; "
            "using f16") in err
    assert "stop: context full (n_ctx 16)" in err
    # llama-bench's thread list and -o json
    assert main(["bench", tiny_llama, "-p", "8", "-n", "2", "-r", "1", "-t", "1,2",
                 "-o", "json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["threads"] == 1
    assert "note: -t 1,2: gguflm bench measures one value a run; using 1" in err


def test_chat_takes_llama_clis_first_message_and_single_turn(smollm2_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "gguflm.cli", "chat", str(smollm2_path),
                           "-sys", "Answer in one short sentence.", "-p",
                           "What is the capital of France?", "-st", "--temp", "0",
                           "--log-disable"], input="", capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "The capital of France is Paris.\n"  # no prompt read: one turn


def test_context_shift_keeps_the_start_and_goes_on(tiny_llama: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["-p", PROMPT, "-c", "16", "-n", "40", "--ignore-eos", "--temp", "0"]
    stopped = _json(capsys, tiny_llama, *argv)
    assert stopped["stopped_by"] == "context" and len(stopped["generated_tokens"]) < 16
    shifted = _json(capsys, tiny_llama, *argv, "--context-shift", "--keep", "2")
    assert shifted["stopped_by"] == "max_tokens" and len(shifted["generated_tokens"]) == 40
    # until the first shift, the same tokens
    n = len(stopped["generated_tokens"])
    assert shifted["generated_tokens"][:n] == stopped["generated_tokens"]
    assert main(["run", tiny_llama, *argv, "--context-shift", "-s", "5"]) == 0
    err = capsys.readouterr().err
    assert "40 tokens; context shifted" in err and "seed 5]" in err
    with pytest.raises(SystemExit):
        main(["run", tiny_llama, *argv, "--context-shift", "--regex", "a+"])
