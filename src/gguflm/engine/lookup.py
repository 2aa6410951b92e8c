"""Prompt-lookup drafts for speculative decoding (llama.cpp's ``llama-lookup`` idea).

When a model rewrites, summarises or edits a text it was given, its next tokens often
repeat a stretch of the prompt (or of what it wrote so far). ``NgramDrafter`` finds the
latest earlier occurrence of the last few tokens and proposes the tokens that followed it.
The engine evaluates the sequence's last token and the draft in one forward pass (one row
each, logits for all) and keeps the draft up to the first token the sampler would not
have chosen.

Why the output does not change: each row's logits are bit-identical to evaluating that
token alone (the model's arithmetic is batch-invariant), and every kept token is the one
the sampler draws from those logits, with one random draw per token as without a draft.
So at any temperature, with the same seed, the text is the same as without lookup; only
the number of forward passes changes. (This is the standard speculative acceptance rule
for a draft that is a single proposed token: drawing x from p and keeping the draft while
x equals it.)
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["MAX_LOOKUP", "NgramDrafter", "check_lookup"]

MAX_LOOKUP = 64   # the largest draft a request may ask for
NGRAM_MAX = 4     # the longest suffix matched first (a longer match predicts better)
NGRAM_MIN = 2     # a single repeated token predicts too little to pay for its rows


def check_lookup(value: object) -> int:
    """A draft length as given (API keyword, JSON field, option): an integer 0..MAX_LOOKUP
    (0: off); ValueError saying what is allowed otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_LOOKUP:
        raise ValueError(f"lookup must be an integer from 0 to {MAX_LOOKUP}, got {value!r}")
    return value


class NgramDrafter:
    """The token history of one sequence and an index of where each short n-gram last
    continued; ``draft(k)`` proposes up to ``k`` tokens. O(NGRAM_MAX) per token added."""

    def __init__(self, ids: Iterable[int] = ()) -> None:
        self.ids: list[int] = []
        # n-gram -> index of the token that followed its latest occurrence
        self._next: dict[tuple[int, ...], int] = {}
        self.extend(ids)

    def extend(self, ids: Iterable[int]) -> None:
        for t in ids:
            self.push(t)

    def push(self, token: int) -> None:
        h = self.ids
        i = len(h)
        h.append(int(token))
        for n in range(1, NGRAM_MAX + 1):  # the n-grams ending just before i continue at i
            if i - n < 0:
                break
            self._next[tuple(h[i - n:i])] = i

    def draft(self, k: int) -> list[int]:
        """Up to ``k`` tokens that followed the latest earlier occurrence of the longest
        matching suffix (NGRAM_MAX down to NGRAM_MIN tokens); [] when none matches."""
        h = self.ids
        if k <= 0:
            return []
        for n in range(min(NGRAM_MAX, len(h)), NGRAM_MIN - 1, -1):
            j = self._next.get(tuple(h[-n:]))
            if j is not None:
                return h[j:j + k]
        return []
