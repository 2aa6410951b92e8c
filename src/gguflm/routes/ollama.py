"""Ollama's API on the server, on the same port as OpenAI's: ``/api/chat``, ``/api/generate``,
``/api/embed`` and ``/api/embeddings`` (``wire/ollama.py`` reads and shapes them), and the
model listing ``/api/tags``, ``/api/show``, ``/api/ps``, ``/api/version``, ``/api/pull``.

A single-model server answers every model name a request gives (``name:tag``) with its
model, as the OpenAI routes answer every ``model``. With several models, the name picks one
(``:latest`` may be added or left out); ``/api/tags`` lists every model that can be served
and ``/api/ps`` those loaded, each by its name with ``:latest``. ``keep_alive`` (seconds,
or a Go duration such as ``"5m"``; 0: unload after this request; negative: keep) sets how
long the model stays loaded once idle, and a chat without messages or a generate without a
prompt only loads (or, with ``keep_alive`` 0, unloads) it, as in Ollama.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .. import __version__
from ..gguf.types import FILE_TYPE_NAMES
from ..server import RequestError, Wire, read_json_body
from ..wire.ollama import (
    ChatShaper,
    GenerateShaper,
    error_body,
    ndjson,
    parse_chat,
    parse_embed,
    parse_generate,
)

__all__ = ["OLLAMA", "routes"]

# Ollama's stream: one JSON object a line; errors as {"error": message}
OLLAMA = Wire("application/x-ndjson", ndjson, error_body)


def routes(server: Any) -> list[Route]:
    api = _Ollama(server)
    return [Route("/api/chat", api.chat, methods=["POST"]),
            Route("/api/generate", api.generate, methods=["POST"]),
            Route("/api/embed", api.embed, methods=["POST"]),
            Route("/api/embeddings", api.embeddings, methods=["POST"]),
            Route("/api/tags", api.tags, methods=["GET"]),
            Route("/api/ps", api.ps, methods=["GET"]),
            Route("/api/show", api.show, methods=["POST"]),
            Route("/api/version", api.version, methods=["GET"]),
            Route("/api/pull", api.pull, methods=["POST"])]


class _Ollama:
    def __init__(self, server: Any) -> None:
        self.server, self.pool = server, server.pool

    @property
    def llm(self) -> Any:
        return self.server.llm

    async def _use(self, body: dict[str, Any]) -> None:
        """The request's model and how long to keep it (``keep_alive``) afterwards."""
        await self.server.use_model(body, keep_alive=keep_alive_seconds(body))

    def _loaded_only(self, body: dict[str, Any], what: str) -> Response | None:
        """Ollama's answer to a request with nothing to run (no messages, no prompt): the
        model is loaded, or unloaded after it with keep_alive 0."""
        if body.get(what):
            return None
        reply: dict[str, Any] = {"model": self.name, "created_at": _now()}
        reply |= ({"response": ""} if what == "prompt"
                  else {"message": {"role": "assistant", "content": ""}})
        unload = keep_alive_seconds(body) == 0
        return JSONResponse(reply | {"done": True,
                                     "done_reason": "unload" if unload else "load"})

    async def chat(self, request: Request) -> Response:
        s = self.server
        try:
            body = await read_json_body(request)
            call = s.call(lambda: parse_chat(body))
            await self._use(body)
            if (done := self._loaded_only(body, "messages")) is not None:
                return done
            req, plan = await asyncio.to_thread(s.call, lambda: self.llm.chat_request(
                call.messages, call.spec))
        except RequestError as e:
            return s.error(e, OLLAMA)
        shaper = ChatShaper(self.name, plan)
        return await s.answer(request, req, call.stream, shaper, OLLAMA)

    async def generate(self, request: Request) -> Response:
        s = self.server
        try:
            body = await read_json_body(request)
            call = s.call(lambda: parse_generate(body))
            await self._use(body)
            if not body.get("context") and (done := self._loaded_only(body, "prompt")):
                return done
            req = await asyncio.to_thread(s.call, lambda: self._generate_request(call))
        except RequestError as e:
            return s.error(e, OLLAMA)
        return await s.answer(request, req, call.stream, GenerateShaper(self.name), OLLAMA)

    def _generate_request(self, call: Any) -> Any:
        if call.messages is not None:
            return self.llm.chat_request(call.messages, call.spec)[0]
        if call.context:
            prompt = call.context + self.llm.tokenize(call.prompt, add_special=False,
                                                      parse_special=True)
            return self.llm.completion_request(prompt, call.spec)[0]
        return self.llm.completion_request(call.prompt, call.spec)[0]

    async def embed(self, request: Request, old: bool = False) -> Response:
        s = self.server
        try:
            body = await read_json_body(request)
            value, normalize = s.call(lambda: parse_embed(body, old))
            await self._use(body)
            result = await s.embed(request, value, normalize=normalize)
        except RequestError as e:
            return s.error(e, OLLAMA)
        vectors = [d["embedding"] for d in result["data"]]
        if old:
            return JSONResponse({"embedding": vectors[0]})
        return JSONResponse({"model": self.name, "embeddings": vectors,
                             "prompt_eval_count": result["usage"]["prompt_tokens"]})

    async def embeddings(self, request: Request) -> Response:
        return await self.embed(request, old=True)

    @property
    def name(self) -> str:
        return _ollama_name(self.llm.model_id)

    def _model(self, spec: Any) -> dict[str, Any]:
        """``/api/tags``' entry for a model that can be served."""
        path = Path(spec.path)
        st = path.stat()
        arch, ftype, n_params = _file_facts(str(path), st.st_size, st.st_mtime_ns)
        digest = hashlib.sha256(f"{path}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()
        name = _ollama_name(spec.name)
        return {"name": name, "model": name, "size": st.st_size, "digest": digest,
                "modified_at": datetime.fromtimestamp(st.st_mtime, UTC).isoformat(),
                "details": {"parent_model": "", "format": "gguf", "family": arch,
                            "families": [arch], "parameter_size": _billions(n_params),
                            "quantization_level": str(FILE_TYPE_NAMES.get(ftype, "unknown"))
                            .removeprefix("MOSTLY_")}}

    async def tags(self, request: Request) -> Response:
        return JSONResponse({"models": [self._model(spec) for spec in self.pool.specs]})

    async def ps(self, request: Request) -> Response:
        """The loaded models, most recently used first; ``size`` the memory counted for
        each (the file with several models: its estimate), ``expires_at`` when it will be
        unloaded if still idle (year 1: never)."""
        out = []
        for spec, llm, expires, _ in self.pool.loaded():
            m = self._model(spec)
            if not self.pool.single:
                m["size"] = self.pool.sizes[spec.name]
            out.append(m | {"expires_at": "0001-01-01T00:00:00Z" if expires is None
                            else datetime.fromtimestamp(expires, UTC).isoformat(),
                            "size_vram": 0, "context_length": llm.n_ctx})
        return JSONResponse({"models": out})

    async def show(self, request: Request) -> Response:
        try:
            body = await read_json_body(request)
            await self.server.use_model({"model": body.get("model") or body.get("name")})
        except RequestError as e:
            return self.server.error(e, OLLAMA)
        meta = self.llm.model.gguf.metadata
        info = {k: v for k, v in meta.items()
                if not k.startswith("tokenizer.") and isinstance(v, str | int | float | bool)}
        source = self.llm.chat_template.source or ""
        caps = ["embedding"] if self.llm.model.is_encoder else ["completion"]
        if "tools" in source:
            caps.append("tools")
        return JSONResponse({"license": "", "modelfile": f"FROM {self.llm.model_path}\n",
                             "parameters": "", "template": source,
                             "details": self._model(self._spec())["details"],
                             "model_info": info,
                             "capabilities": caps})

    async def version(self, request: Request) -> Response:
        return JSONResponse({"version": __version__})

    async def pull(self, request: Request) -> Response:
        """The served model is already here; any other name is not this server's to
        fetch (``gguflm pull``)."""
        try:
            body = await read_json_body(request)
        except RequestError as e:
            return self.server.error(e, OLLAMA)
        name = str(body.get("model") or body.get("name") or "")
        served = [_ollama_name(s.name) for s in self.pool.specs]
        if self.pool.single:
            ok = name.split(":")[0] in (served[0].split(":")[0], self.pool.default.name)
        else:
            ok = any(name.split(":")[0] in (n.split(":")[0], s.name)
                     for n, s in zip(served, self.pool.specs, strict=True))
        if not ok:
            return self.server.error(RequestError(
                404, f"model '{name}' is not served here: this server runs "
                f"{', '.join(served)}; fetch other models with 'gguflm pull'"), OLLAMA)
        return JSONResponse({"status": "success"})

    def _spec(self) -> Any:
        """The pool's entry for the request's model."""
        llm = self.llm
        return next((s for s, m, _, _ in self.pool.loaded() if m is llm), self.pool.default)


def _ollama_name(name: str) -> str:
    return f"{name.removesuffix('.gguf')}:latest"


def _now() -> str:
    return datetime.now(UTC).isoformat()


@functools.lru_cache(maxsize=256)
def _file_facts(path: str, size: int, mtime_ns: int) -> tuple[str, Any, int]:
    """(architecture, file type, parameter count) of a GGUF file, from its header (kept
    per path, size and time: the listing reads it again only when the file changes)."""
    from ..gguf.reader import open as open_gguf

    gguf = open_gguf(path)
    try:
        meta = gguf.metadata
        return (str(meta.get("general.architecture", "")), meta.get("general.file_type"),
                sum(t.n_elements for t in gguf.tensors.values()))
    finally:
        gguf.close()


# Go's time.ParseDuration units, as Ollama reads keep_alive strings
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


def keep_alive_seconds(body: dict[str, Any]) -> float | None:
    """``keep_alive`` in seconds (None: not given; negative: forever): a number of seconds
    or a Go duration (``"5m"``, ``"1h30m"``, ``"-1s"``); RequestError 400 otherwise."""
    value = body.get("keep_alive")
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    text = str(value).strip()
    try:
        return float(text)
    except ValueError:
        pass
    sign, rest = (-1.0, text[1:]) if text.startswith("-") else (1.0, text.lstrip("+"))
    parts = _DURATION.findall(rest)
    if not rest or "".join(n + u for n, u in parts) != rest:
        raise RequestError(400, f"keep_alive must be seconds or a duration such as \"5m\", "
                           f"got {value!r}", param="keep_alive")
    return sign * sum(float(n) * _UNITS[u] for n, u in parts)


def _billions(n: int) -> str:
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"
