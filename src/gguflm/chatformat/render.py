"""Rendering a conversation the way llama.cpp's chat layer does before it calls a template.

llama.cpp does not hand the request to the template as it came: it probes what the template
can do (its "caps": does it print a system message, does it read tool-call arguments as an
object) and adjusts the messages to fit, and it adds a few variables of its own
(``enable_thinking``, ``date_string``, ``datetime``, ``reasoning_strength``). Doing the same
here is what makes our prompts byte-identical to llama.cpp's for the same template.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ..tokenizer.chat import ChatTemplate, ChatTemplateError

__all__ = ["TemplateCaps", "probe_caps", "render_prompt"]

_MARK = "Zq7Marker"  # a value no template prints by itself


@dataclass(frozen=True)
class TemplateCaps:
    """What a template does with its input, found by rendering probes (as llama.cpp's caps)."""

    system_role: bool = True
    object_arguments: bool = False
    tool_calls: bool = True


def _try(template: ChatTemplate, messages: list[dict[str, Any]], tools: list | None) -> str | None:
    try:
        return template.render(messages, True, tools)
    except ChatTemplateError:
        return None


def _probe_tools() -> list[dict[str, Any]]:
    params = {"type": "object", "properties": {"arg": {"type": "string"}}, "required": ["arg"]}
    return [{"type": "function", "function": {"name": "tool1", "description": "Tool",
                                              "parameters": params}}]


def _probe_call_messages(arguments: Any) -> list[dict[str, Any]]:
    call = {"id": "call00001", "type": "function",
            "function": {"name": "tool1", "arguments": arguments}}
    return [{"role": "user", "content": "User message"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": "Tool response", "tool_call_id": "call00001"},
            {"role": "assistant", "content": "The tool response was 'tool response'"},
            {"role": "user", "content": "User message"}]


def probe_caps(template: ChatTemplate) -> TemplateCaps:
    """Render the probes llama.cpp uses and see which marked values reach the output: a
    system message that vanishes means no system role; an argument read out of an object
    means the template wants arguments as objects, not JSON strings."""
    system = _try(template, [{"role": "system", "content": _MARK},
                             {"role": "user", "content": "User message"}], None)
    # a template that rejects the probe (Gemma 2's "System role not supported") has none
    system_role = system is not None and _MARK in system
    as_object = _try(template, _probe_call_messages({"arg": _MARK}), _probe_tools())
    object_arguments = as_object is not None and _MARK in as_object
    tool_calls = object_arguments
    if not object_arguments:
        as_string = _try(template, _probe_call_messages(json.dumps({"arg": _MARK})),
                         _probe_tools())
        tool_calls = as_string is not None and _MARK in as_string
    return TemplateCaps(system_role, object_arguments, tool_calls)


def _merge_system(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # llama.cpp folds a system message the template would drop into the next message
    if not messages or messages[0].get("role") != "system":
        return messages
    if len(messages) == 1:
        return []
    first, second = messages[0], dict(messages[1])
    second["content"] = f"{first.get('content') or ''}\n{second.get('content') or ''}"
    return [second, *messages[2:]]


def _arguments_as_objects(messages: list[dict[str, Any]]) -> None:
    for message in messages:
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            if isinstance(function.get("arguments"), str):
                try:
                    function["arguments"] = json.loads(function["arguments"])
                except json.JSONDecodeError as e:
                    raise ChatTemplateError(
                        f"tool call arguments are not JSON: {e}") from None


def prepare_messages(messages: Sequence[Mapping[str, Any]], caps: TemplateCaps,
                     keep_developer: bool) -> list[dict[str, Any]]:
    """The messages as llama.cpp hands them to the template (a deep copy)."""
    out = copy.deepcopy([dict(m) for m in messages])
    for message in out:
        if message.get("role") == "developer" and not keep_developer:
            message["role"] = "system"
        if message.get("tool_calls") and message.get("content") is None:
            message["content"] = ""
    if not caps.system_role:
        out = _merge_system(out)
    if caps.object_arguments:
        _arguments_as_objects(out)
    return out


def clock_variables(now: datetime | None) -> dict[str, Any]:
    """``strftime_now``, ``date_string`` and ``datetime`` from one clock reading (``now``
    pins it, so a render can be reproduced)."""
    moment = now or datetime.now(UTC)

    def strftime_now(fmt: str) -> str:
        return moment.strftime(str(fmt)[:4096])

    return {"strftime_now": strftime_now, "date_string": moment.strftime("%d %b %Y"),
            "datetime": moment.strftime("%b %d %Y")}


def render_prompt(template: ChatTemplate, messages: list[dict[str, Any]],
                  tools: Sequence[Mapping[str, Any]] | None, add_generation_prompt: bool,
                  kwargs: Mapping[str, Any], now: datetime | None) -> str:
    """One render with llama.cpp's extra variables; ``kwargs`` override them."""
    context: dict[str, Any] = {"enable_thinking": thinking_enabled(kwargs)}
    context.update(clock_variables(now))
    context.update(kwargs)
    effort = context.pop("reasoning_effort", None)
    if isinstance(effort, str) and effort and effort != "none":  # "none" only turns thinking off
        context["reasoning_effort"] = context["reasoning_strength"] = effort
    preserve = kwargs.get("preserve_reasoning")
    if isinstance(preserve, bool):  # llama.cpp's one switch for the names templates use
        context.update(preserve_thinking=preserve, clear_thinking=not preserve,
                       truncate_history_thinking=not preserve, drop_thinking=not preserve)
    return template.render(messages, add_generation_prompt, list(tools) if tools else None,
                           **context)


def thinking_enabled(kwargs: Mapping[str, Any]) -> bool:
    """llama.cpp's rule: thinking is on unless ``enable_thinking`` is false or
    ``reasoning_effort`` is "none"."""
    return kwargs.get("enable_thinking") is not False and kwargs.get("reasoning_effort") != "none"
