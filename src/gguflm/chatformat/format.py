"""``ChatFormat``: the one entry point of the chat-format layer."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from ..tokenizer.chat import ChatTemplate
from .analysis import learn_reasoning_tags
from .detect import detect_family
from .render import prepare_messages, probe_caps, render_prompt, thinking_enabled
from .reply import Reply, Request

__all__ = ["ChatFormat"]

# what parse renders to find the generation prompt when the caller gives no messages
_DEFAULT_MESSAGES = ({"role": "system", "content": "You are a helpful assistant."},
                     {"role": "user", "content": "Hello"})


class ChatFormat:
    """A chat template together with the family that writes replies for it."""

    def __init__(self, template_text: str | ChatTemplate, bos_token: str = "",
                 eos_token: str = "") -> None:
        """``template_text``: the template's source, or a ``ChatTemplate`` already made
        (a model's: its name, special tokens and limits are kept)."""
        if isinstance(template_text, ChatTemplate):
            self.template, template_text = template_text, template_text.source
        else:
            self.template = ChatTemplate(template_text, {"bos_token": bos_token,
                                                         "eos_token": eos_token})
        self.caps = probe_caps(self.template)
        family = detect_family(template_text)
        # llama.cpp learns the reasoning tags of templates it has no parser of its own for,
        # and reads their calls only where the template can write calls
        self.reasoning_tags: tuple[str, str] | None = None
        if not family.specialized:
            tags = learn_reasoning_tags(self.template, template_text, self.caps.tool_calls)
            self.reasoning_tags = (tags.start, tags.end)
            family = replace(family, learned=self.reasoning_tags,
                             think=(tags.start.strip(), tags.end.strip()),
                             template_calls=self.caps.tool_calls)
        self.family = family

    @property
    def name(self) -> str:
        """The family's name (``hermes``, ``harmony``, ...; ``generic`` when none matched)."""
        return self.family.name

    def render(self, messages: Sequence[Mapping[str, Any]],
               tools: Sequence[Mapping[str, Any]] | None = None,
               add_generation_prompt: bool = True,
               chat_template_kwargs: Mapping[str, Any] | None = None,
               now: datetime | None = None) -> str:
        """The prompt for ``messages`` (and ``tools``), as llama.cpp renders it."""
        prepared = prepare_messages(messages, self.caps, self.family.keeps_developer)
        if self.family.prepare is not None:
            prepared = self.family.prepare(prepared)
        return render_prompt(self.template, prepared, tools, add_generation_prompt,
                             dict(chat_template_kwargs or {}), now)

    def generation_prompt(self, messages: Sequence[Mapping[str, Any]] | None = None,
                          tools: Sequence[Mapping[str, Any]] | None = None,
                          chat_template_kwargs: Mapping[str, Any] | None = None) -> str:
        """What the generation prompt adds after the conversation (the assistant header,
        and an opened ``<think>`` where the template forces thinking)."""
        msgs = list(messages or _DEFAULT_MESSAGES)
        without = self.render(msgs, tools, False, chat_template_kwargs)
        with_prompt = self.render(msgs, tools, True, chat_template_kwargs)
        n = 0
        limit = min(len(without), len(with_prompt))
        while n < limit and without[n] == with_prompt[n]:
            n += 1
        return with_prompt[n:]

    def parse(self, text: str, messages: Sequence[Mapping[str, Any]] | None = None,
              tools: Sequence[Mapping[str, Any]] | None = None,
              chat_template_kwargs: Mapping[str, Any] | None = None, partial: bool = False,
              reasoning_format: str = "deepseek") -> dict[str, Any]:
        """Split a reply into ``content``, ``reasoning_content`` and ``tool_calls``.

        The request (``messages``, ``tools``, ``chat_template_kwargs``) matters as it does
        in llama.cpp: the generation prompt it renders may open a ``<think>`` the reply
        continues, and tool calls are read only when tools were given. ``partial``: the
        reply is cut off (streaming); what it has so far is returned. ``reasoning_format``
        "none" leaves reasoning in the content.
        """
        kwargs = dict(chat_template_kwargs or {})
        request = Request(
            generation_prompt=self.generation_prompt(messages, tools, kwargs),
            tools=list(tools or []), thinking=thinking_enabled(kwargs), partial=partial,
            extract_reasoning=reasoning_format != "none")
        reply: Reply = self.family.parse(text, request)
        return reply.as_dict()

    def __repr__(self) -> str:
        return f"ChatFormat({self.family.name})"
