"""Gemma 4: ``<|channel>thought\\n...<channel|>`` reasoning blocks between pieces of content,
and calls ``<|tool_call>call:NAME{key:value,...}<tool_call|>`` whose arguments are Gemma's
own object syntax: bare keys, strings in ``<|"|>`` quotes, JSON numbers, booleans, null,
lists. The arguments come back as JSON text (what there is of it in a partial reply)."""

from __future__ import annotations

import json
from typing import Any

from .reply import Call, Reply, Request, partial_tail_cut, text_until

__all__ = ["gemma4", "gemma4_messages"]

_TURN = "<|turn>model\n"
_CHANNEL, _CHANNEL_END = "<|channel>", "<channel|>"
_THOUGHT = "<|channel>thought"
_CALL, _CALL_END = "<|tool_call>call:", "<tool_call|>"
_QUOTE = '<|"|>'
_BARE_STOPS = ",}]"


def _string(text: str, pos: int) -> tuple[str, int, bool]:
    """A ``<|"|>`` string at ``pos``: its JSON, where it ends, whether it is closed."""
    stop = text.find(_QUOTE, pos + len(_QUOTE))
    if stop < 0:
        body = partial_tail_cut(text[pos + len(_QUOTE):], _QUOTE)
        return json.dumps(body, ensure_ascii=False)[:-1], len(text), False
    body = text[pos + len(_QUOTE):stop]
    return json.dumps(body, ensure_ascii=False), stop + len(_QUOTE), True


def _bare(text: str, pos: int) -> tuple[str, int]:
    """A number, boolean or null: the text up to the next delimiter."""
    end = pos
    while end < len(text) and text[end] not in _BARE_STOPS and not text[end].isspace():
        end += 1
    return text[pos:end], end


def to_json(text: str, pos: int) -> tuple[str, int, bool]:
    """The Gemma object at ``pos`` as JSON text, where it ends, and whether it closed; one
    forward pass, so a cut-off object gives the JSON written so far (and text that stops
    being an object ends it)."""
    out: list[str] = []
    closers: list[str] = []
    want_key = after_value = False
    while pos < len(text):
        ch = text[pos]
        if ch.isspace():
            pos += 1
        elif after_value and ch not in ",}]":
            break  # not an object any more
        elif want_key and ch != "}":
            colon = text.find(":", pos)
            if colon < 0:  # a key still being written: what there is of it
                out.append(json.dumps(text[pos:].strip(), ensure_ascii=False)[:-1])
                break
            out.append(json.dumps(text[pos:colon].strip(), ensure_ascii=False) + ":")
            pos, want_key = colon + 1, False
        elif ch in "{[":
            out.append(ch)
            closers.append("}" if ch == "{" else "]")
            pos, want_key = pos + 1, ch == "{"
        elif ch in "}]":
            out.append(ch)
            closers.pop()
            pos, want_key, after_value = pos + 1, False, True
            if not closers:
                return "".join(out), pos, True
        elif ch == ",":
            out.append(ch)
            pos, want_key, after_value = pos + 1, closers[-1] == "}", False
        elif len(text) - pos < len(_QUOTE) and _QUOTE.startswith(text[pos:]):
            out.append('"')  # a string's opening quote still being written
            break
        else:
            piece, pos, closed = _string(text, pos) if text.startswith(_QUOTE, pos) \
                else (*_bare(text, pos), True)
            out.append(piece)
            after_value = True
            if not closed or not piece:
                break
    return "".join(out), pos, False


def _thought(text: str, pos: int, request: Request, reply: Reply) -> int:
    """Read a ``<|channel>thought ... <channel|>`` block at ``pos`` into ``reply``; where
    it ends (``pos`` when there is none). Empty ``<|channel>`` openers before it are skipped."""
    start = pos
    while text.startswith(_CHANNEL, pos) and not text.startswith(_THOUGHT, pos):
        pos += len(_CHANNEL)
    if not text.startswith(_THOUGHT, pos):
        return start
    body_at = pos + len(_THOUGHT)
    stop = text.find(_CHANNEL_END, body_at)
    body = text[body_at:] if stop < 0 else text[body_at:stop]
    if stop < 0 and request.partial:
        body = partial_tail_cut(body, _CHANNEL_END)
    body = body.lstrip()
    if request.extract_reasoning:
        reply.reasoning += body
    else:
        reply.content += text[pos:len(text) if stop < 0 else stop + len(_CHANNEL_END)]
    return len(text) if stop < 0 else stop + len(_CHANNEL_END)




def _calls(text: str, pos: int, request: Request) -> list[Call]:
    calls: list[Call] = []
    while text.startswith(_CALL, pos):
        brace = text.find("{", pos + len(_CALL))
        if brace < 0:
            break  # the name is still being written
        args, end, closed = to_json(text, brace)
        calls.append(Call(text[pos + len(_CALL):brace], args))
        if not closed or not text.startswith(_CALL_END, end):
            break
        pos = end + len(_CALL_END)
    return calls


def gemma4(text: str, request: Request) -> Reply:
    """Reasoning blocks and content, then the calls (when tools were offered)."""
    opened = request.generation_prompt.rfind(_TURN)
    tail = request.generation_prompt[opened + len(_TURN):] if opened >= 0 else ""
    text = (tail + text).removeprefix(_TURN)
    tools = bool(request.tools)
    stops = (_CHANNEL, _CHANNEL_END, "<|tool_call>") if tools else (_CHANNEL, _CHANNEL_END)
    reply = Reply()
    pos = 0
    while pos < len(text):
        after = _thought(text, pos, request, reply)
        if after == pos and text.startswith(_CHANNEL, pos):
            break
        piece, pos = text_until(text, after, stops, request)
        reply.content += piece
        if pos == after and not text.startswith(_CHANNEL, pos):
            break
    if tools:
        call_at = text.find("<|tool_call>", pos)
        if call_at >= 0:
            reply.calls = _calls(text, call_at, request)
    return reply


def gemma4_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Older Gemma 4 templates read tool results from the assistant turn that made the
    calls (``tool_responses``), as llama.cpp arranges them: each assistant turn with calls
    takes the tool messages after it and the plain answer that follows them."""
    out: list[dict[str, Any]] = []
    i = 0
    while i < len(messages):
        msg = messages[i]
        if msg.get("role") != "assistant" or not msg.get("tool_calls"):
            out.append(msg)
            i += 1
            continue
        merged, i = _model_turn(messages, i)
        out.append(merged)
    return out


def _model_turn(messages: list[dict[str, Any]], i: int) -> tuple[dict[str, Any], int]:
    first = messages[i]
    calls = list(first["tool_calls"])
    merged: dict[str, Any] = {"role": "assistant", "tool_calls": calls}
    if isinstance(first.get("reasoning_content"), str):
        merged["reasoning_content"] = first["reasoning_content"]
    responses = []
    i += 1
    while i < len(messages) and messages[i].get("role") == "tool":
        responses.append(_tool_response(messages[i], calls, len(responses)))
        i += 1
    if responses:
        merged["tool_responses"] = responses
    if i < len(messages) and messages[i].get("role") == "assistant":
        nxt = messages[i]
        if not nxt.get("tool_calls") and nxt.get("content"):
            merged["content"] = nxt["content"]
            i += 1
    return merged, i


def _tool_response(message: dict[str, Any], calls: list, index: int) -> dict[str, Any]:
    content = message.get("content")
    response: Any = content
    if isinstance(content, str):
        try:
            response = json.loads(content)
        except json.JSONDecodeError:
            response = content
    name = ""
    if index < len(calls):
        name = (calls[index].get("function") or {}).get("name", "")
    return {"name": name or message.get("tool_call_id", ""), "response": response}
