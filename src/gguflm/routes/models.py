"""The server's own state and its models: ``GET /health``, ``/slots`` and ``/metrics``,
``GET /v1/models`` and ``/models`` (what can be served; with several models each one's
``status`` as llama-server's router mode gives it: loaded, loading or unloaded), and
``POST /models/load`` and ``/models/unload`` (``{"model": NAME}``, answered
``{"success": true}``) to load and unload by hand.

With several models, ``/slots`` and ``/metrics`` take ``?model=NAME`` (default: the first
model), which must be loaded, as llama-server's router takes it on its GET routes."""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..model_pool import PoolError
from ..server import RequestError, read_json_body

__all__ = ["routes"]


def routes(server: Any) -> list[Route]:
    api = _Models(server)
    return [Route("/health", api.health, methods=["GET"]),
            Route("/slots", api.slots, methods=["GET"]),
            Route("/metrics", api.metrics, methods=["GET"]),
            Route("/v1/models", api.models, methods=["GET"]),
            Route("/models", api.models, methods=["GET"]),
            Route("/models/load", api.load, methods=["POST"]),
            Route("/models/unload", api.unload, methods=["POST"])]


def _pool_error(e: PoolError) -> RequestError:
    return RequestError(e.status, str(e), param="model", code=e.code,
                        type="invalid_request_error" if e.status < 500 else "server_error")


def _engine_state(llm: Any) -> dict[str, Any]:
    e = llm.engine
    busy = e.n_running
    return {"slots_idle": e.n_slots - busy, "slots_processing": busy, "queue": e.n_waiting,
            "n_ctx": llm.n_ctx, "model": llm.model_id}


class _Models:
    def __init__(self, server: Any) -> None:
        self.server, self.pool = server, server.pool

    async def health(self, request: Request) -> Response:
        """The slots' state; with several models, each loaded one's under ``models``."""
        if self.pool.single:
            return JSONResponse({"status": "ok"} | _engine_state(self.server.llm))
        return JSONResponse({"status": "ok", "models": [
            _engine_state(llm) for _, llm, _, _ in self.pool.loaded()]})

    def _loaded_llm(self, request: Request) -> Any:
        """The one model, else ``?model=NAME``'s (default: the first), which is loaded."""
        if self.pool.single:
            return self.server.llm
        try:
            spec = self.pool.spec(request.query_params.get("model"))
        except PoolError as e:
            raise _pool_error(e) from None
        for s, llm, _, _ in self.pool.loaded():
            if s is spec:
                return llm
        raise RequestError(400, f"model '{spec.name}' is not loaded", param="model",
                           code="model_not_loaded")

    async def slots(self, request: Request) -> Response:
        try:
            return JSONResponse(self._loaded_llm(request).engine.slots_info())
        except RequestError as e:
            return self.server.error(e)

    async def metrics(self, request: Request) -> Response:
        try:
            engine = self._loaded_llm(request).engine
        except RequestError as e:
            return self.server.error(e)
        return Response(self.server.counters.text(engine),
                        media_type="text/plain; version=0.0.4; charset=utf-8")

    async def models(self, request: Request) -> Response:
        """Every model that can be served, loaded ones with their ``meta``; with several,
        each one's aliases, file, estimated memory and ``status`` too."""
        loaded = {spec.name: llm for spec, llm, _, _ in self.pool.loaded()}
        data = []
        for spec in self.pool.specs:
            entry: dict[str, Any] = {"id": spec.name, "object": "model",
                                     "created": self.server.started, "owned_by": "gguflm"}
            llm = loaded.get(spec.name)
            if llm is not None:
                entry["meta"] = {"n_ctx": llm.n_ctx, "n_vocab": llm.tokenizer.n_vocab,
                                 "parallel": llm.engine.n_slots}
            if not self.pool.single:
                entry |= {"aliases": list(spec.aliases), "path": str(spec.path),
                          "memory_bytes": self.pool.sizes[spec.name], "status": {
                              "value": "loaded" if llm is not None
                              else self.pool.state(spec.name)}}
            data.append(entry)
        return JSONResponse({"object": "list", "data": data})

    async def _named(self, request: Request) -> str:
        """The ``model`` a load or unload request names (a RequestError otherwise)."""
        body = await read_json_body(request)
        name = body.get("model")
        if not isinstance(name, str) or not name:
            raise RequestError(400, "'model' (a model's name) is required", param="model")
        if self.pool.single:
            raise RequestError(400, "this server serves one model, always loaded; serve "
                               "several (-m repeated, --models-dir or --models-config) to "
                               "load and unload them", param="model")
        try:
            return self.pool.spec(name).name
        except PoolError as e:
            raise _pool_error(e) from None

    async def load(self, request: Request) -> Response:
        """Load a model now (the answer comes once it is loaded; a loaded one: at once)."""
        try:
            name = await self._named(request)
            await asyncio.to_thread(self.pool.load, name)
        except PoolError as e:
            return self.server.error(_pool_error(e))
        except RequestError as e:
            return self.server.error(e)
        return JSONResponse({"success": True})

    async def unload(self, request: Request) -> Response:
        """Unload a model: at once if idle, else when its requests end."""
        try:
            name = await self._named(request)
            if not await asyncio.to_thread(self.pool.unload, name):
                raise RequestError(400, f"model '{name}' is not loaded", param="model",
                                   code="model_not_loaded")
        except RequestError as e:
            return self.server.error(e)
        return JSONResponse({"success": True})
