"""A reply read as it streams: the family's parser run again on the text so far, and what it
adds since the last run given out as OpenAI deltas (``reasoning_content``, ``content``,
``tool_calls``), as llama-server does; a tool call goes out whole, once its arguments are.

A parse is linear in the text, so parsing after every token would cost the square of a long
reply: past ``_EVERY`` characters a new parse waits until the text has grown by a
``1/_GROWTH`` part (a 1 MB reply is parsed a few hundred times, and its deltas arrive at
most that much late). The last parse, on the whole reply, is the message a non-streamed
response returns; the deltas add up to it, because each is what a parse added to the one
before (text a parse no longer shows, which a partial parse should never have given, is not
taken back: ``diverged`` records it).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from .format import ChatFormat
from .render import thinking_enabled
from .reply import Reply, Request

__all__ = ["ReplyStream"]

_EVERY = 4096
_GROWTH = 32


class ReplyStream:
    """One reply of ``fmt`` to a request with ``tools`` (None: calls are not read) and
    ``kwargs``; ``new_id`` names each call."""

    def __init__(self, fmt: ChatFormat, generation_prompt: str,
                 tools: Sequence[Mapping[str, Any]] | None, kwargs: Mapping[str, Any],
                 reasoning_format: str, new_id: Callable[[], str]) -> None:
        self.fmt, self.new_id = fmt, new_id
        self.request = Request(generation_prompt=generation_prompt, tools=list(tools or []),
                               thinking=thinking_enabled(kwargs), partial=True,
                               extract_reasoning=reasoning_format != "none")
        self.pieces: list[str] = []
        self.length = self.parsed_at = 0
        self.sent = Reply()  # what the deltas so far add up to
        self.ids: list[str] = []
        self.last: Reply | None = None
        self.diverged = False

    def feed(self, text: str) -> list[dict[str, Any]]:
        """The deltas ``text`` (the next piece of the reply) adds."""
        self.pieces.append(text)
        self.length += len(text)
        grown = self.length - self.parsed_at
        if not text or self.length > _EVERY and grown * _GROWTH < self.length:
            return []
        return self._deltas(partial=True)

    def finish(self) -> list[dict[str, Any]]:
        """The deltas the whole reply adds to what was sent."""
        return self._deltas(partial=False)

    def result(self) -> Reply:
        """The whole reply, parsed (after ``finish``), with the calls' ids."""
        if self.last is None:
            self.finish()
        assert self.last is not None
        return self.last

    def _deltas(self, partial: bool) -> list[dict[str, Any]]:
        text = "".join(self.pieces)
        self.pieces = [text]
        if partial and _ends_inside(text, self.fmt.family.think[0]):
            return []  # "<thi": a tag or text, the next piece says
        self.parsed_at = self.length
        reply = self.fmt.family.parse(text, replace(self.request, partial=partial))
        for i, call in enumerate(reply.calls):
            if i == len(self.ids):
                self.ids.append(self.new_id())
            call.id = self.ids[i]
        self.last = reply
        out = []
        for field, key in (("reasoning", "reasoning_content"), ("content", "content")):
            added = self._added(getattr(self.sent, field), getattr(reply, field))
            if added:
                setattr(self.sent, field, getattr(self.sent, field) + added)
                out.append({key: added})
        out.extend(self._call_deltas(reply, partial))
        return out

    def _added(self, sent: str, now: str) -> str:
        if now.startswith(sent):
            return now[len(sent):]
        self.diverged = True
        return ""

    def _call_deltas(self, reply: Reply, partial: bool) -> list[dict[str, Any]]:
        """Each call whole, once its arguments are (whole JSON in a partial reply; the
        last parse gives the rest): the shapers of every API send a call in one piece."""
        out = []
        for i, call in enumerate(reply.calls[len(self.sent.calls):], len(self.sent.calls)):
            if partial and not _whole_json(call.arguments):
                break
            self.sent.calls.append(call)
            out.append({"tool_calls": [{"index": i, "id": call.id, "type": "function",
                                        "function": {"name": call.name,
                                                     "arguments": call.arguments}}]})
        return out


def _ends_inside(text: str, tag: str) -> bool:
    """``text`` ends with a beginning of ``tag`` (not the whole of it)."""
    return any(text.endswith(tag[:k]) for k in range(1, len(tag)))


def _whole_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True
