"""The table of chat formats, and recognising a template's family from its text.

llama.cpp recognises families by what their templates contain (``[TOOL_CALLS]``,
``<|channel|>``, ``<tool_call>``...); so do we. The table is ordered: the first family
whose markers all appear in the template wins, so a family that also contains another
family's markers (Qwen3-Coder's ``<function=`` inside ``<tool_call>``) comes first.
"""

from __future__ import annotations

from .families import FAMILIES, GENERIC, Family

__all__ = ["FAMILIES", "Family", "detect_family"]


def detect_family(template_text: str) -> Family:
    """The first family that ``template_text`` matches (else the generic one: ``<think>``
    reasoning, no tool calls)."""
    for family in FAMILIES:
        if family.matches(template_text):
            return family
    return GENERIC
