"""A forced tool call (``tool_choice`` "required" or a named function) in the family's own
syntax, as Lark text for llguidance: the call the model would write unforced, with its
arguments held to the function's schema, written so that the family's parser reads it
back as that call.

``call_grammar(family, ...)`` returns the grammar for the families that have a row in
``_WRITERS`` and None for the others (the caller says so; nothing falls back). Harmony's
grammar includes its analysis channel, since its calls are a channel of their own; the
others describe only the call, and the caller lets reasoning come first
(``engine.grammar.after_reasoning``). The rows: Harmony and Qwen3-Coder here, the
JSON-argument families in ``call_grammars_json``, the key/value ones in
``call_grammars_xml``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .call_grammars_gemma import gemma4
from .call_grammars_json import JSON_WRITERS
from .call_grammars_xml import XML_WRITERS
from .call_rules import (
    Functions,
    Spell,
    Unsupported,
    choose,
    json_rule,
    keyed,
    lit,
    raw_value,
    until,
)

__all__ = ["call_grammar", "families_with_forced_calls", "includes_reasoning"]


def _harmony(functions: Functions, parallel: bool, spell: Spell) -> list[str]:
    """``<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>``
    (or the recipient first, as gpt-oss's template writes past calls: `` to=functions.NAME
    <|channel|>commentary json<|message|>``) after an optional analysis message (the
    generation prompt is ``<|start|>assistant``)."""
    def write(rule: str, name: str, params: Mapping[str, Any]) -> list[str]:
        channel_first = spell(f"<|channel|>commentary to=functions.{name} "
                              "<|constrain|>json<|message|>")
        recipient_first = spell(f" to=functions.{name}<|channel|>commentary json<|message|>")
        return [f"{rule}: ({channel_first} | {recipient_first}) {rule}_args "
                f"{spell('<|call|>')}", json_rule(f"{rule}_args", params)]
    return [f"start: ({spell('<|channel|>analysis<|message|>')} think "
            f"{spell('<|start|>assistant')})? fn",
            *until("think", "<|end|>", spell), *choose(functions, write)]


def _qwen3_coder(functions: Functions, parallel: bool, spell: Spell) -> list[str]:
    """``<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n...
    </function>\\n</tool_call>``: string values as raw text, others as JSON; the required
    parameters in the schema's order, each optional one optional."""
    def param(rule: str, key: str, schema: Any) -> list[str]:
        if any(c in key for c in "<>") or not key.strip():
            raise Unsupported(f"a parameter named {key!r} in a tag")
        return [f"{rule}: {lit(f'<parameter={key}>' + chr(10))} {rule}_v",
                *raw_value(f"{rule}_v", schema, "\n</parameter>\n", spell)]

    def write(rule: str, name: str, params: Mapping[str, Any]) -> list[str]:
        lines, items = keyed(rule, params, param)
        body = " ".join(item if required else f"{item}?" for item, required in items)
        return [f"{rule}: {lit(name + '>' + chr(10))} {body}".rstrip(), *lines]
    return ['start: call ("\\n"? call)*' if parallel else "start: call",
            f"call: {spell('<tool_call>')} \"\\n<function=\" fn \"</function>\\n\" "
            f"{spell('</tool_call>')}", *choose(functions, write)]


_WRITERS = {"harmony": _harmony, "qwen3-coder": _qwen3_coder, "gemma4": gemma4,
            "gemma4-legacy": gemma4, **JSON_WRITERS, **XML_WRITERS}


def families_with_forced_calls() -> tuple[str, ...]:
    return tuple(_WRITERS)


def call_grammar(family: str, functions: Functions, parallel: bool, spell: Spell
                 ) -> str | None:
    """Lark text for a forced call of one of ``functions`` in ``family``'s syntax (None:
    the family has no row, or its syntax cannot hold one of the schemas as written here);
    whether it already covers the reasoning is ``includes_reasoning(family)``."""
    writer = _WRITERS.get(family)
    if writer is None:
        return None
    try:
        return "\n".join(writer(functions, parallel, spell)) + "\n"
    except Unsupported:
        return None


# families whose reply the caller reads whole (no reasoning rules: ``chatformat.thinking``),
# whose grammar lets the reasoning come first itself
_WITH_REASONING = frozenset({"harmony", "gemma4", "gemma4-legacy", "minimax-m3", "kimi-k3",
                             "muse-glimmer"})


def includes_reasoning(family: str) -> bool:
    return family in _WITH_REASONING
