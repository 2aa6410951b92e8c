"""``Family``: how one model family marks reasoning and writes tool calls."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .calls import Call
from .learned import learned_reasoning
from .reply import Reply, Request, Spacing, partial_tail_cut, split_reasoning

__all__ = ["Family", "ReplyReader", "ToolParser"]

ToolParser = Callable[[str, Request], "tuple[str, list[Call]]"]
ReplyReader = Callable[[str, Request], Reply]
MessageRewrite = Callable[[list[dict[str, Any]]], list[dict[str, Any]]]


def no_tools(text: str, request: Request) -> tuple[str, list[Call]]:
    """A family without tool calls: everything is content."""
    return text, []


@dataclass(frozen=True)
class Family:
    """One row of the table: ``markers`` (all must appear in the template to recognise
    it, and none of ``absent``), the thinking tags, and the parser of its tool calls (run
    on what follows the reasoning, only when the request offered tools)."""

    name: str
    markers: tuple[str, ...]
    tools: ToolParser = no_tools
    think: tuple[str, str] = ("<think>", "</think>")
    keeps_developer: bool = False  # Harmony has a developer role of its own
    # where the family's own parser skips whitespace around the reasoning block
    spacing: Spacing = Spacing()
    # a family whose reply is not "reasoning block, then content" reads it whole
    reader: ReplyReader | None = None
    # the turn's own markup the model may write around its reply (Cohere's chatbot token
    # and end of turn); llama.cpp's grammar takes it, so it is never content
    turn: tuple[str, str] = ("", "")
    # a rewrite of the messages llama.cpp makes for this family before rendering
    prepare: MessageRewrite | None = None
    # llama.cpp has a parser of its own for this family; the others it learns from the
    # template, and reads calls only where the template can write calls in its history
    specialized: bool = False
    absent: tuple[str, ...] = ()
    # markers that also end the reasoning (without being taken: the calls they open follow)
    think_stops: tuple[str, ...] = ()
    # for a learnt family, set per template: its reasoning tags with the whitespace the
    # template writes after them, and whether the template can write calls at all
    learned: tuple[str, str] | None = None
    template_calls: bool = True

    def matches(self, template_text: str) -> bool:
        """Whether ``template_text`` is this family's (all markers, none of ``absent``)."""
        return all(m in template_text for m in self.markers) and \
            not any(m in template_text for m in self.absent)

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
        if self.learned is not None:
            return self._parse_learned(text, request, self.learned)
        reasoning, rest = split_reasoning(text, request, *self.think, self.spacing,
                                          self.think_stops)
        if request.tools and self.template_calls:
            content, calls = self.tools(rest, request)
        else:
            content, calls = rest, []
        return Reply(content.lstrip() if self.spacing.content else content, reasoning, calls)

    def _parse_learned(self, text: str, request: Request, tags: tuple[str, str]) -> Reply:
        """A family whose reasoning tags llama.cpp learns from the template: content is
        kept as written, except whitespace before it when a reasoning block or calls could
        have come first."""
        reasoning, rest = learned_reasoning(text, request, tags, self.think_stops)
        if request.tools and self.template_calls:
            content, calls = self.tools(rest if any(tags) else rest.lstrip(), request)
            return Reply(content, reasoning, calls)
        return Reply(rest, reasoning)
