"""Tool-call building blocks the families are made of: calls wrapped in tags, calls as a
JSON object ``{"name", "arguments"}``, a JSON list of them, and key/value parameters."""

from __future__ import annotations

from collections.abc import Callable

import regex

from .reply import Call, Request, dump_arguments, json_value, param_schema, partial_tail_cut, scalar

__all__ = ["json_call", "json_call_list", "tagged_calls"]

# how JSON-style formats open a call; arguments are then the model's own JSON text
_NAME_FIRST = regex.compile(r'\s*\{\s*"(?:name|tool_name|function)"\s*:\s*"((?:[^"\\]|\\.)*)"'
                            r'\s*,\s*"(?:arguments|parameters)"\s*:\s*')

# a partial call whose name is written but whose arguments are not begun: llama.cpp then
# reports the call with arguments "{"
_NAME_ONLY = regex.compile(r'\s*\{\s*"(?:name|tool_name|function)"\s*:\s*"((?:[^"\\]|\\.)*)"'
                           r'\s*(?:,\s*(?:"[A-Za-z_]*"?\s*(?::\s*)?)?)?$')

BodyReader = Callable[[str, Request, bool], "list[Call]"]


def value_text(text: str, pos: int, partial: bool = True) -> tuple[str, int] | None:
    """The JSON value's own text at ``pos`` and its end; an unfinished value is what there
    is so far (llama.cpp reads replies leniently, finished or not), unless ``partial`` is
    False."""
    found = json_value(text, pos)
    if found is not None:
        end = found[1]
        return text[pos:end].strip(), end
    if partial:
        return text[pos:].strip(), len(text)
    return None


def _named_only(body: str, pos: int) -> list[Call]:
    """The call a cut-off reply has named but not given arguments yet (none otherwise)."""
    head = _NAME_ONLY.match(body, pos)
    return [Call(head.group(1), "{")] if head is not None else []


def json_call(body: str, request: Request, complete: bool) -> list[Call]:
    """``{"name": ..., "arguments": {...}}`` (also ``parameters``, ``tool_name``)."""
    head = _NAME_FIRST.match(body)
    if head is None:
        return _named_only(body, 0)
    got = value_text(body, head.end())
    if got is None:
        return []
    return [Call(head.group(1), got[0] or "{")]  # arguments not begun: llama.cpp says "{"


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
            return calls + _named_only(body, pos)
        got = value_text(body, head.end())
        if got is None:
            return calls
        calls.append(Call(head.group(1), got[0] or "{"))
        close = body.find("}", got[1])
        nxt = body.find(",", close) if close >= 0 else -1
        if close < 0 or nxt < 0:
            return calls
        pos = nxt + 1


def _first(text: str, tags: tuple[str, ...]) -> int:
    found = [at for tag in tags if (at := text.find(tag)) >= 0]
    return min(found) if found else -1


def tagged_calls(text: str, request: Request, open_tag: str, close_tag: str,
                 read: BodyReader, section: str | tuple[str, ...] = "") -> tuple[str, list[Call]]:
    """Content up to the first ``open_tag`` (or the ``section`` tag that opens the calls;
    one of several spellings), and the calls in each ``open_tag``...``close_tag`` block
    after it (the last may be cut off in a partial reply)."""
    sections = (section,) if isinstance(section, str) else section
    openers = tuple(s for s in sections if s) or (open_tag,)
    first = _first(text, openers)
    if first < 0:  # a partial reply may stop inside the opening tag: that is no content
        if request.partial:
            text = min((partial_tail_cut(text, tag) for tag in openers), key=len)
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
