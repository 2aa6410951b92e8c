"""An OpenAI-compatible HTTP server over the serving engine: starlette on uvicorn (asyncio).

Endpoints: ``GET /health`` (with the slots' state), ``GET /slots``, ``GET /metrics``
(Prometheus text), ``GET /v1/models``, ``POST /v1/completions`` and
``POST /v1/chat/completions`` (JSON, or Server-Sent Events with ``"stream": true``); the same
paths without ``/v1`` work too. ``GET /`` is the chat page (``gguflm.webui``; off with
``webui=False``). Origins and the optional API key are checked as ``gguflm.access`` says
(403 / 401 with an OpenAI error object), before anything else. Requests go to the
``LLM``'s engine, which computes up to ``parallel`` of them together (continuous batching)
and queues the rest in arrival order.

One asyncio loop serves every connection: an idle connection costs a socket, not a thread,
and uvicorn's h11 parser frames requests strictly (odd ``Transfer-Encoding`` headers are
refused, not guessed at). The engine thread wakes a request's coroutine through
``loop.call_soon_threadsafe`` when it has new text. Bad requests get a 4xx answer with an
OpenAI error object (``{"error": {"message", "type", "param", "code"}}``); nothing a client
sends or does (hanging up mid-stream ends its generation at the next step) stops the server.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import socket
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from . import webui as webui_page
from .access import AccessPolicy
from .api import LLM, InvalidRequestError, QueueFullError
from .engine.errors import ConstraintFailure, NoTokenAllowed
from .http_protocol import hardened_protocol
from .model_pool import CURRENT, ModelPool, PoolError, PoolScope
from .replies import ChatShaper, CompletionShaper
from .server_metrics import ServerMetrics
from .wire.openai import parse_chat, parse_completion, parse_embeddings

__all__ = ["APIServer", "make_server"]

MAX_BODY = 16 * 2**20       # bytes; larger requests get 413
KEEP_ALIVE_SECONDS = 5      # an idle connection is closed after this (before its first
                            # request too, which uvicorn alone does not do)
MAX_CONNECTIONS = 1000      # open connections at most (fewer if the fd limit is lower)
ACCEPT_BURST = 64           # connections accepted per wake-up (the listen backlog too)
SHUTDOWN_SECONDS = 5        # answers in progress get this long to end after a stop signal



def _log_config() -> dict[str, Any]:
    """uvicorn's logging, with its access log (one line per request, serve -v) on stderr
    like the rest, not on stdout."""
    import copy

    import uvicorn.config

    config = copy.deepcopy(uvicorn.config.LOGGING_CONFIG)
    config["handlers"]["access"]["stream"] = "ext://sys.stderr"
    return config


class RequestError(Exception):
    """An HTTP error answer: status, message, and OpenAI's ``type``/``param``/``code``."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None, type: str = "invalid_request_error",
                 close: bool = False) -> None:
        super().__init__(message)
        self.status, self.param, self.code, self.type = status, param, code, type
        self.close = close or status in (411, 413)

    def body(self) -> dict[str, Any]:
        return {"error": {"message": str(self), "type": self.type, "param": self.param,
                          "code": self.code}}

    def response(self) -> JSONResponse:
        headers = {"Retry-After": "1"} if self.status == 503 else {}
        if self.close:  # the body may be left unread: never parse it as a request
            headers["Connection"] = "close"
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


async def read_json_body(request: Request) -> dict[str, Any]:
    """A request's JSON object body, read within MAX_BODY; a RequestError otherwise."""
    if "transfer-encoding" in request.headers and "content-length" in request.headers:
        # h11 frames by Transfer-Encoding, as RFC 9112 says; but a client sending both
        # is confused or hostile: answer and close (RFC 9112 6.3)
        raise RequestError(400, "both Transfer-Encoding and Content-Length were sent",
                           close=True)
    length = request.headers.get("content-length")
    if length is not None and (not length.isdigit() or int(length) > MAX_BODY):
        raise RequestError(413 if length.isdigit() else 400,
                           f"the request body is over {MAX_BODY} bytes"
                           if length.isdigit() else "invalid Content-Length")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY:
            raise RequestError(413, f"the request body is over {MAX_BODY} bytes")
        chunks.append(chunk)
    try:
        body = json.loads(b"".join(chunks).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:  # incl. over-long integer literals
        raise RequestError(400, f"the request body is not valid JSON: {e}",
                           close=True) from None
    except RecursionError:
        raise RequestError(400, "the request body is nested too deeply",
                           close=True) from None
    if not isinstance(body, dict):
        raise RequestError(400, "the request body must be a JSON object")
    return body


def sequence_error(seq: Any) -> RequestError:
    """The answer to a sequence that ended in an error: a constraint that broke down is the
    grammar's (or logit_bias's) doing, a 400 naming its field; anything else is ours: 500."""
    if isinstance(seq.error, NoTokenAllowed):
        return RequestError(400, str(seq.error), param=seq.error.param,
                            code="no_token_allowed")
    if isinstance(seq.error, ConstraintFailure):
        param = getattr(seq.request.constraint, "grammar", None)
        param = getattr(param, "param", None)
        return RequestError(400, f"the constraint ({param}) failed during generation: "
                            f"{str(seq.error)[:300]}", param=param, code="constraint_failed")
    return RequestError(500, f"generation failed: {type(seq.error).__name__}",
                        type="server_error")


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode("utf-8") + b"\n\n"


@dataclass(frozen=True)
class Wire:
    """How one API frames a stream and shapes an error: ``item`` encodes a streamed item,
    ``end`` closes the stream, ``error_body`` is the API's own error object for a
    RequestError (in a stream, encoded as an item)."""

    media_type: str
    item: Callable[[Any], bytes]
    error_body: Callable[[RequestError], Any]
    end: bytes = b""


# OpenAI's Server-Sent Events: ``data: {chunk}`` ... ``data: [DONE]``
OPENAI = Wire("text/event-stream", _sse, RequestError.body, b"data: [DONE]\n\n")


def _uvicorn_server(config: Any, on_exit: Callable[[], None]) -> Any:
    """uvicorn's server, whose stop signals (SIGINT or SIGTERM) also cancel the work in
    progress (``on_exit``); a second signal of either kind stops it at once (uvicorn forces
    only on a second SIGINT), and the process is gone 2 s later whatever still runs."""
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            if self.should_exit:
                self.force_exit = True
                timer = threading.Timer(2.0, os._exit, (128 + sig,))
                timer.daemon = True
                timer.start()
            super().handle_exit(sig, frame)
            on_exit()

    return Server(config)


class APIServer:
    """The HTTP server over one ``LLM``, or over a ``ModelPool`` of several (each request's
    ``model`` picks one: ``use_model``): bound at construction, served by ``serve_forever``
    (in any thread), stopped by ``shutdown`` from another."""

    def __init__(self, llm: LLM | ModelPool, host: str = "127.0.0.1", port: int = 8080, *,
                 max_queue: int | None = None, verbose: bool = False, webui: bool = True,
                 cors: Iterable[str] = (), api_key: str | None = None,
                 allowed_hosts: Iterable[str] = ()) -> None:
        import uvicorn

        # ValueError for a bad origin, key or host name
        self.access = AccessPolicy(cors, api_key, (host, *allowed_hosts))
        self.webui = webui  # serve the chat page at GET /
        self.pool = llm if isinstance(llm, ModelPool) else ModelPool.single_model(llm)
        if max_queue is not None and not isinstance(llm, ModelPool):
            llm.engine.max_queue = max_queue
        self.verbose = verbose
        self.started = int(time.time())
        self.counters = ServerMetrics()
        self.count = self.counters.count
        self.sock = socket.create_server((host, port), backlog=ACCEPT_BURST)
        self.server_address = self.sock.getsockname()[:2]
        # stay under the file-descriptor limit: past it accept() fails, asyncio stops
        # accepting for a second at a time, and new clients (/health too) wait. A burst of
        # accepts opens ACCEPT_BURST sockets before the oldest idle ones can be closed, and
        # the process needs some descriptors of its own.
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        limit = MAX_CONNECTIONS if soft == resource.RLIM_INFINITY else min(
            MAX_CONNECTIONS, max(16, soft - ACCEPT_BURST - 96))
        config = uvicorn.Config(
            self.app(), log_level="info" if verbose else "warning", access_log=verbose,
            timeout_keep_alive=KEEP_ALIVE_SECONDS, limit_concurrency=limit, lifespan="off",
            http=hardened_protocol(limit), ws="none", backlog=ACCEPT_BURST,
            log_config=_log_config(), timeout_graceful_shutdown=SHUTDOWN_SECONDS)
        self._uvicorn = _uvicorn_server(config, self.cancel_all)
        self._stopped = threading.Event()
        # what cancels each request in progress (see cancel_all)
        self._cancels: set[Callable[[], None]] = set()

    @property
    def url(self) -> str:
        host, port = self.server_address
        return f"http://{host}:{port}"

    def serve_forever(self) -> None:
        try:
            self._uvicorn.run(sockets=[self.sock])
        finally:
            self._stopped.set()

    def shutdown(self) -> None:
        """Stop serving: the work in progress is cancelled (streams end, waiting requests
        get their answers at once), then the server stops."""
        self._uvicorn.should_exit = True
        self.cancel_all()
        self._stopped.wait(30)

    def cancel_all(self) -> None:
        """Cancel every request in progress (on shutdown: nothing runs on for minutes)."""
        for cancel in list(self._cancels):
            cancel()

    def server_close(self) -> None:
        self.sock.close()
        self.pool.close()

    def log(self, message: str) -> None:
        sys.stderr.write(f"gguflm serve: {message}\n")
        sys.stderr.flush()

    # --- the application -----------------------------------------------------------------

    def app(self) -> Any:
        """The ASGI application: the access checks and the page around the API routes, each
        request holding the models it uses until its answer is sent (``PoolScope``)."""
        api = self.api_app()
        known = {r.path for r in api.routes} | set(webui_page.ROUTES)
        return _Access(PoolScope(api, self.pool), self, known)

    # --- the request's model -------------------------------------------------------------

    @property
    def llm(self) -> LLM:
        """The model of the request being answered (picked by ``use_model``); a
        single-model server's one model."""
        held = CURRENT.get()
        if held is not None and held.llm is not None:
            return held.llm
        if self.pool.single:
            return self.pool.default_llm
        raise RequestError(400, "this server serves several models: name one in 'model'",
                           param="model")

    @property
    def engine(self) -> Any:
        return self.llm.engine

    async def use_model(self, body: dict[str, Any], keep_alive: float | None = None) -> LLM:
        """The model ``body`` names (``model``), loaded if it is not, held until this
        request's answer is sent and then kept ``keep_alive`` seconds (None: its ttl) for
        the next; ``self.llm`` is it from here on. A single-model server's one model takes
        any name. RequestError: an unknown model (404, listing what is served), or one that
        does not fit (503)."""
        if self.pool.single:
            return self.llm
        name = body.get("model")
        if name is not None and not isinstance(name, str):
            raise RequestError(400, "'model' must be a string", param="model")
        held = CURRENT.get()
        assert held is not None, "requests run inside PoolScope"
        try:
            r = await asyncio.to_thread(held.take, self.pool, name)
        except PoolError as e:
            raise RequestError(e.status, str(e), param="model", code=e.code,
                               type="invalid_request_error" if e.status < 500
                               else "server_error") from None
        held.llm, held.keep_alive = r.llm, keep_alive
        return r.llm

    def api_app(self) -> Starlette:
        routes = [
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/completions", self.completions, methods=["POST"]),
            Route("/v1/chat/completions", self.chat, methods=["POST"]),
            Route("/chat/completions", self.chat, methods=["POST"]),
            Route("/v1/embeddings", self.embeddings, methods=["POST"]),
            Route("/embeddings", self.embeddings, methods=["POST"]),
        ]
        from .routes import anthropic, models, ollama, rerank, responses  # (they import this)

        for api in (models, anthropic, ollama, responses, rerank):
            routes += api.routes(self)
        return Starlette(routes=routes, exception_handlers={
            HTTPException: self._http_error, Exception: self._internal_error})

    async def _http_error(self, request: Request, exc: Exception) -> Response:
        self.count("errors")
        return _refusal(request, exc)

    async def _internal_error(self, request: Request, exc: Exception) -> Response:
        self.log(f"internal error on {request.method} {request.url.path}: "
                 f"{type(exc).__name__}: {exc}")
        return RequestError(500, f"internal error: {type(exc).__name__}", type="server_error"
                            ).response()

    # --- generation ----------------------------------------------------------------------

    async def completions(self, request: Request) -> Response:
        try:
            body = await read_json_body(request)
            call = self.call(lambda: parse_completion(body))
            await self.use_model(body)
            req, ptext = await asyncio.to_thread(self.call, lambda: self.llm.completion_request(
                call.prompt, call.spec, call.echo))
        except RequestError as e:
            return self.error(e)
        shaper = CompletionShaper(self.llm.model_id, ptext if call.echo else None,
                                  call.include_usage)
        return await self.answer(request, req, call.stream, shaper)

    async def chat(self, request: Request) -> Response:
        try:
            body = await read_json_body(request)
            call = self.call(lambda: parse_chat(body))
            await self.use_model(body)
            req, plan = await asyncio.to_thread(self.call, lambda: self.llm.chat_request(
                call.messages, call.spec))
        except RequestError as e:
            return self.error(e)
        shaper = ChatShaper(self.llm.model_id, plan, call.include_usage)
        return await self.answer(request, req, call.stream, shaper)

    async def answer(self, request: Request, req: Any, stream: bool, shaper: Any,
                     wire: Wire = OPENAI) -> Response:
        """Run ``req``: streamed as ``shaper`` shapes its items (``opening``, ``piece``,
        ``closing``) and ``wire`` frames them, or to its end and answered with
        ``shaper.whole``; an engine refusal as ``wire``'s error object."""
        if stream:
            try:
                running = self.submit(req)
            except RequestError as e:
                return self.error(e, wire)
            return self.stream(self._items(shaper, running), wire)
        try:
            seq = await self.complete(request, req)
        except RequestError as e:
            return self.error(e, wire)
        return JSONResponse(shaper.whole(seq, seq.text))

    async def _items(self, shaper: Any, running: tuple[Any, asyncio.Event]
                     ) -> AsyncIterator[Any]:
        for item in shaper.opening():
            yield item
        async for piece, seq in self._generate(*running):
            for item in shaper.piece(piece) if seq is None else shaper.closing(seq):
                yield item

    def error(self, e: RequestError, wire: Wire = OPENAI) -> Response:
        """``e`` answered in ``wire``'s error shape (counted)."""
        self.count("errors")
        if e.status == 503:
            self.count("busy_rejections")
        resp = e.response()
        return JSONResponse(wire.error_body(e), status_code=e.status,
                            headers={k: v for k, v in resp.headers.items()
                                     if k.lower() in ("retry-after", "connection")})

    @staticmethod
    def call(fn: Any) -> Any:
        """Run an LLM call (argument checks, chat template), its errors as 4xx."""
        try:
            return fn()
        except InvalidRequestError as e:
            raise RequestError(400, str(e), param=e.param, code=e.code) from None

    def submit(self, req: Any) -> tuple[Any, asyncio.Event]:
        """Queue ``req`` in the engine; its sequence and the event its new text sets."""
        loop = asyncio.get_running_loop()
        wake = asyncio.Event()

        def notify() -> None:
            try:
                loop.call_soon_threadsafe(wake.set)
            except RuntimeError:  # the loop has closed (server shutting down)
                pass
        try:
            seq = self.engine.submit(req, notify)
        except QueueFullError as e:
            raise RequestError(503, str(e), type="server_error") from None
        except ValueError as e:
            raise RequestError(400, str(e), param="prompt",
                               code="context_length_exceeded") from None
        self.count("requests")
        self._cancels.add(seq.cancel)
        return seq, wake

    def _ended(self, seq: Any) -> None:
        """Bookkeeping at a sequence's end; its error, if any, as an answer."""
        self._cancels.discard(seq.cancel)
        self.counters.ended(seq)
        if seq.finish_reason == "error":
            raise sequence_error(seq)

    async def _generate(self, seq: Any, wake: asyncio.Event
                        ) -> AsyncIterator[tuple[str, Any]]:
        """(text, None) for each piece of ``seq``, then ("", seq) at the end. Leaving early
        (the client went away: the stream is cancelled) cancels the sequence."""
        try:
            while True:
                wake.clear()
                pieces, ended = seq.poll()
                for p in pieces:
                    if p.text:
                        yield p.text, None
                if ended:
                    break
                if not pieces:
                    await wake.wait()
        finally:
            if not seq.done:
                seq.cancel()
                self.count("disconnects")
                self._cancels.discard(seq.cancel)
        self._ended(seq)
        yield "", seq

    async def complete(self, request: Request, req: Any) -> Any:
        """Run ``req`` to its end; a client that leaves meanwhile cancels it."""
        seq, wake = self.submit(req)
        try:
            while not seq.done:
                wake.clear()
                try:
                    await asyncio.wait_for(wake.wait(), 0.5)
                except TimeoutError:
                    pass
                if not seq.done and await request.is_disconnected():
                    seq.cancel()
                    self.count("disconnects")
                    seq.poll()
            seq.wait()
        finally:
            if not seq.done:
                seq.cancel()
                self._cancels.discard(seq.cancel)
        self._ended(seq)
        return seq

    def stream(self, items: AsyncIterator[Any], wire: Wire = OPENAI) -> Response:
        """``items`` framed as ``wire`` frames them; errors found once the stream has
        started are sent as ``wire``'s error object in the stream."""
        async def events() -> AsyncIterator[bytes]:
            try:
                async for item in items:
                    yield wire.item(item)
            except RequestError as e:
                yield wire.item(wire.error_body(e))
            yield wire.end

        return StreamingResponse(events(), media_type=wire.media_type,
                                 headers={"Cache-Control": "no-cache"})

    # --- embeddings ------------------------------------------------------------------------

    async def embeddings(self, request: Request) -> Response:
        """``POST /v1/embeddings``: OpenAI's request and response (``encoding_format``
        float or base64), computed by the engine beside the running generations."""
        try:
            body = await read_json_body(request)
            call = self.call(lambda: parse_embeddings(body))
            await self.use_model(body)
            result = await self.embed(request, call.input,
                                      encoding_format=call.encoding_format, **call.extra)
        except RequestError as e:
            return self.error(e)
        return JSONResponse(result)

    async def embed(self, request: Request, inputs: Any, **options: Any) -> dict[str, Any]:
        """``LLM.create_embedding`` of ``inputs`` (``in_thread``)."""
        llm = self.llm
        return await self.in_thread(request, lambda cancel: llm.create_embedding(
            inputs, cancel=cancel, **options))

    async def in_thread(self, request: Request, work: Callable[[Callable[[], bool]], Any]
                        ) -> Any:
        """``work(cancel)`` (an LLM call that polls ``cancel``) in a thread, cancelled when
        the client leaves or the server stops; a refusal as RequestError (503: the queue is
        full)."""
        gone = threading.Event()  # set when the client leaves or the server stops
        self._cancels.add(gone.set)
        watch = asyncio.ensure_future(_watch_disconnect(request, gone))
        try:
            result = await asyncio.to_thread(self.call, lambda: work(gone.is_set))
        except RequestError as e:
            if e.code == "cancelled":
                self.count("disconnects")
            raise
        except QueueFullError as e:
            raise RequestError(503, str(e), type="server_error") from None
        finally:
            watch.cancel()
            self._cancels.discard(gone.set)
        self.count("requests")
        return result


def _refusal(request: Request, exc: Exception) -> Response:
    """Starlette's 404/405 (or another HTTPException) as an OpenAI error object."""
    assert isinstance(exc, HTTPException)
    method, path = request.method, request.url.path
    if exc.status_code == 404:
        msg = f"no such endpoint: {method} {path}"
    elif exc.status_code == 405:
        msg = f"{method} is not allowed on {path}"
    else:
        msg = str(exc.detail)
    # the body of a refused request is not read: close, so it is never parsed as the
    # next request on this connection
    resp = RequestError(exc.status_code, msg).response()
    resp.headers["Connection"] = "close"
    return resp


async def _watch_disconnect(request: Request, gone: threading.Event) -> None:
    """Set ``gone`` when the client of ``request`` disconnects (for work that runs in a
    thread, which cannot await the disconnect itself)."""
    while not gone.is_set():
        if await request.is_disconnected():
            gone.set()
            return
        await asyncio.sleep(0.25)


class _Access:
    """ASGI middleware: who may ask (``gguflm.access``), CORS headers on every answer, the
    preflights, and the chat page. Order: origin (403), OPTIONS on a known path (204), the
    page, then the API routes with the key checked (401) for those that need it."""

    def __init__(self, app: Any, server: APIServer, known: set[str]) -> None:
        self.app, self.server, self.known = app, server, known

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        from starlette.datastructures import Headers

        headers = Headers(scope=scope)
        access = self.server.access
        cors = [(k.lower().encode("latin-1"), v.encode("latin-1"))
                for k, v in access.cors_headers(headers)]

        async def send_cors(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start" and cors:
                message["headers"] = list(message.get("headers", [])) + cors
            await send(message)

        path = scope["path"].rstrip("/") or "/"
        method = scope["method"]
        err = access.host_error(headers) or access.origin_error(headers)
        if err is not None:
            resp: Response = _closing(JSONResponse(err, status_code=403))
        elif method == "OPTIONS" and path in self.known:
            resp = Response(status_code=204, headers=dict(access.preflight_headers(headers)))
        elif path in webui_page.ROUTES and method in ("GET", "HEAD"):
            if not self.server.webui:
                resp = RequestError(404, "the web page is turned off (--no-webui)").response()
            else:
                name = webui_page.ROUTES[path]
                resp = Response(webui_page.asset(name), media_type=None,
                                headers={"Content-Type": webui_page.CONTENT_TYPES[name],
                                         **dict(webui_page.HEADERS)})
        elif path in self.known and (err := access.key_error(path, headers)) is not None:
            resp = _closing(JSONResponse(err, status_code=401,
                                         headers={"WWW-Authenticate": "Bearer"}))
        else:
            await self.app(scope, receive, send_cors)
            return
        await resp(scope, receive, send_cors)


def _closing(resp: Response) -> Response:
    """The answer to a refused request, whose body is left unread: close the connection."""
    resp.headers["Connection"] = "close"
    return resp


def make_server(llm: LLM | ModelPool, host: str = "127.0.0.1", port: int = 8080,
                **kwargs: Any) -> APIServer:
    """A bound (not yet serving) server over one model or a pool of them; call
    ``serve_forever()`` (port 0: any free port, see ``server_address``)."""
    return APIServer(llm, host, port, **kwargs)
