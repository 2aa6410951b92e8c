"""The table of families, most specific first (see ``detect``).

Two kinds of rows, as in llama.cpp. ``specialized`` rows are families llama.cpp has a
parser of its own for (found by the same template markers it looks for); their reasoning
tags are fixed here. The other rows only name a tool-call syntax: llama.cpp learns those
templates' reasoning tags from renders (``analysis``), and so do we.
"""

from __future__ import annotations

from . import cohere, gemma4, harmony, kimi_k3, minimax, muse, pythonic
from . import json_families as js
from . import json_more as jm
from . import xml_families as xml
from .family import Family
from .reply import STRICT, Spacing
from .wrapped import wrapped_content

__all__ = ["FAMILIES", "GENERIC", "Family"]

GENERIC = Family("generic", ())

_NO_THINK = ("", "")

# families llama.cpp has its own parser for, in the order it looks for them
_SPECIALIZED: tuple[Family, ...] = (
    Family("ministral3", ("[SYSTEM_PROMPT]", "[TOOL_CALLS]", "[ARGS]"), js.mistral,
           think=("[THINK]", "[/THINK]"), absent=("[CALL_ID]",), specialized=True,
           spacing=Spacing(before=False, reasoning=False)),
    Family("harmony", ("<|channel|>",), keeps_developer=True, reader=harmony.harmony,
           specialized=True),
    Family("muse-glimmer", ("<atem:function_calls>", "<|eom|>"), reader=muse.muse,
           specialized=True),
    Family("functionary-v3.2", (">>>all", ">>>${recipient}"), reader=jm.functionary_v32,
           specialized=True),
    Family("kimi-k2", ("<|tool_calls_section_begin|>", "<|tool_call_begin|>"), js.kimi_k2,
           think_stops=("<|tool_calls_section_begin|>", "<|tool_call_begin|>"), spacing=STRICT,
           specialized=True),
    Family("kimi-k3", ("<|open|>", "<|close|>", "<|end_of_msg|>"), reader=kimi_k3.kimi_k3,
           specialized=True),
    Family("ling3", ("<role>ASSISTANT</role>", "<arg_key>"),
           xml.xml_tools("<tool_call>", "</tool_call>", xml.GLM), specialized=True,
           think_stops=("<tool_call>",), spacing=STRICT),
    Family("cohere2", ("<|START_TEXT|>", "<|START_ACTION|>"), reader=cohere.cohere2,
           turn=("", "<|END_OF_TURN_TOKEN|>"), specialized=True),
    # LFM2 / LFM2.5: llama.cpp reads <think> only where the template writes "<think>";
    # these write just "</think>" (to drop past thinking), so a <think> stays content
    Family("lfm2", ("<|tool_list_start|>", "<|tool_list_end|>"), pythonic.pythonic,
           think=_NO_THINK, spacing=STRICT, specialized=True),
    Family("lfm2.5", ("List of tools: [",), pythonic.pythonic, think=_NO_THINK,
           absent=("<|tool_list_start|>",), spacing=STRICT, specialized=True),
    Family("gigachat3", ("<|role_sep|>", "<|message_sep|>"), jm.gigachat, think=_NO_THINK,
           absent=("<|function_call|>",), spacing=STRICT, specialized=True),
    Family("minimax-m3", ("]<]minimax[>[", "<tool_call>", "<invoke name="),
           reader=minimax.minimax_m3, specialized=True),
    Family("deepseek-dsml", ("dsml_token", "DSML"),
           xml.xml_tools("<｜DSML｜invoke ", "</｜DSML｜invoke>", xml.DSML,
                         section=("<｜DSML｜tool_calls>", "<｜DSML｜function_calls>"),
                         lead="\n\n"),
           think_stops=("\n\n<｜DSML｜tool_calls>", "<｜DSML｜tool_calls>",
                        "\n\n<｜DSML｜function_calls>", "<｜DSML｜function_calls>"),
           spacing=STRICT, specialized=True),
    Family("gemma4", ("'<|tool_call>call:'", "{#- OpenAI Chat Completions:"),
           reader=gemma4.gemma4, specialized=True),
    # older Gemma 4 templates read tool results from the calling turn (llama.cpp's rewrite)
    Family("gemma4-legacy", ("'<|tool_call>call:'",), reader=gemma4.gemma4,
           prepare=gemma4.gemma4_messages, specialized=True),
    Family("minicpm5", ("Tool usage guidelines:", '<function name="', '<param name="'),
           xml.xml_tools("<function ", "</function>", xml.MINICPM), specialized=True),
    # Qwen3-Coder's XML calls, also Qwen3.5, Nemotron 3 Nano, StepFun 3.5: one family (one
    # call syntax), two rows, as llama.cpp reads <think> only where the template has it
    Family("qwen3-coder", ("<tool_call>", "<function=", "<parameter=", "<think>"),
           xml.xml_tools("<tool_call>", "</tool_call>", xml.QWEN3_CODER),
           absent=("'<tool_call><function=' ~ tool_call.name ~ '>'",),
           think_stops=("<tool_call>",), specialized=True),
    Family("qwen3-coder", ("<tool_call>", "<function=", "<parameter="),
           xml.xml_tools("<tool_call>", "</tool_call>", xml.QWEN3_CODER), think=_NO_THINK,
           absent=("'<tool_call><function=' ~ tool_call.name ~ '>'",), specialized=True),
)

# templates llama.cpp learns; the row says how calls are written
_LEARNED: tuple[Family, ...] = (
    Family("mistral", ("[TOOL_CALLS]",), js.mistral),
    Family("nemotron", ("<TOOLCALL>",), js.tagged_list("<TOOLCALL>", "</TOOLCALL>")),
    Family("apriel", ("<tool_calls>", "[BEGIN FINAL RESPONSE]"),
           js.tagged_list("<tool_calls>", "</tool_calls>")),
    Family("command-r7b", ("<|START_RESPONSE|>", "<|START_ACTION|>"),
           reader=cohere.command_r7b, turn=("", "<|END_OF_TURN_TOKEN|>")),
    Family("command-r", ("<|START_OF_TURN_TOKEN|>", "Action:"), cohere.command_r,
           turn=("<|CHATBOT_TOKEN|>", "<|END_OF_TURN_TOKEN|>")),
    Family("apertus", ("<|tools_prefix|>", "<|tools_suffix|>"), jm.apertus),
    Family("gigachat3.1", ("<|role_sep|>", "<|function_call|>"), jm.gigachat31),
    Family("minimax-m1", ("<tool_calls>", "ai name=assistant"), jm.minimax_m1),
    Family("minimax-m2", ("<minimax:tool_call>", "<invoke name="),
           xml.xml_tools('<invoke name="', "</invoke>", xml.MINIMAX_M2,
                         section="<minimax:tool_call>")),
    Family("seed-oss", ("<seed:tool_call>", "<function="),
           xml.xml_tools("<seed:tool_call>", "</seed:tool_call>", xml.SEED_OSS)),
    Family("solar-open", ("<|content|>", "<|end|>"),
           reader=wrapped_content("<|content|>", "<|end|>")),
    Family("granite", ("<|tool_call|>",), js.json_list_after("<|tool_call|>")),
    Family("firefunction", ("functools[",), js.json_list_after("functools")),
    Family("functionary-v3.1", ("<function=", "<|start_header_id|>"), jm.functionary_v31),
    Family("llama3", ("<|start_header_id|>", "parameters"), js.llama3),
    Family("hy3", ("<tool_calls{}>", ":opensource"),
           xml.xml_tools("<tool_call:opensource>", "</tool_call:opensource>", xml.HY3,
                         section="<tool_calls:opensource>")),
    Family("glm", ("<arg_key>",), xml.xml_tools("<tool_call>", "</tool_call>", xml.GLM)),
    # DeepSeek R1 (``function<｜tool▁sep｜>NAME`` and a fenced JSON) and V3.1 (``NAME
    # <｜tool▁sep｜>{...}``); the R1 distills write calls only in the history, so their
    # calls are read only where the template can write them (as llama.cpp does)
    Family("deepseek", ("<｜tool▁calls▁begin｜>", "<｜tool▁sep｜>"), js.deepseek_r1),
    Family("hermes", ("<tool_call>",), js.hermes),
)

FAMILIES: tuple[Family, ...] = _SPECIALIZED + _LEARNED
