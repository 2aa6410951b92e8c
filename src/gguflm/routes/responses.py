"""OpenAI's Responses API on the server: ``POST /v1/responses`` (``wire/responses.py`` reads
and shapes it; the recent responses are kept for ``previous_response_id``)."""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..server import RequestError, Wire, read_json_body
from ..wire.responses import ResponsesShaper, ResponseStore, parse_responses, sse

__all__ = ["RESPONSES", "routes"]

# the Responses stream: named Server-Sent Events, no end marker; errors as OpenAI's object
RESPONSES = Wire("text/event-stream", sse, RequestError.body)


def routes(server: Any) -> list[Route]:
    store = ResponseStore()

    async def responses(request: Request) -> Response:
        try:
            body = await read_json_body(request)
            call = server.call(lambda: parse_responses(body, store))
            await server.use_model(body)
            req, plan = await asyncio.to_thread(server.call, lambda: server.llm.chat_request(
                call.messages, call.spec))
        except RequestError as e:
            return server.error(e, RESPONSES)
        shaper = ResponsesShaper(server.llm.model_id, plan, call, len(req.prompt_ids), store)
        return await server.answer(request, req, call.stream, shaper, RESPONSES)

    return [Route("/v1/responses", responses, methods=["POST"]),
            Route("/responses", responses, methods=["POST"])]
