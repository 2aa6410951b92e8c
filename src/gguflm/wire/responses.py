"""OpenAI's Responses API (``POST /v1/responses``): request bodies read into a conversation
and its ``GenerationSpec``, replies shaped as the ``response`` object and its stream of
events.

``input`` is a string (one user message) or items: messages (``user``, ``assistant``,
``system``, ``developer`` as system; content a string or ``input_text``/``output_text``
parts), ``function_call`` items (an assistant's tool calls) and ``function_call_output``
items (``tool`` messages); ``reasoning`` items are dropped. ``instructions`` is a system
message. ``tools`` (``type: function``), ``tool_choice``, ``parallel_tool_calls`` and
``text.format`` (``json_schema``, ``json_object``) map to the chat API's fields, so the one
tool-call and structured-output path serves both. ``previous_response_id`` continues a
response the server still holds (``ResponseStore``). ``reasoning.effort`` is the template's
reasoning effort (Harmony's); the reply's reasoning is kept out of the output text (no
``reasoning`` output item yet). ``store``, ``metadata``, ``truncation``, ``user``, ``include``
are accepted; images and built-in tools are refused.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..engine.errors import InvalidRequestError
from ..engine.spec import FIELDS, Field, GenerationSpec, chat_extras, check_json_types
from ..replies import ChatReply

__all__ = ["ResponseStore", "ResponsesCall", "ResponsesShaper", "parse_responses", "sse"]

_SAMPLING = {n: f for n, f in FIELDS.items() if f.kind == "sampling"}
RESPONSES_FIELDS = _SAMPLING | {
    "model": Field("wire", (str,), "a string"),
    "input": Field("wire", (str, list), "a string or a list of items"),
    "instructions": Field("wire", (str,), "a string"),
    "tools": Field("wire", (list,), "a list of tools"),
    "tool_choice": Field("wire", (str, dict), "\"auto\", \"required\", \"none\" or a function"),
    "parallel_tool_calls": Field("wire", (bool,), "a boolean"),
    "text": Field("wire", (dict,), "an object"),
    "reasoning": Field("wire", (dict,), "an object"),
    "max_output_tokens": Field("wire", (int,), "an integer"),
    "stream": Field("wire", (bool,), "a boolean"),
    "previous_response_id": Field("wire", (str,), "a string"),
    "store": Field("wire", (bool,), "a boolean"),
    "metadata": Field("wire", (dict,), "an object"),
}
MAX_STORED = 256                # responses held for previous_response_id, oldest out first
MAX_STORED_CHARS = 64 << 20     # ... and at most this much conversation text in all


@dataclass
class ResponsesCall:
    messages: list[dict[str, Any]]
    spec: GenerationSpec
    stream: bool
    echo: dict[str, Any] = field(default_factory=dict)  # request fields the reply repeats


class ResponseStore:
    """The conversations of recent responses (their input and output as chat messages),
    for ``previous_response_id``: bounded in count and in characters, oldest out first."""

    def __init__(self) -> None:
        self._items: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()
        self._chars: dict[str, int] = {}

    def get(self, rid: str) -> list[dict[str, Any]]:
        if rid not in self._items:
            raise InvalidRequestError(f"previous response with id '{rid[:80]}' not found "
                                      f"(the server keeps the last {MAX_STORED})",
                                      param="previous_response_id")
        return list(self._items[rid])

    def put(self, rid: str, messages: list[dict[str, Any]]) -> None:
        self._items[rid] = messages
        self._chars[rid] = len(json.dumps(messages))
        while len(self._items) > MAX_STORED or sum(self._chars.values()) > MAX_STORED_CHARS:
            old, _ = self._items.popitem(last=False)
            del self._chars[old]


def sse(item: dict[str, Any]) -> bytes:
    return (f"event: {item.get('type', 'error')}\ndata: ".encode()
            + json.dumps(item, ensure_ascii=False).encode("utf-8") + b"\n\n")


def parse_responses(body: Mapping[str, Any], store: ResponseStore) -> ResponsesCall:
    check_json_types(body, RESPONSES_FIELDS)
    if body.get("input") is None:
        raise InvalidRequestError("'input' is required", param="input")
    messages = store.get(body["previous_response_id"]) \
        if body.get("previous_response_id") else []
    if body.get("instructions"):
        messages = [m for m in messages if m["role"] != "system"]
        messages.insert(0, {"role": "system", "content": body["instructions"]})
    items = body["input"]
    messages += [{"role": "user", "content": items}] if isinstance(items, str) \
        else _items(items)
    fields = {k: body[k] for k in _SAMPLING if body.get(k) is not None}
    fields |= _tools(body) | _text_format(body.get("text") or {}) | chat_extras(body)
    effort = (body.get("reasoning") or {}).get("effort")
    if effort is not None:
        fields["reasoning_effort"] = effort
    spec = GenerationSpec.from_body("chat", fields, body.get("max_output_tokens"))
    echo = {k: body.get(k) for k in ("instructions", "max_output_tokens", "temperature",
                                     "top_p", "previous_response_id", "metadata")}
    echo |= {"tools": body.get("tools") or [], "tool_choice": body.get("tool_choice", "auto"),
             "parallel_tool_calls": body.get("parallel_tool_calls", True),
             "text": body.get("text") or {"format": {"type": "text"}}}
    return ResponsesCall(messages, spec, bool(body.get("stream")), echo)


def _items(items: list[Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        where = f"input.{i}"
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "message":
            role = {"developer": "system"}.get(item.get("role"), item.get("role"))
            if role not in ("user", "assistant", "system"):
                raise InvalidRequestError(f"{where}.role: expected user, assistant, system "
                                          "or developer", param="input")
            out.append({"role": role, "content": _content(item.get("content"), where)})
        elif kind == "function_call":
            call = {"id": item.get("call_id"), "type": "function", "function": {
                "name": item.get("name"), "arguments": item.get("arguments") or "{}"}}
            if out and out[-1]["role"] == "assistant" and "tool_calls" in out[-1]:
                out[-1]["tool_calls"].append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            out.append({"role": "tool", "tool_call_id": item.get("call_id"),
                        "content": _content(item.get("output"), where)})
        elif kind != "reasoning":  # earlier reasoning: dropped
            raise InvalidRequestError(f"{where}: an item of type {kind!r} is not supported",
                                      param="input")
    return out


def _content(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequestError(f"{where}.content: expected a string or parts", param="input")
    parts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in ("input_text", "output_text", "text") \
                or not isinstance(part.get("text"), str):
            raise InvalidRequestError(f"{where}.content.{j}: {kind!r} parts are not supported "
                                      "(text only)", param="input")
        parts.append(part["text"])
    return "".join(parts)


def _tools(body: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if body.get("tools"):
        out["tools"] = [_tool(t, f"tools.{i}") for i, t in enumerate(body["tools"])]
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
            raise InvalidRequestError("tool_choice: expected {\"type\": \"function\", "
                                      "\"name\": ...}", param="tool_choice")
        choice = {"type": "function", "function": {"name": choice["name"]}}
    if choice is not None:
        out["tool_choice"] = choice
    if body.get("parallel_tool_calls") is not None:
        out["parallel_tool_calls"] = body["parallel_tool_calls"]
    return out


def _tool(t: Any, where: str) -> dict[str, Any]:
    if not isinstance(t, dict) or t.get("type") != "function":
        kind = t.get("type") if isinstance(t, dict) else None
        raise InvalidRequestError(f"{where}: tool type {kind!r} is not supported (function "
                                  "tools only)", param="tools")
    return {"type": "function", "function": {
        "name": t.get("name"), "description": t.get("description") or "",
        "parameters": t.get("parameters") or {"type": "object"}}}


def _text_format(text: Mapping[str, Any]) -> dict[str, Any]:
    fmt = text.get("format") or {"type": "text"}
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return {}
    if kind == "json_object":
        return {"response_format": {"type": "json_object"}}
    if kind == "json_schema":
        return {"response_format": {"type": "json_schema", "json_schema": {
            "name": fmt.get("name", "response"), "schema": fmt.get("schema")}}}
    raise InvalidRequestError("text.format.type: expected text, json_object or json_schema",
                              param="text.format")


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


class ResponsesShaper:
    """A Responses reply: the ``response`` object, or its events (``response.created``,
    ``response.in_progress``, per output item ``response.output_item.added``, its text
    deltas (``response.content_part.added``, ``response.output_text.delta``/``.done``,
    ``response.content_part.done``) or its call's arguments
    (``response.function_call_arguments.delta``/``.done``), ``response.output_item.done``,
    then ``response.completed`` (``response.incomplete`` when the limit cut it)). When it
    ends, the conversation and the reply go to ``store``."""

    def __init__(self, model_id: str, plan: Any, call: ResponsesCall, n_prompt: int,
                 store: ResponseStore) -> None:
        self.model_id, self.call, self.n_prompt, self.store = model_id, call, n_prompt, store
        self.reply = ChatReply(plan)
        self.id, self.created = _new_id("resp"), int(time.time())
        self.output: list[dict[str, Any]] = []
        self.number = 0           # the next event's sequence_number
        self.text: list[str] | None = None  # the open message item's text, while open

    def opening(self) -> list[dict[str, Any]]:
        response = self._response("in_progress", None)
        return [self._event("response.created", response=response),
                self._event("response.in_progress", response=response)]

    def piece(self, text: str) -> list[dict[str, Any]]:
        return [e for d in self.reply.feed(text) for e in self._delta(d)]

    def closing(self, seq: Any) -> list[dict[str, Any]]:
        out = [e for d in self.reply.finish() for e in self._delta(d)] + self._close_text()
        response = self._response(self._status(seq), seq)
        self._remember()
        kind = "response.completed" if response["status"] == "completed" \
            else "response.incomplete"
        return out + [self._event(kind, response=response)]

    def whole(self, seq: Any, text: str) -> dict[str, Any]:
        self.reply.feed(text)
        self.reply.finish()
        msg = self.reply.message()
        if msg.get("content"):
            self.output.append(_message_item(_new_id("msg"), msg["content"], "completed"))
        self.output += [_call_item(c, "completed") for c in msg.get("tool_calls") or []]
        self._remember()
        return self._response(self._status(seq), seq)

    def _status(self, seq: Any) -> str:
        return "incomplete" if self.reply.finish_reason(seq.finish_reason) == "length" \
            else "completed"

    def _remember(self) -> None:
        msg = self.reply.message()
        reply = {"role": "assistant", "content": msg.get("content") or ""}
        if msg.get("tool_calls"):
            reply["tool_calls"] = msg["tool_calls"]
        self.store.put(self.id, self.call.messages + [reply])

    def _response(self, status: str, seq: Any) -> dict[str, Any]:
        usage = None if seq is None else {
            "input_tokens": self.n_prompt,
            "input_tokens_details": {"cached_tokens": seq.n_cached},
            "output_tokens": len(seq.tokens), "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": self.n_prompt + len(seq.tokens)}
        return {"id": self.id, "object": "response", "created_at": self.created,
                "status": status, "model": self.model_id, "output": list(self.output),
                "error": None, "usage": usage,
                "incomplete_details": {"reason": "max_output_tokens"}
                if status == "incomplete" else None} | self.call.echo

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        self.number += 1
        return {"type": kind, "sequence_number": self.number - 1} | fields

    def _delta(self, delta: dict[str, Any]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if delta.get("content"):
            if self.text is None:
                out += self._open_text()
            self.text.append(delta["content"])
            out.append(self._event("response.output_text.delta", **self._where(),
                                   delta=delta["content"], logprobs=[]))
        for call in delta.get("tool_calls") or []:
            out += self._close_text() + self._call_events(call)
        return out

    def _where(self) -> dict[str, Any]:
        index = len(self.output) - 1
        return {"item_id": self.output[index]["id"], "output_index": index,
                "content_index": 0}

    def _open_text(self) -> list[dict[str, Any]]:
        self.text = []
        self.output.append(_message_item(_new_id("msg"), None, "in_progress"))
        where = self._where()
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        return [self._event("response.output_item.added", item=self.output[-1],
                            output_index=where["output_index"]),
                self._event("response.content_part.added", **where, part=part)]

    def _close_text(self) -> list[dict[str, Any]]:
        if self.text is None:
            return []
        text, where = "".join(self.text), self._where()
        self.text = None
        self.output[-1] = _message_item(where["item_id"], text, "completed")
        part = self.output[-1]["content"][0]
        return [self._event("response.output_text.done", **where, text=text, logprobs=[]),
                self._event("response.content_part.done", **where, part=part),
                self._event("response.output_item.done", item=self.output[-1],
                            output_index=where["output_index"])]

    def _call_events(self, call: dict[str, Any]) -> list[dict[str, Any]]:
        item = _call_item(call, "in_progress") | {"arguments": ""}
        self.output.append(item)
        index, args = len(self.output) - 1, call["function"]["arguments"] or "{}"
        self.output[-1] = done = _call_item(call, "completed")
        return [self._event("response.output_item.added", item=item, output_index=index),
                self._event("response.function_call_arguments.delta", item_id=item["id"],
                            output_index=index, delta=args),
                self._event("response.function_call_arguments.done", item_id=item["id"],
                            output_index=index, arguments=args, name=done["name"]),
                self._event("response.output_item.done", item=done, output_index=index)]


def _message_item(item_id: str, text: str | None, status: str) -> dict[str, Any]:
    content = [] if text is None else [{"type": "output_text", "text": text,
                                        "annotations": [], "logprobs": []}]
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": content}


def _call_item(call: dict[str, Any], status: str) -> dict[str, Any]:
    return {"type": "function_call", "id": "fc_" + call["id"].removeprefix("call_"),
            "call_id": call["id"], "name": call["function"]["name"],
            "arguments": call["function"]["arguments"] or "{}", "status": status}
