"""Forced calls of the families that spell each parameter out (``call_grammars``): GLM's
``<arg_key>``/``<arg_value>`` (also Ling 3, Hunyuan 3), DeepSeek V3.2/V4's DSML, MiniCPM 5,
MiniMax M2 and M3, Seed-OSS, Kimi K3, Muse Glimmer, and LFM2's Python-style calls. A
string value is raw text (its ``enum``, ``const``, ``minLength`` and ``maxLength`` kept),
anything else JSON, as the templates write them and the parsers (``xml_families``,
``minimax``, ``kimi_k3``, ``muse``, ``pythonic``) read them; the parameters come in the
schema's order, those it does not require optional."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import regex

from .call_rules import (
    CallWriter,
    Functions,
    Spell,
    Unsupported,
    choose,
    json_rule,
    keyed,
    lit,
    raw_value,
    separated,
    until,
)

__all__ = ["XML_WRITERS"]

Lines = list[str]
Writer = Callable[[Functions, bool, Spell], Lines]

# holes in a ``Tags`` text, filled with Lark: a newline the model may write or leave out,
# a call's index, a JSON value's type name where the schema gives none, an empty response
# section the model may write before its calls and the message's end after them (Kimi K3)
_MAY_NL, _INDEX, _ANY_TYPE, _K3_RESPONSE, _K3_END = "\x00", "\x01", "\x02", "\x03", "\x04"
_HOLES: dict[str, Callable[[Spell], str]] = {
    _MAY_NL: lambda spell: '"\\n"?',
    _INDEX: lambda spell: "/[0-9]{1,3}/",
    _ANY_TYPE: lambda spell: '("number" | "boolean" | "null" | "object" | "array")',
    _K3_RESPONSE: lambda spell: f"({spell('<|open|>response<|sep|><|close|>response<|sep|>')})?",
    _K3_END: lambda spell: f"({spell('<|close|>message<|sep|>')} {spell('<|end_of_msg|>')}?)?"}
_HOLE = regex.compile("([\x00-\x04])")
# Kimi K3's type attribute of a JSON value, by the schema's type
_TYPE_NAMES = {"integer": "number", "number": "number", "boolean": "boolean", "null": "null",
               "object": "object", "array": "array"}


@dataclass(frozen=True)
class Tags:
    """How a family writes calls: ``open``/``close`` around all of them, ``call_open``
    (with ``{name}``) and ``call_close`` around each (``sep`` between two), and each
    parameter as ``param_open`` (with ``{key}``; ``json_open``, also with ``{type}``, for
    a value that is not a string, where the family marks it) VALUE ``param_close`` (with
    ``{key}``). The texts may hold the holes above."""

    open: str
    close: str
    call_open: str
    call_close: str
    param_open: str
    param_close: str
    json_open: str = ""
    sep: str = ""


def _spelled(text: str, spell: Spell) -> str:
    """``text`` as Lark, its holes filled."""
    parts = _HOLE.split(text)
    out = [_HOLES[p](spell) if i % 2 else spell(p) for i, p in enumerate(parts) if p]
    return " ".join(out) or '""'


_PY_NAME = regex.compile(r"[A-Za-z_][\w.\-]*")  # a key the Python-style parser reads


def _tagged_call(tags: Tags, spell: Spell) -> CallWriter:
    def param(rule: str, key: str, schema: Any) -> Lines:
        if any(c in key for c in '"<>') or not key.strip():
            raise Unsupported(f"a parameter named {key!r} in a tag")
        kind = schema.get("type") if isinstance(schema, Mapping) else None
        head = tags.json_open if kind != "string" and tags.json_open else tags.param_open
        head = head.format(key=key, type=_TYPE_NAMES.get(kind, _ANY_TYPE)
                           if isinstance(kind, str) else _ANY_TYPE)
        close, may_nl, _ = tags.param_close.format(key=key).partition(_MAY_NL)
        lines = raw_value(f"{rule}_v", schema, close, spell)
        return [f"{rule}: {_spelled(head, spell)} {rule}_v"
                + (" " + _HOLES[_MAY_NL](spell) if may_nl else ""), *lines]

    def write(rule: str, name: str, params: Mapping[str, Any]) -> Lines:
        lines, items = keyed(rule, params, param)
        body = " ".join(item if required else f"{item}?" for item, required in items)
        return [f"{rule}: {_spelled(tags.call_open.format(name=name), spell)} {body} "
                f"{_spelled(tags.call_close, spell)}", *lines]
    return write


def tagged(tags: Tags, thinking: tuple[str, str] = ("", "")) -> Writer:
    """The calls written in ``tags``. ``thinking``: the family's reasoning block (open and
    end tags; no open tag: the generation prompt opened it, and the end tag must come),
    which the grammar lets come first, for the families whose reply the caller does not
    split into reasoning and answer (``includes_reasoning``)."""
    def writer(functions: Functions, parallel: bool, spell: Spell) -> Lines:
        sep = _spelled(tags.sep, spell) if tags.sep else ""
        calls = f"fn ({sep} fn)*" if parallel and sep else "fn+" if parallel else "fn"
        opened, end = thinking
        think = f"({spell(opened)} think)?" if opened else "think" if end else ""
        parts = [think, _spelled(tags.open, spell) if tags.open else "", calls,
                 _spelled(tags.close, spell) if tags.close else ""]
        lines = ["start: " + " ".join(p for p in parts if p)]
        if end:
            lines += until("think", end, spell)
        return [*lines, *choose(functions, _tagged_call(tags, spell))]
    return writer


def _pythonic(functions: Functions, parallel: bool, spell: Spell) -> Lines:
    """LFM2: ``<|tool_call_start|>[NAME(key=VALUE, ...), ...]<|tool_call_end|>``, each
    value a JSON literal (which the Python-literal parser reads as such)."""
    def param(rule: str, key: str, schema: Any) -> Lines:
        if not _PY_NAME.fullmatch(key):
            raise Unsupported(f"a parameter named {key!r} in a Python-style call")
        return [f"{rule}: {lit(key + '=')} {rule}_v", json_rule(f"{rule}_v", schema)]

    def write(rule: str, name: str, params: Mapping[str, Any]) -> Lines:
        lines, items = keyed(rule, params, param)
        chain, start = separated(f"{rule}_a", items, lit(", "))
        return [f"{rule}: {lit(name + '(')} {start} {lit(')')}", *lines, *chain]
    calls = 'fn (", " fn)*' if parallel else "fn"
    return [f"start: {spell('<|tool_call_start|>[')} {calls} {spell(']<|tool_call_end|>')}",
            *choose(functions, write)]


_N = _MAY_NL
_GLM = Tags("", "", "<tool_call>{name}" + _N, "</tool_call>",
            "<arg_key>{key}</arg_key>" + _N + "<arg_value>", "</arg_value>" + _N, sep=_N)
_DSML_PARAM = '<｜DSML｜parameter name="{key}" string="'
_DSML = Tags("<｜DSML｜tool_calls>\n", "</｜DSML｜tool_calls>",
             '<｜DSML｜invoke name="{name}">\n', "</｜DSML｜invoke>\n",
             _DSML_PARAM + 'true">', "</｜DSML｜parameter>\n", _DSML_PARAM + 'false">')
_HY3 = Tags("<tool_calls:opensource>\n", "</tool_calls:opensource>",
            "<tool_call:opensource>{name}<tool_sep:opensource>\n", "</tool_call:opensource>\n",
            "<arg_key:opensource>{key}</arg_key:opensource>\n<arg_value:opensource>",
            "</arg_value:opensource>\n")
_NS = "]<]minimax[>["  # MiniMax M3's namespace token, before each of its tags
_MINIMAX_M3 = Tags(_NS + "<tool_call>\n", _NS + "</tool_call>", _NS + '<invoke name="{name}">',
                   _NS + "</invoke>\n", _NS + "<{key}>", _NS + "</{key}>")
# Kimi K3: the think section the generation prompt opened is closed (perhaps empty), an
# empty response section may follow; the parser reads calls only after one of them
_K3 = Tags(_K3_RESPONSE + "<|open|>tools<|sep|>", "<|close|>tools<|sep|>" + _K3_END,
           '<|open|>call tool="{name}" index="' + _INDEX + '"<|sep|>', "<|close|>call<|sep|>",
           '<|open|>argument key="{key}" type="string"<|sep|>', "<|close|>argument<|sep|>",
           '<|open|>argument key="{key}" type="{type}"<|sep|>')
# Muse Glimmer: each call a message to the function, after an optional one to itself
# (its reasoning); the generation prompt opened the first message
_MUSE_NEXT = "<|eom|><|start|>assistant"
_MUSE = Tags("", "", ' to={name}<|message|><atem:function_calls>\n<atem:invoke name="{name}">\n',
             "</atem:invoke>\n</atem:function_calls>", '<atem:parameter name="{key}">',
             "</atem:parameter>\n", sep=_MUSE_NEXT)
_SEED = Tags("", "", "<seed:tool_call>\n<function={name}>\n", "</function>\n</seed:tool_call>",
             "<parameter={key}>", "</parameter>\n", sep="\n")

XML_WRITERS: dict[str, Writer] = {
    "glm": tagged(_GLM),
    "ling3": tagged(_GLM),
    "hy3": tagged(_HY3),
    "deepseek-dsml": tagged(_DSML),
    "minicpm5": tagged(Tags("", "", '<function name="{name}">', "</function>",
                            '<param name="{key}">', "</param>", sep="\n")),
    "minimax-m2": tagged(Tags("<minimax:tool_call>\n", "</minimax:tool_call>",
                              '<invoke name="{name}">' + _N, "</invoke>\n",
                              '<parameter name="{key}">', "</parameter>" + _N)),
    "minimax-m3": tagged(_MINIMAX_M3, ("<mm:think>", "</mm:think>")),
    "kimi-k3": tagged(_K3, ("", "<|close|>think<|sep|>")),
    "seed-oss": tagged(_SEED),
    "muse-glimmer": tagged(_MUSE, (" to=self<|message|>", _MUSE_NEXT)),
    "lfm2": _pythonic,
    "lfm2.5": _pythonic,
}
