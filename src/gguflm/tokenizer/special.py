"""Splitting text on special tokens before the model's tokenizer sees it.

llama.cpp's ``tokenizer_st_partition``: for each special token, longest text first, every
stretch of raw text still unsplit is cut at each occurrence of the token's text. Control
and unknown tokens take part only with ``parse_special``; user-defined tokens always do
(as in Hugging Face tokenizers). A token with the LSTRIP / RSTRIP attribute also swallows
the ASCII whitespace before / after it.
"""

from __future__ import annotations

from .vocab import Attr, Vocab

_ASCII_SPACE = " \t\n\v\f\r"  # C isspace() in the "C" locale
Fragment = str | int  # raw text, or a token id
_LSTRIP, _RSTRIP = int(Attr.LSTRIP), int(Attr.RSTRIP)


class SpecialSplitter:
    """Precomputed (text, id, attr) lists for the two ``parse_special`` settings."""

    def __init__(self, vocab: Vocab) -> None:
        tokens, attrs = vocab.tokens, vocab.attrs
        self.all = [(tokens[t], t, int(attrs[t])) for t in vocab.special_ids]
        skip = int(Attr.CONTROL | Attr.UNKNOWN)
        self.user = [entry for entry in self.all if not entry[2] & skip]

    def split(self, text: str, parse_special: bool) -> list[Fragment]:
        """``text`` as raw-text pieces and special-token ids, in order."""
        frags: list[Fragment] = [text]
        for tok, tid, attr in (self.all if parse_special else self.user):
            if tok not in text:  # pieces are substrings of text: nothing to do
                continue
            lstrip, rstrip = attr & _LSTRIP, attr & _RSTRIP
            new: list[Fragment] = []
            for frag in frags:
                if isinstance(frag, int) or tok not in frag:
                    new.append(frag)
                    continue
                pos = 0
                while True:
                    at = frag.find(tok, pos)
                    if at < 0:
                        break
                    left = frag[pos:at]
                    if lstrip:
                        left = left.rstrip(_ASCII_SPACE)
                    if left:
                        new.append(left)
                    new.append(tid)
                    pos = at + len(tok)
                    if rstrip:
                        while pos < len(frag) and frag[pos] in _ASCII_SPACE:
                            pos += 1
                if pos < len(frag):
                    new.append(frag[pos:])
            frags = new
        return frags
