"""``Family``: how one model family marks reasoning and writes tool calls."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .calls import Call
from .reply import Reply, Request, partial_tail_cut, split_reasoning

__all__ = ["Family", "ReplyReader", "ToolParser"]

ToolParser = Callable[[str, Request], "tuple[str, list[Call]]"]
ReplyReader = Callable[[str, Request], Reply]


def no_tools(text: str, request: Request) -> tuple[str, list[Call]]:
    """A family without tool calls: everything is content."""
    return text, []


@dataclass(frozen=True)
class Family:
    """One row of the table: ``markers`` (all must appear in the template to recognise
    it), the thinking tags, and the parser of its tool calls (run on what follows the
    reasoning, only when the request offered tools)."""

    name: str
    markers: tuple[str, ...]
    tools: ToolParser = no_tools
    think: tuple[str, str] = ("<think>", "</think>")
    keeps_developer: bool = False  # Harmony has a developer role of its own
    # keep the whitespace around the reasoning block (llama.cpp does, for some families)
    raw_whitespace: bool = False
    # a family whose reply is not "reasoning block, then content" reads it whole
    reader: ReplyReader | None = None
    # the turn's own markup the model may write around its reply (Cohere's chatbot token
    # and end of turn); llama.cpp's grammar takes it, so it is never content
    turn: tuple[str, str] = ("", "")

    def unwrap(self, text: str, request: Request) -> str:
        """``text`` less the turn's opening and closing markup (or the closing markup's
        beginning, when a partial reply stops inside it)."""
        start, end = self.turn
        if start:
            text = text.removeprefix(start)
        if end:
            text = text.removesuffix(end)
            text = partial_tail_cut(text, end) if request.partial else text
        return text

    def parse(self, text: str, request: Request) -> Reply:
        """Reasoning first, then content and tool calls."""
        text = self.unwrap(text, request)
        if self.reader is not None:
            return self.reader(text, request)
        reasoning, rest = split_reasoning(text, request, *self.think, self.raw_whitespace)
        if request.tools:
            content, calls = self.tools(rest, request)
        else:
            content, calls = rest, []
        return Reply(content if self.raw_whitespace else content.lstrip(), reasoning, calls)
