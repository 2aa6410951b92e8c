"""Forced calls in Gemma 4's syntax (``call_grammars``): ``<|tool_call>call:NAME{key:VALUE,
...}<tool_call|>``, values in Gemma's own notation as ``gemma4.to_json`` reads them: strings
in ``<|"|>`` quotes (raw text between), numbers, booleans and null bare, objects with bare
keys, lists. Keys come sorted, as the template writes them; the properties a schema does not
require are optional. A value whose schema says no plain type (``anyOf``, ``$ref``, a list
of types, an object without ``properties``) has no Gemma grammar here: ``Unsupported``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .call_rules import (
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

__all__ = ["gemma4"]

_Q = '<|"|>'
_SCALARS = ("integer", "number", "boolean", "null")
MAX_LISTED_ITEMS = 32  # a maxItems above this has no grammar here (its nesting grows with it)


def _value(rule: str, schema: Any, spell: Spell) -> list[str]:
    """Rules for ``rule``: one value held to ``schema``, in Gemma's notation."""
    if not isinstance(schema, Mapping):
        raise Unsupported("a parameter schema that is not an object")
    kind = schema.get("type")
    words = [schema["const"]] if "const" in schema else schema.get("enum")
    if isinstance(words, list) and words and all(isinstance(w, str) for w in words):
        return [f"{rule}: " + " | ".join(spell(_Q + w + _Q) for w in words)]
    if kind == "string":
        return [f"{rule}: {spell(_Q)} {rule}_s", *raw_value(f"{rule}_s", schema, _Q, spell)]
    if kind in _SCALARS:
        return [json_rule(rule, schema)]
    if kind == "object" and isinstance(schema.get("properties"), Mapping):
        return _object(rule, schema, spell)
    if kind == "array" and isinstance(schema.get("items"), Mapping):
        return [f"{rule}: {lit('[')} {_listed(f'{rule}_i', schema)} {lit(']')}",
                *_value(f"{rule}_i", schema["items"], spell)]
    raise Unsupported(f"a parameter of type {kind!r} in Gemma 4's notation")


def _object(rule: str, schema: Mapping[str, Any], spell: Spell) -> list[str]:
    """``{key:value,...}``, the keys sorted."""
    props = schema["properties"]
    if any(not str(k).strip() or any(c in str(k) for c in ":,{}[]") for k in props):
        raise Unsupported("a key Gemma 4's notation cannot write bare")
    ordered = {**schema, "properties": {k: props[k] for k in sorted(props)}}
    lines, items = keyed(rule, ordered, lambda r, key, sub: [
        f"{r}: {lit(key + ':')} {r}_v", *_value(f"{r}_v", sub, spell)])
    chain, start = separated(f"{rule}_a", items, lit(","))
    return [f"{rule}: {lit('{')} {start} {lit('}')}", *lines, *chain]


def _listed(item: str, schema: Mapping[str, Any]) -> str:
    """``item`` repeated with commas between, within the schema's minItems and maxItems."""
    low, high = schema.get("minItems", 0), schema.get("maxItems")
    low = low if isinstance(low, int) and not isinstance(low, bool) else 0
    sep = lit(",")
    if not isinstance(high, int) or isinstance(high, bool):
        if low == 0:
            return f"({item} ({sep} {item})*)?"
        return " ".join([item] + [f"{sep} {item}"] * (low - 1)) + f" ({sep} {item})*"
    if high > MAX_LISTED_ITEMS:
        raise Unsupported(f"maxItems above {MAX_LISTED_ITEMS} in Gemma 4's notation")
    expr = ""
    for k in range(high, 0, -1):  # the k-th item, and those after it
        body = f"{item if k == 1 else sep + ' ' + item} {expr}".strip()
        expr = body if k <= low else f"({body})?"
    return expr or '""'


def gemma4(functions: Functions, parallel: bool, spell: Spell) -> list[str]:
    """``<|tool_call>call:NAME{...}<tool_call|>``, one block a call, after an optional
    ``<|channel>thought ...<channel|>`` block (the caller does not split Gemma's reply, so
    the grammar holds its reasoning)."""
    def write(rule: str, name: str, params: Mapping[str, Any]) -> list[str]:
        return [f"{rule}: {spell('<|tool_call>call:' + name)} {rule}_o {spell('<tool_call|>')}",
                *_object(f"{rule}_o", params, spell)]
    return [f"start: ({spell('<|channel>thought')} think)? {'fn+' if parallel else 'fn'}",
            *until("think", "<channel|>", spell), *choose(functions, write)]
