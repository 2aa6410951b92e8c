"""Replies whose content is always wrapped in a pair of markers (Solar Open:
``<|content|>...<|end|>``): the content is what lies between them."""

from __future__ import annotations

from .family import ReplyReader
from .reply import Reply, Request, partial_tail_cut

__all__ = ["wrapped_content"]


def wrapped_content(start: str, end: str) -> ReplyReader:
    """The reader of content between ``start`` and ``end`` (text before ``start`` is
    content too); a reply without ``start`` does not fit (llama.cpp rejects it): it is
    content as written, or nothing yet while it is partial."""
    def read(text: str, request: Request) -> Reply:
        at = text.find(start)
        if at < 0:
            return Reply() if request.partial else Reply(text)
        body = text[at + len(start):]
        stop = body.find(end)
        if stop >= 0:
            return Reply(text[:at] + body[:stop])
        return Reply(text[:at] + (partial_tail_cut(body, end) if request.partial else body))
    return read
