"""Where a family's reasoning ends and its answer starts, for what comes after the prompt:
the tags the reasoning budget watches (``ReasoningTags``) and the Lark rules that let a
constraint wait for the answer (``reasoning_rules``, for ``engine.grammar.after_reasoning``).

Most families think between two tags (``Family.think``); Harmony (gpt-oss) thinks in its
``analysis`` channel and answers in ``final``, so it has a row of its own. Families that
read their reply whole some other way (Cohere's actions) have no rules here: a constraint
then applies from the reply's first token, as it always did.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .call_rules import until
from .format import ChatFormat
from .render import thinking_enabled
from .reply import opened_tail

__all__ = ["ReasoningTags", "reasoning_rules", "reasoning_tags", "template_variables"]

# Lark text for "these characters", the special tokens among them spelled as tokens
Spell = Callable[[str], str]


@dataclass(frozen=True)
class ReasoningTags:
    """The block's ``start`` and ``end`` tags, what is written to close it when the budget
    is spent (``close``), and whether the generation prompt has opened it already."""

    start: str
    end: str
    close: str
    opened: bool


# Harmony: the analysis channel, then the final one (the generation prompt is
# "<|start|>assistant"; a reply may skip the analysis)
_HARMONY_START = "<|channel|>analysis<|message|>"
_HARMONY_END = "<|end|>"
_HARMONY_FINAL = "<|start|>assistant<|channel|>final<|message|>"
_SPECIAL = {"harmony": ReasoningTags(_HARMONY_START, _HARMONY_END,
                                     _HARMONY_END + _HARMONY_FINAL, False)}


def reasoning_tags(fmt: ChatFormat, generation_prompt: str,
                   kwargs: Mapping[str, Any]) -> ReasoningTags | None:
    """The reasoning block of ``fmt``'s replies for this request; None when the family has
    none, reads its reply another way, or thinking is off."""
    if not thinking_enabled(kwargs):
        return None
    if fmt.name in _SPECIAL:
        return _SPECIAL[fmt.name]
    start, end = fmt.family.think
    if not start or not end or fmt.family.reader is not None:
        return None
    opened = opened_tail(generation_prompt, start, end) is not None
    return ReasoningTags(start, end, end, opened)


def reasoning_rules(tags: ReasoningTags, family: str, spell: Spell) -> str:
    """Lark rules for ``reasoning``: the block (optional unless the prompt opened it), its
    text matched lazily up to the end tag, then the whitespace a model puts before its
    answer."""
    # llguidance takes no special token inside a lazy lexeme (Harmony's <|end|> is one in
    # gpt-oss's vocabulary): until() ends the text where such a token comes
    lines = [*until("think", tags.end, spell), "WS: /[ \\t\\r\\n]{1,4}/"]
    if family == "harmony":
        final = spell(_HARMONY_FINAL.removeprefix("<|start|>assistant"))
        head = spell("<|start|>assistant")
        lines.insert(0, f"reasoning: ({spell(tags.start)} think {head})? {final}")
    elif tags.opened:
        lines.insert(0, "reasoning: think WS?")
    else:
        lines.insert(0, f"reasoning: ({spell(tags.start)} think WS?)?")
    return "\n".join(lines) + "\n"


def template_variables(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The template variables a request's ``chat_template_kwargs`` give, with llama.cpp's
    mappings: ``enable_thinking`` always set (true unless turned off: llama.cpp passes it to
    every template, and some read whether it is defined), ``reasoning_effort`` also as
    ``reasoning_strength`` ("none" only turns thinking off), and ``preserve_reasoning`` as
    the names templates use for keeping past thinking."""
    context = {"enable_thinking": thinking_enabled(kwargs)} | dict(kwargs)
    effort = context.pop("reasoning_effort", None)
    if isinstance(effort, str) and effort and effort != "none":
        context["reasoning_effort"] = context["reasoning_strength"] = effort
    preserve = kwargs.get("preserve_reasoning")
    if isinstance(preserve, bool):
        context.update(preserve_thinking=preserve, clear_thinking=not preserve,
                       truncate_history_thinking=not preserve, drop_thinking=not preserve)
    return context
