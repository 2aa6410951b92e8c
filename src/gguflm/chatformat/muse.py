"""Muse Glimmer: a reply is a run of messages, each `` to=RECIPIENT<|message|>BODY``, the
next opened by ``<|eom|><|start|>assistant`` (the generation prompt opened the first).
``to=self`` is reasoning, ``to=user`` (or no recipient) the answer, any other recipient a
tool call whose body is ``<atem:function_calls><atem:invoke name="NAME"><atem:parameter
name="KEY">VALUE</atem:parameter>...</atem:invoke></atem:function_calls>``."""

from __future__ import annotations

from .reply import Call, Reply, Request, partial_tail_cut
from .xml_families import MUSE, xml_reader

__all__ = ["muse"]

_NEXT = "<|eom|><|start|>assistant"
_MESSAGE = "<|message|>"
_ENDS = ("<|eom|>", "<|eot|>")
_INVOKE, _INVOKE_END = "<atem:invoke ", "</atem:invoke>"
_read_invoke = xml_reader(MUSE)


def _body_end(text: str, pos: int) -> int:
    """Where the message body at ``pos`` ends (its end marker, else the reply's end)."""
    found = [at for tag in _ENDS if (at := text.find(tag, pos)) >= 0]
    return min(found) if found else len(text)


def _call(body: str, request: Request) -> list[Call]:
    at = body.find(_INVOKE)
    if at < 0:
        return []
    inner = body[at + len(_INVOKE):]
    stop = inner.find(_INVOKE_END)
    complete = stop >= 0 or not request.partial
    return _read_invoke(inner if stop < 0 else inner[:stop], request, complete)


def _recipient(header: str) -> str:
    header = header.strip()
    return header[len("to="):].strip() if header.startswith("to=") else ""


def muse(text: str, request: Request) -> Reply:
    """Reasoning, content and calls of a Muse Glimmer reply."""
    reply = Reply()
    pos = 0
    while pos < len(text):
        opened = text.find(_MESSAGE, pos)
        if opened < 0:
            break  # a header still being written
        recipient = _recipient(text[pos:opened])
        start = opened + len(_MESSAGE)
        stop = _body_end(text, start)
        body = text[start:stop]
        if stop == len(text) and request.partial:
            body = min((partial_tail_cut(body, tag) for tag in _ENDS), key=len)
        if recipient == "self" and request.extract_reasoning:
            reply.reasoning += body
        elif recipient in ("", "user", "self"):
            reply.content += body
        elif request.tools:
            reply.calls.extend(_call(body, request))
        if not text.startswith(_NEXT, stop):
            break
        pos = stop + len(_NEXT)
    return reply
