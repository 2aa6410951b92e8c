"""Tool-call building blocks the families are made of: calls wrapped in tags, calls as a
JSON object ``{"name", "arguments"}``, a JSON list of them, and key/value parameters."""

from __future__ import annotations

from collections.abc import Callable

import regex

from .reply import Call, Request, dump_arguments, json_value, param_schema, scalar

__all__ = ["json_call", "json_call_list", "tagged_calls"]

# how JSON-style formats open a call; arguments are then the model's own JSON text
_NAME_FIRST = regex.compile(r'\s*\{\s*"(?:name|tool_name|function)"\s*:\s*"((?:[^"\\]|\\.)*)"'
                            r'\s*,\s*"(?:arguments|parameters)"\s*:\s*')

BodyReader = Callable[[str, Request, bool], "list[Call]"]


def value_text(text: str, pos: int, partial: bool) -> tuple[str, int] | None:
    """The JSON value's own text at ``pos`` and its end; in a partial reply an unfinished
    value is what there is so far."""
    found = json_value(text, pos)
    if found is not None:
        end = found[1]
        return text[pos:end].strip(), end
    if partial:
        return text[pos:].strip(), len(text)
    return None


def json_call(body: str, request: Request, complete: bool) -> list[Call]:
    """``{"name": ..., "arguments": {...}}`` (also ``parameters``, ``tool_name``)."""
    head = _NAME_FIRST.match(body)
    if head is None:
        return []
    got = value_text(body, head.end(), request.partial or not complete)
    if got is None:
        return []
    return [Call(head.group(1), got[0])]


def json_call_list(body: str, request: Request, complete: bool) -> list[Call]:
    """``[{"name": ..., "arguments": ...}, ...]``: calls one after another in a list."""
    calls: list[Call] = []
    pos = body.find("[")
    if pos < 0:
        return calls
    pos += 1
    while True:
        head = _NAME_FIRST.match(body, pos)
        if head is None:
            return calls
        got = value_text(body, head.end(), request.partial or not complete)
        if got is None:
            return calls
        calls.append(Call(head.group(1), got[0]))
        close = body.find("}", got[1])
        nxt = body.find(",", close) if close >= 0 else -1
        if close < 0 or nxt < 0:
            return calls
        pos = nxt + 1


def tagged_calls(text: str, request: Request, open_tag: str, close_tag: str,
                 read: BodyReader, section: str = "") -> tuple[str, list[Call]]:
    """Content up to the first ``open_tag`` (or the ``section`` tag that opens the calls),
    and the calls in each ``open_tag``...``close_tag`` block after it (the last may be cut
    off in a partial reply)."""
    first = text.find(section or open_tag)
    if first < 0:
        return text, []
    calls: list[Call] = []
    pos = first
    while (at := text.find(open_tag, pos)) >= 0:
        start = at + len(open_tag)
        stop = text.find(close_tag, start) if close_tag else -1
        body = text[start:] if stop < 0 else text[start:stop]
        calls.extend(read(body, request, stop >= 0 or not close_tag))
        if stop < 0:
            break
        pos = stop + len(close_tag)
    return text[:first], calls


def keyed_parameters(name: str, pairs: list[tuple[str, str]], request: Request) -> Call:
    """A call whose parameters came as key/text pairs: each value typed by the tool's
    schema, the arguments written as compact JSON (as llama.cpp writes them)."""
    args = {key: scalar(value, param_schema(request.tools, name, key)) for key, value in pairs}
    return Call(name, dump_arguments(args))
