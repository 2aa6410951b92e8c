"""The Lark pieces forced-call grammars are built of (``call_grammars``): a choice among
the offered functions, JSON values held to a schema, and parameters spelled out one by one
(as raw text where the family writes strings raw)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["Functions", "Spell", "Unsupported", "choose", "json_rule", "keyed", "lit",
           "raw_value", "separated", "sub_schema", "until"]

Spell = Callable[[str], str]  # characters as Lark text, special tokens spelled as tokens
# (name, parameters schema) of each function a forced call may choose
Functions = Sequence[tuple[str, Mapping[str, Any]]]
# the rules of one function's call: (rule, name, parameters schema) -> Lark lines that
# define ``rule`` (and rules named after it)
CallWriter = Callable[[str, str, Mapping[str, Any]], list[str]]
# the rules of one parameter: (rule name, key, schema) -> Lark lines that define it
ParamWriter = Callable[[str, str, Any], list[str]]



class Unsupported(ValueError):
    """A schema the family's syntax cannot hold as the grammar writes it (the request is
    refused as for a family without a grammar; nothing is written loosely instead)."""


# what a parameter's own schema keeps from the function's (llguidance's options, and the
# definitions its references point into)
_INHERITED = ("x-guidance", "$defs", "definitions")


def lit(text: str) -> str:
    """``text`` as a Lark string literal."""
    return json.dumps(text, ensure_ascii=False)


def json_rule(name: str, schema: Any) -> str:
    return f"{name}: %json {json.dumps(schema, ensure_ascii=False)}"


def sub_schema(params: Mapping[str, Any], schema: Any) -> dict[str, Any]:
    """A parameter's schema on its own: the function's llguidance options and definitions
    carried over, so that its ``$ref``s resolve and its JSON is spaced like the rest."""
    out = dict(schema) if isinstance(schema, Mapping) else {}
    for key in _INHERITED:
        if key in params and key not in out:
            out[key] = params[key]
    return out


def choose(functions: Functions, write: CallWriter, rule: str = "fn") -> list[str]:
    """Rules ``{rule}0``... (one a function) written by ``write``, and ``rule``: any one
    of them."""
    lines: list[str] = []
    for i, (name, params) in enumerate(functions):
        lines += write(f"{rule}{i}", name, params)
    lines.append(f"{rule}: " + " | ".join(f"{rule}{i}" for i in range(len(functions))))
    return lines


def keyed(fn: str, params: Mapping[str, Any], write: ParamWriter
          ) -> tuple[list[str], list[tuple[str, bool]]]:
    """The rules of function rule ``fn``'s parameters, one a property in the schema's order, and
    ``(rule, required)`` for each (a parameter the schema does not require may be left
    out). Properties are what a key/value syntax can spell; a schema without them has no
    parameters here."""
    props = params.get("properties")
    props = props if isinstance(props, Mapping) else {}
    required = params.get("required")
    required = set(required) if isinstance(required, list) else set()
    lines: list[str] = []
    items: list[tuple[str, bool]] = []
    for j, (key, schema) in enumerate(props.items()):
        rule = f"{fn}_p{j}"
        lines += write(rule, str(key), sub_schema(params, schema))
        items.append((rule, key in required))
    return lines, items


def separated(prefix: str, items: list[tuple[str, bool]], sep: str) -> tuple[list[str], str]:
    """Rules for ``items`` in order with ``sep`` (Lark) between those written, the optional
    ones optional, and the expression that starts them ('' when there are none):
    ``{prefix}_f{j}`` is what follows when nothing is written yet, ``{prefix}_r{j}`` when
    something is."""
    n = len(items)
    lines: list[str] = []
    for j, (item, required) in enumerate(items):
        rest = f" {prefix}_r{j + 1}" if j + 1 < n else ""
        after = f"{sep} {item}" if required else f"({sep} {item})?"
        lines.append(f"{prefix}_r{j}: {after}{rest}")
        if required:
            lines.append(f"{prefix}_f{j}: {item}{rest}")
        elif j + 1 < n:
            lines.append(f"{prefix}_f{j}: {item}{rest} | {prefix}_f{j + 1}")
        else:
            lines.append(f"{prefix}_f{j}: {item}?")
    return lines, (f"{prefix}_f0" if n else "")


_SPECIAL = re.compile(r" ?(<\[\d+\]>) ?")


def until(rule: str, end: str, spell: Spell, text: str = "(?s:.*)") -> list[str]:
    """``rule``: free text (the regex ``text``) up to the first ``end``, and ``end``. A
    lazy lexeme ends at the first ``end``; llguidance takes no special token inside a
    lexeme, so where ``end`` holds special tokens the lexeme runs up to its text before
    the first of them (or, with none before, is ended by that token: no text matches a
    special token), and the rest of ``end`` follows as its own items."""
    spelled = spell(end)
    if spelled == lit(end):
        return [f"{rule}[lazy]: /{text}/ {spelled}"]
    head, *rest = _SPECIAL.split(spelled, maxsplit=1)
    tail = " ".join(rest).strip()
    if not head:
        return [f"{rule}: /{text}/ {tail}"]
    return [f"{rule}: {rule}_text {tail}", f"{rule}_text[lazy]: /{text}/ {head}"]


def raw_value(rule: str, schema: Any, close: str, spell: Spell) -> list[str]:
    """A parameter's value and then the text ``close``: a string as raw text up to the
    close (its ``enum`` or ``const`` as the choices, its ``minLength`` and ``maxLength``
    kept), anything else as JSON."""
    if not isinstance(schema, Mapping):
        schema = {}
    if schema.get("type") != "string":
        return [f"{rule}: {rule}_json {spell(close)}", json_rule(f"{rule}_json", schema)]
    words = [schema["const"]] if "const" in schema else schema.get("enum")
    if isinstance(words, list):
        return [f"{rule}: ({' | '.join(lit(str(w)) for w in words)}) {spell(close)}"]
    low, high = schema.get("minLength"), schema.get("maxLength")
    low = low if isinstance(low, int) and not isinstance(low, bool) else 0
    high = high if isinstance(high, int) and not isinstance(high, bool) else None
    bound = "*" if high is None and not low else f"{{{low},{'' if high is None else high}}}"
    return until(rule, close, spell, f"(?s:.{bound})")
