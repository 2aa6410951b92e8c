"""Ollama's API on the server, on the same port as OpenAI's: ``/api/chat``, ``/api/generate``,
``/api/embed`` and ``/api/embeddings`` (``wire/ollama.py`` reads and shapes them), and the
model listing ``/api/tags``, ``/api/show``, ``/api/ps``, ``/api/version``, ``/api/pull``.

The server holds one model: every model name a request gives (``name:tag``) is answered by
it, as the OpenAI routes answer every ``model``; ``/api/tags`` and ``/api/ps`` list it by
its name with ``:latest``.
"""

from __future__ import annotations

import asyncio
import hashlib
from datetime import UTC, datetime
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
        self.server, self.llm = server, server.llm

    async def chat(self, request: Request) -> Response:
        s = self.server
        try:
            body = await read_json_body(request)
            call = s.call(lambda: parse_chat(body))
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
        return f"{self.llm.model_id.removesuffix('.gguf')}:latest"

    def _model(self) -> dict[str, Any]:
        path = self.llm.model_path
        st = path.stat()
        meta = self.llm.model.gguf.metadata
        arch = str(meta.get("general.architecture", ""))
        ftype = meta.get("general.file_type")
        n_params = sum(t.n_elements for t in self.llm.model.gguf.tensors.values())
        digest = hashlib.sha256(f"{path}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()
        return {"name": self.name, "model": self.name, "size": st.st_size, "digest": digest,
                "modified_at": datetime.fromtimestamp(st.st_mtime, UTC).isoformat(),
                "details": {"parent_model": "", "format": "gguf", "family": arch,
                            "families": [arch], "parameter_size": _billions(n_params),
                            "quantization_level": str(FILE_TYPE_NAMES.get(ftype, "unknown"))
                            .removeprefix("MOSTLY_")}}

    async def tags(self, request: Request) -> Response:
        return JSONResponse({"models": [self._model()]})

    async def ps(self, request: Request) -> Response:
        m = self._model()
        return JSONResponse({"models": [m | {"expires_at": "0001-01-01T00:00:00Z",
                                             "size_vram": 0, "context_length": self.llm.n_ctx}]})

    async def show(self, request: Request) -> Response:
        meta = self.llm.model.gguf.metadata
        info = {k: v for k, v in meta.items()
                if not k.startswith("tokenizer.") and isinstance(v, str | int | float | bool)}
        source = self.llm.chat_template.source or ""
        caps = ["embedding"] if self.llm.model.is_encoder else ["completion"]
        if "tools" in source:
            caps.append("tools")
        return JSONResponse({"license": "", "modelfile": f"FROM {self.llm.model_path}\n",
                             "parameters": "", "template": source,
                             "details": self._model()["details"], "model_info": info,
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
        if name.split(":")[0] not in (self.name.split(":")[0], self.llm.model_id):
            return self.server.error(RequestError(
                404, f"model '{name}' is not served here: this server runs {self.name}; "
                "fetch other models with 'gguflm pull'"), OLLAMA)
        return JSONResponse({"status": "success"})


def _billions(n: int) -> str:
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"
