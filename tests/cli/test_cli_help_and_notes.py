"""Help texts that match the behaviour, and the small things a first session meets: serve's
--help names every route and -v logs to stderr, perplexity --json's help names its keys,
tokenize -p, chat's /show with the values in effect, and the note when another gguflm
process works the same cores."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

import gguflm
from gguflm.cli import build_parser, main
from gguflm.cli.common import other_gguflm_processes
from gguflm.server import APIServer
from test_cli_llama_flags import PROMPT, _on_a_terminal


def _help(command: str) -> str:
    sub = build_parser().parse_args([command] + (["-f", "x"] if command == "perplexity"
                                                 else [])).subparsers[command]
    return " ".join(sub.format_help().split())


def test_serve_help_names_every_route(tiny_llama: str) -> None:
    llm = gguflm.LLM(tiny_llama, parallel=1)
    try:
        server = APIServer(llm, port=0)
        paths = {r.path for r in server.api_app().routes}
        server.server_close()
    finally:
        llm.close()
    text = _help("serve")
    assert "/v1/embeddings" in paths
    for path in paths:
        if "/v1" + path in paths:  # the same route without /v1 (llama-server's aliases)
            continue
        assert path in text, path


def test_serve_v_logs_requests_to_stderr(tiny_llama: str) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "gguflm.cli", "serve", tiny_llama, "--port", "0",
                             "-v", "-np", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stderr is not None
        url = None
        deadline = time.monotonic() + 240
        while url is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            m = re.search(r"listening on (http://\S+)/v1", line)
            url = m.group(1) if m else None
        assert url, "the server did not start"
        with urllib.request.urlopen(url + "/health", timeout=30) as r:
            assert r.status == 200
        time.sleep(0.5)
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=60)
    assert out == ""  # stdout stays clean
    assert "GET /health" in err


def test_perplexity_json_help_names_the_keys_it_prints(tiny_llama: str, reference: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    text = str(reference / "text" / "apache-2.0.txt")
    assert main(["perplexity", tiny_llama, "-f", text, "-c", "32", "--chunks", "2", "--json"]) == 0
    keys = set(json.loads(capsys.readouterr().out))
    helped = _help("perplexity").split("--json print one JSON object: ")[1].split(" -")[0]
    named = {w.strip(",") for w in helped.split() if re.fullmatch(r"[a-z_]+,?", w)}
    assert keys <= named and named - keys <= {"the", "estimate", "after", "each", "chunk"}


def test_tokenize_takes_llama_tokenizes_options(tiny_llama: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tokenize", tiny_llama, "Hello world"]) == 0
    plain = capsys.readouterr().out
    assert main(["tokenize", "-m", tiny_llama, "-p", "Hello world"]) == 0
    assert capsys.readouterr().out == plain
    assert main(["tokenize", tiny_llama, "-p", "Hello world", "--ids", "--show-count"]) == 0
    out = capsys.readouterr().out.splitlines()
    ids = json.loads(out[0])
    assert out[1] == f"Total number of tokens: {len(ids)}" and len(ids) == len(plain.splitlines())
    proc = subprocess.run([sys.executable, "-m", "gguflm.cli", "tokenize", tiny_llama, "--stdin"],
                          input="Hello world", capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout == plain
    with pytest.raises(SystemExit) as e:
        main(["tokenize", tiny_llama])
    assert e.value.code == 2 and "TEXT, -p TEXT, -f FILE or --stdin" in capsys.readouterr().err


def test_chat_show_prints_the_values_in_effect(capsys: pytest.CaptureFixture[str]) -> None:
    from gguflm.cli import chat

    state = chat.Chat(None, chat.default_args())
    chat.command(state, "/show")
    shown = capsys.readouterr().err
    assert "llama.cpp's defaults" not in shown
    for part in ("temperature 0.8", "top_k 40", "top_p 0.95", "min_p 0.05", "seed random",
                 "mirostat 0", "max_tokens 512"):
        assert part in shown, part
    chat.command(state, "/set temperature 0.2")
    chat.command(state, "/set seed 9")
    chat.command(state, "/show")
    shown = capsys.readouterr().err
    assert "temperature 0.2" in shown and "seed 9" in shown


def test_a_note_when_another_gguflm_works_the_cores(tiny_llama: str) -> None:
    # a process whose command line is a gguflm run (it only sleeps)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "gguflm",
                              "run"])
    try:
        time.sleep(0.3)
        assert other.pid in [pid for pid, _ in other_gguflm_processes()]
        rc, _, err = _on_a_terminal(["run", tiny_llama, "-p", PROMPT, "-n", "2"])
        assert rc == 0
        assert "note: another gguflm process is running (gguflm " in err  # (others may run)
        assert "-t N" in err
    finally:
        other.kill()
        other.wait()
    # not a terminal (a script, a test): no note
    proc = subprocess.run([sys.executable, "-m", "gguflm.cli", "run", tiny_llama, "-p", PROMPT,
                           "-n", "2"], capture_output=True, text=True, timeout=300)
    assert "another gguflm" not in proc.stderr
