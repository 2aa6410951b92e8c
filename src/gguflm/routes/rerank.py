"""Reranking on the server: ``POST /v1/rerank`` (and ``/rerank``, ``/v1/reranking``,
``/reranking``, llama-server's aliases), in llama-server's shape, which is Jina's and
Cohere's: ``{"query", "documents", "top_n", "return_documents"}`` answered with ``results``
``[{"index", "relevance_score"}]`` best first, ``model``, ``object`` and ``usage``. A body
with ``texts`` instead of ``documents`` is Hugging Face TEI's request, answered as TEI (and
llama-server) do: a bare list of ``{"index", "score"}`` (``return_text``: with ``text``).
Scores come from ``LLM.rerank`` (``reranker.py``); errors are OpenAI's error object.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..engine.errors import InvalidRequestError
from ..engine.spec import Field, check_json_types
from ..server import RequestError, read_json_body

__all__ = ["FIELDS", "parse_rerank", "routes"]

FIELDS = {
    "query": Field("wire", (str,), "a string"),
    "documents": Field("wire", (list,), "a list of strings"),
    "texts": Field("wire", (list,), "a list of strings"),
    "top_n": Field("wire", (int,), "an integer"),
    "return_documents": Field("wire", (bool,), "a boolean"),
    "return_text": Field("wire", (bool,), "a boolean"),
    "truncate": Field("wire", (bool,), "a boolean"),
    "model": Field("wire", (str,), "a string"),
}


def routes(server: Any) -> list[Route]:
    api = _Rerank(server)
    return [Route(path, api.rerank, methods=["POST"])
            for path in ("/v1/rerank", "/rerank", "/v1/reranking", "/reranking")]


def parse_rerank(body: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """``LLM.rerank``'s arguments from a request body, and whether it is TEI's shape."""
    check_json_types(body, FIELDS)
    if body.get("query") is None:
        raise InvalidRequestError("'query' is required", param="query")
    tei = body.get("documents") is None and body.get("texts") is not None
    documents = body.get("texts") if tei else body.get("documents")
    if documents is None:
        raise InvalidRequestError("'documents' is required", param="documents")
    if body.get("truncate"):
        raise InvalidRequestError("truncate is not supported: an input longer than the "
                                  "model's context is refused", param="truncate")
    return {"query": body["query"], "documents": documents, "top_n": body.get("top_n"),
            "return_documents": bool(body.get("return_text" if tei else "return_documents")),
            "model": body.get("model")}, tei


class _Rerank:
    def __init__(self, server: Any) -> None:
        self.server = server

    async def rerank(self, request: Request) -> Response:
        s = self.server
        try:
            body = await read_json_body(request)
            args, tei = s.call(lambda: parse_rerank(body))
            llm = await s.use_model(body)
            result = await s.in_thread(request, lambda cancel: llm.rerank(
                cancel=cancel, **args))
        except RequestError as e:
            return s.error(e)
        if tei:
            return JSONResponse([{"index": r["index"], "score": r["relevance_score"],
                                  **({"text": r["document"]["text"]} if "document" in r
                                     else {})} for r in result["results"]])
        return JSONResponse(result)
