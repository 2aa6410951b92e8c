"""Families whose calls are JSON objects: Hermes/Qwen ``<tool_call>``, JSON lists after a
marker (Nemotron, Apriel, Granite, Firefunction, Mistral Nemo), Llama 3's bare JSON, and
DeepSeek R1's fenced JSON, Mistral's ``[TOOL_CALLS]``, Kimi K2's call sections."""

from __future__ import annotations

from .calls import json_call, json_call_list, tagged_calls, value_text
from .reply import Call, Request, partial_tail_cut

__all__ = ["deepseek_r1", "hermes", "json_list_after", "kimi_k2", "llama3", "mistral",
           "tagged_list"]


def hermes(text: str, request: Request) -> tuple[str, list[Call]]:
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, one block per call."""
    return tagged_calls(text, request, "<tool_call>", "</tool_call>", json_call)


def tagged_list(open_tag: str, close_tag: str):
    """Calls as one JSON list between two tags (``<TOOLCALL>[...]</TOOLCALL>``)."""
    def parse(text: str, request: Request) -> tuple[str, list[Call]]:
        return tagged_calls(text, request, open_tag, close_tag, json_call_list)
    return parse


def json_list_after(marker: str):
    """Calls as a JSON list after a marker that has no closing tag (``[TOOL_CALLS]``)."""
    return tagged_list(marker, "")


def llama3(text: str, request: Request) -> tuple[str, list[Call]]:
    """Llama 3.x: content, then the call as a bare ``{"name": ..., "parameters": {...}}``
    object (after an optional ``<|python_tag|>``). A reply whose ``{`` opens no call is
    content (llama.cpp rejects it); while it is partial, text from the ``{`` on waits."""
    at = text.find("{")
    if at < 0:
        return text, []
    head = text[:at]
    calls = json_call(text[at:], request, not request.partial)
    if not calls:
        return (head if request.partial else text), []
    return head.removesuffix("<|python_tag|>"), calls


_R1_SEP = "<｜tool▁sep｜>"


def _r1_call(body: str, request: Request, complete: bool) -> list[Call]:
    """R1's ``function<｜tool▁sep｜>NAME\n```json\n{...}\n```'' (the name ends at the
    line's end, the arguments are the JSON in the fence) or V3.1's ``NAME<｜tool▁sep｜>
    {...}`` (the arguments right after the separator)."""
    sep = body.find(_R1_SEP)
    after = sep + len(_R1_SEP)
    if sep >= 0 and body[after:after + 1] == "{":
        got = value_text(body, after)
        return [Call(body[:sep].strip(), got[0])] if got is not None else []
    line_end = body.find("\n", sep) if sep >= 0 else -1
    if line_end < 0:
        return []  # the name is still being written
    name = body[sep + len(_R1_SEP):line_end].strip()
    fence = body.find("```json", line_end)
    if fence < 0 and "```json".startswith(body[line_end:].strip()[:7]):
        return []  # the fence is still being written
    pos = line_end if fence < 0 else fence + len("```json")
    got = value_text(body, pos)
    return [Call(name, got[0])] if got is not None else []


def deepseek_r1(text: str, request: Request) -> tuple[str, list[Call]]:
    """DeepSeek R1: ``<｜tool▁calls▁begin｜>`` then one ``<｜tool▁call▁begin｜>...
    <｜tool▁call▁end｜>`` block per call."""
    return tagged_calls(text, request, "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", _r1_call,
                        section="<｜tool▁calls▁begin｜>")


_TOOL_CALLS = "[TOOL_CALLS]"


def _mistral_call(body: str, request: Request, complete: bool) -> list[Call]:
    """One ``[TOOL_CALLS]`` block: ``NAME[CALL_ID]ID[ARGS]{json}`` (Mistral Small 3.2;
    Ministral and Devstral leave out the id), or the older JSON list of calls (Nemo)."""
    if body.lstrip().startswith("["):
        return json_call_list(body, request, complete)
    args_at = body.find("[ARGS]")
    if args_at < 0:
        return []  # the name is still being written
    name, _, call_id = body[:args_at].partition("[CALL_ID]")
    got = value_text(body, args_at + len("[ARGS]"))
    return [Call(name.strip(), got[0], call_id.strip())] if got is not None else []


def mistral(text: str, request: Request) -> tuple[str, list[Call]]:
    """Mistral: content, then calls each opened by ``[TOOL_CALLS]`` (no closing tag)."""
    first = text.find(_TOOL_CALLS)
    if first < 0:
        return (partial_tail_cut(text, _TOOL_CALLS) if request.partial else text), []
    blocks = text[first + len(_TOOL_CALLS):].split(_TOOL_CALLS)
    calls: list[Call] = []
    for n, block in enumerate(blocks):
        calls.extend(_mistral_call(block, request, not request.partial or n + 1 < len(blocks)))
    return text[:first], calls


_KIMI_ARGS = "<|tool_call_argument_begin|>"


def _kimi_call(body: str, request: Request, complete: bool) -> list[Call]:
    """``functions.NAME:INDEX<|tool_call_argument_begin|>{json}``: the id is the whole
    ``functions.NAME:INDEX``, the name what lies between its prefix and the index."""
    args_at = body.find(_KIMI_ARGS)
    if args_at < 0:
        return []  # the id is still being written
    call_id = body[:args_at].strip()
    name = call_id.removeprefix("functions.").rpartition(":")[0] or call_id
    got = value_text(body, args_at + len(_KIMI_ARGS))
    return [Call(name, got[0], call_id)] if got is not None else []


def kimi_k2(text: str, request: Request) -> tuple[str, list[Call]]:
    """Kimi K2: ``<|tool_calls_section_begin|>`` then ``<|tool_call_begin|>...
    <|tool_call_end|>`` blocks."""
    return tagged_calls(text, request, "<|tool_call_begin|>", "<|tool_call_end|>", _kimi_call,
                        section="<|tool_calls_section_begin|>")
