"""An OpenAI-compatible HTTP server over one ``LLM``, on the standard library alone.

Endpoints: ``GET /health``, ``GET /v1/models``, ``POST /v1/completions`` and
``POST /v1/chat/completions`` (JSON, or Server-Sent Events with ``"stream": true``); the same
paths without ``/v1`` work too. ``GET /`` is the chat page (``gguflm.webui``; off with
``webui=False``). Origins and the optional API key are checked as ``gguflm.access`` says
(403 / 401 with an OpenAI error object). Each request runs in its own thread and waits for the one
model (the ``LLM``'s lock), so concurrent requests are served one after another. Bad
requests get a 4xx answer with an OpenAI error object (``{"error": {"message", "type",
"param", "code"}}``); nothing a client sends or does (including hanging up mid-stream, which
ends its generation at the next token) stops the server.
"""

from __future__ import annotations

import json
import select
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from . import webui
from .access import AccessPolicy
from .api import LLM, InvalidRequestError

__all__ = ["APIServer", "make_server"]

MAX_BODY = 16 * 2**20  # bytes; larger requests get 413
DEFAULT_MAX_QUEUE = 256  # requests running or waiting for the model; more get 503
SOCKET_TIMEOUT = 120.0  # seconds a client may stall reading or writing

# Field checks: name -> (allowed Python types, description for the error). None is always
# allowed (it means "default"); bool is never a number here even though it is an int.
_NUM = (int, float)
_COMMON_FIELDS: dict[str, tuple[tuple[type, ...], str]] = {
    "model": ((str,), "a string"),
    "max_tokens": ((int,), "an integer"),
    "temperature": (_NUM, "a number"),
    "top_p": (_NUM, "a number"),
    "top_k": ((int,), "an integer"),
    "min_p": (_NUM, "a number"),
    "typical_p": (_NUM, "a number"),
    "repeat_penalty": (_NUM, "a number"),
    "presence_penalty": (_NUM, "a number"),
    "frequency_penalty": (_NUM, "a number"),
    "seed": ((int,), "an integer"),
    "stop": ((str, list), "a string or a list of strings"),
    "stream": ((bool,), "a boolean"),
    "stream_options": ((dict,), "an object"),
    "n": ((int,), "an integer"),
    "user": ((str,), "a string"),
}
_COMPLETION_FIELDS = _COMMON_FIELDS | {
    "prompt": ((str, list), "a string or a list of token ids"),
    "echo": ((bool,), "a boolean"),
    "suffix": ((str,), "a string"),
}
_CHAT_FIELDS = _COMMON_FIELDS | {
    "messages": ((list,), "a list of messages"),
    "max_completion_tokens": ((int,), "an integer"),
    "tools": ((list,), "a list of tools"),
}
# path -> _Handler method; a known path asked with another method gets 405, not 404
_GET_ROUTES = {"/health": "_health", "/v1/models": "_models", "/models": "_models"}
_POST_ROUTES = {"/v1/completions": "_completions", "/completions": "_completions",
                "/v1/chat/completions": "_chat", "/chat/completions": "_chat"}
_SAMPLING = ("temperature", "top_p", "top_k", "min_p", "typical_p", "repeat_penalty",
             "presence_penalty", "frequency_penalty")


class RequestError(Exception):
    """An HTTP error answer: status, message, and OpenAI's ``type``/``param``/``code``."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None, type: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.param, self.code, self.type = status, param, code, type

    def body(self) -> dict[str, Any]:
        return {"error": {"message": str(self), "type": self.type, "param": self.param,
                          "code": self.code}}


def _check_fields(body: dict[str, Any], spec: dict[str, tuple[tuple[type, ...], str]]) -> None:
    for name, (types, what) in spec.items():
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) and bool not in types or not isinstance(value, types):
            raise RequestError(400, f"'{name}' must be {what}, got {json.dumps(value)[:40]}",
                               param=name)
    stop = body.get("stop")
    if isinstance(stop, list) and not all(isinstance(s, str) for s in stop):
        raise RequestError(400, "'stop' must be a string or a list of strings", param="stop")
    if body.get("n") not in (None, 1):
        raise RequestError(400, "only n = 1 is supported", param="n")
    if body.get("logprobs") not in (None, False, 0):
        raise RequestError(400, "logprobs are not supported", param="logprobs")
    if body.get("suffix"):
        raise RequestError(400, "suffix (insertion) is not supported", param="suffix")


def _options(body: dict[str, Any], max_tokens: Any) -> dict[str, Any]:
    """LLM keyword arguments from a checked request body."""
    opts: dict[str, Any] = {k: body[k] for k in _SAMPLING if body.get(k) is not None}
    opts.update(max_tokens=max_tokens, stop=body.get("stop"), seed=body.get("seed"))
    return opts


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "gguflm"
    timeout = SOCKET_TIMEOUT
    server: APIServer
    _cors: list[tuple[str, str]] = []  # CORS headers for the request being answered

    # --- plumbing ----------------------------------------------------------------------------

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        if self.server.verbose:
            sys.stderr.write(f"{self.address_string()} - {format % args}\n")

    def _send_json(self, status: int, obj: dict[str, Any]) -> None:
        data = json.dumps(obj, ensure_ascii=False).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if status == HTTPStatus.SERVICE_UNAVAILABLE:
            self.send_header("Retry-After", "1")
        if status == HTTPStatus.UNAUTHORIZED:
            self.send_header("WWW-Authenticate", "Bearer")
        self.end_headers()
        self.wfile.write(data)

    def end_headers(self) -> None:
        for name, value in self._cors:
            self.send_header(name, value)
        super().end_headers()

    def _send_error(self, e: RequestError) -> None:
        self.server.count("errors")
        self._send_json(e.status, e.body())

    def _read_json(self) -> dict[str, Any]:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            self.close_connection = True
            raise RequestError(411, "send the body with a Content-Length")
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            self.close_connection = True
            raise RequestError(400, "invalid Content-Length") from None
        if length > MAX_BODY:
            self.close_connection = True  # the body is left unread
            raise RequestError(413, f"the request body is over {MAX_BODY} bytes")
        raw = self.rfile.read(length) if length > 0 else b""
        if len(raw) < length:
            self.close_connection = True
            raise RequestError(400, "the request body ended early")
        try:
            body = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise RequestError(400, f"the request body is not valid JSON: {e}") from None
        if not isinstance(body, dict):
            raise RequestError(400, "the request body must be a JSON object")
        return body

    def _client_gone(self) -> bool:
        """True when the client has closed its end (readable, and reading would give EOF)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            if not readable:
                return False
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    # --- dispatch ----------------------------------------------------------------------------

    def do_GET(self) -> None:  # noqa: N802 - BaseHTTPRequestHandler's naming
        self._dispatch(_GET_ROUTES, "GET")

    def do_POST(self) -> None:  # noqa: N802
        self._dispatch(_POST_ROUTES, "POST")

    def do_OPTIONS(self) -> None:  # noqa: N802
        self._dispatch({}, "OPTIONS")

    def _other_method(self) -> None:
        self._dispatch({}, self.command)

    do_PUT = do_DELETE = do_PATCH = do_HEAD = _other_method  # noqa: N815

    def _dispatch(self, routes: dict[str, str], method: str) -> None:
        path = self.path.split("?", 1)[0].rstrip("/") or "/"
        access = self.server.access
        self._cors = access.cors_headers(self.headers)
        try:
            _check_origin(access, self.headers)
            page = webui.ROUTES.get(path) if self.server.webui else None
            known = page is not None or path in _GET_ROUTES or path in _POST_ROUTES
            if method == "OPTIONS" and known:  # a CORS preflight, or a client asking
                self._send_empty(204, access.preflight_headers(self.headers))
                return
            if page is not None and method == "GET":
                self._send_page(page)
                return
            handler = routes.get(path)
            if handler is None:
                if known:
                    self.close_connection = True  # a body may be left unread
                    raise RequestError(405, f"{method} is not allowed on {path}")
                if path in webui.ROUTES:
                    raise RequestError(404, "the web page is turned off (--no-webui)")
                raise RequestError(404, f"no such endpoint: {method} {path}")
            _check_key(access, path, self.headers)
            getattr(self, handler)()
        except RequestError as e:
            if e.status in (401, 403):
                self.close_connection = True  # the body is left unread
            self._send_error(e)
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            self.close_connection = True
        except Exception as e:  # noqa: BLE001 - one bad request must not take the server down
            self.close_connection = True
            self.server.log(f"internal error on {method} {path}: {type(e).__name__}: {e}")
            try:
                self._send_error(RequestError(500, f"internal error: {type(e).__name__}: {e}",
                                              type="server_error"))
            except OSError:
                pass

    # --- the chat page ----------------------------------------------------------------------

    def _send_page(self, name: str) -> None:
        data = webui.asset(name)
        self.send_response(200)
        self.send_header("Content-Type", webui.CONTENT_TYPES[name])
        self.send_header("Content-Length", str(len(data)))
        for header, value in webui.HEADERS:
            self.send_header(header, value)
        self.end_headers()
        self.wfile.write(data)

    def _send_empty(self, status: int, headers: list[tuple[str, str]]) -> None:
        self.send_response(status)
        for header, value in headers:
            self.send_header(header, value)
        self.send_header("Content-Length", "0")
        self.end_headers()

    # --- endpoints ---------------------------------------------------------------------------

    def _health(self) -> None:
        self._send_json(200, {"status": "ok"})

    def _models(self) -> None:
        llm = self.server.llm
        self._send_json(200, {"object": "list", "data": [{
            "id": llm.model_id, "object": "model", "created": self.server.started,
            "owned_by": "gguflm", "meta": {"n_ctx": llm.n_ctx,
                                           "n_vocab": llm.tokenizer.n_vocab}}]})

    def _completions(self) -> None:
        body = self._read_json()
        _check_fields(body, _COMPLETION_FIELDS)
        prompt = body.get("prompt")
        if prompt is None:
            raise RequestError(400, "'prompt' is required", param="prompt")
        if isinstance(prompt, list):
            if len(prompt) == 1 and isinstance(prompt[0], str):
                prompt = prompt[0]
            elif prompt and all(isinstance(p, str) for p in prompt):
                raise RequestError(400, "only one prompt per request is supported",
                                   param="prompt")
            elif not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
                raise RequestError(400, "'prompt' must be a string or a list of token ids",
                                   param="prompt")
        # OpenAI's default for completions is 16 tokens (chat: until the turn ends)
        opts = _options(body, 16 if body.get("max_tokens") is None else body["max_tokens"])
        llm = self.server.llm
        stream = bool(body.get("stream"))
        with self.server.slot():
            if stream:
                chunks = self._call(lambda: llm.stream(
                    prompt, echo=bool(body.get("echo")), cancel=self._client_gone,
                    include_usage=_include_usage(body), **opts))
                self._stream(chunks)
            else:
                self._send_json(200, self._call(lambda: llm.generate(
                    prompt, echo=bool(body.get("echo")), cancel=self._client_gone, **opts)))

    def _chat(self) -> None:
        body = self._read_json()
        _check_fields(body, _CHAT_FIELDS)
        messages = body.get("messages")
        if not messages:
            raise RequestError(400, "'messages' must be a non-empty list", param="messages")
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        opts = _options(body, max_tokens)
        llm = self.server.llm
        stream = bool(body.get("stream"))
        with self.server.slot():
            result = self._call(lambda: llm.chat(
                messages, stream=stream, tools=body.get("tools"), cancel=self._client_gone,
                include_usage=_include_usage(body), **opts))
            if stream:
                self._stream(result)
            else:
                self._send_json(200, result)

    def _call(self, fn: Callable[[], Any]) -> Any:
        """Run an LLM call, turning its argument errors into 400s."""
        try:
            return fn()
        except InvalidRequestError as e:
            raise RequestError(400, str(e), param=e.param, code=e.code) from None

    def _stream(self, chunks: Iterator[dict[str, Any]]) -> None:
        """Send chunks as Server-Sent Events, then ``data: [DONE]``. A client that hangs up
        ends the generation (closing the iterator releases the model)."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")  # the stream ends when the connection does
        self.end_headers()
        self.close_connection = True
        try:
            try:
                for chunk in chunks:
                    self.wfile.write(b"data: " + json.dumps(chunk, ensure_ascii=False)
                                     .encode("utf-8") + b"\n\n")
                    self.wfile.flush()
            except (OSError, TimeoutError):
                self.server.count("disconnects")
                return
            except InvalidRequestError as e:  # found only while running: report in-stream
                err = RequestError(400, str(e), param=e.param, code=e.code)
                self.wfile.write(b"data: " + json.dumps(err.body()).encode() + b"\n\n")
            except Exception as e:  # noqa: BLE001 - headers are sent: report in-stream
                self.server.log(f"internal error while streaming: {type(e).__name__}: {e}")
                err = RequestError(500, f"internal error: {type(e).__name__}: {e}",
                                   type="server_error")
                self.wfile.write(b"data: " + json.dumps(err.body()).encode() + b"\n\n")
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
        except OSError:
            self.server.count("disconnects")
        finally:
            close = getattr(chunks, "close", None)
            if close:
                close()


def _check_origin(access: AccessPolicy, headers: Any) -> None:
    """403 for a browser request from an origin that is not allowed."""
    body = access.origin_error(headers)
    if body is not None:
        raise RequestError(403, body["error"]["message"], code=body["error"]["code"])


def _check_key(access: AccessPolicy, path: str, headers: Any) -> None:
    """401 for an API request without the right key (when the server has one)."""
    body = access.key_error(path, headers)
    if body is not None:
        raise RequestError(401, body["error"]["message"], code=body["error"]["code"])


def _include_usage(body: dict[str, Any]) -> bool:
    opts = body.get("stream_options") or {}
    return bool(opts.get("include_usage"))


class APIServer(ThreadingHTTPServer):
    """The HTTP server: one thread per connection, one shared ``LLM``."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128  # the listen backlog: a burst of clients connecting at once

    def __init__(self, llm: LLM, host: str = "127.0.0.1", port: int = 8080, *,
                 max_queue: int = DEFAULT_MAX_QUEUE, verbose: bool = False,
                 webui: bool = True, cors: Iterable[str] = (),
                 api_key: str | None = None) -> None:
        self.llm = llm
        self.webui = webui  # serve the chat page at GET /
        self.access = AccessPolicy(cors, api_key)  # ValueError for a bad origin or key
        self.verbose = verbose
        self.max_queue = max_queue
        self.started = int(time.time())
        self.stats = {"requests": 0, "errors": 0, "disconnects": 0, "busy_rejections": 0}
        self._active = 0
        self._stats_lock = threading.Lock()
        super().__init__((host, port), _Handler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    def count(self, what: str) -> None:
        with self._stats_lock:
            self.stats[what] += 1

    def slot(self) -> _Slot:
        """A place in the queue for the model (503 when ``max_queue`` are already there)."""
        return _Slot(self)

    def log(self, message: str) -> None:
        sys.stderr.write(f"gguflm serve: {message}\n")
        sys.stderr.flush()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # the default prints a traceback; a dropped connection is not worth one
        exc = sys.exc_info()[1]
        if not isinstance(exc, OSError | TimeoutError):
            self.log(f"error with client {client_address}: {type(exc).__name__}: {exc}")


class _Slot:
    def __init__(self, server: APIServer) -> None:
        self.server = server

    def __enter__(self) -> None:
        s = self.server
        with s._stats_lock:
            if s._active >= s.max_queue:
                s.stats["busy_rejections"] += 1
                raise RequestError(503, f"the server is busy ({s._active} requests queued)",
                                   type="server_error")
            s._active += 1
            s.stats["requests"] += 1

    def __exit__(self, *exc: object) -> None:
        with self.server._stats_lock:
            self.server._active -= 1


def make_server(llm: LLM, host: str = "127.0.0.1", port: int = 8080, **kwargs: Any) -> APIServer:
    """A bound (not yet serving) server; call ``serve_forever()`` (port 0: any free port,
    see ``server_address``)."""
    return APIServer(llm, host, port, **kwargs)
