"""Kimi K3: sections written with ``<|open|>NAME attrs<|sep|>`` ... ``<|close|>NAME<|sep|>``.
A reply is ``[think] [response] [tools]`` then the message closer and ``<|end_of_msg|>``;
the generation prompt already opened the think section. Calls: ``<|open|>call tool="NAME"
index="N"<|sep|>`` then one ``<|open|>argument key="KEY" type="T"<|sep|>VALUE<|close|>
argument<|sep|>`` per argument (typed by the tool's schema) and ``<|close|>call<|sep|>``."""

from __future__ import annotations

from .calls import tagged_calls
from .reply import Reply, Request, text_until
from .xml_families import ParamSyntax, xml_reader

__all__ = ["kimi_k3"]

_MSG_START = '<|open|>message role="assistant"<|sep|>'
_THINK, _THINK_END = "<|open|>think<|sep|>", "<|close|>think<|sep|>"
_RESP, _RESP_END = "<|open|>response<|sep|>", "<|close|>response<|sep|>"
_TOOLS, _TOOLS_END = "<|open|>tools<|sep|>", "<|close|>tools<|sep|>"
_MSG_END = "<|close|>message<|sep|>"
_CALL, _CALL_END = "<|open|>call ", "<|close|>call<|sep|>"
_SYNTAX = ParamSyntax('tool="', '"', '<|open|>argument key="', '"', "<|sep|>",
                      "<|close|>argument<|sep|>", key_when_named=True)
_read_call = xml_reader(_SYNTAX)




def _skip(text: str, pos: int, tag: str) -> int:
    return pos + len(tag) if text.startswith(tag, pos) else pos


def kimi_k3(text: str, request: Request) -> Reply:
    """The think section (reasoning), the response (content) and the tools section."""
    pos = _skip(text, _skip(text, 0, _MSG_START), _THINK)
    thought, pos = text_until(text, pos, (_THINK_END, _RESP), request)
    pos = _skip(text, _skip(text, pos, _THINK_END), _RESP)
    if request.partial and _RESP.startswith(text[pos:pos + len(_RESP)]) and \
            len(text) - pos < len(_RESP):
        pos = len(text)  # the response's open tag being written
    content, pos = text_until(text, pos, (_RESP_END, _TOOLS, _MSG_END), request)
    thought = thought if thought.strip() else ""
    pos = _skip(text, pos, _RESP_END)
    reply = Reply(content, thought) if request.extract_reasoning else Reply(thought + content)
    if request.tools and text.startswith(_TOOLS, pos):
        tools_text = text[pos:]
        end = tools_text.find(_TOOLS_END)
        tools_text = tools_text if end < 0 else tools_text[:end]
        reply.calls = tagged_calls(tools_text, request, _CALL, _CALL_END, _read_call)[1]
    return reply
