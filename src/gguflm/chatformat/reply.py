"""What every family's parser shares: the request it parses for, the reply it builds, and
the steps each format is made of (reasoning blocks, JSON values, argument objects).

Every step scans forward with ``str.find`` or one ``raw_decode`` from a known offset, so
parsing is linear in the reply's length (a 1 MB ``<think>`` costs one ``find``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

__all__ = ["STRICT", "Call", "Reply", "Request", "Spacing", "json_value", "split_reasoning",
           "text_until"]

_DECODER = json.JSONDecoder()


@dataclass
class Request:
    """What a reply is parsed for: the generation prompt that came before it (it may open a
    ``<think>``), the tools offered, whether thinking was on, and whether the reply is
    cut off (``partial``)."""

    generation_prompt: str = ""
    tools: list[dict[str, Any]] = field(default_factory=list)
    thinking: bool = True
    partial: bool = False
    extract_reasoning: bool = True


@dataclass
class Call:
    """One tool call; ``arguments`` is JSON text (a prefix of it in a partial reply)."""

    name: str
    arguments: str
    id: str = ""

    def as_openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class Reply:
    """A parsed reply: content, reasoning and calls."""

    content: str = ""
    reasoning: str = ""
    calls: list[Call] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"content": self.content, "reasoning_content": self.reasoning,
                "tool_calls": [c.as_openai() for c in self.calls]}


def opened_tail(generation_prompt: str, start: str, end: str) -> str | None:
    """What follows the thinking tag the generation prompt opened and did not close (the
    reply begins inside that block); None when it opened none."""
    at = generation_prompt.rfind(start) if start else -1
    if at < 0 or generation_prompt.find(end, at + len(start)) >= 0:
        return None
    return generation_prompt[at + len(start):]


def skip_pad(text: str, pad: str) -> str:
    """``text`` less as much of ``pad`` (whitespace that follows a tag in the template) as
    it starts with, character by character: llama.cpp takes that whitespace if it is there."""
    n = 0
    while n < len(pad) and n < len(text) and text[n] == pad[n]:
        n += 1
    return text[n:]


def closed_block(generation_prompt: str, start: str, end: str) -> tuple[str, str] | None:
    """``(reasoning, after)`` of a thinking block the generation prompt opened and closed
    itself (thinking turned off), with the prompt's text after it; None if it did not."""
    at = generation_prompt.rfind(start) if start else -1
    stop = generation_prompt.find(end, at + len(start)) if at >= 0 else -1
    if stop < 0:
        return None
    return generation_prompt[at + len(start):stop], generation_prompt[stop + len(end):]


def _block_end(body: str, end: str, stops: tuple[str, ...]) -> tuple[int, int]:
    """Where the reasoning in ``body`` stops, and where what follows it starts: at ``end``
    (taken) or at the first of ``stops`` (left for the calls it opens); (-1, -1) if none."""
    found = [(at, at + len(end)) for at in (body.find(end),) if at >= 0]
    found += [(at, at) for tag in stops if (at := body.find(tag)) >= 0]
    return min(found) if found else (-1, -1)


@dataclass(frozen=True)
class Spacing:
    """Where a family's own parser skips whitespace around the reasoning block (llama.cpp
    writes it as ``<<`` between parts): before the open tag, at the reasoning's start, at
    the content's start."""

    before: bool = True
    reasoning: bool = True
    content: bool = True


STRICT = Spacing(False, False, False)  # every character kept where it was written


def split_reasoning(text: str, request: Request, start: str, end: str,
                    spacing: Spacing = Spacing(), stops: tuple[str, ...] = ()) -> tuple[str, str]:
    """``(reasoning, rest)``: the thinking block at the start of ``text`` (opened there, or
    already by the generation prompt) and what follows it. A block that never closes is
    all reasoning; a block the generation prompt already closed is the only one (a later
    one is content, as in llama.cpp, which reads one block from prompt tail plus reply).
    ``stops`` also end the reasoning (they open calls); ``spacing`` says where whitespace
    is skipped. Whitespace at the end of ``start`` or ``end`` (as the template writes the
    tags) is taken when present."""
    if not start or not request.extract_reasoning:
        return "", text
    start, start_pad = start.rstrip(), start[len(start.rstrip()):]
    end, end_pad = end.rstrip(), end[len(end.rstrip()):]
    closed = closed_block(request.generation_prompt, start, end)
    if closed is not None:
        reasoning = skip_pad(closed[0], start_pad)
        return (reasoning if reasoning.strip() else ""), skip_pad(closed[1], end_pad) + text
    body = text.lstrip() if spacing.before else text
    if opened_tail(request.generation_prompt, start, end) is not None:
        body = body.removeprefix(start)  # the model may write the open tag again
    elif body.startswith(start):
        body = body[len(start):]
    else:
        return "", text
    body = skip_pad(body, start_pad)
    stop, after = _block_end(body, end, stops)
    if stop < 0:
        reasoning, rest = partial_tail_cut(body, end) if request.partial else body, ""
    else:
        rest = body[after:]
        reasoning, rest = body[:stop], (skip_pad(rest, end_pad) if after > stop else rest)
    reasoning = reasoning.lstrip() if spacing.reasoning else reasoning
    return (reasoning if reasoning.strip() else ""), rest


def partial_tail_cut(text: str, tag: str) -> str:
    """``text`` less any beginning of ``tag`` it ends with (a tag being written when a
    partial reply stops), so no half-written markup leaks into content."""
    for n in range(min(len(text), len(tag)), 0, -1):
        if tag.startswith(text[-n:]):
            return text[:-n]
    return text


def text_until(text: str, pos: int, stops: tuple[str, ...], request: Request
               ) -> tuple[str, int]:
    """The text from ``pos`` to the first of ``stops`` (or to the end, less a half-written
    stop in a partial reply) and where it ends."""
    found = [at for tag in stops if (at := text.find(tag, pos)) >= 0]
    if found:
        return text[pos:min(found)], min(found)
    body = text[pos:]
    if request.partial:
        body = min((partial_tail_cut(body, tag) for tag in stops), key=len)
    return body, len(text)


def json_value(text: str, pos: int) -> tuple[Any, int] | None:
    """The JSON value at ``pos`` (whitespace skipped) and where it ends; None if none
    parses there."""
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    try:
        return _DECODER.raw_decode(text, pos)
    except json.JSONDecodeError:
        return None


def dump_arguments(value: Any) -> str:
    """Arguments as llama.cpp writes what it rebuilt from parameters: compact-ish JSON."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def scalar(text: str, schema: dict[str, Any] | None) -> Any:
    """A parameter written as bare text (XML-style formats): a string when the tool's
    schema says so, else the JSON it spells (a number, true, an object), else the text."""
    if schema and schema.get("type") == "string":
        return text
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def param_schema(tools: list[dict[str, Any]], name: str, param: str) -> dict[str, Any] | None:
    """The JSON schema of parameter ``param`` of tool ``name``, if the request has it."""
    for tool in tools:
        function = tool.get("function") or {}
        if function.get("name") == name:
            props = (function.get("parameters") or {}).get("properties") or {}
            found = props.get(param)
            return found if isinstance(found, dict) else None
    return None
