"""Python-style tool calls (LFM2 / LFM2.5): ``<|tool_call_start|>[f(a="x", b=3), g()]
<|tool_call_end|>``. Values are Python or JSON literals (strings in either quote, numbers,
``True``/``true``, ``None``/``null``, lists, dicts); the arguments come back as compact JSON,
as llama.cpp writes them, and a call cut off mid-value gives the JSON written so far.

Every value is matched by one anchored regex or one character test at a known offset, so a
body is read in one forward pass."""

from __future__ import annotations

import json
from typing import Any

import regex

from .calls import tagged_calls
from .reply import Call, Request, dump_arguments, partial_tail_cut

__all__ = ["pythonic"]

_OPEN, _CLOSE = "<|tool_call_start|>", "<|tool_call_end|>"
_SPACE = regex.compile(r"\s*")
_NAME = regex.compile(r"[A-Za-z_][\w.\-]*")
_STRING = regex.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', regex.S)
_NUMBER = regex.compile(r"-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?")
_WORD = regex.compile(r"True|False|None|true|false|null")
_WORDS = {"True": True, "False": False, "None": None,
          "true": True, "false": False, "null": None}


class _Cut(Exception):
    """The body stops inside a value; ``so_far`` is that value's JSON text so far."""

    def __init__(self, so_far: str) -> None:
        super().__init__(so_far)
        self.so_far = so_far


def _skip(text: str, pos: int) -> int:
    return _SPACE.match(text, pos).end()


def _string(literal: str) -> str:
    """A Python string literal's text, either quote, its escapes kept as JSON reads them."""
    body = literal[1:-1]
    if literal[0] == "'":
        body = body.replace("\\'", "'").replace('"', '\\"')
    try:
        return json.loads(f'"{body}"')
    except json.JSONDecodeError:
        return body  # an escape JSON lacks: the text as written


def _cut_string(rest: str) -> str:
    """A string cut off after its opening quote, as a JSON prefix (no closing quote; a
    half-written escape dropped)."""
    body = rest[1:]
    if body.endswith("\\") and not body.endswith("\\\\"):
        body = body[:-1]
    return json.dumps(_string(rest[0] + body + rest[0]), ensure_ascii=False)[:-1]


def _value(text: str, pos: int) -> tuple[Any, int]:
    """The literal at ``pos`` and where it ends; ``_Cut`` when the text stops inside it."""
    pos = _skip(text, pos)
    if pos >= len(text):
        raise _Cut("")
    first = text[pos]
    if first in "\"'":
        found = _STRING.match(text, pos)
        if found is None:
            raise _Cut(_cut_string(text[pos:]))
        return _string(found.group()), found.end()
    if first in "[{":
        return _container(text, pos)
    found = _NUMBER.match(text, pos) or _WORD.match(text, pos)
    if found is None:
        raise _Cut(text[pos:].strip())
    word = found.group()
    return (_WORDS[word] if word in _WORDS else json.loads(word)), found.end()


def _container(text: str, pos: int) -> tuple[Any, int]:
    """A list ``[v, ...]`` or a dict ``{k: v, ...}`` at ``pos``."""
    is_dict = text[pos] == "{"
    closing = "}" if is_dict else "]"
    items: list[Any] = []
    pairs: dict[Any, Any] = {}
    start, pos = pos, _skip(text, pos + 1)
    while pos < len(text) and text[pos] != closing:
        try:
            item, pos = _value(text, pos)
            if is_dict:
                pos = _skip(text, pos)
                if not text.startswith(":", pos):
                    raise _Cut("")
                pairs[item], pos = _value(text, pos + 1)
            else:
                items.append(item)
        except _Cut:
            raise _Cut(text[start:].strip()) from None
        pos = _skip(text, pos)
        if text.startswith(",", pos):
            pos = _skip(text, pos + 1)
    if pos >= len(text):
        raise _Cut(text[start:].strip())
    return (pairs if is_dict else items), pos + 1


def _arguments(text: str, pos: int) -> tuple[str, int, bool]:
    """``k=v, ...`` up to the call's ``)``: the arguments as JSON text, where they end,
    and whether the call was complete."""
    args: dict[str, Any] = {}
    pos = _skip(text, pos)
    while not text.startswith(")", pos):
        key = _NAME.match(text, pos)
        equals = _skip(text, key.end()) if key else pos
        if key is None or not text.startswith("=", equals):
            return _open_json(args, ""), len(text), False
        try:
            args[key.group()], pos = _value(text, equals + 1)
        except _Cut as cut:
            return _open_json(args, json.dumps(key.group()) + ":" + cut.so_far), len(text), False
        pos = _skip(text, pos)
        if text.startswith(",", pos):
            pos = _skip(text, pos + 1)
        elif not text.startswith(")", pos):
            return _open_json(args, ""), len(text), False
    return dump_arguments(args), pos + 1, True


def _open_json(args: dict[str, Any], tail: str) -> str:
    """The complete arguments so far, left open, with the one being written after them."""
    head = dump_arguments(args)[:-1]
    if tail:
        head += ("," if args else "") + tail
    return head


def _call_list(body: str, request: Request, complete: bool) -> list[Call]:
    """``[name(args), ...]``; a call cut off (partial reply) gives its arguments so far."""
    calls: list[Call] = []
    pos = _skip(body, 0)
    if not body.startswith("[", pos):
        return calls
    pos = _skip(body, pos + 1)
    while (name := _NAME.match(body, pos)) is not None:
        paren = _skip(body, name.end())
        if not body.startswith("(", paren):
            return calls  # the name is still being written
        arguments, pos, closed = _arguments(body, paren + 1)
        if not closed and not (request.partial or not complete):
            return calls
        calls.append(Call(name.group(), arguments))
        pos = _skip(body, pos)
        if not body.startswith(",", pos):
            return calls
        pos = _skip(body, pos + 1)
    return calls


def pythonic(text: str, request: Request) -> tuple[str, list[Call]]:
    """Content up to the first ``<|tool_call_start|>``, then the calls in each block; a
    partial reply's half-written start tag stays out of the content."""
    content, calls = tagged_calls(text, request, _OPEN, _CLOSE, _call_list)
    if request.partial and not calls and content == text:
        content = partial_tail_cut(content, _OPEN)
    return content, calls
