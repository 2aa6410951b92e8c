"""Anthropic's Messages API (``POST /v1/messages``, ``/v1/messages/count_tokens``): request
bodies read into a conversation and its ``GenerationSpec``, replies shaped as Anthropic's
``message`` object and its stream of events, errors as its error object.

A conversation becomes the chat template's messages as OpenAI's API writes them: ``system``
(a string or text blocks) a system message; ``text`` blocks joined; an assistant's
``tool_use`` blocks its ``tool_calls`` (arguments as JSON text); a user's ``tool_result``
blocks ``tool`` messages before the rest of that turn; earlier ``thinking`` blocks dropped
(as most templates drop earlier reasoning). ``tools`` (``input_schema``) and ``tool_choice``
(``auto``, ``any``, ``tool``, ``none``; ``disable_parallel_tool_use``) map to OpenAI's, so
the one tool-call path serves both. ``thinking`` turns the template's thinking on (with
``budget_tokens`` as the reasoning budget) or off, and a reasoning model's thinking comes
back as a ``thinking`` block (its ``signature`` empty: nothing here signs it);
``metadata`` and ``service_tier`` are accepted and have no effect; images and documents
are refused.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..engine.errors import InvalidRequestError
from ..engine.spec import FIELDS, Field, GenerationSpec, chat_extras, check_json_types
from ..replies import ChatReply

__all__ = ["MessagesCall", "MessagesShaper", "error_body", "parse_messages", "sse"]

_SAMPLING = {n: f for n, f in FIELDS.items() if f.kind == "sampling"}
MESSAGES_FIELDS = _SAMPLING | {
    "model": Field("wire", (str,), "a string"),
    "max_tokens": Field("wire", (int,), "an integer"),
    "messages": Field("wire", (list,), "a list of messages"),
    "system": Field("wire", (str, list), "a string or a list of text blocks"),
    "stop_sequences": Field("wire", (list,), "a list of strings"),
    "stream": Field("wire", (bool,), "a boolean"),
    "tools": Field("wire", (list,), "a list of tools"),
    "tool_choice": Field("wire", (dict,), "an object"),
    "metadata": Field("wire", (dict,), "an object"),
    "thinking": Field("wire", (dict,), "an object"),
}
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                403: "permission_error", 404: "not_found_error", 413: "request_too_large",
                429: "rate_limit_error", 503: "overloaded_error"}


@dataclass
class MessagesCall:
    """A Messages request: the conversation as chat-template messages, its spec, whether
    to stream."""

    messages: list[dict[str, Any]]
    spec: GenerationSpec
    stream: bool


def error_body(e: Any) -> dict[str, Any]:
    """Anthropic's error object for a RequestError (``status``, message)."""
    kind = _ERROR_TYPES.get(e.status, "api_error" if e.status >= 500 else
                            "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": str(e)}}


def sse(item: tuple[str, dict[str, Any]] | dict[str, Any]) -> bytes:
    """One Server-Sent Event as Anthropic names them (``event: TYPE``); an error object
    alone is an ``error`` event."""
    name, data = item if isinstance(item, tuple) else (item.get("type", "error"), item)
    return (f"event: {name}\ndata: ".encode() + json.dumps(data, ensure_ascii=False)
            .encode("utf-8") + b"\n\n")


def parse_messages(body: Mapping[str, Any], counting: bool = False) -> MessagesCall:
    """A ``/v1/messages`` body (``counting``: ``count_tokens``'s, without max_tokens)."""
    check_json_types(body, MESSAGES_FIELDS)
    if not counting and body.get("max_tokens") is None:
        raise InvalidRequestError("max_tokens: field required", param="max_tokens")
    messages = body.get("messages")
    if not messages:
        raise InvalidRequestError("messages: at least one message is required",
                                  param="messages")
    chat = ([{"role": "system", "content": _text(body["system"], "system")}]
            if body.get("system") else [])
    for i, m in enumerate(messages):
        chat += _turn(m, f"messages.{i}")
    fields = {k: body[k] for k in _SAMPLING if body.get(k) is not None}
    fields |= _tool_fields(body) | _thinking(body.get("thinking")) | chat_extras(body)
    stops = body.get("stop_sequences")
    if stops is not None:
        fields["stop"] = stops
    spec = GenerationSpec.from_body("chat", fields, body.get("max_tokens"))
    return MessagesCall(chat, spec, bool(body.get("stream")))


def _thinking(thinking: Any) -> dict[str, Any]:
    """Anthropic's ``thinking``: ``{"type": "enabled", "budget_tokens": N}`` turns the
    template's thinking on with that budget, ``{"type": "disabled"}`` off."""
    if thinking is None:
        return {}
    kind = thinking.get("type")
    if kind == "disabled":
        return {"think": False}
    if kind != "enabled":
        raise InvalidRequestError("thinking.type must be \"enabled\" or \"disabled\"",
                                  param="thinking.type")
    budget = thinking.get("budget_tokens")
    if budget is None:
        return {"think": True}
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
        raise InvalidRequestError("thinking.budget_tokens must be a non-negative integer",
                                  param="thinking.budget_tokens")
    return {"think": True, "reasoning_budget_tokens": budget}


def _text(content: Any, where: str) -> str:
    """A string, or the text of a list of ``text`` blocks."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequestError(f"{where}: expected a string or a list of blocks",
                                  param=where)
    parts = []
    for j, block in enumerate(content):
        if not isinstance(block, dict) or block.get("type") != "text" \
                or not isinstance(block.get("text"), str):
            raise InvalidRequestError(f"{where}.{j}: expected a text block", param=where)
        parts.append(block["text"])
    return "".join(parts)


def _turn(m: Any, where: str) -> list[dict[str, Any]]:
    """One message as chat-template messages (tool results first, then the turn)."""
    if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
        raise InvalidRequestError(f"{where}.role: expected 'user' or 'assistant'",
                                  param="messages")
    role, content = m["role"], m.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise InvalidRequestError(f"{where}.content: expected a string or a list of blocks",
                                  param="messages")
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for j, block in enumerate(content):
        _block(block, role, f"{where}.content.{j}", texts, calls, results)
    out = list(results)
    if texts or calls or not results:
        msg: dict[str, Any] = {"role": role, "content": "".join(texts)}
        if calls:
            msg["tool_calls"] = calls
        out.append(msg)
    return out


def _block(block: Any, role: str, where: str, texts: list[str],
           calls: list[dict[str, Any]], results: list[dict[str, Any]]) -> None:
    kind = block.get("type") if isinstance(block, dict) else None
    if kind == "text" and isinstance(block.get("text"), str):
        texts.append(block["text"])
    elif kind == "tool_use" and role == "assistant":
        if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
            raise InvalidRequestError(f"{where}: a tool_use block needs an id and a name",
                                      param="messages")
        calls.append({"id": block["id"], "type": "function", "function": {
            "name": block["name"], "arguments": json.dumps(block.get("input") or {})}})
    elif kind == "tool_result" and role == "user":
        if not isinstance(block.get("tool_use_id"), str):
            raise InvalidRequestError(f"{where}: a tool_result block needs a tool_use_id",
                                      param="messages")
        results.append({"role": "tool", "tool_call_id": block["tool_use_id"],
                        "content": _text(block.get("content") or "", where + ".content")})
    elif kind in ("thinking", "redacted_thinking") and role == "assistant":
        pass  # earlier reasoning: dropped, as most chat templates drop it
    elif kind in ("image", "document"):
        raise InvalidRequestError(f"{where}: {kind} blocks are not supported (gguflm runs "
                                  "text models)", param="messages")
    else:
        raise InvalidRequestError(f"{where}: a {kind!r} block is not valid in a {role} "
                                  "message", param="messages")


def _tool_fields(body: Mapping[str, Any]) -> dict[str, Any]:
    """``tools`` and ``tool_choice`` as OpenAI's chat API writes them."""
    out: dict[str, Any] = {}
    tools = body.get("tools")
    if tools:
        out["tools"] = [_tool(t, f"tools.{i}") for i, t in enumerate(tools)]
    choice = body.get("tool_choice")
    if choice is not None:
        kind = choice.get("type")
        mapped = {"auto": "auto", "any": "required", "none": "none"}.get(kind)
        if kind == "tool":
            if not isinstance(choice.get("name"), str):
                raise InvalidRequestError("tool_choice.name: required for type 'tool'",
                                          param="tool_choice")
            mapped = {"type": "function", "function": {"name": choice["name"]}}
        if mapped is None:
            raise InvalidRequestError("tool_choice.type: expected auto, any, tool or none",
                                      param="tool_choice")
        out["tool_choice"] = mapped
        if choice.get("disable_parallel_tool_use"):
            out["parallel_tool_calls"] = False
    return out


def _tool(t: Any, where: str) -> dict[str, Any]:
    if not isinstance(t, dict) or t.get("type") not in (None, "custom"):
        kind = t.get("type") if isinstance(t, dict) else None
        raise InvalidRequestError(f"{where}: tool type {kind!r} is not supported (client "
                                  "tools with an input_schema only)", param="tools")
    return {"type": "function", "function": {
        "name": t.get("name"), "description": t.get("description", ""),
        "parameters": t.get("input_schema", {"type": "object"})}}


def _stop_reason(reply: ChatReply, seq: Any) -> tuple[str, str | None]:
    reason = reply.finish_reason(seq.finish_reason)
    if reason == "tool_calls":
        return "tool_use", None
    if reason == "length":
        return "max_tokens", None
    if seq.stopped_by == "stop_string":
        return "stop_sequence", seq.stop_string
    return "end_turn", None


class MessagesShaper:
    """A Messages reply: the ``message`` object, or its events (``message_start``, a
    ``content_block_start``/``delta``/``stop`` run per text or tool_use block, then
    ``message_delta`` with the stop reason and ``message_stop``); ``plan`` the tool plan
    (``chatplan.ChatPlan``) or None. Reasoning is a ``thinking`` block before the text; a
    tool call's arguments arrive whole (engine/toolcalls.py) or in pieces (a family the
    chat format reads), each an ``input_json_delta``."""

    def __init__(self, model_id: str, plan: Any, n_prompt: int) -> None:
        self.model_id, self.n_prompt = model_id, n_prompt
        self.reply = ChatReply(plan)
        self.id = f"msg_{uuid.uuid4().hex[:24]}"
        self.index, self.open = -1, None  # the current block's index and type

    def opening(self) -> list[tuple[str, dict[str, Any]]]:
        message = {"id": self.id, "type": "message", "role": "assistant", "content": [],
                   "model": self.model_id, "stop_reason": None, "stop_sequence": None,
                   "usage": {"input_tokens": self.n_prompt, "output_tokens": 0}}
        return [("message_start", {"type": "message_start", "message": message}),
                ("ping", {"type": "ping"})]

    def piece(self, text: str) -> list[tuple[str, dict[str, Any]]]:
        out: list[tuple[str, dict[str, Any]]] = []
        for delta in self.reply.feed(text):
            out += self._delta(delta)
        return out

    def closing(self, seq: Any) -> list[tuple[str, dict[str, Any]]]:
        out: list[tuple[str, dict[str, Any]]] = []
        for delta in self.reply.finish():
            out += self._delta(delta)
        out += self._close()
        reason, stop = _stop_reason(self.reply, seq)
        return out + [
            ("message_delta", {"type": "message_delta",
                               "delta": {"stop_reason": reason, "stop_sequence": stop},
                               "usage": {"output_tokens": len(seq.tokens)}}),
            ("message_stop", {"type": "message_stop"})]

    def whole(self, seq: Any, text: str) -> dict[str, Any]:
        self.reply.feed(text)
        self.reply.finish()
        msg = self.reply.message()
        content: list[dict[str, Any]] = []
        if msg.get("reasoning_content"):
            content.append({"type": "thinking", "thinking": msg["reasoning_content"],
                            "signature": ""})
        if msg.get("content"):
            content.append({"type": "text", "text": msg["content"]})
        for call in msg.get("tool_calls") or []:
            content.append(_tool_use(call, json.loads(call["function"]["arguments"] or "{}")))
        reason, stop = _stop_reason(self.reply, seq)
        return {"id": self.id, "type": "message", "role": "assistant", "content": content,
                "model": self.model_id, "stop_reason": reason, "stop_sequence": stop,
                "usage": {"input_tokens": self.n_prompt, "output_tokens": len(seq.tokens)}}

    def _delta(self, delta: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        out: list[tuple[str, dict[str, Any]]] = []
        for key, kind, field in (("reasoning_content", "thinking", "thinking"),
                                 ("content", "text", "text")):
            if delta.get(key):
                if self.open != kind:
                    out += self._start({"type": kind, field: ""}
                                       | ({"signature": ""} if kind == "thinking" else {}))
                out.append(self._event({"type": f"{kind}_delta", field: delta[key]}))
        for call in delta.get("tool_calls") or []:
            if call.get("id"):  # a call begins (whole from engine/toolcalls.py)
                out += self._start(_tool_use(call, {}))
            args = call["function"].get("arguments")
            if args or call.get("id"):
                out.append(self._event({"type": "input_json_delta",
                                        "partial_json": args or ""}))
        return out

    def _start(self, block: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        out = self._close()
        self.index, self.open = self.index + 1, block["type"]
        return out + [("content_block_start", {"type": "content_block_start",
                                               "index": self.index, "content_block": block})]

    def _event(self, delta: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        return ("content_block_delta", {"type": "content_block_delta", "index": self.index,
                                        "delta": delta})

    def _close(self) -> list[tuple[str, dict[str, Any]]]:
        if self.open is None:
            return []
        self.open = None
        return [("content_block_stop", {"type": "content_block_stop", "index": self.index})]


def _tool_use(call: dict[str, Any], args: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
            "input": args}
