"""Hostile input, round 3 (issue 45), the server and engine half: request bodies over the
limit get their 413 (not a reset), a logit_bias that leaves nothing to choose, the
background compiler's lock in a folder of the user's own, sampler errors naming their
field, and model metadata (pooling type, soft caps) that lies.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

import gguflm
from gguflm.engine.errors import InvalidRequestError
from gguflm.gguf.errors import MetadataError
from gguflm.model import background
from test_hostile_server import _addr, _health_fast, _post, _start, _stop

CLI = [sys.executable, "-m", "gguflm.cli"]
OVER = (16 << 20) + 4096  # just over the server's 16 MiB body limit


@pytest.fixture(scope="module")
def served(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[tuple[str, Path]]:
    log = tmp_path_factory.mktemp("round3") / "log.txt"
    proc, url = _start(smollm2_path, log, "-np", "2")
    yield url, log
    assert proc.poll() is None, "the server died"
    _stop(proc)


@pytest.fixture(scope="module")
def server(served: tuple[str, Path]) -> str:
    return served[0]


# --- 7. bodies over the limit: the client that sent it all reads its 413 ---------------------

def _send_whole(url: str, body: bytes, chunked: bool = False) -> tuple[int, dict]:
    """POST ``body`` as a plain client does: send it all, then read the answer."""
    conn = http.client.HTTPConnection(*_addr(url), timeout=60)
    headers = {"Content-Type": "application/json"}
    if chunked:
        pieces = (body[i:i + (1 << 16)] for i in range(0, len(body), 1 << 16))
        conn.request("POST", "/v1/completions", body=pieces, headers=headers,
                     encode_chunked=True)
    else:
        conn.request("POST", "/v1/completions", body=body, headers=headers)
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, json.loads(data)


@pytest.mark.parametrize("size", [OVER, 40 << 20])
@pytest.mark.parametrize("chunked", [False, True])
def test_a_body_over_the_limit_gets_its_413(server: str, size: int, chunked: bool) -> None:
    body = json.dumps({"prompt": "x" * size, "max_tokens": 1}).encode()
    t0 = time.perf_counter()
    status, out = _send_whole(server, body, chunked)
    assert status == 413, out
    assert set(out["error"]) == {"message", "type", "param", "code"}
    assert "over 16777216 bytes" in out["error"]["message"]
    assert time.perf_counter() - t0 < 20
    _health_fast(server)


def test_the_openai_client_sees_the_413(server: str) -> None:
    client = openai.OpenAI(base_url=server + "/v1", api_key="x", max_retries=0, timeout=60)
    for _ in range(3):  # a reset would show as APIConnectionError, now and then
        with pytest.raises(openai.APIStatusError) as e:
            client.completions.create(model="m", prompt="y" * OVER, max_tokens=1)
        assert e.value.status_code == 413


def test_after_a_413_the_rest_of_the_body_is_never_a_request(server: str) -> None:
    """The connection is answered and closed: what follows the declared body (a request
    smuggled after it) is read and thrown away, never answered."""
    smuggled = b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\n\r\n"
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: "
            b"application/json\r\nContent-Length: " + str(OVER).encode() + b"\r\n\r\n")
    with socket.create_connection(_addr(server), timeout=20) as s:
        s.sendall(head + b"x" * OVER + smuggled)
        got = b""
        while chunk := s.recv(65536):
            got += chunk
    assert got.startswith(b"HTTP/1.1 413") and got.count(b"HTTP/1.1") == 1, got[:300]
    _health_fast(server)


def test_a_client_that_declares_a_huge_body_and_sends_none_is_not_waited_for(
        server: str) -> None:
    """The 413 is answered from the headers at once; the lingering read is bounded in time
    (the server closes by itself) and /health answers meanwhile."""
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Length: "
            + str(1 << 30).encode() + b"\r\n\r\n{")
    with socket.create_connection(_addr(server), timeout=30) as s:
        s.sendall(head)
        t0 = time.perf_counter()
        got = s.recv(65536)
        assert got.startswith(b"HTTP/1.1 413"), got[:200]
        _health_fast(server)
        while s.recv(65536):  # the server closes the connection within its linger time
            pass
        assert time.perf_counter() - t0 < 15


# --- 8. a logit_bias that leaves no token ----------------------------------------------------

N_VOCAB = 49152  # SmolLM2's


@pytest.mark.parametrize("bias", [
    {str(i): False for i in range(N_VOCAB)},
    [[i, False] for i in range(N_VOCAB)],
])
def test_a_logit_bias_that_bans_every_token_is_refused(server: str, bias: object) -> None:
    status, out = _post(server, "/v1/completions", json.dumps(
        {"prompt": "hi", "max_tokens": 3, "logit_bias": bias}))
    assert status == 400, out
    assert out["error"]["param"] == "logit_bias" and "every token" in out["error"]["message"]
    _health_fast(server)


def test_banning_every_token_a_grammar_allows_is_a_400(served: tuple[str, Path]) -> None:
    server, log = served
    allowed = {65, 66}  # "b" and "c" may stay: the regex wants letters from d on
    bias = [[i, False] for i in range(N_VOCAB) if i not in allowed]
    body = {"prompt": "hi", "max_tokens": 3, "logit_bias": bias, "regex": "[d-z]+"}
    status, out = _post(server, "/v1/completions", json.dumps(body))
    assert status == 400, out
    assert out["error"]["code"] == "no_token_allowed"
    assert out["error"]["param"] == "logit_bias"
    conn = http.client.HTTPConnection(*_addr(server), timeout=60)
    conn.request("POST", "/v1/completions", json.dumps(body | {"stream": True}),
                 {"Content-Type": "application/json"})
    events = conn.getresponse().read().decode()
    assert '"code": "no_token_allowed"' in events and events.endswith("data: [DONE]\n\n")
    assert "RuntimeWarning" not in log.read_text()  # no NaN arithmetic in the sampler


def test_a_bias_that_leaves_one_token_still_generates(server: str) -> None:
    status, out = _post(server, "/v1/completions", json.dumps(
        {"prompt": "hi", "max_tokens": 3, "temperature": 1.0,
         "logit_bias": [[i, False] for i in range(N_VOCAB) if i != 66]}))
    assert status == 200, out
    assert out["usage"]["completion_tokens"] == 3


def test_the_python_api_refuses_a_bias_that_bans_everything(smollm2_path: Path) -> None:
    llm = gguflm.LLM(str(smollm2_path), parallel=1, n_ctx=64)
    try:
        with pytest.raises(InvalidRequestError, match="every token") as e:
            llm.create_completion("hi", max_tokens=2,
                                  logit_bias={i: False for i in range(N_VOCAB)})
        assert e.value.param == "logit_bias"
    finally:
        llm.close()


# --- 10a. a sampler error names its field ----------------------------------------------------

@pytest.mark.parametrize("field, value", [
    ("samplers", "nonsense"), ("samplers", ["top_k", 5]), ("samplers", 7),
    ("samplers", "a;" * 70), ("mirostat", 3), ("repeat_last_n", -2), ("top_p", 2.0),
])
def test_a_bad_sampling_value_names_its_field(server: str, field: str, value: object) -> None:
    status, out = _post(server, "/v1/completions", json.dumps(
        {"prompt": "hi", "max_tokens": 1, field: value}))
    assert status == 400, out
    assert out["error"]["param"] == field, out


# --- 9. the background compiler's lock -------------------------------------------------------

@pytest.fixture
def shared_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in for the shared temporary folder, with no session folder of the user's."""
    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp_path))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    return tmp_path


def test_the_lock_lives_in_a_private_folder(shared_tmp: Path) -> None:
    fd = background.open_lock()
    os.close(fd)
    folder = Path(background.lock_path()).parent
    assert folder.parent == shared_tmp and folder.name == f"gguflm-{os.geteuid()}"
    assert folder.stat().st_mode & 0o777 == 0o700
    assert Path(background.lock_path()).stat().st_mode & 0o077 == 0


def test_a_planted_symlink_is_never_followed(shared_tmp: Path) -> None:
    folder = Path(background.private_folder())
    victim = shared_tmp / "victim.txt"
    victim.write_text("precious")
    Path(background.lock_path()).symlink_to(victim)
    with pytest.raises(OSError):
        background.open_lock()
    assert victim.read_text() == "precious"
    dangling = shared_tmp / "created-by-the-attacker's-choice"
    Path(background.lock_path()).unlink()
    Path(background.lock_path()).symlink_to(dangling)
    assert background.Compiling.start("no-such-model.gguf", lambda: False) is None
    assert not dangling.exists() and folder.is_dir()
    assert background.Compiling(None, lambda: True).finished()  # no lock: nothing running


@pytest.mark.parametrize("plant", ["symlink", "open", "file", "other owner"])
def test_a_folder_someone_else_made_is_refused(shared_tmp: Path, plant: str) -> None:
    path = shared_tmp / f"gguflm-{os.geteuid()}"
    elsewhere = shared_tmp / "theirs"
    elsewhere.mkdir(mode=0o700)
    if plant == "symlink":
        path.symlink_to(elsewhere)
    elif plant == "open":
        path.mkdir()
        path.chmod(0o777)
    elif plant == "file":
        path.write_text("")
    else:
        if os.geteuid() != 0:
            pytest.skip("making a folder of another user's needs root")
        path.mkdir(mode=0o700)
        os.chown(path, 54321, -1)
    with pytest.raises(OSError):
        background.private_folder()
    assert background.Compiling.start("no-such-model.gguf", lambda: False) is None
    assert list(elsewhere.iterdir()) == []


def test_the_session_folder_is_used_when_it_is_private(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = tmp_path / "run-user"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    assert background.private_folder() == str(runtime)
    runtime.chmod(0o777)  # not private: the temporary folder's own instead
    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp_path))
    assert background.private_folder() == str(tmp_path / f"gguflm-{os.geteuid()}")


# --- 10b. metadata that lies: pooling type, soft caps ----------------------------------------

@pytest.mark.parametrize("value", [99, 5, -2, 2**31])
def test_an_unknown_pooling_type_is_an_error_naming_the_key(minilm_path: Path,
                                                          value: int) -> None:
    with pytest.raises(MetadataError, match="bert.pooling_type.*not a pooling type"):
        gguflm.LLM(str(minilm_path), parallel=1, kv_overrides={"bert.pooling_type": value})


def test_a_pooling_type_of_the_wrong_type_is_an_error(minilm_path: Path) -> None:
    out = subprocess.run([*CLI, "embed", str(minilm_path), "-p", "hi", "--override-kv",
                          "bert.pooling_type=str:mean"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 1, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "pooling_type" in lines[0]


def test_unspecified_pooling_is_the_default(minilm_path: Path) -> None:
    llm = gguflm.LLM(str(minilm_path), parallel=1, kv_overrides={"bert.pooling_type": -1})
    try:
        assert llm.pooling == "mean"
    finally:
        llm.close()


def test_a_reranker_refuses_to_embed_without_a_pooling_and_no_warning(
        minilm_path: Path) -> None:
    out = subprocess.run([*CLI, "embed", str(minilm_path), "-p", "hi", "--override-kv",
                          "bert.pooling_type=int:4"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 1, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "rank" in lines[0] and lines[0].startswith("error: "), lines
    llm = gguflm.LLM(str(minilm_path), parallel=1, kv_overrides={"bert.pooling_type": 4})
    try:
        assert llm.pooling == "rank"
        with pytest.raises(InvalidRequestError, match="rank"):
            llm.embed("hi")
        assert len(llm.embed("hi", pooling="cls")) == llm.model.config.n_embd
    finally:
        llm.close()


@pytest.mark.parametrize("cap", [1e-44, 1e-5, -1.0, -30.0, 1e39])
def test_a_soft_cap_that_breaks_the_arithmetic_is_refused(gemma4_path: Path,
                                                          cap: float) -> None:
    out = subprocess.run([*CLI, "run", str(gemma4_path), "-p", "hi", "-n", "2",
                          "--override-kv", f"gemma4.final_logit_softcapping=float:{cap}"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 1, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert "final_logit_softcapping" in lines[0] and "RuntimeWarning" not in out.stderr


def test_a_zero_soft_cap_means_none(gemma4_path: Path) -> None:
    """0 is the default of the key (no capping), so the logits are the uncapped ones: the
    file's cap of 30 applied to them gives the file's logits."""
    import numpy as np

    plain = gguflm.LLM(str(gemma4_path), parallel=1, n_ctx=64)
    zero = gguflm.LLM(str(gemma4_path), parallel=1, n_ctx=64,
                      kv_overrides={"gemma4.final_logit_softcapping": 0.0})
    try:
        cap = plain.model.config.final_softcap
        assert cap == 30.0 and zero.model.config.final_softcap == 0.0
        ids = plain.tokenizer.encode("hi there")
        capped, uncapped = plain.model.logits(ids), zero.model.logits(ids)
        assert np.allclose(np.tanh(uncapped / cap) * cap, capped, atol=1e-4)
        assert not np.allclose(uncapped, capped, atol=1e-4)
    finally:
        plain.close()
        zero.close()


# --- 1, in the library: files it reads as text are bounded too ------------------------------

def _unreadable(tmp_path: Path, size: int) -> list[Path]:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    zero = tmp_path / "zero-link"
    zero.symlink_to("/dev/zero")
    big = tmp_path / "big.txt"
    with open(big, "wb") as f:
        f.truncate(size)
    return [fifo, zero, Path("/dev/urandom"), tmp_path, big]


def test_the_library_reads_template_and_schema_files_within_bounds(tmp_path: Path) -> None:
    from gguflm.engine.errors import ConstraintError
    from gguflm.engine.schema import schema_from_arg
    from gguflm.textfile import GRAMMAR_FILES, TEMPLATE_FILES
    from gguflm.tokenizer.chat import ChatTemplateError, load_template_file

    for path in _unreadable(tmp_path, TEMPLATE_FILES.limit + 1):
        t0 = time.perf_counter()
        with pytest.raises(ChatTemplateError, match="not a regular file|over the 8 MiB"):
            load_template_file(path)
        assert time.perf_counter() - t0 < 1
    schemas = tmp_path / "schemas"
    schemas.mkdir()
    for path in _unreadable(schemas, GRAMMAR_FILES.limit + 1):
        with pytest.raises(ConstraintError, match="not a regular file|over the 4 MiB") as e:
            schema_from_arg(str(path))
        assert e.value.param == "json_schema"


def test_an_llm_with_a_fifo_for_its_chat_template_fails_at_once(smollm2_path: Path,
                                                                tmp_path: Path) -> None:
    fifo = tmp_path / "template.jinja"
    os.mkfifo(fifo)
    t0 = time.perf_counter()
    with pytest.raises(Exception, match="not a regular file"):
        gguflm.LLM(str(smollm2_path), parallel=1, n_ctx=64, chat_template=str(fifo))
    assert time.perf_counter() - t0 < 60
