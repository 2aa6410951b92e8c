"""Anthropic's Messages API on the server: ``POST /v1/messages`` and
``/v1/messages/count_tokens`` (``wire/anthropic.py`` reads and shapes them)."""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..server import RequestError, Wire, read_json_body
from ..wire.anthropic import MessagesShaper, error_body, parse_messages, sse

__all__ = ["ANTHROPIC", "routes"]

# Anthropic's stream: named Server-Sent Events, no end marker; errors as its error object
ANTHROPIC = Wire("text/event-stream", sse, error_body)


def routes(server: Any) -> list[Route]:
    async def messages(request: Request) -> Response:
        try:
            body = await read_json_body(request)
            call = server.call(lambda: parse_messages(body))
            await server.use_model(body)
            req, plan = await asyncio.to_thread(server.call, lambda: server.llm.chat_request(
                call.messages, call.spec))
        except RequestError as e:
            return server.error(e, ANTHROPIC)
        shaper = MessagesShaper(server.llm.model_id, plan, len(req.prompt_ids))
        return await server.answer(request, req, call.stream, shaper, ANTHROPIC)

    async def count_tokens(request: Request) -> Response:
        """The prompt's token count: the conversation rendered as ``messages`` renders it
        (tools included), so it equals the usage's ``input_tokens``."""
        try:
            body = await read_json_body(request)
            call = server.call(lambda: parse_messages(body, counting=True))
            await server.use_model(body)
            req, _ = await asyncio.to_thread(server.call, lambda: server.llm.chat_request(
                call.messages, call.spec))
        except RequestError as e:
            return server.error(e, ANTHROPIC)
        return JSONResponse({"input_tokens": len(req.prompt_ids)})

    return [Route("/v1/messages", messages, methods=["POST"]),
            Route("/v1/messages/count_tokens", count_tokens, methods=["POST"])]
