"""The chat page's files as the server sends them, and who may use the server: origins
(403, CORS headers, preflights) and the API key (401 with an OpenAI error object, the
official client with and without it). In-process servers on 127.0.0.1 over one LLM.
"""

from __future__ import annotations

import http.client
import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gguflm import webui
from gguflm.access import AccessPolicy, check_origin
from gguflm.api import LLM
from gguflm.cli import main
from gguflm.server import APIServer, make_server

HOST = "127.0.0.1"
KEY = "s3cret-key"
CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "temperature": 0}


@pytest.fixture(scope="module")
def llm(smollm2_path: Path) -> Iterator[LLM]:
    model = LLM(smollm2_path, n_ctx=512)
    yield model
    model.close()


@pytest.fixture(scope="module")
def start(llm: LLM) -> Iterator:
    """start(**make_server kwargs) -> a running server; all are shut down at the end."""
    servers: list[APIServer] = []

    def run(**kwargs) -> APIServer:
        server = make_server(llm, HOST, 0, **kwargs)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server

    yield run
    for server in servers:
        server.shutdown()
        server.server_close()


def request(server: APIServer, method: str, path: str, body: dict | None = None,
            headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection(*server.server_address[:2], timeout=120)
    conn.request(method, path, body=None if body is None else json.dumps(body),
                 headers=headers or {})
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data


def error_of(data: bytes) -> dict:
    err = json.loads(data)["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return err


# --- the page ------------------------------------------------------------------------------

def test_page_files_are_served_with_their_headers(start) -> None:
    server = start()
    for path, name in webui.ROUTES.items():
        status, headers, data = request(server, "GET", path)
        assert status == 200, path
        assert data == webui.asset(name) and len(data) > 500
        assert headers["content-type"] == webui.CONTENT_TYPES[name]
        assert headers["content-security-policy"] == webui.CSP
        assert "script-src 'self'" in webui.CSP and "unsafe" not in webui.CSP
        assert headers["x-content-type-options"] == "nosniff"
    # the HTML asks for exactly the files the server has, all from its own origin
    html = webui.asset("index.html").decode()
    wanted = set(re.findall(r'(?:src|href)="([^"]+)"', html)) - {"data:,"}
    assert wanted == set(webui.ROUTES) - {"/"}
    with pytest.raises(KeyError):
        webui.asset("../server.py")


def test_page_uses_no_network_but_its_own_endpoints() -> None:
    """No CDN, no fonts or images from elsewhere; the script fetches only the standard
    endpoints of the server that sent it."""
    html = webui.asset("index.html").decode()
    css = webui.asset("style.css").decode()
    js = webui.asset("app.js").decode()
    assert not re.search(r'(?:src|href)="(?:https?:)?//', html)
    assert "url(" not in css and "@import" not in css
    assert not re.search(r"^\s*import\b|\bimport\(", js, re.M)  # one module, no imports
    calls = re.findall(r"\b(?:fetch|api)\(\s*([^,)]+)", js)
    assert calls and {c.strip() for c in calls} <= {
        "'/v1/models'", "'/v1/chat/completions'", "'/health'", "path"}
    assert sum(len(webui.asset(n)) for n in webui.CONTENT_TYPES) < 64 * 1024  # small


def test_no_webui_turns_the_page_off(start) -> None:
    server = start(webui=False)
    for path in webui.ROUTES:
        status, _, data = request(server, "GET", path)
        assert status == 404 and "--no-webui" in error_of(data)["message"]
    assert request(server, "GET", "/health")[0] == 200


# --- origins -------------------------------------------------------------------------------

def test_check_origin() -> None:
    assert check_origin("https://Example.com:8443/") == "https://example.com:8443"
    assert check_origin("*") == "*"
    for bad in ("example.com", "ftp://example.com", "http://x.org/path", "http://x.org?q",
                "http://user@x.org", "http://x.org:99999", ""):
        with pytest.raises(ValueError):
            check_origin(bad)
    with pytest.raises(ValueError):
        AccessPolicy(api_key="")


def test_other_origins_are_refused_unless_allowed(start, llm: LLM) -> None:
    server = start(cors=["http://allowed.example"])
    host = server.url.removeprefix("http://")
    own = {"Origin": f"http://{host}", "Host": host}

    # no Origin (curl, SDKs) and the server's own page: answered, no CORS headers
    for headers in ({}, own):
        status, got, _ = request(server, "GET", "/v1/models", headers=headers)
        assert status == 200 and "access-control-allow-origin" not in got

    # another site: 403 before anything runs, for the page and the API alike
    llm.last_run = None
    for method, path, body in (("GET", "/v1/models", None), ("GET", "/", None),
                               ("POST", "/v1/chat/completions", CHAT)):
        status, got, data = request(server, method, path, body,
                                    {"Origin": "http://evil.example"})
        assert status == 403 and "access-control-allow-origin" not in got
        err = error_of(data)
        assert err["code"] == "origin_not_allowed" and "--cors" in err["message"]
    assert llm.last_run is None  # the model never ran for it

    # an allowed origin: answered, with the headers that let its page read the answer
    allowed = {"Origin": "http://allowed.example"}
    status, got, data = request(server, "POST", "/v1/chat/completions", CHAT, allowed)
    assert status == 200 and json.loads(data)["object"] == "chat.completion"
    assert got["access-control-allow-origin"] == "http://allowed.example"
    assert got["vary"] == "Origin"

    # its preflight; another origin's preflight is refused
    pre = allowed | {"Access-Control-Request-Method": "POST",
                     "Access-Control-Request-Headers": "authorization, content-type"}
    status, got, data = request(server, "OPTIONS", "/v1/chat/completions", headers=pre)
    assert status == 204 and data == b""
    assert got["access-control-allow-origin"] == "http://allowed.example"
    assert "POST" in got["access-control-allow-methods"]
    assert got["access-control-allow-headers"] == "authorization, content-type"
    pre["Origin"] = "http://evil.example"
    assert request(server, "OPTIONS", "/v1/chat/completions", headers=pre)[0] == 403
    assert request(server, "OPTIONS", "/nowhere", headers=allowed)[0] == 404


def test_cors_star_allows_any_origin(start) -> None:
    server = start(cors=["*"])
    status, got, _ = request(server, "GET", "/v1/models", headers={"Origin": "http://a.b"})
    assert status == 200 and got["access-control-allow-origin"] == "*"


# --- the API key ---------------------------------------------------------------------------

def test_api_key_guards_the_api_not_the_page(start) -> None:
    server = start(api_key=KEY)
    for auth in (None, "Bearer wrong", f"Basic {KEY}", KEY):
        headers = {"Authorization": auth} if auth else {}
        for method, path, body in (("GET", "/v1/models", None), ("GET", "/models", None),
                                   ("POST", "/v1/chat/completions", CHAT),
                                   ("POST", "/v1/completions", {"prompt": "a"})):
            status, got, data = request(server, method, path, body, headers)
            assert status == 401, (auth, path)
            assert got["www-authenticate"] == "Bearer"
            err = error_of(data)
            assert err["code"] == "invalid_api_key" and err["type"] == "invalid_request_error"
            assert KEY not in err["message"]
    # the page and the health probe need no key; the right key opens the API
    assert request(server, "GET", "/")[0] == 200
    assert request(server, "GET", "/health")[0] == 200
    status, _, data = request(server, "POST", "/v1/chat/completions", CHAT,
                              {"Authorization": f"Bearer {KEY}"})
    assert status == 200 and json.loads(data)["choices"][0]["message"]["content"]


def test_openai_client_with_and_without_the_key(start) -> None:
    openai = pytest.importorskip("openai", reason="the openai client is a test dependency")
    server = start(api_key=KEY)
    url = server.url + "/v1"
    wrong = openai.OpenAI(base_url=url, api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        wrong.chat.completions.create(model="x", **CHAT)
    assert e.value.status_code == 401 and e.value.code == "invalid_api_key"
    right = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0)
    assert right.models.list().data[0].id
    r = right.chat.completions.create(model="x", **CHAT)
    assert r.choices[0].message.content


@pytest.mark.parametrize(("args", "message"), [
    (["--cors", "example.com"], "--cors: 'example.com' is not an origin"),
    (["--cors", "http://a.org,ftp://b.org"], "--cors: 'ftp://b.org' is not an origin"),
    (["--api-key", " "], "--api-key must not be empty"),
])
def test_serve_rejects_bad_access_options(args: list[str], message: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """Checked before the model loads: one error line."""
    assert main(["serve", "/nonexistent.gguf", *args]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {message}") and err.count("\n") == 1
