"""Ids back to text: token pieces, llama.cpp's detokenizer clean-up, streaming decoding.

A token's *piece* is the bytes llama.cpp's ``llama_token_to_piece`` gives it: nothing for
control and unknown tokens unless ``special``; the text itself for those and user-defined
tokens; ``▁`` -> space for normal SentencePiece tokens; GPT-2's byte alphabet mapped back to
bytes for normal byte-level BPE tokens; the byte itself for ``<0xNN>`` byte tokens.
"""

from __future__ import annotations

import codecs

from .unicode_data import UNICODE_TO_BYTE
from .vocab import Attr, Vocab

_SHOWN_ALWAYS = Attr.CONTROL | Attr.UNKNOWN | Attr.USER_DEFINED  # raw text when shown


def make_piece(vocab: Vocab, tid: int) -> bytes:
    """The piece of ``tid`` as shown with ``special=True`` (llama.cpp's piece cache)."""
    text = vocab.tokens[tid]
    attr = int(vocab.attrs[tid])
    if attr & _SHOWN_ALWAYS:
        return text.encode("utf-8", "surrogateescape")
    if attr & Attr.NORMAL:
        if vocab.kind == "spm" or vocab.escape_whitespaces:
            return text.replace("\u2581", " ").encode("utf-8", "surrogateescape")
        return _byte_decode(text)
    if attr & Attr.BYTE:
        return bytes([int(text[3:5], 16)])  # "<0xNN>"
    return b""  # unused and undefined tokens render as nothing


def _byte_decode(text: str) -> bytes:
    """GPT-2 byte alphabet -> bytes; llama.cpp's marker for a character outside it."""
    out = bytearray()
    for ch in text:
        b = UNICODE_TO_BYTE.get(ch)
        if b is not None:
            out.append(b)
        else:
            utf8 = ch.encode("utf-8", "surrogateescape")
            out += b"[UNK_BYTE_0x" + utf8.hex().encode() + text.encode("utf-8", "surrogateescape")
            out += b"]"
    return bytes(out)


def clean_up_spaces(text: bytes) -> bytes:
    """clean_up_tokenization_spaces, byte for byte as llama.cpp's detokenizer does it.

    Drops the space before ``? ! . ,``, the spaces around a lone ``'``, and the space before
    ``'s 'm 're 've`` (but not ``'t 'd 'll``).
    """
    t = bytearray(text)
    # first pass: " ?", " !", " .", " ,"
    out = bytearray(t[:1])
    for i in range(1, len(t)):
        x = t[i]
        if t[i - 1] == 0x20 and x in b"?!.,":
            out.pop()
        out.append(x)
    t = out
    # second pass: " ' " -> "'" (llama.cpp zeroes the skipped space, which the next
    # character's look-back then sees)
    out = bytearray(t[:1])
    i = 1
    while i < len(t):
        x = t[i]
        if x == 0x27 and i + 1 < len(t) and t[i - 1] == 0x20 and t[i + 1] == 0x20:
            out.pop()
            i += 1
            t[i] = 0
        out.append(x)
        i += 1
    t = out
    # third pass: " 's", " 'm", " 're", " 've"
    out = bytearray(t[:1])
    for i in range(1, len(t)):
        x = t[i]
        if t[i - 1] == 0x20 and x == 0x27 and i + 1 < len(t):
            x1 = t[i + 1]
            if x1 in b"sm" or (i + 2 < len(t) and t[i + 1:i + 3] in (b"re", b"ve")):
                out.pop()
        out.append(x)
    return bytes(out)


class IncrementalDecoder:
    """Ids in, text out, never splitting a UTF-8 character across two ``feed`` results.

    Bytes of a character that is still incomplete wait for the next id; ``flush`` ends the
    stream (an incomplete tail becomes U+FFFD). Invalid bytes become U+FFFD.
    """

    def __init__(self, piece, special: bool = False) -> None:
        self._piece = piece
        self._special = special
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")

    def feed(self, tid: int) -> str:
        """The text that ``tid`` completes (possibly empty)."""
        return self._utf8.decode(self._piece(tid, self._special))

    def flush(self) -> str:
        """Whatever is still held back (a truncated character, as U+FFFD); resets."""
        out = self._utf8.decode(b"", final=True)
        self._utf8.reset()
        return out
