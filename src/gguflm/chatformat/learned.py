"""Reading the reasoning block the way llama.cpp's learnt ("differential autoparser")
parsers do, with the tags ``analysis`` found in the template.

llama.cpp parses the generation prompt's tail (from the start tag on) together with the
reply: an open tag in the prompt puts the reply inside the block, a closed pair uses the
block up. Whitespace before the block is skipped; the whitespace the template writes after
each tag is taken when the model writes it too; everything else is kept as written (the
reasoning keeps the newline before its end tag, the content its own leading blank lines).
"""

from __future__ import annotations

from .reply import Request, partial_tail_cut, skip_pad

__all__ = ["learned_reasoning"]


def _pad(tag: str) -> tuple[str, str]:
    """A learnt tag's core and the whitespace the template writes after it."""
    core = tag.strip()
    return core, tag[len(tag.rstrip()):]


def _stop(body: str, end: str, stops: tuple[str, ...]) -> tuple[int, int]:
    """Where the reasoning stops and where what follows starts: at ``end`` (taken) or at
    the first of ``stops`` (left for the calls it opens); (-1, -1) if neither is there."""
    found = [(at, at + len(end)) for at in (body.find(end),) if end and at >= 0]
    found += [(at, at) for tag in stops if (at := body.find(tag)) >= 0]
    return min(found) if found else (-1, -1)


def learned_reasoning(text: str, request: Request, tags: tuple[str, str],
                      stops: tuple[str, ...] = ()) -> tuple[str, str]:
    """``(reasoning, rest)`` of ``text`` for a template whose reasoning tags (with their
    whitespace) are ``tags``; ``("", text)`` when it has none."""
    (start, start_pad), (end, end_pad) = _pad(tags[0]), _pad(tags[1])
    if not (start or end) or not request.extract_reasoning:
        return "", text
    prompt = request.generation_prompt
    at = prompt.find(start) if start else -1
    body = ((prompt[at:] if at >= 0 else "") + text).lstrip()
    if start:
        if not body.startswith(start):
            if request.partial and start.startswith(body):
                return "", ""  # the open tag being written
            return "", body
        body = skip_pad(body[len(start):], start_pad)
    stop, after = _stop(body, end, stops)
    if stop < 0:
        if not start:
            return "", body  # no end tag: there was no reasoning block
        reasoning, rest = (partial_tail_cut(body, end) if request.partial else body), ""
    else:
        rest = body[after:]
        reasoning, rest = body[:stop], (skip_pad(rest, end_pad) if after > stop else rest)
    return (reasoning if reasoning.strip() else ""), rest
