"""Reading a model's reply as OpenAI tool calls, whole or as it streams.

``ToolCallParser`` turns text in one of the tool-call formats (see ``tools``: ``hermes``,
``llama3``, ``json``) into OpenAI ``tool_calls`` plus the remaining content. Streamed, it
emits ``delta`` objects as soon as they are certain: content, then per call its id and
function name, then its arguments in fragments; text that might start a call is held back
until it is clear. Read whole (``parse``), it gives exactly what the deltas add up to.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import regex

if TYPE_CHECKING:
    from .tools import Tool

__all__ = ["TOOL_FORMATS", "ParsedReply", "ToolCall", "ToolCallParser", "new_call_id",
           "parse_tool_calls"]

TOOL_FORMATS = ("hermes", "llama3", "json")


@dataclass
class ToolCall:
    """One parsed call; ``arguments`` is JSON text, as OpenAI returns it."""

    id: str
    name: str
    arguments: str

    def as_openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


TRUNCATED = ("the token budget (max_tokens) ran out inside a tool call; that call was "
             "left out (the calls before it are complete)")


@dataclass
class ParsedReply:
    """A reply split into ``content`` (None when empty) and ``tool_calls`` (each complete:
    its arguments whole JSON). ``truncated``: the reply was cut off inside a call, which is
    left out; ``repeated``: the model began a call it had made already (a loop; the repeat
    is left out and the reply ends there)."""

    content: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)
    truncated: bool = False
    repeated: bool = False

    def finish_reason(self, reason: str) -> str:
        """OpenAI's finish_reason: ``length`` when the budget ran out inside a call;
        ``tool_calls`` for a reply with calls that ended (``stop``), ran out of tokens
        after its last call, or was ended at a repeated call; the others stay."""
        if self.truncated:
            return "length"
        if self.tool_calls and (reason in ("stop", "length") or self.repeated):
            return "tool_calls"
        return reason

    def detail(self) -> str | None:
        """Why the reply ended, in words, when finish_reason alone would mislead."""
        return TRUNCATED if self.truncated else None

    def message(self) -> dict[str, Any]:
        """The assistant message object of a chat completion."""
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            msg["tool_calls"] = [c.as_openai() for c in self.tool_calls]
        return msg


_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
_PY_TAG = "<|python_tag|>"
# the start of a call as the formats write it; matched as text arrives (partial matches wait)
_HEADER = regex.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\\n]|\\.){1,256})"\s*,\s*'
                        r'"(?:arguments|parameters)"\s*:\s*')


def new_call_id() -> str:
    """An OpenAI-style call id: ``call_`` and 24 hex digits."""
    return "call_" + secrets.token_hex(12)


class _Scan:
    """Follows one JSON value character by character (strings, escapes, nesting) to tell
    where it ends; does not validate it."""

    def __init__(self, depth: int = 0) -> None:
        self.depth = depth
        self.in_string = False
        self.escape = False
        self.started = depth > 0
        self.kind = "" if depth == 0 else "{"
        self.done = False

    def feed(self, ch: str) -> bool:
        """Take ``ch``; True if it belongs to the value (False: it comes after the end)."""
        if self.done:
            return False
        if not self.started:
            if ch in " \t\r\n":
                return True
            self.started, self.kind = True, ch
        if self.in_string:
            if self.escape:
                self.escape = False
            elif ch == "\\":
                self.escape = True
            elif ch == '"':
                self.in_string = False
                if self.depth == 0:
                    self.done = True
            return True
        if ch == '"':
            self.in_string = True
        elif ch in "{[":
            self.depth += 1
        elif ch in "}]":
            if self.depth == 0:  # closes an enclosing object: a scalar ended before it
                self.done = True
                return False
            self.depth -= 1
            if self.depth == 0:
                self.done = True
        elif self.depth == 0 and self.kind not in "{[\"" and ch in ", \t\r\n":
            self.done = True  # a bare scalar (number, true, null) ended
            return False
        return True


class ToolCallParser:
    """Reads a reply as it streams: ``feed(text)`` returns OpenAI delta objects
    (``{"content": ...}``, or ``{"tool_calls": [{"index", "id", "type", "function":
    {"name", "arguments"}}]}`` once a call is complete: a call is held back until its
    arguments are whole JSON, so that neither a stream nor a reply cut off by max_tokens
    ever carries half an argument object); ``finish()`` the last ones; ``result()`` the
    whole ``ParsedReply``, equal to what the deltas add up to. Text that only might start
    a call is held back until it is clear. ``repeated`` turns true when the model repeats
    a call (the same function and arguments): the caller should stop generating.

    Calls are recognised only for the ``tools`` given (an unknown function name leaves the
    text as content). Leading and trailing whitespace of the content is dropped.
    """

    def __init__(self, fmt: str, tools: Iterable[Tool],
                 new_id: Callable[[], str] | None = None) -> None:
        if fmt not in TOOL_FORMATS:
            raise ValueError(f"unknown tool-call format {fmt!r} (one of {TOOL_FORMATS})")
        self.format = fmt
        self._names = {t.name for t in tools}
        self._new_id = new_id or new_call_id
        self._buf = ""
        self._state = "text" if self._names else "plain"
        self._calls: list[ToolCall] = []
        self._content: list[str] = []
        self._pending_ws = ""
        self._scan: _Scan | None = None
        self._arg_parts: list[str] = []
        self._opaque_scan: _Scan | None = None  # the search for the end of an opaque call
        self._opaque_pos = 0
        self._finished = False
        self.truncated = False  # cut off inside a call (left out)
        self.repeated = False  # a call made twice (the repeat left out)

    # --- public ---

    def feed(self, text: str) -> list[dict[str, Any]]:
        if self._finished:
            raise RuntimeError("feed() after finish()")
        self._buf += text
        return self._run(final=False)

    def finish(self) -> list[dict[str, Any]]:
        out = self._run(final=True)
        if self._state == "args":  # cut off inside the arguments (max_tokens)
            self._calls.pop()
            self.truncated = True
        self._finished = True
        return out

    def result(self) -> ParsedReply:
        content = "".join(self._content)
        return ParsedReply(content or None, list(self._calls), self.truncated, self.repeated)

    def _complete(self, call: ToolCall, out: list[dict[str, Any]]) -> None:
        """A call is whole: emit it, unless it repeats an earlier one (then drop it and
        note the loop)."""
        key = _call_key(call)
        if any(_call_key(c) == key for c in self._calls if c is not call):
            if self._calls and self._calls[-1] is call:
                self._calls.pop()
            self.repeated = True
            return
        if not self._calls or self._calls[-1] is not call:
            self._calls.append(call)
        out.append({"tool_calls": [{
            "index": len(self._calls) - 1, "id": call.id, "type": "function",
            "function": {"name": call.name, "arguments": call.arguments}}]})

    def parse(self, text: str) -> ParsedReply:
        """The whole reply at once (the same reading as streaming it)."""
        self.feed(text)
        self.finish()
        return self.result()

    # --- the state machine ---

    def _run(self, final: bool) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        while True:
            step = getattr(self, f"_{self._state}")
            if not step(out, final):
                return out

    def _emit_content(self, out: list[dict[str, Any]], text: str) -> None:
        if not self._content:
            text = text.lstrip()
        body = text.rstrip()
        if not body:
            if self._content:
                self._pending_ws += text
            return
        piece = self._pending_ws + body
        self._pending_ws = text[len(body):]
        self._content.append(piece)
        out.append({"content": piece})

    def _plain(self, out: list[dict[str, Any]], final: bool) -> bool:
        if self._buf:
            self._emit_content(out, self._buf)
            self._buf = ""
        return False

    def _text(self, out: list[dict[str, Any]], final: bool) -> bool:
        if self.format == "hermes":
            i = self._buf.find(_OPEN)
            if i >= 0:
                self._emit_content(out, self._buf[:i])
                self._buf = self._buf[i + len(_OPEN):]
                self._state = "head"
                return True
            keep = 0 if final else _prefix_overlap(self._buf, _OPEN)
            self._emit_content(out, self._buf[:len(self._buf) - keep])
            self._buf = self._buf[len(self._buf) - keep:]
            return False
        # json formats: a call is the whole reply (or a run of calls), starting with "{"
        s = self._buf.lstrip()
        if s.startswith(_PY_TAG):
            s = s[len(_PY_TAG):].lstrip()
        elif not final and _PY_TAG.startswith(s) and s:
            return False
        if not s:
            if final:
                self._buf = ""
            return False
        self._buf = s
        self._state = "head" if s.startswith("{") else "plain"
        return True

    def _head(self, out: list[dict[str, Any]], final: bool) -> bool:
        m = _HEADER.match(self._buf, partial=True)
        if m is not None and m.partial:
            if final:
                self._state = "opaque"
                return True
            return False
        if m is not None:
            try:
                name = json.loads(f'"{m.group(1)}"')
            except ValueError:
                name = None
            if name in self._names:
                self._calls.append(ToolCall(self._new_id(), name, ""))  # emitted when whole
                self._buf = self._buf[m.end():]
                self._scan, self._arg_parts = _Scan(), []
                self._state = "args"
                return True
        self._state = "opaque"
        return True

    def _args(self, out: list[dict[str, Any]], final: bool) -> bool:
        scan = self._scan
        assert scan is not None
        n = 0
        for ch in self._buf:
            if not scan.feed(ch):
                break
            n += 1
            if scan.done:
                break
        piece, self._buf = self._buf[:n], self._buf[n:]
        if not self._arg_parts:
            piece = piece.lstrip()
        if piece:
            self._arg_parts.append(piece)
        if scan.done:
            self._end_args(out)
            self._scan = _Scan(depth=1)  # the rest of the call object
            self._state = "tail"
            return True
        return False

    def _end_args(self, out: list[dict[str, Any]]) -> None:
        raw = "".join(self._arg_parts)
        call = self._calls[-1]
        if self._scan is not None and self._scan.kind == '"':
            try:  # a JSON-string encoding of the arguments
                raw = json.loads(raw)
            except ValueError:
                pass
        call.arguments = raw
        self._complete(call, out)

    def _tail(self, out: list[dict[str, Any]], final: bool) -> bool:
        scan = self._scan
        assert scan is not None
        n = 0
        for ch in self._buf:
            scan.feed(ch)
            n += 1
            if scan.done:
                break
        self._buf = self._buf[n:]
        if scan.done:
            self._state = "close" if self.format == "hermes" else "after"
            return True
        if final:
            self._buf = ""
        return False

    def _close(self, out: list[dict[str, Any]], final: bool) -> bool:
        s = self._buf.lstrip()
        if s.startswith(_CLOSE):
            self._buf = s[len(_CLOSE):]
        elif not final and _CLOSE.startswith(s):
            return False  # (all whitespace, or a part of the closing tag)
        self._state = "text"
        return True

    def _after(self, out: list[dict[str, Any]], final: bool) -> bool:
        s = self._buf.lstrip(" \t\r\n;,")
        if not s:
            if final:
                self._buf = ""
            return False
        self._buf = s
        self._state = "head" if s.startswith("{") else "plain"
        return True

    def _opaque(self, out: list[dict[str, Any]], final: bool) -> bool:
        """A call whose start did not stream as expected (keys in another order, an unknown
        function, not a call at all): wait for its end, then take it whole or as text. The
        search resumes where the last one stopped (a long reply costs linear time)."""
        if self._opaque_scan is None:
            self._opaque_scan, self._opaque_pos = _Scan(), 0
        if self.format == "hermes":
            i = self._buf.find(_CLOSE, self._opaque_pos)
            if i < 0 and not final:
                self._opaque_pos = max(0, len(self._buf) - len(_CLOSE) + 1)
                return False
            body = self._buf if i < 0 else self._buf[:i]
            rest = "" if i < 0 else self._buf[i + len(_CLOSE):]
            raw = _OPEN + body + ("" if i < 0 else _CLOSE)
            next_state = "text"
        else:
            scan, n = self._opaque_scan, self._opaque_pos
            while n < len(self._buf) and not scan.done:
                scan.feed(self._buf[n])
                n += 1
            self._opaque_pos = n
            if not scan.done and not final:
                return False
            body, rest, raw = self._buf[:n], self._buf[n:], self._buf[:n]
            next_state = "after"
        self._opaque_scan = None
        call = self._whole_call(body)
        if call is None and final and self._cut_off(body):
            self.truncated = True  # the start of a call, cut off: left out
        elif call is None:
            self._emit_content(out, raw)
            next_state = "text" if self.format == "hermes" else "plain"
        else:
            self._complete(call, out)
        self._buf = rest
        self._state = next_state
        return True

    def _cut_off(self, body: str) -> bool:
        """Whether ``body``, the unfinished end of a reply, is the start of a call of one
        of the tools (rather than text that merely began like one)."""
        head = _HEADER.match(body, partial=True)
        if head is None:
            return False
        if head.partial:  # the name itself may be cut: a prefix of a known one
            name = head.group(1) or ""
            return not name or any(n.startswith(name) for n in self._names)
        try:
            return json.loads(f'"{head.group(1)}"') in self._names
        except ValueError:
            return False

    def _whole_call(self, body: str) -> ToolCall | None:
        try:
            obj = json.loads(body)
        except ValueError:
            return None
        if not isinstance(obj, dict) or obj.get("name") not in self._names:
            return None
        args = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):
            text = args
        else:
            text = json.dumps(args, ensure_ascii=False)
        return ToolCall(self._new_id(), obj["name"], text)


def _call_key(call: ToolCall) -> tuple[str, Any]:
    """What makes two calls the same: the function and the arguments' value."""
    try:
        return call.name, json.dumps(json.loads(call.arguments), sort_keys=True)
    except ValueError:
        return call.name, call.arguments


def _prefix_overlap(text: str, marker: str) -> int:
    """The length of the longest end of ``text`` that begins ``marker``."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def parse_tool_calls(text: str, fmt: str, tools: Iterable[Tool]) -> ParsedReply:
    """A finished reply in format ``fmt`` as content and tool calls of ``tools``."""
    return ToolCallParser(fmt, tools).parse(text)
