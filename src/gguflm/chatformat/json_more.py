"""More families whose calls carry JSON: Apertus (``{"NAME": {args}}`` in a list), MiniMax
M1 (one call object a line in ``<tool_calls>``), GigaChat 3 (one call in a ``function call``
message; 3.1 after ``<|function_call|>``), Functionary v3.1 (``<function=NAME>{args}
</function>``) and v3.2 (``>>>NAME`` recipients)."""

from __future__ import annotations

import regex

from .calls import json_call, tagged_calls, value_text
from .reply import Call, Reply, Request, json_value, partial_tail_cut

__all__ = ["apertus", "functionary_v31", "functionary_v32", "gigachat", "gigachat31",
           "minimax_m1"]

_KEY = regex.compile(r'\s*[\[,]?\s*\{\s*"((?:[^"\\]|\\.)*)"\s*:\s*')


def _name_keyed(body: str, request: Request, complete: bool) -> list[Call]:
    """``[{"NAME": {args}}, ...]``: each call an object whose one key is the tool's name."""
    calls: list[Call] = []
    pos = 0
    while (head := _KEY.match(body, pos)) is not None:
        got = value_text(body, head.end())
        if got is None:
            break
        calls.append(Call(head.group(1), got[0] or "{"))
        close = body.find("}", got[1])
        if close < 0:
            break
        pos = close + 1
    return calls


def apertus(text: str, request: Request) -> tuple[str, list[Call]]:
    """Apertus: ``<|tools_prefix|>[{"NAME": {args}}, ...]<|tools_suffix|>``."""
    return tagged_calls(text, request, "<|tools_prefix|>", "<|tools_suffix|>", _name_keyed)


def _json_run(body: str, request: Request, complete: bool) -> list[Call]:
    """Call objects one after another (one a line), the last perhaps cut off."""
    calls: list[Call] = []
    pos = 0
    while (at := body.find("{", pos)) >= 0:
        found = json_call(body[at:], request, complete)
        calls.extend(found)
        whole = json_value(body, at)
        if not found or whole is None:
            break
        pos = whole[1]
    return calls


def minimax_m1(text: str, request: Request) -> tuple[str, list[Call]]:
    """MiniMax M1: ``<tool_calls>\\n{"name", "arguments"}\\n...</tool_calls>``."""
    return tagged_calls(text, request, "<tool_calls>", "</tool_calls>", _json_run)


_GIGA_SECTION = "<|message_sep|>\n\n"
_GIGA_CALL = _GIGA_SECTION + "function call<|role_sep|>\n"


def gigachat(text: str, request: Request) -> tuple[str, list[Call]]:
    """GigaChat 3: content, then one call as a message of its own (no parallel calls)."""
    cut = text.find(_GIGA_SECTION)
    if cut < 0 or not text.startswith(_GIGA_CALL, cut):
        return (partial_tail_cut(text, _GIGA_CALL) if request.partial else text), []
    return text[:cut], json_call(text[cut + len(_GIGA_CALL):], request, not request.partial)


def gigachat31(text: str, request: Request) -> tuple[str, list[Call]]:
    """GigaChat 3.1: content, then ``<|function_call|>{"name", "arguments"}``."""
    return tagged_calls(text, request, "<|function_call|>", "", json_call)


def _named_tag_call(body: str, request: Request, complete: bool) -> list[Call]:
    """``NAME>{args}``: what follows ``<function=``."""
    close = body.find(">")
    if close < 0:
        return []
    got = value_text(body, close + 1)
    return [Call(body[:close].strip(), got[0])] if got is not None else []


def functionary_v31(text: str, request: Request) -> tuple[str, list[Call]]:
    """Functionary v3.1: content, then ``<function=NAME>{args}</function>`` calls."""
    return tagged_calls(text, request, "<function=", "</function>", _named_tag_call)


_ALL = "all\n"


def functionary_v32(text: str, request: Request) -> Reply:
    """Functionary v3.2: the generation prompt ends with ``>>>``; the reply names its
    recipient: ``all\\n`` then content, or ``NAME\\n{args}`` for one call. As in llama.cpp,
    a reply that opens with content is content to its end (calls after it are not read)."""
    if text.startswith(_ALL):
        return Reply(text[len(_ALL):])
    if request.partial and _ALL.startswith(text):
        return Reply()
    line = text.find("\n")
    if line < 0 and request.partial:
        return Reply()  # the recipient is still being written
    got = value_text(text, line + 1) if line >= 0 and request.tools else None
    if got is None:
        return Reply(text)
    return Reply("", "", [Call(text[:line].strip(), got[0])])
