"""WordPiece (``tokenizer.ggml.model = bert``), as llama.cpp's ``llm_tokenizer_wpm`` runs it.

Normalisation, one code point at a time: with accent stripping, each code point becomes the
first code point of its NFD form (llama.cpp keeps only that one) and combining marks are
dropped; control characters, U+0000 and U+FFFD vanish; letters are lower-cased (simple case
mapping) when ``tokenizer.ggml.normalizer.lowercase`` says so. Whitespace ends a word;
punctuation, ASCII symbols and CJK ideographs are words of their own. Each word, with ``▁``
before it (the converter's phantom space: word-initial pieces are stored as ``▁piece``,
``##piece`` continuations as ``piece``), is cut greedily into the longest vocabulary pieces
from the left; a word with any position that matches nothing becomes one ``[UNK]``.
"""

from __future__ import annotations

import unicodedata

from .unicode_data import NON_ASCII_WHITESPACE, category_class, is_unassigned
from .vocab import Vocab

# what a code point does to the word being built (plus the text it contributes)
_SKIP, _SPACE, _ALONE, _APPEND = 0, 1, 2, 3
_WHITESPACE = frozenset([*range(0x09, 0x0E), 0x20, *NON_ASCII_WHITESPACE])
# CJK ideograph blocks, as llama.cpp (and Hugging Face's BertPreTokenizer) list them
_CJK = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
        (0x2B740, 0x2B81F), (0x2B920, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))


def _is_cjk(cp: int) -> bool:
    return any(first <= cp <= last for first, last in _CJK)


def _lower(ch: str) -> str:
    low = ch.lower()
    return low if len(low) == 1 else low[0]  # U+0130's simple lowercase is "i"


def _classify(cp: int, lowercase: bool, strip_accents: bool) -> tuple[int, str]:
    """(action, text) for one input code point."""
    if strip_accents:
        cp = ord(unicodedata.normalize("NFD", chr(cp))[0])
    if cp in _WHITESPACE:
        return _SPACE, ""
    cls = category_class(cp)
    if cp in (0, 0xFFFD) or (cls == "C" and not is_unassigned(cp)):
        return _SKIP, ""
    if strip_accents and cls == "M":
        return _SKIP, ""
    ch = _lower(chr(cp)) if lowercase else chr(cp)
    if cls == "P" or (cp < 0x7F and cls == "S") or _is_cjk(cp):
        return _ALONE, ch
    return _APPEND, ch


class WPMTokenizer:
    """Tokenizes one raw-text fragment (no special tokens in it) into ids."""

    def __init__(self, vocab: Vocab) -> None:
        self.lookup = vocab.token_to_id
        self.unk = vocab.special["unk"]
        self.lowercase, self.strip_accents = vocab.lowercase, vocab.strip_accents
        self.max_len = max((len(t) for t in vocab.tokens), default=1)
        self._actions: dict[int, tuple[int, str]] = {}

    def words(self, text: str) -> list[str]:
        """llama.cpp's ``preprocess``: the normalised words of ``text``."""
        actions, words, cur = self._actions, [], []
        for ch in text:
            cp = ord(ch)
            act = actions.get(cp)
            if act is None:
                act = actions[cp] = _classify(cp, self.lowercase, self.strip_accents)
            kind, s = act
            if kind == _APPEND:
                cur.append(s)
            elif kind == _SPACE:
                if cur:
                    words.append("".join(cur))
                    cur = []
            elif kind == _ALONE:
                if cur:
                    words.append("".join(cur))
                    cur = []
                words.append(s)
        if cur:
            words.append("".join(cur))
        return words

    def encode(self, text: str, out: list[int]) -> None:
        for word in self.words(text):
            self._encode_word("\u2581" + word, out)

    def _encode_word(self, word: str, out: list[int]) -> None:
        lookup, n, start, i = self.lookup, len(word), len(out), 0
        while i < n:
            for j in range(min(n, i + self.max_len), i, -1):
                tid = lookup.get(word[i:j])
                if tid is not None:
                    out.append(tid)
                    i = j
                    break
            else:  # some position matches nothing: the whole word is unknown
                del out[start:]
                break
        if len(out) == start and self.unk is not None:
            out.append(self.unk)
