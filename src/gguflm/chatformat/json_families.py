"""Families whose calls are JSON objects: Hermes/Qwen ``<tool_call>``, JSON lists after a
marker (Nemotron, Apriel, Granite, Firefunction, Mistral Nemo), and Llama 3's bare JSON."""

from __future__ import annotations

from .calls import json_call, json_call_list, tagged_calls
from .reply import Call, Request

__all__ = ["hermes", "json_list_after", "llama3", "tagged_list"]


def hermes(text: str, request: Request) -> tuple[str, list[Call]]:
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, one block per call."""
    return tagged_calls(text, request, "<tool_call>", "</tool_call>", json_call)


def tagged_list(open_tag: str, close_tag: str):
    """Calls as one JSON list between two tags (``<TOOLCALL>[...]</TOOLCALL>``)."""
    def parse(text: str, request: Request) -> tuple[str, list[Call]]:
        return tagged_calls(text, request, open_tag, close_tag, json_call_list)
    return parse


def json_list_after(marker: str):
    """Calls as a JSON list after a marker that has no closing tag (``[TOOL_CALLS]``)."""
    return tagged_list(marker, "")


def llama3(text: str, request: Request) -> tuple[str, list[Call]]:
    """Llama 3.x: the whole reply is ``{"name": ..., "parameters": {...}}`` (after an
    optional ``<|python_tag|>``); anything else is content."""
    body = text.strip()
    if body.startswith("<|python_tag|>"):
        body = body[len("<|python_tag|>"):]
    calls = json_call(body, request, True)
    return ("", calls) if calls else (text, [])
