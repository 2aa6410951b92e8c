"""Forced calls of the families whose arguments are one JSON object (``call_grammars``):
Mistral's ``[TOOL_CALLS]``, DeepSeek's tool-call blocks, Kimi K2's sections, the JSON lists
of Granite, Nemotron, Apriel, Firefunction, Command R and Cohere, Apertus, MiniMax M1,
GigaChat, Functionary. Each writes what the family's parser (``json_families``,
``json_more``, ``cohere``) reads back: the arguments are JSON held to the function's
schema, the rest is spelled as the family's template writes it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .call_rules import CallWriter, Functions, Spell, choose, json_rule, lit

__all__ = ["JSON_WRITERS"]

Lines = list[str]
Writer = Callable[[Functions, bool, Spell], Lines]


def around(spell: Spell, head: str, tail: str = "", before: str = "", after: str = ""
           ) -> CallWriter:
    """A call as ``head`` ARGS ``tail`` (texts, spelled: special tokens as tokens; ``head``
    with the function's ``{name}`` in it); ``before`` and ``after`` are Lark put right
    before and after the arguments (an id, a separator)."""
    def write(rule: str, name: str, params: Mapping[str, Any]) -> Lines:
        parts = [spell(head.format(name=name)), before, f"{rule}_args", after,
                 spell(tail) if tail else ""]
        return [f"{rule}: " + " ".join(p for p in parts if p),
                json_rule(f"{rule}_args", params)]
    return write


def _calls(open_: str, close: str, sep: str, parallel: bool, spell: Spell,
           rule: str = "fn") -> str:
    """``open_`` then one call (``parallel``: one or more, ``sep`` between), then
    ``close``, as a Lark expression."""
    more = f" ({spell(sep)} {rule})*" if sep else "+"
    parts = [spell(open_) if open_ else "", rule + (more if parallel else ""),
             spell(close) if close else ""]
    return " ".join(p for p in parts if p)


def wrapped(open_: str, close: str, head: str, tail: str = "}", sep: str = ", ") -> Writer:
    """Calls ``head`` ARGS ``tail`` one after another with ``sep`` between (none: one
    after the other), after ``open_`` and before ``close``."""
    def writer(functions: Functions, parallel: bool, spell: Spell) -> Lines:
        return [f"start: {_calls(open_, close, sep, parallel, spell)}",
                *choose(functions, around(spell, head, tail))]
    return writer


def single(head: str, tail: str = "}") -> Writer:
    """Families whose parser reads one call a reply: parallel or not, one call."""
    inner = wrapped("", "", head, tail)
    return lambda functions, parallel, spell: inner(functions, False, spell)


_NAME_ARGS = '{{"name": "{name}", "arguments": '
_ID9 = "/[A-Za-z0-9]{9}/"
_NEMO_ID = lit(', "id": "') + " " + _ID9
_DIGITS = "/[0-9]{1,3}/"
_NL = "\n"


def _mistral(functions: Functions, parallel: bool, spell: Spell) -> Lines:
    """Mistral's two spellings, as its templates write them: Nemo's ``[TOOL_CALLS][{"name",
    "arguments", "id"}, ...]`` and Small 3.2's ``[TOOL_CALLS]NAME[CALL_ID]ID[ARGS]{...}``
    (no id where the template writes none). The model writes the one its template taught
    it; the parser reads both."""
    call_id = f"({spell('[CALL_ID]')} {_ID9})? {spell('[ARGS]')}"
    return [f"start: ({_calls('[TOOL_CALLS][', ']', ', ', parallel, spell, 'nemo')}) | "
            f"({_calls('', '', '', parallel, spell, 'named')})",
            *choose(functions, around(spell, "[TOOL_CALLS]{name}", "", call_id), "named"),
            *choose(functions, around(spell, _NAME_ARGS, '"}', "", _NEMO_ID), "nemo")]


def _deepseek(functions: Functions, parallel: bool, spell: Spell) -> Lines:
    """R1 and V3: ``<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\n{...}\\n```
    <｜tool▁call▁end｜>``; V3.1: ``<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}
    <｜tool▁call▁end｜>``; the calls in ``<｜tool▁calls▁begin｜>...<｜tool▁calls▁end｜>``.
    Both spellings are allowed (one family, one parser, two generations of templates)."""
    end = "<｜tool▁call▁end｜>"
    r1 = around(spell, "<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n",
                "\n```" + end)
    v31 = around(spell, "<｜tool▁call▁begin｜>{name}<｜tool▁sep｜>", end)
    calls = f"fn ({lit(_NL)}? fn)*" if parallel else "fn"
    return [f"start: {spell('<｜tool▁calls▁begin｜>')} {calls} {spell('<｜tool▁calls▁end｜>')}",
            "fn: r1 | v31", *choose(functions, r1, "r1"), *choose(functions, v31, "v31")]


def _kimi_k2(functions: Functions, parallel: bool, spell: Spell) -> Lines:
    """``<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:INDEX
    <|tool_call_argument_begin|>{...}<|tool_call_end|>...<|tool_calls_section_end|>``."""
    write = around(spell, "<|tool_call_begin|>functions.{name}:", "<|tool_call_end|>",
                   f"{_DIGITS} {spell('<|tool_call_argument_begin|>')}")
    calls = _calls("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "",
                   parallel, spell)
    return [f"start: {calls}", *choose(functions, write)]


_ACTION = ("<|START_ACTION|>[\n    ", "\n]<|END_ACTION|>", ",\n    ")


def _cohere(functions: Functions, parallel: bool, spell: Spell) -> Lines:
    """Command R7B and Command A: ``<|START_ACTION|>[\\n    {"tool_call_id": "0",
    "tool_name": NAME, "parameters": {...}}\\n]<|END_ACTION|>`` (keys in that order)."""
    def write(rule: str, name: str, params: Mapping[str, Any]) -> Lines:
        head = lit('{"tool_call_id": "') + f" {_DIGITS} " + \
            lit(f'", "tool_name": "{name}", "parameters": ')
        return [f"{rule}: {head} {rule}_args {lit('}')}", json_rule(f"{rule}_args", params)]
    return [f"start: {_calls(*_ACTION, parallel, spell)}", *choose(functions, write)]


JSON_WRITERS: dict[str, Writer] = {
    "ministral3": wrapped("", "", "[TOOL_CALLS]{name}[ARGS]", "", ""),
    "mistral": _mistral,
    "deepseek": _deepseek,
    "kimi-k2": _kimi_k2,
    "granite": wrapped("<|tool_call|>[", "]", _NAME_ARGS),
    "nemotron": wrapped("<TOOLCALL>[", "]</TOOLCALL>", _NAME_ARGS),
    "apriel": wrapped("<tool_calls>[", "]</tool_calls>", _NAME_ARGS),
    "firefunction": wrapped("functools[", "]", _NAME_ARGS),
    "command-r": wrapped("Action:\n```json\n[", "]\n```",
                         '{{"tool_name": "{name}", "parameters": '),
    "command-r7b": _cohere,
    "cohere2": _cohere,
    "apertus": wrapped("<|tools_prefix|>[", "]<|tools_suffix|>", '{{"{name}": ', "}"),
    "minimax-m1": wrapped("<tool_calls>\n", "\n</tool_calls>", _NAME_ARGS, sep="\n"),
    "gigachat3": single("<|message_sep|>\n\nfunction call<|role_sep|>\n" + _NAME_ARGS),
    "gigachat3.1": single("<|function_call|>" + _NAME_ARGS),
    "functionary-v3.1": wrapped("", "", "<function={name}>", "</function>", ""),
    "functionary-v3.2": single("{name}\n", ""),
}
