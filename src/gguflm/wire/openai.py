"""OpenAI's Completions and Chat Completions request bodies (and llama-server's extra fields
on them), read into what to run and its ``GenerationSpec``.

The generation fields and their JSON types come from ``engine/spec.py``'s table; this module
adds each route's own fields and OpenAI's rules: one prompt and ``n`` 1 per request, no
``logprobs`` or ``suffix``, ``max_completion_tokens`` before ``max_tokens`` in a chat.
Errors are InvalidRequestError naming the field (a 400 on the server).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..engine.errors import InvalidRequestError
from ..engine.spec import FIELDS, Field, GenerationSpec, check_json_types

__all__ = ["ChatCall", "CompletionCall", "EmbeddingCall", "parse_chat", "parse_completion",
           "parse_embeddings"]

_COMMON = {n: f for n, f in FIELDS.items() if f.kind not in ("tools", "chat")} | {
    "model": Field("wire", (str,), "a string"),
    "stream": Field("wire", (bool,), "a boolean"),
    "stream_options": Field("wire", (dict,), "an object"),
    "n": Field("wire", (int,), "an integer"),
    "user": Field("wire", (str,), "a string"),
}
COMPLETION_FIELDS = _COMMON | {
    "prompt": Field("wire", (str, list), "a string or a list of token ids"),
    "echo": Field("wire", (bool,), "a boolean"),
    "suffix": Field("wire", (str,), "a string"),
}
CHAT_FIELDS = _COMMON | {n: f for n, f in FIELDS.items() if f.kind in ("tools", "chat")} | {
    "messages": Field("wire", (list,), "a list of messages"),
    "max_completion_tokens": Field("wire", (int,), "an integer"),
}


@dataclass
class CompletionCall:
    """A completion request: its one prompt (text or token ids), ``echo``, the spec, and
    how to answer (``stream``, ``include_usage``)."""

    prompt: Any
    echo: bool
    spec: GenerationSpec
    stream: bool
    include_usage: bool


@dataclass
class ChatCall:
    """A chat request: its messages, the spec, and how to answer."""

    messages: list[Any]
    spec: GenerationSpec
    stream: bool
    include_usage: bool


def parse_completion(body: Mapping[str, Any]) -> CompletionCall:
    _check(body, COMPLETION_FIELDS)
    spec = GenerationSpec.from_body("completion", body, body.get("max_tokens"))
    return CompletionCall(_one_prompt(body.get("prompt")), bool(body.get("echo")), spec,
                          bool(body.get("stream")), _include_usage(body))


def parse_chat(body: Mapping[str, Any]) -> ChatCall:
    _check(body, CHAT_FIELDS)
    messages = body.get("messages")
    if not messages:
        raise InvalidRequestError("'messages' must be a non-empty list", param="messages")
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    if body.get("thinking_budget_tokens") is not None:  # llama-server's other name
        body = {**body, "reasoning_budget_tokens": body["thinking_budget_tokens"]}
        check_json_types(body, {"reasoning_budget_tokens": FIELDS["reasoning_budget_tokens"]})
    spec = GenerationSpec.from_body("chat", body, limit)
    return ChatCall(messages, spec, bool(body.get("stream")), _include_usage(body))


@dataclass
class EmbeddingCall:
    """An embeddings request: its input, ``encoding_format`` and other keywords."""

    input: Any
    encoding_format: str
    extra: dict[str, Any]


EMBEDDING_FIELDS = {
    "input": Field("wire", (str, list), "a string, a list of strings, or token ids"),
    "model": Field("wire", (str,), "a string"),
    "encoding_format": Field("wire", (str,), "a string"),
    "dimensions": Field("wire", (int,), "an integer"),
    "user": Field("wire", (str,), "a string"),
}


def parse_embeddings(body: Mapping[str, Any]) -> EmbeddingCall:
    check_json_types(body, EMBEDDING_FIELDS)
    if body.get("input") is None:
        raise InvalidRequestError("'input' is required", param="input")
    extra = {"dimensions": body["dimensions"]} if body.get("dimensions") else {}
    return EmbeddingCall(body["input"], body.get("encoding_format") or "float", extra)


def _check(body: Mapping[str, Any], fields: Mapping[str, Field]) -> None:
    check_json_types(body, fields)
    stop = body.get("stop")
    if isinstance(stop, list) and not all(isinstance(s, str) for s in stop):
        raise InvalidRequestError("'stop' must be a string or a list of strings",
                                  param="stop")
    if body.get("n") not in (None, 1):
        raise InvalidRequestError("only n = 1 is supported", param="n")
    if body.get("logprobs") not in (None, False, 0):
        raise InvalidRequestError("logprobs are not supported", param="logprobs")
    if body.get("suffix"):
        raise InvalidRequestError("suffix (insertion) is not supported", param="suffix")


def _one_prompt(prompt: Any) -> Any:
    """The request's one prompt: text, or token ids (a list of one text is that text)."""
    if prompt is None:
        raise InvalidRequestError("'prompt' is required", param="prompt")
    if isinstance(prompt, list):
        if len(prompt) == 1 and isinstance(prompt[0], str):
            return prompt[0]
        if prompt and all(isinstance(p, str) for p in prompt):
            raise InvalidRequestError("only one prompt per request is supported",
                                      param="prompt")
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            raise InvalidRequestError("'prompt' must be a string or a list of token ids",
                                      param="prompt")
    return prompt


def _include_usage(body: Mapping[str, Any]) -> bool:
    options = body.get("stream_options") or {}
    return bool(options.get("include_usage"))
