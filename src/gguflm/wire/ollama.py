"""Ollama's API (``/api/chat``, ``/api/generate``, ``/api/embed``, ``/api/embeddings``):
request bodies read into what to run and its ``GenerationSpec``, replies shaped as Ollama's
objects (streamed as NDJSON, the default), errors as ``{"error": message}``.

``options`` map to the generation fields (``num_predict`` -> ``max_tokens``, -1 and -2 both
"until the end"; ``stop``, the sampling parameters by their own names); the runner's knobs
(``num_ctx``, ``num_thread``, ``num_gpu``, ``num_batch``, ``use_mmap``, ...) are accepted and
have no effect: the server's context, threads and memory are set when it starts. ``format``
is ``"json"`` (any JSON object) or a JSON schema. ``keep_alive`` is how long the model
stays loaded after the request on a server of several models (model_pool.py).
``images`` are refused; ``/api/generate`` takes ``raw`` (the prompt as it
is) or renders ``system`` and ``prompt`` through the model's chat template, and refuses
``template`` (Go templates) and ``suffix``. ``think`` turns thinking on or off (a level:
the reasoning effort), and a chat's reasoning comes back in ``message.thinking``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ..engine.errors import InvalidRequestError
from ..engine.spec import FIELDS, Field, GenerationSpec, chat_extras, check_json_types
from ..replies import ChatReply

__all__ = ["ChatShaper", "GenerateShaper", "OllamaCall", "error_body", "ndjson",
           "parse_chat", "parse_embed", "parse_generate"]

_SAMPLING = {n: f for n, f in FIELDS.items() if f.kind == "sampling"}
# options Ollama's runner takes that gguflm sets at start (accepted, no effect)
RUNNER_OPTIONS = {"num_ctx", "num_keep", "num_batch", "num_gpu", "main_gpu", "num_thread",
                  "use_mmap", "use_mlock", "low_vram", "f16_kv", "vocab_only", "numa",
                  "penalize_newline", "tfs_z"}
_COMMON = {
    "model": Field("wire", (str,), "a string"),
    "format": Field("wire", (str, dict), "\"json\" or a JSON schema"),
    "options": Field("wire", (dict,), "an object"),
    "stream": Field("wire", (bool,), "a boolean"),
    "keep_alive": Field("wire", (str, int, float), "a duration"),
    "think": Field("wire", (bool, str), "a boolean"),
}
CHAT_FIELDS = _COMMON | {"messages": Field("wire", (list,), "a list of messages"),
                         "tools": Field("wire", (list,), "a list of tools")}
GENERATE_FIELDS = _COMMON | {
    "prompt": Field("wire", (str,), "a string"), "system": Field("wire", (str,), "a string"),
    "template": Field("wire", (str,), "a string"), "suffix": Field("wire", (str,), "a string"),
    "raw": Field("wire", (bool,), "a boolean"), "context": Field("wire", (list,), "token ids"),
    "images": Field("wire", (list,), "a list of images")}


@dataclass
class OllamaCall:
    """What a chat or generate request runs: ``messages`` (a conversation) or ``prompt``
    (raw text, ``context`` ids before it), its spec, and whether to stream."""

    spec: GenerationSpec
    stream: bool
    messages: list[dict[str, Any]] | None = None
    prompt: str | None = None
    context: list[int] | None = None


def error_body(e: Any) -> dict[str, Any]:
    return {"error": str(e)}


def ndjson(item: dict[str, Any]) -> bytes:
    return json.dumps(item, ensure_ascii=False).encode("utf-8") + b"\n"


def parse_chat(body: Mapping[str, Any]) -> OllamaCall:
    check_json_types(body, CHAT_FIELDS)
    messages = body.get("messages") or []
    chat = [_message(m, f"messages.{i}") for i, m in enumerate(messages)]
    fields = _options(body) | _format(body) | _think(body) | chat_extras(body)
    if body.get("tools"):
        fields["tools"] = body["tools"]
    spec = GenerationSpec.from_body("chat", fields, fields.pop("max_tokens", None))
    return OllamaCall(spec, body.get("stream", True) is not False, messages=chat)


def _think(body: Mapping[str, Any]) -> dict[str, Any]:
    """Ollama's ``think``: true or false turns the template's thinking on or off; a level
    ("low", "medium", "high": gpt-oss) is the reasoning effort."""
    think = body.get("think")
    if think is None:
        return {}
    if isinstance(think, bool):
        return {"think": think}
    if think not in ("low", "medium", "high"):
        raise InvalidRequestError("think must be true, false, \"low\", \"medium\" or "
                                  "\"high\"", param="think")
    return {"reasoning_effort": think}


def parse_generate(body: Mapping[str, Any]) -> OllamaCall:
    check_json_types(body, GENERATE_FIELDS)
    if body.get("images"):
        raise InvalidRequestError("images are not supported (gguflm runs text models)",
                                  param="images")
    for name in ("template", "suffix"):
        if body.get(name):
            raise InvalidRequestError(f"'{name}' is not supported (use raw, or the model's "
                                      "own chat template)", param=name)
    fields = _options(body) | _format(body) | _think(body)
    spec = GenerationSpec.from_body("chat", fields, fields.pop("max_tokens", None))
    stream = body.get("stream", True) is not False
    prompt = body.get("prompt") or ""
    if body.get("raw"):
        return OllamaCall(spec, stream, prompt=prompt, context=_context(body))
    system = [{"role": "system", "content": body["system"]}] if body.get("system") else []
    return OllamaCall(spec, stream, messages=system + [{"role": "user", "content": prompt}])


def parse_embed(body: Mapping[str, Any], old: bool = False) -> tuple[Any, bool]:
    """``/api/embed``'s input (or the older ``/api/embeddings``' prompt) and whether to
    normalize (the older route's vectors are not)."""
    check_json_types(body, {"model": _COMMON["model"], "options": _COMMON["options"],
                            "input": Field("wire", (str, list), "a string or a list"),
                            "prompt": Field("wire", (str,), "a string")})
    value = body.get("prompt" if old else "input")
    if value is None:
        raise InvalidRequestError(f"'{'prompt' if old else 'input'}' is required",
                                  param="prompt" if old else "input")
    return value, not old


def _context(body: Mapping[str, Any]) -> list[int] | None:
    ctx = body.get("context")
    if ctx is not None and not all(isinstance(t, int) and not isinstance(t, bool)
                                   for t in ctx):
        raise InvalidRequestError("'context' must be a list of token ids", param="context")
    return ctx


def _message(m: Any, where: str) -> dict[str, Any]:
    if not isinstance(m, dict) or not isinstance(m.get("role"), str):
        raise InvalidRequestError(f"{where}: expected an object with a role", param="messages")
    if m.get("images"):
        raise InvalidRequestError(f"{where}.images: images are not supported (gguflm runs "
                                  "text models)", param="messages")
    out: dict[str, Any] = {"role": m["role"], "content": m.get("content") or ""}
    calls = m.get("tool_calls")
    if calls:
        out["tool_calls"] = [_call(c, f"{where}.tool_calls.{j}", j) for j, c in
                             enumerate(calls)]
    if m["role"] == "tool" and isinstance(m.get("tool_name"), str):
        out["name"] = m["tool_name"]
    return out


def _call(c: Any, where: str, j: int) -> dict[str, Any]:
    fn = c.get("function") if isinstance(c, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise InvalidRequestError(f"{where}: expected {{'function': {{'name', 'arguments'}}}}",
                                  param="messages")
    args = fn.get("arguments") or {}
    return {"id": f"call_{j}", "type": "function", "function": {
        "name": fn["name"], "arguments": args if isinstance(args, str) else json.dumps(args)}}


def _options(body: Mapping[str, Any]) -> dict[str, Any]:
    """The generation fields ``options`` gives (type-checked as the table says)."""
    options = body.get("options") or {}
    out = {k: v for k, v in options.items() if k in _SAMPLING and v is not None}
    check_json_types(out, _SAMPLING)
    if options.get("stop") is not None:
        out["stop"] = options["stop"]
    n = options.get("num_predict")
    if n is not None:
        if isinstance(n, bool) or not isinstance(n, int) or n < -2:
            raise InvalidRequestError("options.num_predict must be an integer of at least "
                                      "-2", param="options.num_predict")
        out["max_tokens"] = -1 if n < 0 else n
    return out


def _format(body: Mapping[str, Any]) -> dict[str, Any]:
    fmt = body.get("format")
    if fmt in (None, ""):
        return {}
    if fmt == "json":
        return {"response_format": {"type": "json_object"}}
    if isinstance(fmt, dict):
        return {"json_schema": fmt}
    raise InvalidRequestError("format must be \"json\" or a JSON schema", param="format")


def _stamp() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _final(seq: Any) -> dict[str, Any]:
    """The last object's fields: why it ended and its counts and durations (ns)."""
    t = seq.timings
    ns = 1e9
    return {"done": True, "done_reason": "length" if seq.finish_reason == "length" else "stop",
            "total_duration": int(max(t.ended - t.submitted, 0) * ns), "load_duration": 0,
            "prompt_eval_count": len(seq.prompt_ids),
            "prompt_eval_duration": int(max(t.prompt_done - t.started, 0) * ns),
            "eval_count": len(seq.tokens),
            "eval_duration": int(max(t.ended - t.prompt_done, 0) * ns)}


class ChatShaper:
    """``/api/chat``'s reply: one object per piece of content (or tool call), then the last
    with ``done`` and the counts; or the whole message at once."""

    def __init__(self, model_id: str, plan: Any) -> None:
        self.model_id = model_id
        self.reply = ChatReply(plan)

    def _object(self, message: dict[str, Any], done: bool = False) -> dict[str, Any]:
        return {"model": self.model_id, "created_at": _stamp(),
                "message": {"role": "assistant", "content": ""} | message, "done": done}

    def opening(self) -> list[dict[str, Any]]:
        return []

    def piece(self, text: str) -> list[dict[str, Any]]:
        return self._objects(self.reply.feed(text))

    def _objects(self, deltas: list[dict[str, Any]]) -> list[dict[str, Any]]:
        # ollama sends a tool call whole, in the last object's message (below)
        return [self._object(_ollama_delta(d)) for d in deltas if not d.get("tool_calls")]

    def closing(self, seq: Any) -> list[dict[str, Any]]:
        out = self._objects(self.reply.finish())
        calls = self.reply.message().get("tool_calls")
        last = {"tool_calls": [_ollama_call(c) for c in calls]} if calls else {}
        return out + [self._object(last) | _final(seq)]

    def whole(self, seq: Any, text: str) -> dict[str, Any]:
        self.reply.feed(text)
        self.reply.finish()
        msg = self.reply.message()
        message: dict[str, Any] = {"content": msg.get("content") or ""}
        if msg.get("reasoning_content"):
            message["thinking"] = msg["reasoning_content"]
        if msg.get("tool_calls"):
            message["tool_calls"] = [_ollama_call(c) for c in msg["tool_calls"]]
        return self._object(message) | _final(seq)


class GenerateShaper:
    """``/api/generate``'s reply: ``response`` pieces, then the last object with ``done``,
    the counts and ``context`` (the prompt's and the reply's token ids)."""

    def __init__(self, model_id: str) -> None:
        self.model_id = model_id

    def _object(self, text: str) -> dict[str, Any]:
        return {"model": self.model_id, "created_at": _stamp(), "response": text,
                "done": False}

    def opening(self) -> list[dict[str, Any]]:
        return []

    def piece(self, text: str) -> list[dict[str, Any]]:
        return [self._object(text)]

    def closing(self, seq: Any) -> list[dict[str, Any]]:
        return [self._object("") | _final(seq) | {"context": seq.prompt_ids + seq.tokens}]

    def whole(self, seq: Any, text: str) -> dict[str, Any]:
        return self._object(text) | _final(seq) | {"context": seq.prompt_ids + seq.tokens}


def _ollama_delta(delta: dict[str, Any]) -> dict[str, Any]:
    if delta.get("reasoning_content"):
        return {"thinking": delta["reasoning_content"]}
    return {"content": delta.get("content") or ""}


def _ollama_call(call: dict[str, Any]) -> dict[str, Any]:
    fn = call["function"]
    try:
        args = json.loads(fn.get("arguments") or "{}")
    except ValueError:
        args = {}
    return {"function": {"name": fn["name"], "arguments": args}}
