"""How one chat request's reply is read and held: its reasoning, its tool calls and the
constraint that waits for the answer, from the model's chat format (chatformat/).

``ChatPlan`` is what ``Intake.chat`` hands the reply shapers (``replies.ChatReply``): the
tool plan (``engine/tools.py``), and a factory of ``ReplyStream`` when the family marks
reasoning or writes calls the chat format reads. ``ChatSetup`` holds what is decided per
request before generation: the template's variables, the family, whether thinking is on
and where its block ends, and it wraps a constraint so that it starts after the reasoning
(``engine.grammar.after_reasoning``) and builds the reasoning budget
(``engine/reasoning.py``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import regex

from .chatformat.call_grammars import call_grammar, includes_reasoning
from .chatformat.family import no_tools
from .chatformat.stream import ReplyStream
from .chatformat.thinking import ReasoningTags, reasoning_rules, reasoning_tags
from .engine.errors import InvalidRequestError
from .engine.grammar import Grammar, after_reasoning
from .engine.reasoning import BudgetState, Thinking
from .engine.toolcalls import new_call_id
from .engine.tools import NativeCalls, ToolPlan

if TYPE_CHECKING:
    from .chatformat import ChatFormat
    from .tokenizer import Tokenizer

__all__ = ["REASONING_FORMATS", "ChatDefaults", "ChatPlan", "ChatSetup", "Speller"]

# llama-server's --reasoning-format values: "none" leaves reasoning in the content; the
# others put it in reasoning_content (llama.cpp's "deepseek-legacy" also keeps the tags in
# the content, which no client wants: it is taken as "deepseek")
REASONING_FORMATS = ("none", "auto", "deepseek", "deepseek-legacy")


@dataclass
class ChatDefaults:
    """What a chat request leaves out, as ``serve`` sets it: ``--chat-template-kwargs``,
    ``--reasoning-format`` and ``--reasoning-budget``."""

    kwargs: dict[str, Any] = field(default_factory=dict)
    reasoning_format: str = "auto"
    budget: int = -1
    budget_message: str = ""  # written before the end tag when the budget runs out


@dataclass
class ChatPlan:
    """A chat reply's readers: ``tools`` (None without tools) and ``stream`` (a new
    ``ReplyStream`` per reply; None: the reply is plain content, or read by the tool
    parser alone)."""

    tools: ToolPlan | None
    stream: Callable[[], ReplyStream] | None

    @property
    def legacy_tools(self) -> ToolPlan | None:
        """The tool plan when ``engine/toolcalls.py`` reads its calls (not the chat
        format)."""
        if self.tools is None or self.tools.format == "native":
            return None
        return self.tools


class Speller:
    """Text as Lark literals for one tokenizer, its special tokens spelled as tokens
    (``<[id]>``): llguidance sees a special token as itself, not as its text."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        from .engine.constraints import special_tokens

        self.ids = special_tokens(tokenizer)
        names = sorted(self.ids, key=len, reverse=True)
        self.split = regex.compile("(" + "|".join(map(regex.escape, names)) + ")") \
            if names else None

    def __call__(self, text: str) -> str:
        parts = self.split.split(text) if self.split is not None else [text]
        out = []
        for i, part in enumerate(parts):
            if i % 2:
                out.append(f"<[{self.ids[part]}]>")
            elif part:
                out.append(json.dumps(part, ensure_ascii=False))
        return " ".join(out) or '""'


def _reads_calls(fmt: ChatFormat) -> bool:
    """The family writes calls the chat format reads, and the template can show them in
    its history (llama.cpp reads none from a template that cannot: Granite 3.3, the
    DeepSeek R1 distills)."""
    family = fmt.family
    return family.template_calls and (family.tools is not no_tools or family.reader is not None)


@dataclass
class ChatSetup:
    """One chat request's reading of the chat format (see the module's docstring)."""

    fmt: ChatFormat
    kwargs: dict[str, Any]
    reasoning_format: str
    budget: int
    speller: Callable[[], Speller]
    budget_message: str = ""

    def native(self) -> NativeCalls | None:
        """The family's own calls, for ``plan_tools`` (None: the family writes none the
        chat format reads)."""
        if not _reads_calls(self.fmt):
            return None
        name = self.fmt.name
        return NativeCalls(name, lambda functions, parallel: call_grammar(
            name, functions, parallel, self.speller()))

    def tags(self, messages: Sequence[Mapping[str, Any]],
             tools: Sequence[Mapping[str, Any]] | None) -> tuple[str, ReasoningTags | None]:
        """The generation prompt and the reasoning block of the reply (None: none). A
        family that marks no reasoning and reads its reply in blocks has no use for the
        prompt: the two renders that find it are skipped (most plain chat models)."""
        family = self.fmt.family
        if not any(family.think) and family.reader is None:
            return "", None
        prompt = self.fmt.generation_prompt(messages, tools, self.kwargs)
        if self.reasoning_format == "none":
            return prompt, None
        return prompt, reasoning_tags(self.fmt, prompt, self.kwargs)

    def plan(self, tools: ToolPlan | None, prompt: str, tags: ReasoningTags | None
             ) -> ChatPlan:
        """How the reply is read."""
        native = tools is not None and tools.format == "native" and tools.choice != "none"
        if tags is None and not native:
            return ChatPlan(tools, None)
        offered = tools.template_tools if native and tools is not None else None
        fmt, kwargs, rf = self.fmt, self.kwargs, self.reasoning_format
        return ChatPlan(tools, lambda: ReplyStream(fmt, prompt, offered, kwargs, rf,
                                                   new_call_id))

    def constrained(self, g: Grammar, tags: ReasoningTags | None, native_call: bool
                    ) -> Grammar:
        """``g`` starting after the reasoning, where the reply has a reasoning block."""
        if tags is None or native_call and includes_reasoning(self.fmt.name):
            return g
        return after_reasoning(g, reasoning_rules(tags, self.fmt.name, self.speller()))

    def budget_state(self, tags: ReasoningTags | None, tokenizer: Tokenizer
                     ) -> BudgetState | None:
        """The reasoning budget's state for one sequence (None: no budget)."""
        if tags is None or self.budget < 0:
            return None
        forced = tokenizer.encode(self.budget_message + tags.close, add_special=False,
                                  parse_special=True)
        thinking = Thinking(tags.start.encode(), tags.end.encode(), tags.opened,
                            self.budget, tuple(forced))
        return BudgetState(thinking, lambda t: tokenizer.token_to_piece(t, special=True))


def check_reasoning_format(value: Any) -> str:
    if value not in REASONING_FORMATS:
        raise InvalidRequestError(f"reasoning_format must be one of "
                                  f"{', '.join(REASONING_FORMATS)}, got {value!r}",
                                  param="reasoning_format")
    return value


def check_budget(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < -1:
        raise InvalidRequestError(f"reasoning_budget_tokens must be an integer >= -1 (-1: no "
                                  f"limit), got {value!r}", param="reasoning_budget_tokens")
    return value
