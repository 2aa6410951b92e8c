"""Families whose calls spell each parameter out in tags rather than JSON: Qwen3-Coder
(``<function=..><parameter=..>``), GLM (``<arg_key>/<arg_value>``), DeepSeek V4 DSML,
MiniCPM and Muse ``<param name=..>``. The arguments come back as compact JSON, each value
typed by the tool's schema; a call cut off mid-value gives the JSON written so far."""

from __future__ import annotations

import json
from dataclasses import dataclass

import regex

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
    # a partial call shows a parameter as soon as its key is written (Kimi K3), not only
    # once its value has begun
    key_when_named: bool = False


def _bare_name(body: str, syntax: ParamSyntax, complete: bool) -> tuple[str, int] | None:
    """A name with no closing tag (GLM): it ends at the first whitespace or parameter; in
    a cut-off call, only once something follows it."""
    stop = body.find(syntax.name_close) if syntax.name_close else -1
    if stop >= 0:
        return body[:stop].strip(), stop + len(syntax.name_close)
    lead = len(body) - len(body.lstrip())
    ends = [at for at in (body.find(syntax.key_open), _space_at(body, lead)) if at >= 0]
    if ends:
        return body[:min(ends)].strip(), min(ends)
    return (body.strip(), len(body)) if complete else None


def _space_at(text: str, pos: int) -> int:
    """Where the first whitespace at or after ``pos`` is (-1: none)."""
    found = regex.search(r"\s", text[pos:pos + 512]) if pos < len(text) else None
    return pos + found.start() if found is not None else -1


def _name(body: str, syntax: ParamSyntax, complete: bool) -> tuple[str, int] | None:
    if not syntax.name_open:
        return _bare_name(body, syntax, complete)
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


def _open_value(raw: str, syntax: ParamSyntax) -> str | None:
    """The text so far of a value the reply stops inside (None: nothing of it yet)."""
    raw = partial_tail_cut(raw, syntax.value_close)
    if syntax.trim_newlines:  # the value begins with the newline after its tag
        return raw.removeprefix("\n").removesuffix("\n") if raw else None
    return raw


def _params(body: str, pos: int, name: str, syntax: ParamSyntax, request: Request):
    """``(done, open)``: finished parameters, and the one being written (key, text so far;
    text None when only its key is there) if the reply stops inside it."""
    done: dict = {}
    while (k := body.find(syntax.key_open, pos)) >= 0:
        k += len(syntax.key_open)
        key_end = body.find(syntax.key_close, k)
        if key_end < 0:
            return done, None
        key = body[k:key_end].strip()
        v = body.find(syntax.value_open, key_end + len(syntax.key_close))
        if v < 0:
            return done, ((key, None, False) if syntax.key_when_named else None)
        attrs = body[key_end:v]
        v += len(syntax.value_open)
        end = body.find(syntax.value_close, v)
        schema = param_schema(request.tools, name, key)
        if end < 0:
            raw = _open_value(body[v:], syntax)
            typed = 'string="false"' in attrs or not _may_be_string(schema)
            return done, ((key, raw, typed) if raw is not None or syntax.key_when_named else None)
        done[key] = _value(body[v:end], syntax, 'string="false"' in attrs, schema)
        pos = end + len(syntax.value_close)
    return done, None


def _may_be_string(schema: dict | None) -> bool:
    """Whether a parameter's value is text (llama.cpp then reads it raw, else as JSON)."""
    kind = (schema or {}).get("type")
    return kind is None or kind == "string" or (isinstance(kind, list) and "string" in kind)


OpenParam = tuple[str, str | None, bool]


def _partial_json(done: dict, open_param: OpenParam | None) -> str:
    """The arguments so far: finished parameters, then the one being written (its text as
    a JSON string so far, or as written when the value is JSON-typed)."""
    text = dump_arguments(done)[:-1]
    if open_param is None:
        return text
    key, raw, typed = open_param
    sep = "," if done else ""
    value = "" if raw is None else (raw if typed else json.dumps(raw, ensure_ascii=False)[:-1])
    return text + sep + json.dumps(key, ensure_ascii=False) + ":" + value


def xml_reader(syntax: ParamSyntax):
    """The reader of one call block written in ``syntax``."""
    def read(body: str, request: Request, complete: bool) -> list[Call]:
        named = _name(body, syntax, complete)
        if named is None or not named[0]:
            return []
        name, pos = named
        done, open_param = _params(body, pos, name, syntax, request)
        if complete:
            return [Call(name, dump_arguments(done))]
        return [Call(name, _partial_json(done, open_param))]
    return read


def xml_tools(open_tag: str, close_tag: str, syntax: ParamSyntax,
              section: str | tuple[str, ...] = "", lead: str = ""):
    """Calls in ``open_tag``...``close_tag`` blocks (inside a ``section`` if the family
    wraps them in one), parameters in ``syntax``; ``lead`` is the separator the family
    writes between content and its calls (not part of the content)."""
    read = xml_reader(syntax)

    first = section if isinstance(section, str) else section[0]

    def parse(text: str, request: Request) -> tuple[str, list[Call]]:
        content, calls = tagged_calls(text, request, open_tag, close_tag, read, section)
        if lead and calls:
            content = content.removesuffix(lead)
        elif lead and request.partial:  # the separator may be the calls' beginning
            content = partial_tail_cut(content, lead + (first or open_tag))
        return content, calls
    return parse


QWEN3_CODER = ParamSyntax("<function=", ">", "<parameter=", ">", "", "</parameter>",
                          trim_newlines=True)
GLM = ParamSyntax("", "", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>",
                 key_when_named=True)
HY3 = ParamSyntax("", "<tool_sep:opensource>", "<arg_key:opensource>", "</arg_key:opensource>",
                  "<arg_value:opensource>", "</arg_value:opensource>", key_when_named=True)
DSML = ParamSyntax('name="', '"', '<｜DSML｜parameter name="', '"', ">",
                   "</｜DSML｜parameter>")
MINICPM = ParamSyntax('name="', '"', '<param name="', '"', ">", "</param>")
MUSE = ParamSyntax('name="', '"', '<atem:parameter name="', '"', ">",
                   "</atem:parameter>")
MINIMAX_M2 = ParamSyntax("", '">', '<parameter name="', '"', ">", "</parameter>")
SEED_OSS = ParamSyntax("<function=", ">", "<parameter=", ">", "", "</parameter>")
