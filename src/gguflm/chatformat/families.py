"""The table of families, most specific first (see ``detect``)."""

from __future__ import annotations

from . import harmony
from . import json_families as js
from . import xml_families as xml
from .family import Family

__all__ = ["FAMILIES", "GENERIC", "Family"]

GENERIC = Family("generic", ())

FAMILIES: tuple[Family, ...] = (
    Family("harmony", ("<|channel|>",), keeps_developer=True, reader=harmony.harmony),
    Family("mistral", ("[TOOL_CALLS]",), js.mistral, think=("[THINK]", "[/THINK]")),
    Family("kimi-k2", ("<|tool_calls_section_begin|>", "<|tool_call_begin|>"), js.kimi_k2),
    Family("nemotron", ("<TOOLCALL>",), js.tagged_list("<TOOLCALL>", "</TOOLCALL>")),
    Family("apriel", ("<tool_calls>", "[BEGIN FINAL RESPONSE]"),
           js.tagged_list("<tool_calls>", "</tool_calls>"),
           think=("Here are my reasoning steps:", "[BEGIN FINAL RESPONSE]")),
    Family("granite", ("<|tool_call|>",), js.json_list_after("<|tool_call|>")),
    Family("firefunction", ("functools[",), js.json_list_after(" functools")),
    Family("llama3", ("<|start_header_id|>", "parameters"), js.llama3),
    Family("qwen3-coder", ("<function=", "<parameter="),
           xml.xml_tools("<tool_call>", "</tool_call>", xml.QWEN3_CODER)),
    Family("hy3", ("<tool_calls:opensource>",),
           xml.xml_tools("<tool_call:opensource>", "</tool_call:opensource>", xml.HY3,
                         section="<tool_calls:opensource>"),
           think=("<think:opensource>", "</think:opensource>")),
    Family("glm", ("<arg_key>",), xml.xml_tools("<tool_call>", "</tool_call>", xml.GLM)),
    Family("deepseek-dsml", ("DSML",),
           xml.xml_tools("<｜DSML｜invoke ", "</｜DSML｜invoke>", xml.DSML,
                         section="<｜DSML｜tool_calls>")),
    Family("deepseek-r1", ("<｜tool▁calls▁begin｜>", "<｜tool▁sep｜>", "tools"), js.deepseek_r1,
           raw_whitespace=True),
    # the R1 distills write calls only in the history: llama.cpp reads none from replies
    Family("deepseek-r1-distill", ("<｜Assistant｜>", "<think>"), raw_whitespace=True),
    Family("minicpm", ('<function name="', '<param name="'),
           xml.xml_tools("<function ", "</function>", xml.MINICPM)),
    Family("hermes", ("<tool_call>",), js.hermes),
)
