"""The table of families, most specific first (see ``detect``)."""

from __future__ import annotations

from . import cohere, harmony, pythonic
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
    # LFM2 / LFM2.5: llama.cpp reads <think> only where the template writes "<think>";
    # these write just "</think>" (to drop past thinking), so a <think> stays content
    Family("lfm2", ("<|tool_list_start|>", "<|tool_list_end|>"), pythonic.pythonic,
           think=("", "")),
    Family("lfm2.5", ("List of tools: [",), pythonic.pythonic, think=("", "")),
    Family("cohere2", ("<|START_TEXT|>", "<|START_ACTION|>"), reader=cohere.cohere2,
           turn=("", "<|END_OF_TURN_TOKEN|>")),
    Family("command-r", ("<|START_OF_TURN_TOKEN|>", "Action:"), cohere.command_r,
           turn=("<|CHATBOT_TOKEN|>", "<|END_OF_TURN_TOKEN|>")),
    Family("granite", ("<|tool_call|>",), js.json_list_after("<|tool_call|>")),
    Family("firefunction", ("functools[",), js.json_list_after(" functools")),
    Family("llama3", ("<|start_header_id|>", "parameters"), js.llama3),
    Family("qwen3-coder", ("<function=", "<parameter="),
           xml.xml_tools("<tool_call>", "</tool_call>", xml.QWEN3_CODER)),
    Family("hy3", ("<tool_calls:opensource>",),
           xml.xml_tools("<tool_call:opensource>", "</tool_call:opensource>", xml.HY3,
                         section="<tool_calls:opensource>"),
           think=("<think:opensource>", "</think:opensource>")),
    # a GLM-style template whose generation prompt opens a bare <think> (poolside Laguna):
    # llama.cpp keeps the whitespace around the block, as for QwQ
    Family("glm-open-think", ("<arg_key>", "{{- '<think>' -}}"),
           xml.xml_tools("<tool_call>", "</tool_call>", xml.GLM), raw_whitespace=True),
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
    # a Hermes template whose generation prompt opens <think> itself (QwQ): llama.cpp then
    # parses the prompt's tail with the reply and keeps the whitespace around the block
    Family("hermes-open-think", ("<tool_call>", "'<|im_start|>assistant\\n<think>\\n'"),
           js.hermes, raw_whitespace=True),
    Family("hermes", ("<tool_call>",), js.hermes),
    # SmolLM3: no call syntax llama.cpp reads, but it keeps the whitespace around <think>
    Family("smollm3", ('"<|im_start|>assistant\\n" + "<think>\\n\\n</think>\\n"',),
           raw_whitespace=True),
)
