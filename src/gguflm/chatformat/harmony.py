"""Harmony (gpt-oss): a reply is a run of messages, each a header then a body.

``<|channel|>analysis<|message|>...<|end|>`` is reasoning, ``<|channel|>commentary<|message|>
...<|end|>`` a preamble (content), ``<|channel|>final<|message|>...`` the answer (content,
to the end), and a header naming ``to=functions.NAME`` (before or after the channel) opens
a tool call whose body is its JSON arguments. Messages after the first are opened by
``<|start|>assistant`` (the generation prompt opened the first). As in llama.cpp, a tool
call or the final message ends the reply: anything after them is dropped.
"""

from __future__ import annotations

from .calls import value_text
from .reply import Call, Reply, Request, partial_tail_cut

__all__ = ["harmony"]

_START = "<|start|>assistant"
_MESSAGE = "<|message|>"
_CHANNEL = "<|channel|>"
_END = "<|end|>"
_RECIPIENT = " to=functions."


def _header(header: str) -> tuple[str, str | None]:
    """``(channel, tool name or None)`` of a message header; a stray ``<|channel|>``
    before the real one is skipped, and a ``<|constrain|>json`` after it ignored."""
    name = None
    at = header.find(_RECIPIENT)
    if at >= 0:
        tail = header[at + len(_RECIPIENT):]
        name = tail.split(_CHANNEL, 1)[0].split(None, 1)[0] if tail.strip() else ""
    channel_at = header.rfind(_CHANNEL)
    channel = ""
    if channel_at >= 0:
        words = header[channel_at + len(_CHANNEL):].split(None, 1)
        channel = words[0].split("<|", 1)[0] if words else ""
    return channel, name


def _tool_names(request: Request) -> set[str]:
    return {(t.get("function") or {}).get("name", "") for t in request.tools}


def _tool_call(text: str, pos: int, name: str, request: Request) -> list[Call]:
    """The call whose JSON arguments start at ``pos`` (what there is of them, partial)."""
    if name not in _tool_names(request):
        return []
    got = value_text(text, pos)
    return [Call(name, got[0])] if got is not None else []


def _body(text: str, pos: int, request: Request) -> tuple[str, int]:
    """A message body up to ``<|end|>`` and where the next message starts; an unended body
    runs to the end of the reply (less a half-written ``<|end|>`` in a partial one)."""
    stop = text.find(_END, pos)
    if stop < 0:
        body = text[pos:]
        return (partial_tail_cut(body, _END) if request.partial else body), len(text)
    nxt = stop + len(_END)
    if text.startswith(_START, nxt):
        nxt += len(_START)
    return text[pos:stop], nxt


def harmony(text: str, request: Request) -> Reply:
    """Reasoning, content and the (single, final) tool call of a Harmony reply."""
    reply = Reply()
    pos = 0
    while pos < len(text):
        opened = text.find(_MESSAGE, pos)
        if opened < 0:  # a header still being written
            break
        channel, name = _header(text[pos:opened])
        start = opened + len(_MESSAGE)
        if name is not None and request.tools:
            reply.calls = _tool_call(text, start, name, request)
            break
        body, pos = _body(text, start, request)
        if name is not None:
            continue  # a call to a tool that was not offered: llama.cpp drops it
        if channel == "analysis" and request.extract_reasoning:
            reply.reasoning += body
        elif channel == "analysis":
            reply.content += f"{_CHANNEL}analysis{_MESSAGE}{body}{_END}"
        else:
            reply.content += body
        if channel == "final":
            break
    return reply
