"""``gguflm serve`` with several models: SmolLM2, Gemma 3 270M and all-MiniLM behind one
server on 127.0.0.1 whose memory budget holds two of them. The request's ``model`` picks;
replies equal what each model alone gives (the Python API on the same file, which
tests/api_server/test_server.py checks against a single-model server); models are loaded on first
use, evicted least recently used first when the budget says so (never while a request
uses them), unloaded after their time to live; the listings say what is loaded.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gguflm.api import LLM
from gguflm.cli.serve_models import _dir_models, parse_size
from gguflm.model_pool import ModelPool, ModelSpec, estimate_bytes
from gguflm.server import make_server

openai = pytest.importorskip("openai", reason="the openai client is a test dependency")

HOST = "127.0.0.1"
CHAT = [{"role": "user", "content": "Name three colours."}]
N_CTX = {"smollm": 512, "gemma": 768, "minilm": 512}
PARALLEL = 2


def _request(url: str, path: str, body: dict[str, Any] | None = None,
             timeout: float = 300) -> tuple[int, Any]:
    """(status, JSON answer) of a GET (no body) or POST to the server."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _loaded(url: str) -> list[str]:
    """The names /api/ps lists, without ``:latest``, most recently used first."""
    return [m["name"].removesuffix(":latest") for m in _request(url, "/api/ps")[1]["models"]]


def _status(url: str) -> dict[str, str]:
    return {m["id"]: m["status"]["value"] for m in _request(url, "/v1/models")[1]["data"]}


@pytest.fixture(scope="module")
def paths(smollm2_path: Path, gemma3_path: Path, minilm_path: Path) -> dict[str, Path]:
    return {"smollm": smollm2_path, "gemma": gemma3_path, "minilm": minilm_path}


@pytest.fixture(scope="module")
def sizes(paths: dict[str, Path]) -> dict[str, int]:
    return {name: estimate_bytes(ModelSpec(name, path, {"n_ctx": N_CTX[name],
                                                        "parallel": PARALLEL}))
            for name, path in paths.items()}


@pytest.fixture(scope="module")
def budget(sizes: dict[str, int]) -> int:
    """Room for any two of the three, never for all three."""
    pair = sum(sorted(sizes.values())[1:])
    assert pair < sum(sizes.values())
    return pair + min(sizes.values()) // 2


@pytest.fixture(scope="module")
def server(paths: dict[str, Path], budget: int, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[str]:
    """``gguflm serve --models-config`` in its own process; yields its base URL."""
    d = tmp_path_factory.mktemp("multi")
    config = d / "models.toml"
    config.write_text(
        f'[models.smollm]\nmodel = "{paths["smollm"]}"\naliases = ["small"]\n'
        f'[models.gemma]\nmodel = "{paths["gemma"]}"\nn_ctx = {N_CTX["gemma"]}\n'
        f'[models.minilm]\nmodel = "{paths["minilm"]}"\n')
    log = d / "stderr.txt"
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gguflm.cli", "serve", "--models-config", str(config),
             "-c", str(N_CTX["smollm"]), "-np", str(PARALLEL), "--host", HOST, "--port", "0",
             "--mem-budget", str(budget), "--ttl", "600"],
            stdout=subprocess.DEVNULL, stderr=err)
    try:
        url = None
        deadline = time.monotonic() + 120
        while url is None and time.monotonic() < deadline and proc.poll() is None:
            m = re.search(r"listening on (http://127\.0\.0\.1:\d+)", log.read_text())
            url = m.group(1) if m else time.sleep(0.2)
        assert url, f"gguflm serve did not start: {log.read_text()}"
        yield url
        assert proc.poll() is None, f"the server died: {log.read_text()}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="module")
def expected(paths: dict[str, Path]) -> dict[str, Any]:
    """What each model gives alone: the chat reply at temperature 0, the embedding."""
    out: dict[str, Any] = {}
    for name in ("smollm", "gemma"):
        with LLM(paths[name], n_ctx=N_CTX[name], parallel=PARALLEL) as llm:
            reply = llm.chat(CHAT, max_tokens=24, temperature=0)
            out[name] = reply["choices"][0]["message"]["content"]
    with LLM(paths["minilm"]) as llm:
        out["minilm"] = llm.embed("a sentence to embed")
    return out


def _ask(client: Any, name: str, model: str | None = None) -> Any:
    if name == "minilm":
        return client.embeddings.create(model=model or name,
                                        input="a sentence to embed").data[0].embedding
    reply = client.chat.completions.create(model=model or name, messages=CHAT,
                                           max_tokens=24, temperature=0)
    return reply.choices[0].message.content


def test_listing_before_anything_is_loaded(server: str, sizes: dict[str, int]) -> None:
    status, body = _request(server, "/v1/models")
    assert status == 200
    assert [m["id"] for m in body["data"]] == ["smollm", "gemma", "minilm"]
    assert {m["id"]: m["memory_bytes"] for m in body["data"]} == sizes
    assert body["data"][0]["aliases"] == ["small"]
    assert _status(server) == dict.fromkeys(sizes, "unloaded")
    assert _loaded(server) == []
    tags = _request(server, "/api/tags")[1]["models"]
    assert [t["name"] for t in tags] == ["smollm:latest", "gemma:latest", "minilm:latest"]
    assert tags[1]["details"]["family"] == "gemma3"


def test_alternating_models_give_what_each_gives_alone(server: str,
                                                       expected: dict[str, Any]) -> None:
    client = openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0,
                           timeout=300)
    order = ["smollm", "gemma", "minilm"] * 2 + ["gemma", "smollm"]
    for name in order:
        got = _ask(client, name)
        if name == "minilm":
            assert got == pytest.approx(expected[name], abs=1e-6)
        else:
            assert got == expected[name], name
        loaded = _loaded(server)
        assert loaded[0] == name and len(loaded) <= 2, (name, loaded)
    assert _ask(client, "smollm", model="small") == expected["smollm"]  # an alias
    assert _ask(client, "smollm", model="smollm:latest") == expected["smollm"]


def test_least_recently_used_idle_model_is_evicted_and_reloaded(server: str) -> None:
    for name in ("smollm", "gemma"):
        assert _request(server, "/models/load", {"model": name}) == (200, {"success": True})
    assert sorted(_loaded(server)) == ["gemma", "smollm"]
    # a third model: the least recently used (smollm) makes room
    assert _request(server, "/v1/embeddings", {"model": "minilm", "input": "x"})[0] == 200
    assert _loaded(server) == ["minilm", "gemma"]
    assert _status(server) == {"smollm": "unloaded", "gemma": "loaded", "minilm": "loaded"}
    # and it is loaded again on demand, in place of gemma, now the least recently used
    status, _ = _request(server, "/v1/completions", {"model": "smollm", "prompt": "Hi",
                                                     "max_tokens": 2})
    assert status == 200
    assert _loaded(server) == ["smollm", "minilm"]
    # unloading by hand
    assert _request(server, "/models/unload", {"model": "minilm"}) == (200, {"success": True})
    assert _loaded(server) == ["smollm"]
    status, body = _request(server, "/models/unload", {"model": "minilm"})
    assert status == 400 and "not loaded" in body["error"]["message"]


def test_a_model_in_use_is_never_evicted(server: str, expected: dict[str, Any]) -> None:
    """Both loaded models are streaming when the third is asked for: it waits until one of
    them is idle, and the streams end whole."""
    client = openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0,
                           timeout=300)
    ended: dict[str, float] = {}
    texts: dict[str, str] = {}
    started = threading.Barrier(3)

    def stream(name: str) -> None:
        chunks = client.chat.completions.create(model=name, messages=CHAT, max_tokens=24,
                                                temperature=0, stream=True)
        parts = []
        for i, chunk in enumerate(chunks):
            if i == 1:
                started.wait(timeout=120)
            if chunk.choices and chunk.choices[0].delta.content:
                parts.append(chunk.choices[0].delta.content)
        ended[name] = time.monotonic()
        texts[name] = "".join(parts)

    for name in ("smollm", "gemma"):  # both loaded first: the streams start at once
        _request(server, "/models/load", {"model": name})
    threads = [threading.Thread(target=stream, args=(n,)) for n in ("smollm", "gemma")]
    for t in threads:
        t.start()
    started.wait(timeout=120)
    assert sorted(_loaded(server)) == ["gemma", "smollm"]
    vector = _ask(client, "minilm")
    answered = time.monotonic()
    for t in threads:
        t.join()
    assert texts == {"smollm": expected["smollm"], "gemma": expected["gemma"]}
    assert answered >= min(ended.values())  # it waited for a model to be idle
    assert vector == pytest.approx(expected["minilm"], abs=1e-6)


def test_unloading_a_busy_model_waits_for_its_requests(server: str,
                                                       expected: dict[str, Any]) -> None:
    client = openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0,
                           timeout=300)
    chunks = client.chat.completions.create(model="gemma", messages=CHAT, max_tokens=120,
                                            temperature=0, stream=True)
    parts = []
    for i, chunk in enumerate(chunks):
        if i == 1:  # generating: the unload is taken, the model stays until the end
            assert _request(server, "/models/unload", {"model": "gemma"}) == (
                200, {"success": True})
            assert "gemma" in _loaded(server)
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
    assert "".join(parts).startswith(expected["gemma"])
    deadline = time.monotonic() + 20
    while "gemma" in _loaded(server) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "gemma" not in _loaded(server)


def test_unknown_model_in_each_apis_error_shape(server: str) -> None:
    names = "gemma, minilm, small, smollm"
    status, body = _request(server, "/v1/chat/completions", {
        "model": "nope", "messages": CHAT})
    assert status == 404 and body["error"]["code"] == "model_not_found"
    assert body["error"]["param"] == "model" and names in body["error"]["message"]
    status, body = _request(server, "/api/chat", {"model": "nope", "messages": CHAT})
    assert status == 404 and "'nope'" in body["error"] and names in body["error"]
    status, body = _request(server, "/v1/messages", {
        "model": "nope", "max_tokens": 4, "messages": CHAT})
    assert status == 404 and body["error"]["type"] == "not_found_error"
    status, body = _request(server, "/models/load", {"model": "nope"})
    assert status == 404
    status, body = _request(server, "/api/chat", {"model": "smollm", "messages": CHAT,
                                                  "keep_alive": "soon"})
    assert status == 400 and "keep_alive" in body["error"]


def test_keep_alive_unloads_after_the_request(server: str) -> None:
    body = {"model": "minilm", "input": "x", "keep_alive": "2s"}
    assert _request(server, "/api/embed", body)[0] == 200
    assert "minilm" in _loaded(server)
    deadline = time.monotonic() + 20
    while "minilm" in _loaded(server) and time.monotonic() < deadline:
        time.sleep(0.25)
    assert "minilm" not in _loaded(server)
    # keep_alive 0 with nothing to run: Ollama's way to unload
    _request(server, "/api/generate", {"model": "smollm"})
    assert "smollm" in _loaded(server)
    status, body = _request(server, "/api/generate", {"model": "smollm", "keep_alive": 0})
    assert status == 200 and body["done_reason"] == "unload"
    deadline = time.monotonic() + 20
    while "smollm" in _loaded(server) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "smollm" not in _loaded(server)


# --- in-process pools: ttl, a model that cannot fit ------------------------------------------


def _serve(pool: ModelPool) -> Any:
    server = make_server(pool, HOST, 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_ttl_unloads_an_idle_model(minilm_path: Path) -> None:
    spec = ModelSpec("minilm", minilm_path)
    server = _serve(ModelPool([spec], lambda s: LLM(s.path), ttl=2.0))
    try:
        assert _request(server.url, "/v1/embeddings", {"input": "x"})[0] == 200  # default
        t0 = time.monotonic()
        assert _loaded(server.url) == ["minilm"]
        while _loaded(server.url) and time.monotonic() - t0 < 20:
            time.sleep(0.1)
        waited = time.monotonic() - t0
        assert _loaded(server.url) == [] and 1.0 < waited < 6.0, waited
    finally:
        server.shutdown()
        server.server_close()


def test_max_loaded_counts_models(minilm_path: Path) -> None:
    specs = [ModelSpec("one", minilm_path), ModelSpec("two", minilm_path, aliases=("2",))]
    server = _serve(ModelPool(specs, lambda s: LLM(s.path), max_loaded=1))
    try:
        for name, loaded in (("one", ["one"]), ("2", ["two"]), ("one", ["one"])):
            assert _request(server.url, "/api/embed", {"model": name, "input": "x"})[0] == 200
            assert _loaded(server.url) == loaded
    finally:
        server.shutdown()
        server.server_close()


def test_a_model_that_cannot_fit_is_refused_before_loading(minilm_path: Path) -> None:
    spec = ModelSpec("minilm", minilm_path)
    loads: list[str] = []
    need = estimate_bytes(spec)
    pool = ModelPool([spec], lambda s: loads.append(s.name), budget=need - 1)
    server = _serve(pool)
    try:
        status, body = _request(server.url, "/v1/embeddings", {"model": "minilm",
                                                               "input": "x"})
        assert status == 503 and body["error"]["code"] == "model_too_large"
        assert "memory budget" in body["error"]["message"]
        status, body = _request(server.url, "/api/embed", {"model": "minilm", "input": "x"})
        assert status == 503 and "memory budget" in body["error"]
        assert loads == [] and _loaded(server.url) == []
    finally:
        server.shutdown()
        server.server_close()


def test_models_dir_serves_first_shards_only(tmp_path: Path, minilm_path: Path) -> None:
    for name in ("b.gguf", "a-00001-of-00002.gguf", "a-00002-of-00002.gguf"):
        (tmp_path / name).symlink_to(minilm_path)
    (tmp_path / "notes.txt").write_text("not a model")
    assert [p.name for p in _dir_models(str(tmp_path))] == ["a-00001-of-00002.gguf",
                                                            "b.gguf"]


def test_sizes() -> None:
    assert parse_size("512M") == 512 * 2**20
    assert parse_size("1.5GiB") == int(1.5 * 2**30)
    assert parse_size("1000") == 1000
    with pytest.raises(Exception, match="--mem-budget"):
        parse_size("lots")
