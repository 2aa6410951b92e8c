"""Families whose calls spell each parameter out in tags rather than JSON: Qwen3-Coder
(``<function=..><parameter=..>``), GLM (``<arg_key>/<arg_value>``), DeepSeek V4 DSML,
MiniCPM and Muse ``<param name=..>``. The arguments come back as compact JSON, each value
typed by the tool's schema; a call cut off mid-value gives the JSON written so far."""

from __future__ import annotations

import json
from dataclasses import dataclass

from .calls import tagged_calls
from .reply import Call, Request, dump_arguments, param_schema, partial_tail_cut, scalar

__all__ = ["ParamSyntax", "xml_tools"]


@dataclass(frozen=True)
class ParamSyntax:
    """How one family writes a call: the name between ``name_open`` and ``name_close``
    (``name_open`` empty: the body's start up to the first parameter), then parameters as
    ``key_open KEY key_close ... value_open VALUE value_close``."""

    name_open: str
    name_close: str
    key_open: str
    key_close: str
    value_open: str
    value_close: str
    trim_newlines: bool = False  # Qwen3-Coder puts the value on lines of its own


def _name(body: str, syntax: ParamSyntax) -> tuple[str, int] | None:
    if not syntax.name_open:
        stop = body.find(syntax.name_close) if syntax.name_close else -1
        if stop >= 0:
            return body[:stop].strip(), stop + len(syntax.name_close)
        stop = body.find(syntax.key_open)
        stop = len(body) if stop < 0 else stop
        return body[:stop].strip(), stop
    start = body.find(syntax.name_open)
    if start < 0:
        return None
    start += len(syntax.name_open)
    stop = body.find(syntax.name_close, start)
    if stop < 0:
        return None
    return body[start:stop].strip(), stop + len(syntax.name_close)


def _value(raw: str, syntax: ParamSyntax, as_json: bool, schema: dict | None):
    if syntax.trim_newlines:
        raw = raw.removeprefix("\n").removesuffix("\n")
    # DSML says string="false" for JSON values; elsewhere the tool's schema decides
    return scalar(raw, None if as_json else (schema or {"type": "string"}))


def _params(body: str, pos: int, name: str, syntax: ParamSyntax, request: Request):
    """``(done, open)``: finished parameters, and the one being written (key, text) if the
    reply stops inside a value."""
    done: dict = {}
    while (k := body.find(syntax.key_open, pos)) >= 0:
        k += len(syntax.key_open)
        key_end = body.find(syntax.key_close, k)
        if key_end < 0:
            return done, None
        key = body[k:key_end].strip()
        v = body.find(syntax.value_open, key_end + len(syntax.key_close))
        if v < 0:
            return done, None
        attrs = body[key_end:v]
        v += len(syntax.value_open)
        end = body.find(syntax.value_close, v)
        schema = param_schema(request.tools, name, key)
        as_json = 'string="false"' in attrs
        if end < 0:
            raw = partial_tail_cut(body[v:], syntax.value_close)
            return done, (key, raw.removeprefix("\n") if syntax.trim_newlines else raw)
        done[key] = _value(body[v:end], syntax, as_json, schema)
        pos = end + len(syntax.value_close)
    return done, None


def _partial_json(done: dict, open_param: tuple[str, str] | None) -> str:
    text = dump_arguments(done)[:-1]
    if open_param is None:
        return text
    key, raw = open_param
    sep = "," if done else ""
    return text + sep + json.dumps(key, ensure_ascii=False) + ":" + \
        json.dumps(raw, ensure_ascii=False)[:-1]


def xml_reader(syntax: ParamSyntax):
    """The reader of one call block written in ``syntax``."""
    def read(body: str, request: Request, complete: bool) -> list[Call]:
        named = _name(body, syntax)
        if named is None or not named[0]:
            return []
        name, pos = named
        done, open_param = _params(body, pos, name, syntax, request)
        if complete:
            return [Call(name, dump_arguments(done))]
        return [Call(name, _partial_json(done, open_param))]
    return read


def xml_tools(open_tag: str, close_tag: str, syntax: ParamSyntax, section: str = ""):
    """Calls in ``open_tag``...``close_tag`` blocks (inside a ``section`` if the family
    wraps them in one), parameters in ``syntax``."""
    read = xml_reader(syntax)

    def parse(text: str, request: Request) -> tuple[str, list[Call]]:
        return tagged_calls(text, request, open_tag, close_tag, read, section)
    return parse


QWEN3_CODER = ParamSyntax("<function=", ">", "<parameter=", ">", "", "</parameter>",
                          trim_newlines=True)
GLM = ParamSyntax("", "", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>")
HY3 = ParamSyntax("", "<tool_sep:opensource>", "<arg_key:opensource>", "</arg_key:opensource>",
                  "<arg_value:opensource>", "</arg_value:opensource>")
DSML = ParamSyntax('name="', '"', '<｜DSML｜parameter name="', '"', ">",
                   "</｜DSML｜parameter>")
MINICPM = ParamSyntax('<function name="', '"', '<param name="', '"', ">", "</param>")
MUSE = ParamSyntax('name="', '"', '<atem:parameter name="', '"', ">",
                   "</atem:parameter>")
