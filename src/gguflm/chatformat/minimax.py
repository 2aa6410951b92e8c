"""MiniMax M3: ``<mm:think>...</mm:think>`` reasoning (or a bare ``</mm:think>`` when it
is off), content, then calls in a ``]<]minimax[>[<tool_call>`` section, every tag there led
by the ``]<]minimax[>[`` namespace token: ``<invoke name="NAME">`` with one ``<KEY>VALUE
</KEY>`` element per argument, typed by the tool's schema."""

from __future__ import annotations

from .calls import tagged_calls
from .reply import Call, Reply, Request, partial_tail_cut
from .xml_families import ParamSyntax, xml_reader

__all__ = ["minimax_m3"]

_NS = "]<]minimax[>["
_THINK, _THINK_END = "<mm:think>", "</mm:think>"
_SYNTAX = ParamSyntax("", '">', _NS + "<", ">", "", _NS + "</")
_read_invoke = xml_reader(_SYNTAX)


def _tools(text: str, request: Request) -> tuple[str, list[Call]]:
    return tagged_calls(text, request, _NS + '<invoke name="', _NS + "</invoke>", _read_invoke,
                        section=_NS + "<tool_call>")


def _reasoning(text: str, request: Request) -> tuple[str, str] | None:
    """``(reasoning, rest)``: a ``<mm:think>`` block at the reply's start, or the bare end
    tag (thinking off); None while a partial reply is still writing one of the tags."""
    if text.startswith(_THINK_END):
        return "", text[len(_THINK_END):]
    if not text.startswith(_THINK):
        if request.partial and text and (_THINK.startswith(text) or _THINK_END.startswith(text)):
            return None
        return "", text
    body = text[len(_THINK):].lstrip()
    stop = body.find(_THINK_END)
    if stop < 0:
        return (partial_tail_cut(body, _THINK_END) if request.partial else body), ""
    return body[:stop], body[stop + len(_THINK_END):]


def minimax_m3(text: str, request: Request) -> Reply:
    """Reasoning, content and calls of a MiniMax M3 reply."""
    split = _reasoning(text, request) if request.extract_reasoning else ("", text)
    if split is None:
        return Reply()
    reasoning, rest = split
    if not request.tools:
        return Reply(rest, reasoning)
    content, calls = _tools(rest, request)
    return Reply(content, reasoning, calls)
