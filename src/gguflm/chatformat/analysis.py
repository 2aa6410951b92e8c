"""Learning a template's reasoning markers from its own renders, as llama.cpp's
"differential autoparser" does for templates it has no parser of its own for.

Render an assistant turn with and without ``reasoning_content`` and see what wraps the
reasoning: the marker (``<...>`` or ``[...]``) before it and after it, with the whitespace
the template writes around them (that whitespace is then taken when present). Where the
history shows none, compare the generation prompt with thinking on and off: what thinking
adds (an opened ``<think>``) is the start tag, what turning it off adds (``<think></think>``)
gives both. Every render is of a few fixed short messages, so this costs a handful of
renders once per template.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import regex

from ..tokenizer.chat import ChatTemplate, ChatTemplateError
from .render import render_prompt

__all__ = ["ReasoningTags", "learn_reasoning_tags"]

USER_MSG = "U_USER_MSG Hello END_U"
ASSISTANT_MSG = "A_ASST_MSG I can help END_A"
THINKING = "REASON_PART I am thinking END_R"
_MARKER = r"(?:<[^>]*>|\[[^\]]*\])"
_WRAPPED = regex.compile(rf"({_MARKER}\s*){regex.escape(THINKING)}(\s*{_MARKER}\s*)")
_DELIMITED = regex.compile(rf"{regex.escape(THINKING)}\s*({_MARKER}\s*)?")
_TOOLS_ONLY = regex.compile(rf"({_MARKER}\s*){regex.escape(THINKING)}\s*({_MARKER}\s*)")
_ANCHOR = 64


@dataclass(frozen=True)
class ReasoningTags:
    """The reasoning block's start and end tags, with the whitespace the template writes
    after them (``start`` may be empty: the reasoning then runs from the reply's start)."""

    start: str = ""
    end: str = ""

    @property
    def found(self) -> bool:
        return bool(self.start or self.end)


def _render(template: ChatTemplate, messages: list[dict[str, Any]], add_generation_prompt: bool,
            thinking: bool, tools: list | None = None) -> str | None:
    try:
        return render_prompt(template, messages, tools, add_generation_prompt,
                             {"enable_thinking": thinking}, None)
    except ChatTemplateError:
        return None


def segments(text: str) -> list[tuple[bool, str]]:
    """``text`` cut into markers (``<...>``, ``[...]``; True) and the text between."""
    out: list[tuple[bool, str]] = []
    border, opener = 0, ""
    for pos, ch in enumerate(text):
        if not opener and ch in "<[":
            if border < pos:
                out.append((False, text[border:pos]))
            border, opener = pos, ch
        elif opener and ch == (">" if opener == "<" else "]"):
            out.append((True, text[border:pos + 1]))
            border, opener = pos + 1, ""
    if border < len(text):
        out.append((False, text[border:]))
    return out


def _common_prefix(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _common_suffix(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[-1 - n] == b[-1 - n]:
        n += 1
    return n


def _trim_ends(ls: list, rs: list) -> tuple[int, int, int, int, bool, bool]:
    """Walk equal segments off both ends of two segment lists (llama.cpp's order): the
    remaining ranges ``[a, b]`` and ``[c, d]``, and whether either list was used up."""
    a, b, c, d = 0, len(ls) - 1, 0, len(rs) - 1
    left_done = right_done = False
    while a != b and c != d:
        advanced = False
        if ls[a] == rs[c]:
            a, c, advanced = a + 1, c + 1, True
        if ls[b] == rs[d]:
            if a != b:
                b -= 1
            else:
                left_done = True
            if c != d:
                d -= 1
            else:
                right_done = True
            advanced = True
        if not advanced:
            break
    if a == b and c != d:
        if ls[a] == rs[d]:
            d, left_done = d - 1, True
        elif ls[a] == rs[c]:
            c, left_done = c + 1, True
    elif c == d and a != b:
        if ls[b] == rs[c]:
            b, right_done = b - 1, True
        elif ls[a] == rs[c]:
            a, right_done = a + 1, True
    elif a == b and c == d and ls[a] == rs[c] and ls[a][0]:
        left_done = right_done = True
    return a, b, c, d, left_done, right_done


def diff_split(left: str, right: str) -> tuple[str, str]:
    """What only ``left`` has and what only ``right`` has, compared by markers and text
    (llama.cpp's ``calculate_diff_split``)."""
    ls, rs = segments(left), segments(right)
    if not ls:
        return "", right
    if not rs:
        return left, ""
    a, b, c, d, left_done, right_done = _trim_ends(ls, rs)
    text_suffix = not ls[b][0] and not rs[d][0]
    text_prefix = not rs[c][0] and not ls[a][0]
    rem_l = "".join(v for _, v in ls[a:b if left_done else b + 1])
    rem_r = "".join(v for _, v in rs[c:d if right_done else d + 1])
    suffix = _common_suffix(rem_l, rem_r) if text_suffix else 0
    body_l, body_r = rem_l[:len(rem_l) - suffix], rem_r[:len(rem_r) - suffix]
    prefix = _common_prefix(body_l, body_r) if text_prefix else 0
    only_l, only_r = body_l[prefix:], body_r[prefix:]
    if not only_l and only_r and right.startswith(left):
        only_r = right[len(left):]
    return only_l, only_r


def _user() -> dict[str, Any]:
    return {"role": "user", "content": USER_MSG}


def _from_history(template: ChatTemplate) -> ReasoningTags:
    """The tags around reasoning the template writes in an assistant turn's history."""
    plain = {"role": "assistant", "content": ASSISTANT_MSG}
    base = _render(template, [_user(), plain], False, True)
    out = _render(template, [_user(), {**plain, "reasoning_content": THINKING}], False, True)
    if base is None or out is None or THINKING not in diff_split(base, out)[1]:
        return ReasoningTags()
    wrapped = _WRAPPED.search(out)
    if wrapped is not None:
        return ReasoningTags(wrapped.group(1), wrapped.group(2))
    delimited = _DELIMITED.search(out)
    return ReasoningTags("", delimited.group(1) or "") if delimited else ReasoningTags()


def _tail_anchored(off: str, on: str, tags: ReasoningTags) -> ReasoningTags:
    """Both prompts differ in more than the tags (SmolLM3 changes its system message): the
    two markers one prompt's tail adds to the other's."""
    for base, extended in ((on, off), (off, on)):
        anchor = base[-_ANCHOR:]
        at = extended.rfind(anchor)
        if at < 0 or at + len(anchor) >= len(extended):
            continue
        extra = extended[at + len(anchor):].strip()
        marks = [s for s in segments(extra) if s[1].strip()]
        if extra and len(marks) == 2 and marks[0][0] and marks[1][0]:
            return ReasoningTags(tags.start or marks[0][1], tags.end or marks[1][1])
    return tags


def _from_generation_prompt(template: ChatTemplate, tags: ReasoningTags) -> ReasoningTags:
    """Fill in what the history did not show from the generation prompts with thinking
    off and on."""
    off = _render(template, [_user()], True, False)
    on = _render(template, [_user()], True, True)
    if off is None or on is None:
        return tags
    only_off, only_on = diff_split(off, on)
    if not only_off.strip() and only_on:
        if only_on.strip() and on.endswith(only_on.strip()) and not tags.start:
            return ReasoningTags(only_on, tags.end)
        return tags
    if not only_on.strip() and only_off:
        if not only_off.strip() or not off.endswith(only_off.strip()) or tags.end:
            return tags
        marks = [s for s in segments(off) if s[1].strip()]
        start = tags.start
        if len(marks) >= 2 and marks[-1][1] == only_off.strip() and marks[-2][0]:
            start = marks[-2][1]
        return ReasoningTags(start, only_off)
    if only_off.strip() and only_on.strip():
        return _tail_anchored(off, on, tags)
    return tags


def _probe_tools() -> list[dict[str, Any]]:
    schema = {"type": "object", "required": [], "properties": {
        "AA_ARG_FST_AA": {"type": "string", "description": "First argument"},
        "BB_ARG_SND_BB": {"type": "string", "description": "Second argument"}}}
    return [{"type": "function", "function": {"name": name, "description": "Test function",
                                              "parameters": schema}}
            for name in ("FFF_FIRST_FUN_F", "SSS_SECOND_FUN_S")]


def _tools_only(template: ChatTemplate, tags: ReasoningTags) -> ReasoningTags:
    """Templates that show reasoning only in turns that call tools."""
    call = {"id": "call00001", "type": "function", "function": {
        "name": "FFF_FIRST_FUN_F", "arguments": {"AA_ARG_FST_AA": "VVVV", "BB_ARG_SND_BB": "XXXX"}}}
    turn = {"role": "assistant", "content": ASSISTANT_MSG, "reasoning_content": THINKING}
    with_calls = {**turn, "content": None, "tool_calls": [call]}
    plain = _render(template, [_user(), turn], False, True, _probe_tools())
    calling = _render(template, [_user(), with_calls], False, True, _probe_tools())
    if plain is None or calling is None or THINKING in plain or THINKING not in calling:
        return tags
    wrapped = _TOOLS_ONLY.search(calling)
    if wrapped is not None:
        return ReasoningTags(wrapped.group(1), wrapped.group(2))
    delimited = _DELIMITED.search(calling)
    return ReasoningTags("", delimited.group(1) or "") if delimited else ReasoningTags()


def _known_cases(source: str, tags: ReasoningTags) -> ReasoningTags:
    """llama.cpp's fixed answers for templates whose renders mislead the analysis."""
    if "laguna_glm_thinking" in source:  # renders "<think>\n" the model does not write
        return ReasoningTags(tags.start.strip(), tags.end.strip())
    if ("<SPECIAL_10>" in source and "<SPECIAL_11>" in source and "<SPECIAL_12>" in source
            and "<TOOL_RESPONSE>" in source):  # Nemotron Nano v2
        return ReasoningTags("<think>\n", "</think>")
    if "Write your thoughts between <think></think> and write your response between" in source:
        return ReasoningTags("<think>", "</think>")  # Granite 3.3
    if (not tags.found and "content.split('</think>')" in source
            and "reasoning_content" not in source and "<SPECIAL_12>" not in source):
        return ReasoningTags("<think>", "</think>")  # older Qwen templates
    return tags


def learn_reasoning_tags(template: ChatTemplate, source: str, calls: bool) -> ReasoningTags:
    """The template's reasoning tags as llama.cpp's analysis finds them (none found: the
    template has no reasoning block). ``calls``: the template writes tool calls."""
    tags = _from_history(template)
    tags = _from_generation_prompt(template, tags)
    if calls:
        tags = _tools_only(template, tags)
    return _known_cases(source, tags)
