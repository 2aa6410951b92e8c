"""Cohere's formats. Command R(+): ``Action:\\n```json\\n[{"tool_name", "parameters"}, ...]
```''. Cohere2 MoE: a marker-wrapped turn, ``<|START_THINKING|>reasoning<|END_THINKING|>``
then either ``<|START_TEXT|>content<|END_TEXT|>`` or ``<|START_ACTION|>[{"tool_call_id",
"tool_name", "parameters"}, ...]<|END_ACTION|>`` (content and calls never both). Command R7B:
the same with ``<|START_RESPONSE|>content<|END_RESPONSE|>``, content and then calls allowed."""

from __future__ import annotations

import regex

from .calls import value_text
from .json_families import json_list_after
from .reply import Call, Reply, Request, opened_tail, partial_tail_cut

__all__ = ["cohere2", "command_r", "command_r7b"]

# Command R writes its calls as a JSON list after "Action:" (the template's own words)
command_r = json_list_after("Action:")

_THINK, _THINK_END = "<|START_THINKING|>", "<|END_THINKING|>"
_TEXT, _TEXT_END = "<|START_TEXT|>", "<|END_TEXT|>"
_ACTION, _ACTION_END = "<|START_ACTION|>", "<|END_ACTION|>"
# where reasoning stops: its end tag, or the model going straight to its text or action
_REASONING_STOPS = (_THINK_END, _TEXT, _ACTION)
# llama.cpp's Cohere2 grammar fixes the keys' order
_CALL_HEAD = regex.compile(r'\s*\{\s*"tool_call_id"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,'
                           r'\s*"tool_name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,'
                           r'\s*"parameters"\s*:\s*')


def _cut_tags(text: str, tags: tuple[str, ...]) -> str:
    """``text`` less the longest beginning of any of ``tags`` that it ends with."""
    return min((partial_tail_cut(text, tag) for tag in tags), key=len)


def _reasoning(text: str, request: Request) -> tuple[str, str]:
    """``(reasoning, rest)``: the thinking block the generation prompt opened (or the reply
    opens), up to its end tag or the first text/action marker."""
    opened = opened_tail(request.generation_prompt, _THINK, _THINK_END) is not None
    if text.startswith(_THINK):
        text, opened = text[len(_THINK):], True
    if not opened:
        return "", text
    found = [(at, tag) for tag in _REASONING_STOPS if (at := text.find(tag)) >= 0]
    if not found:
        return (_cut_tags(text, _REASONING_STOPS) if request.partial else text), ""
    at, tag = min(found)
    rest = text[at:]
    return text[:at], rest.removeprefix(_THINK_END)


def _calls(body: str, request: Request) -> list[Call]:
    """``[{"tool_call_id", "tool_name", "parameters"}, ...]``; the last call may be cut
    off in a partial reply (its arguments so far)."""
    calls: list[Call] = []
    pos = body.find("[") + 1
    while pos > 0 and (head := _CALL_HEAD.match(body, pos)) is not None:
        got = value_text(body, head.end())
        if got is None:
            break
        calls.append(Call(head.group(2), got[0], head.group(1)))
        close = body.find("}", got[1])
        pos = body.find(",", close) + 1 if close >= 0 else 0
    return calls


def _between(text: str, start: str, end: str, request: Request) -> str:
    """What ``text`` (opening with ``start``) holds before ``end`` (or its partial tail)."""
    body = text[len(start):]
    stop = body.find(end)
    if stop >= 0:
        return body[:stop]
    return partial_tail_cut(body, end) if request.partial else body


def cohere2(text: str, request: Request) -> Reply:
    """Reasoning, then the text or the action block; a reply that fits neither (llama.cpp
    rejects it) is content as written, or nothing yet while it is partial."""
    reasoning, rest = _reasoning(text, request) if request.extract_reasoning else ("", text)
    if rest.startswith(_ACTION) and request.tools:
        return Reply("", reasoning, _calls(_between(rest, _ACTION, _ACTION_END, request),
                                           request))
    if rest.startswith(_TEXT):
        return Reply(_between(rest, _TEXT, _TEXT_END, request), reasoning)
    if request.partial:
        written = _cut_tags(rest, (_TEXT, _ACTION))
        return Reply("", reasoning) if not written else Reply()
    return Reply(rest, reasoning)


_RESPONSE, _RESPONSE_END = "<|START_RESPONSE|>", "<|END_RESPONSE|>"


def command_r7b(text: str, request: Request) -> Reply:
    """Reasoning, the wrapped response, then the action block (each optional); a reply
    that fits none of them is content as written."""
    reasoning, rest = _reasoning(text, request) if request.extract_reasoning else ("", text)
    rest = rest.lstrip()
    content = ""
    if rest.startswith(_RESPONSE):
        content = _between(rest, _RESPONSE, _RESPONSE_END, request)
        stop = rest.find(_RESPONSE_END)
        rest = rest[stop + len(_RESPONSE_END):].lstrip() if stop >= 0 else ""
    elif not rest.startswith(_ACTION):
        written = _cut_tags(rest, (_RESPONSE, _ACTION)) if request.partial else rest
        return Reply(written if written == rest else "", reasoning)
    if rest.startswith(_ACTION) and request.tools:
        body = _between(rest, _ACTION, _ACTION_END, request)
        return Reply(content, reasoning, _calls(body, request))
    return Reply(content, reasoning)
