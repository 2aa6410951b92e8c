"""``gguflm serve``: the official ``openai`` client against a live server on loopback, the
same text from the server, the Python API and ``gguflm run``, error answers, disconnects
and queueing. Only ever 127.0.0.1; small max_tokens keep it quick.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gguflm.api import LLM
from gguflm.cli import main
from gguflm.server import APIServer, make_server

openai = pytest.importorskip("openai", reason="the openai client is a test dependency")

HOST = "127.0.0.1"
PROMPT = "The capital of France is"
CHAT = [{"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def live_server(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``gguflm serve`` in its own process on a free port; yields its base URL."""
    log = tmp_path_factory.mktemp("serve") / "stderr.txt"
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gguflm.cli", "serve", str(smollm2_path), "--host", HOST,
             "--port", "0", "-c", "1024"], stdout=subprocess.DEVNULL, stderr=err)
    try:
        url = None
        deadline = time.monotonic() + 180
        while url is None and time.monotonic() < deadline and proc.poll() is None:
            m = re.search(r"listening on (http://127\.0\.0\.1:\d+)", log.read_text())
            url = m.group(1) if m else time.sleep(0.2)
        assert url, f"gguflm serve did not start: {log.read_text()}"
        yield url
        assert proc.poll() is None, "the server died"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="module")
def client(live_server: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=live_server + "/v1", api_key="unused", max_retries=0,
                         timeout=300)


@pytest.fixture(scope="module")
def llm(smollm2_path: Path) -> Iterator[LLM]:
    model = LLM(smollm2_path, n_ctx=1024)
    yield model
    model.close()


@pytest.fixture(scope="module")
def local_server(llm: LLM) -> Iterator[APIServer]:
    """An in-process server on the module's LLM (so tests can look at its state)."""
    server = make_server(llm, HOST, 0, max_queue=3)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _request(url: str, method: str, path: str, body: bytes | str | dict | None = None,
             headers: dict[str, str] | None = None) -> tuple[int, dict]:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=300)
    if isinstance(body, dict):
        body = json.dumps(body)
    conn.request(method, path, body=body, headers=headers or {})
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, json.loads(data) if data else {}


# --- the official client ------------------------------------------------------------------------

def test_openai_chat_completion(client: openai.OpenAI, llm: LLM) -> None:
    r = client.chat.completions.create(model="any", messages=CHAT, max_tokens=6, temperature=0)
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    text = r.choices[0].message.content
    assert text and r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens == len(llm.chat_prompt_ids(CHAT))
    assert text == llm.chat(CHAT, max_tokens=6, temperature=0)["choices"][0]["message"]["content"]

    stream = client.chat.completions.create(model="any", messages=CHAT, max_tokens=6,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    pieces = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert "".join(pieces) == text
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == \
        r.choices[0].finish_reason
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens


def test_openai_completion_and_models(client: openai.OpenAI) -> None:
    r = client.completions.create(model="any", prompt=PROMPT, max_tokens=6, temperature=0,
                                  top_p=0.9, seed=7)
    assert r.object == "text_completion" and r.choices[0].text
    assert r.usage.completion_tokens <= 6
    cut = client.completions.create(model="any", prompt=PROMPT, max_tokens=6, temperature=0,
                                    stop=["."])
    assert cut.choices[0].text == r.choices[0].text.split(".")[0]
    streamed = client.completions.create(model="any", prompt=PROMPT, max_tokens=6,
                                         temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == r.choices[0].text
    models = client.models.list()
    assert [m.id for m in models.data] == ["SmolLM2-135M-Instruct.Q4_1.gguf"]


def _metric(url: str, name: str) -> float:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    return float(re.search(rf"^{name} (\S+)$", text, re.M).group(1))


def test_lookup_field_gives_the_same_text(client: openai.OpenAI, live_server: str) -> None:
    msgs = [{"role": "user", "content": "Repeat exactly: the cat sat on the mat. The cat sat "
                                        "on the mat. The dog sat on the rug."}]
    plain = client.chat.completions.create(model="any", messages=msgs, max_tokens=30,
                                           temperature=0)
    kept = _metric(live_server, "gguflm_draft_tokens_accepted_total")
    fast = client.chat.completions.create(model="any", messages=msgs, max_tokens=30,
                                          temperature=0, extra_body={"lookup": 8})
    assert _metric(live_server, "gguflm_draft_tokens_accepted_total") >= kept + 10
    assert fast.choices[0].message.content == plain.choices[0].message.content


def test_openai_client_gets_400_for_a_prompt_over_the_context(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="any", prompt="hello " * 1100, max_tokens=1)
    assert info.value.status_code == 400
    assert info.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError, match="top_p must be between 0 and 1"):
        client.chat.completions.create(model="any", messages=CHAT, top_p=7.0)


def test_same_text_from_server_api_and_run(
        live_server: str, llm: LLM, smollm2_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The bar: at temperature 0 the server, the Python API and `gguflm run` agree."""
    prompt, n = "Once upon a time, in a small village,", 12
    status, served = _request(live_server, "POST", "/v1/completions",
                              {"prompt": prompt, "max_tokens": n, "temperature": 0})
    assert status == 200
    api = llm.generate(prompt, max_tokens=n, temperature=0)
    assert main(["run", str(smollm2_path), "-p", prompt, "-n", str(n), "--temp", "0",
                 "--json"]) == 0
    run = json.loads(capsys.readouterr().out)
    assert served["choices"][0]["text"] == api["choices"][0]["text"] == run["text"]
    assert run["text"].strip()


# --- bad requests ---------------------------------------------------------------------------------

@pytest.mark.parametrize("method,path,body,status,match", [
    ("POST", "/v1/completions", "{not json", 400, "not valid JSON"),
    ("POST", "/v1/completions", b"\xff\xfe", 400, "not valid JSON"),
    ("POST", "/v1/completions", "[1, 2]", 400, "must be a JSON object"),
    ("POST", "/v1/completions", {"max_tokens": 3}, 400, "'prompt' is required"),
    ("POST", "/v1/completions", {"prompt": 5}, 400, "'prompt' must be"),
    ("POST", "/v1/completions", {"prompt": ["a", "b"]}, 400, "one prompt"),
    ("POST", "/v1/completions", {"prompt": "x", "max_tokens": "8"}, 400, "'max_tokens'"),
    ("POST", "/v1/completions", {"prompt": "x", "max_tokens": True}, 400, "'max_tokens'"),
    ("POST", "/v1/completions", {"prompt": "x", "temperature": "hot"}, 400, "'temperature'"),
    ("POST", "/v1/completions", {"prompt": "x", "stream": "yes"}, 400, "'stream'"),
    ("POST", "/v1/completions", {"prompt": "x", "stop": [1]}, 400, "'stop'"),
    ("POST", "/v1/completions", {"prompt": "x", "seed": 1.5}, 400, "'seed'"),
    ("POST", "/v1/completions", {"prompt": "x", "n": 2}, 400, "n = 1"),
    ("POST", "/v1/completions", {"prompt": "x", "top_p": 3}, 400, "top_p"),
    ("POST", "/v1/completions", {"prompt": [1, 99999999]}, 400, "outside the vocabulary"),
    ("POST", "/v1/completions", {"prompt": "x", "lookup": 65}, 400, "lookup must be"),
    ("POST", "/v1/completions", {"prompt": "x", "lookup": "8"}, 400, "'lookup'"),
    ("POST", "/v1/chat/completions", {"messages": "hi"}, 400, "'messages'"),
    ("POST", "/v1/chat/completions", {"messages": []}, 400, "'messages'"),
    ("POST", "/v1/chat/completions", {"messages": [{"content": "x"}]}, 400, "role"),
    ("POST", "/v1/chat/completions", {"messages": CHAT, "max_completion_tokens": -5}, 400,
     "max_tokens"),
    ("GET", "/v1/nothing", None, 404, "no such endpoint"),
    ("GET", "/v1/completions", None, 405, "not allowed"),
    ("DELETE", "/v1/models", None, 405, "not allowed"),
])
def test_bad_requests_get_openai_errors(live_server: str, method: str, path: str,
                                        body: object, status: int, match: str) -> None:
    got, payload = _request(live_server, method, path, body,
                            {"Content-Type": "application/json"})
    assert got == status
    err = payload["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert re.search(match, err["message"]), err["message"]


def test_oversized_and_garbage_requests_do_not_hurt(live_server: str) -> None:
    got, payload = _request(live_server, "POST", "/v1/completions", "{}",
                            {"Content-Length": str(1 << 30)})
    assert got == 413 and "over" in payload["error"]["message"]
    host, port = live_server.removeprefix("http://").split(":")
    for junk in (b"GARBAGE\r\n\r\n", b"POST /v1/completions HTTP/1.1\r\nContent-Length: 50"
                 b"\r\n\r\n{\"prompt\": ", b"\x00\x01\x02" * 100):
        with socket.create_connection((host, int(port)), timeout=30) as s:
            s.sendall(junk)
            s.shutdown(socket.SHUT_WR)
            s.recv(4096)
    status, health = _request(live_server, "GET", "/health")
    assert status == 200 and health["status"] == "ok" and health["slots_processing"] == 0


# --- disconnects and queueing (in-process server: its state is visible) ----------------------

def _open_stream(server: APIServer, body: dict) -> socket.socket:
    host, port = server.server_address[:2]
    s = socket.create_connection((host, port), timeout=300)
    data = json.dumps(body).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: "
              b"application/json\r\nContent-Length: " + str(len(data)).encode()
              + b"\r\n\r\n" + data)
    return s


def _wait_idle(server: APIServer, timeout: float = 300) -> None:
    """Until no request runs or waits (their generations ended)."""
    engine = server.engine
    deadline = time.monotonic() + timeout
    while (engine.n_running or engine.n_waiting) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not engine.n_running and not engine.n_waiting, "the server is still busy"


def test_client_disconnect_stops_its_generation(local_server: APIServer, llm: LLM) -> None:
    stats = local_server.engine.stats
    cancelled, generated = stats.finished.get("cancelled", 0), stats.generated_tokens
    s = _open_stream(local_server, {"prompt": PROMPT, "max_tokens": 400, "temperature": 0,
                                    "stream": True})
    got = b""
    while got.count(b"data: ") < 2:
        got += s.recv(4096)
    assert got.startswith(b"HTTP/1.1 200") and b"text/event-stream" in got
    s.close()
    _wait_idle(local_server)
    assert stats.finished.get("cancelled", 0) == cancelled + 1
    assert stats.generated_tokens - generated < 50  # it stopped soon, far short of 400
    status, _ = _request(local_server.url, "GET", "/health")
    assert status == 200


def test_concurrent_requests_are_queued(local_server: APIServer, llm: LLM) -> None:
    body = {"prompt": PROMPT, "max_tokens": 4, "temperature": 0}
    expected = llm.generate(PROMPT, max_tokens=4, temperature=0)["choices"][0]["text"]
    texts: list[str] = []

    def one(stream: bool) -> None:
        if not stream:
            status, out = _request(local_server.url, "POST", "/v1/completions", body)
            texts.append(out["choices"][0]["text"] if status == 200 else f"HTTP {status}")
            return
        host, port = local_server.server_address[:2]
        conn = http.client.HTTPConnection(host, port, timeout=300)
        conn.request("POST", "/v1/completions", json.dumps(body | {"stream": True}),
                     {"Content-Type": "application/json"})
        data = conn.getresponse().read()  # the whole event stream, de-chunked
        conn.close()
        events = [json.loads(line[6:]) for line in data.decode().split("\n")
                  if line.startswith("data: {")]
        ok = data.rstrip().endswith(b"data: [DONE]")
        texts.append("".join(e["choices"][0]["text"] for e in events) if ok else "no [DONE]")

    threads = [threading.Thread(target=one, args=(i % 2 == 0,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert texts == [expected] * 3


def test_a_full_queue_answers_503(local_server: APIServer, llm: LLM) -> None:
    n = local_server.engine.max_queue
    results: list[int] = [0] * n

    def one(i: int) -> None:
        status, out = _request(local_server.url, "POST", "/v1/completions",
                               {"prompt": f"{i} + {i} =", "max_tokens": 1})
        results[i] = status

    threads = []
    engine = local_server.engine
    release = threading.Event()
    holder = threading.Thread(target=engine.call, args=(release.wait,))
    holder.start()  # the engine thread is busy: every request queues
    try:
        for i in range(n):
            threads.append(threading.Thread(target=one, args=(i,)))
            threads[-1].start()
            deadline = time.monotonic() + 60  # each in line before the next is sent
            while engine.n_waiting < i + 1 and time.monotonic() < deadline:
                time.sleep(0.01)
        assert engine.n_waiting == n
        status, payload = _request(local_server.url, "POST", "/v1/completions",
                                   {"prompt": PROMPT, "max_tokens": 1})
        assert status == 503 and payload["error"]["type"] == "server_error"
    finally:
        release.set()
        holder.join()
    for t in threads:
        t.join(timeout=300)
    assert results == [200] * n
    _wait_idle(local_server)
    status, out = _request(local_server.url, "POST", "/v1/completions",
                           {"prompt": PROMPT, "max_tokens": 1})
    assert status == 200 and out["usage"]["completion_tokens"] == 1


# --- continuous batching through HTTP -------------------------------------------------------

def test_replies_do_not_depend_on_concurrent_clients(client: openai.OpenAI,
                                                     live_server: str) -> None:
    """Greedy and seeded replies are the same alone and with 8 clients at once (the server
    computes 4 together and queues the rest), and /slots and /metrics show the work."""
    from concurrent.futures import ThreadPoolExecutor

    prompts = [f"Tell me about the number {i}." for i in range(4)]
    asks = [dict(prompt=p, temperature=0.0) for p in prompts]
    asks += [dict(prompt=p, temperature=0.8, seed=7 + i) for i, p in enumerate(prompts)]

    def ask(kw: dict) -> str:
        r = client.completions.create(model="any", max_tokens=12, **kw)
        return r.choices[0].text

    alone = [ask(kw) for kw in asks]
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(ask, asks))
    assert together == alone
    status, slots = _request(live_server, "GET", "/slots")
    assert status == 200 and len(slots) == 4 and {"id", "state", "n_cached"} <= set(slots[0])
    host, port = live_server.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request("GET", "/metrics")
    metrics = conn.getresponse().read().decode()
    conn.close()
    count = re.search(r"^gguflm_requests_total (\d+)$", metrics, re.M)
    assert count and int(count.group(1)) >= 16
    assert 'gguflm_time_to_first_token_seconds_bucket{le="+Inf"}' in metrics
