"""A forced tool call (``tool_choice`` "required" or a named function) in the family's own
syntax, as Lark text for llguidance: the call the model would write unforced, with its
arguments held to the function's schema.

``call_grammar(family, ...)`` returns the grammar for the families that have a row in
``_WRITERS`` and None for the others (the caller says so; nothing falls back). Harmony's
grammar includes its analysis channel, since its calls are a channel of their own; the
others describe only the call, and the caller lets reasoning come first
(``engine.grammar.after_reasoning``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["call_grammar", "families_with_forced_calls"]

Spell = Callable[[str], str]  # characters as Lark text, special tokens spelled as tokens
# (name, parameters schema) of each function a forced call may choose
Functions = Sequence[tuple[str, Mapping[str, Any]]]


def _json_rule(name: str, schema: Mapping[str, Any]) -> str:
    return f"{name}: %json {json.dumps(schema, ensure_ascii=False)}"


def _harmony(functions: Functions, parallel: bool, spell: Spell) -> list[str]:
    """``<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>``
    after an optional analysis message (the generation prompt is ``<|start|>assistant``)."""
    lines = [f"start: ({spell('<|channel|>analysis<|message|>')} think "
             f"{spell('<|start|>assistant')})? call",
             f"think[lazy]: /(?s:.*)/ {spell('<|end|>')}",
             f"call: {spell('<|channel|>commentary to=functions.')} fn"]
    alts = []
    for i, (name, params) in enumerate(functions):
        lines.append(f"fn{i}: {spell(name + ' <|constrain|>json<|message|>')} args{i} "
                     f"{spell('<|call|>')}")
        lines.append(_json_rule(f"args{i}", params))
        alts.append(f"fn{i}")
    lines.append("fn: " + " | ".join(alts))
    return lines


def _qwen3_coder(functions: Functions, parallel: bool, spell: Spell) -> list[str]:
    """``<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n...
    </function>\\n</tool_call>``: string values as raw text, others as JSON; the required
    parameters in the schema's order, each optional one optional."""
    lines = ['start: call ("\\n" call)*' if parallel else "start: call",
             f"call: {spell('<tool_call>')} \"\\n<function=\" fn \"</function>\\n\" "
             f"{spell('</tool_call>')}"]
    alts = []
    for i, (name, params) in enumerate(functions):
        props = params.get("properties") or {}
        required = set(params.get("required") or [])
        parts = [json.dumps(f"{name}>\n", ensure_ascii=False)]
        for j, (key, schema) in enumerate(props.items()):
            rule = f"p{i}_{j}"
            head = json.dumps(f"<parameter={key}>\n", ensure_ascii=False)
            lines += [f"{rule}: {head} v{i}_{j}", *_xml_value(f"v{i}_{j}", schema)]
            parts.append(rule if key in required else f"{rule}?")
        lines.append(f"fn{i}: " + " ".join(parts))
        alts.append(f"fn{i}")
    lines.append("fn: " + " | ".join(alts))
    return lines


_CLOSE = json.dumps("\n</parameter>\n")


def _xml_value(rule: str, schema: Any) -> list[str]:
    """A parameter's value and its closing tag: a string as raw text (its enum as the
    choices; its maxLength as the bound), anything else as JSON."""
    if not isinstance(schema, Mapping):
        schema = {}
    if schema.get("type") == "string" and isinstance(schema.get("enum"), list):
        words = " | ".join(json.dumps(str(w), ensure_ascii=False) for w in schema["enum"])
        return [f"{rule}: ({words}) {_CLOSE}"]
    if schema.get("type") == "string":
        n = schema.get("maxLength")
        bound = f"{{0,{n}}}" if isinstance(n, int) and not isinstance(n, bool) else "*"
        return [f"{rule}[lazy]: /(?s:.{bound})/ {_CLOSE}"]
    return [f"{rule}: {rule}_json {_CLOSE}", _json_rule(f"{rule}_json", schema)]


_WRITERS = {"harmony": _harmony, "qwen3-coder": _qwen3_coder}


def families_with_forced_calls() -> tuple[str, ...]:
    return tuple(_WRITERS)


def call_grammar(family: str, functions: Functions, parallel: bool, spell: Spell
                 ) -> str | None:
    """Lark text for a forced call of one of ``functions`` in ``family``'s syntax (None:
    the family has no row); whether it already covers the reasoning is
    ``includes_reasoning(family)``."""
    writer = _WRITERS.get(family)
    return None if writer is None else "\n".join(writer(functions, parallel, spell)) + "\n"


def includes_reasoning(family: str) -> bool:
    return family == "harmony"
