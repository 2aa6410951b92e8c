"""OpenAI's reply objects, whole and streamed, for the Python API and the server alike.

``Shapes`` makes the objects of one response (one id, one creation time); ``ChatReply``
turns a chat reply's text into deltas and a message (tool calls parsed out, ``tools.py``).
``CompletionShaper`` and ``ChatShaper`` say what a response is made of: the chunks that
open a stream, those each piece of text adds, those that close it once the sequence has
ended, and the whole object when nothing is streamed. The API's generators and the
server's event streams only drive them, so each reply is spelled once.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

__all__ = ["ChatReply", "ChatShaper", "CompletionShaper", "Shapes", "stream_chunks"]


class ChatReply:
    """A chat reply's text as OpenAI deltas and message (``plan``: a ``chatplan.ChatPlan``,
    or None for plain content). The chat format's stream, where there is one, splits off
    the reasoning and reads the family's calls; the tool parser of ``engine/toolcalls.py``
    reads the calls of its own formats from the content that remains."""

    def __init__(self, plan: Any = None) -> None:
        self.stream = plan.stream() if plan is not None and plan.stream else None
        tools = plan.legacy_tools if plan is not None else None
        self.parser = tools.parser() if tools is not None else None
        self.text: list[str] = []

    def feed(self, text: str) -> list[dict[str, Any]]:
        self.text.append(text)
        if self.stream is None:
            return self._content([{"content": text}] if text else [])
        return self._content(self.stream.feed(text))

    def finish(self) -> list[dict[str, Any]]:
        out = self._content(self.stream.finish()) if self.stream is not None else []
        return out + (self.parser.finish() if self.parser is not None else [])

    def _content(self, deltas: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The deltas with their content read by the tool parser, if there is one."""
        if self.parser is None:
            return deltas
        out = []
        for d in deltas:
            out.extend(self.parser.feed(d["content"]) if "content" in d else [d])
        return out

    def finish_reason(self, reason: str | None) -> str | None:
        if reason is None:
            return reason
        if self.parser is not None:
            return self.parser.result().finish_reason(reason)
        if self.stream is not None and self.stream.result().calls and reason == "stop":
            return "tool_calls"
        return reason

    def detail(self) -> str | None:
        """Why it ended, when finish_reason alone would mislead (a call cut off)."""
        return self.parser.result().detail() if self.parser is not None else None

    def message(self) -> dict[str, Any]:
        if self.parser is not None:
            message = self.parser.result().message()
        elif self.stream is not None:
            message = _message(self.stream.result())
        else:
            return {"role": "assistant", "content": "".join(self.text)}
        if self.stream is not None and self.stream.result().reasoning:
            message["reasoning_content"] = self.stream.result().reasoning
        return message


def _message(reply: Any) -> dict[str, Any]:
    """OpenAI's assistant message for a parsed reply: content None when it is all calls."""
    message: dict[str, Any] = {"role": "assistant",
                               "content": reply.content or (None if reply.calls else "")}
    if reply.calls:
        message["tool_calls"] = [c.as_openai() for c in reply.calls]
    return message


class Shapes:
    """OpenAI's response objects for one response: ``object`` (``text_completion``,
    ``chat.completion`` or ``chat.completion.chunk``), one id and creation time."""

    def __init__(self, object: str, model_id: str) -> None:  # noqa: A002 - OpenAI's name
        prefix = "cmpl" if object == "text_completion" else "chatcmpl"
        self.head = {"id": _new_id(prefix), "object": object, "created": int(time.time()),
                     "model": model_id}

    def completion_chunk(self, text: str, finish: str | None, index: int = 0
                         ) -> dict[str, Any]:
        return self.head | {"choices": [{"text": text, "index": index, "logprobs": None,
                                         "finish_reason": finish}]}

    def completion_result(self, choices: list[dict[str, Any]], usage: dict[str, Any]
                          ) -> dict[str, Any]:
        return self.head | {"choices": choices, "usage": usage}

    def chat_chunk(self, delta: dict[str, Any], finish: str | None,
                   detail: str | None = None) -> dict[str, Any]:
        return self.head | {"choices": [{"index": 0, "delta": delta, "logprobs": None,
                                         "finish_reason": finish} | _detail(detail)]}

    def chat_result(self, message: dict[str, Any], finish: str | None,
                    usage: dict[str, Any], detail: str | None = None) -> dict[str, Any]:
        return self.head | {"choices": [{"index": 0, "message": message, "logprobs": None,
                                         "finish_reason": finish} | _detail(detail)],
                            "usage": usage}

    def usage_chunk(self, usage: dict[str, Any]) -> dict[str, Any]:
        return self.head | {"choices": [], "usage": usage}


def _detail(detail: str | None) -> dict[str, str]:
    """gguflm's own choice field ``finish_detail``: why finish_reason is what it is, when
    it alone would mislead (OpenAI's clients keep unknown fields: ``choice.model_extra``)."""
    return {"finish_detail": detail} if detail else {}


def _new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


class CompletionShaper:
    """A ``text_completion`` response: the prompt's text first when echoed, one chunk per
    piece, the finish reason, and with ``include_usage`` a last chunk of usage."""

    def __init__(self, model_id: str, echo_text: str | None = None,
                 include_usage: bool = False) -> None:
        self.shape = Shapes("text_completion", model_id)
        self.echo_text, self.include_usage = echo_text or None, include_usage

    def opening(self) -> list[dict[str, Any]]:
        return [self.shape.completion_chunk(self.echo_text, None)] if self.echo_text else []

    def piece(self, text: str) -> list[dict[str, Any]]:
        return [self.shape.completion_chunk(text, None)]

    def closing(self, seq: Any) -> list[dict[str, Any]]:
        out = [self.shape.completion_chunk("", seq.finish_reason)]
        return out + [self.shape.usage_chunk(seq.usage())] if self.include_usage else out

    def choice(self, seq: Any, text: str, index: int = 0) -> dict[str, Any]:
        return {"text": (self.echo_text or "") + text, "index": index, "logprobs": None,
                "finish_reason": seq.finish_reason}

    def whole(self, seq: Any, text: str) -> dict[str, Any]:
        return self.shape.completion_result([self.choice(seq, text)], seq.usage())


class ChatShaper:
    """A ``chat.completion`` response (``chat.completion.chunk`` streamed): the role first,
    the content (or tool-call) deltas, the finish reason, and with ``include_usage`` a last
    chunk of usage; ``plan`` is the tool plan (``tools.plan_tools``) or None."""

    def __init__(self, model_id: str, plan: Any = None, include_usage: bool = False) -> None:
        self.model_id, self.include_usage = model_id, include_usage
        self.reply = ChatReply(plan)
        self.shape = Shapes("chat.completion.chunk", model_id)

    def opening(self) -> list[dict[str, Any]]:
        return [self.shape.chat_chunk({"role": "assistant", "content": ""}, None)]

    def piece(self, text: str) -> list[dict[str, Any]]:
        return [self.shape.chat_chunk(delta, None) for delta in self.reply.feed(text)]

    def closing(self, seq: Any) -> list[dict[str, Any]]:
        reply = self.reply
        out = [self.shape.chat_chunk(delta, None) for delta in reply.finish()]
        out.append(self.shape.chat_chunk({}, reply.finish_reason(seq.finish_reason),
                                         reply.detail()))
        return out + [self.shape.usage_chunk(seq.usage())] if self.include_usage else out

    def whole(self, seq: Any, text: str) -> dict[str, Any]:
        reply = self.reply
        reply.feed(text)
        reply.finish()
        return Shapes("chat.completion", self.model_id).chat_result(
            reply.message(), reply.finish_reason(seq.finish_reason), seq.usage(),
            reply.detail())


def stream_chunks(shaper: CompletionShaper | ChatShaper, seq: Any, texts: Iterator[str]
                  ) -> Iterator[dict[str, Any]]:
    """The chunks of a streamed response whose text pieces ``texts`` gives (closing the
    result early closes ``texts``, which cancels the sequence)."""
    try:
        yield from shaper.opening()
        for text in texts:
            yield from shaper.piece(text)
    finally:
        texts.close()
    yield from shaper.closing(seq)
