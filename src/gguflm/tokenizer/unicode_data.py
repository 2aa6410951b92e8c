"""Unicode facts the tokenizers need, as llama.cpp sees them.

llama.cpp classifies code points with its own tables (src/unicode-data.cpp, generated from
Unicode 15.1): one category class per code point (N, L, P, M, S, or other) and a fixed
``White_Space`` set that, unlike Python's ``str.isspace``, excludes U+001C..U+001F.
Its pre-tokenizer regexes then run on a *collapsed* copy of the text in which every
non-ASCII code point is replaced by one stand-in character per class (whitespace becomes
``\\v``); we do the same, so ``\\p{L}`` means exactly what it means in llama.cpp.

Also here: GPT-2's byte <-> unicode map used by byte-level BPE.
"""

from __future__ import annotations

import unicodedata

# Stand-ins in the collapsed text, the code points llama.cpp uses (0xD0..0xD5).
OTHER, NUMBER, LETTER, PUNCT, MARK, SYMBOL = "\xd0", "\xd1", "\xd2", "\xd3", "\xd4", "\xd5"
WHITESPACE_STANDIN = "\x0b"  # non-ASCII whitespace: std::regex's \s knows only ASCII

# ASCII members of each class (llama.cpp's k_ucat_map), used to rewrite \p{..} in regexes.
ASCII_CLASS = {
    NUMBER: "0-9",
    LETTER: "A-Za-z",
    PUNCT: r"!-#%-*,-/:-;?-@\[-\]_\{\}",
    MARK: "",
    SYMBOL: r"\$\+<->\^`\|~",
}

# White_Space code points outside ASCII (PropList.txt); ASCII whitespace is \t\n\v\f\r and space.
NON_ASCII_WHITESPACE = frozenset(
    [0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029, 0x202F, 0x205F, 0x3000])

# Code points assigned in Unicode 15.0 and 15.1, with their general category class. Python
# 3.11's unicodedata is Unicode 14.0 and reports them unassigned; llama.cpp does not. Applied
# only to code points unicodedata calls unassigned, so a newer Python needs none of it.
_ASSIGNED_15 = (
    (0x00CF3, 0x00CF3, "M"), (0x00ECE, 0x00ECE, "M"), (0x02FFC, 0x02FFF, "S"),
    (0x031EF, 0x031EF, "S"), (0x10EFD, 0x10EFF, "M"), (0x1123F, 0x11240, "L"),
    (0x11241, 0x11241, "M"), (0x11B00, 0x11B09, "P"), (0x11F00, 0x11F01, "M"),
    (0x11F02, 0x11F02, "L"), (0x11F03, 0x11F03, "M"), (0x11F04, 0x11F10, "L"),
    (0x11F12, 0x11F33, "L"), (0x11F34, 0x11F3A, "M"), (0x11F3E, 0x11F42, "M"),
    (0x11F43, 0x11F4F, "P"), (0x11F50, 0x11F59, "N"), (0x1342F, 0x1342F, "L"),
    (0x13439, 0x1343F, "C"), (0x13440, 0x13440, "M"), (0x13441, 0x13446, "L"),
    (0x13447, 0x13455, "M"), (0x1B132, 0x1B132, "L"), (0x1B155, 0x1B155, "L"),
    (0x1D2C0, 0x1D2D3, "N"), (0x1DF25, 0x1DF2A, "L"), (0x1E030, 0x1E06D, "L"),
    (0x1E08F, 0x1E08F, "M"), (0x1E4D0, 0x1E4EB, "L"), (0x1E4EC, 0x1E4EF, "M"),
    (0x1E4F0, 0x1E4F9, "N"), (0x1F6DC, 0x1F6DC, "S"), (0x1F774, 0x1F776, "S"),
    (0x1F77B, 0x1F77F, "S"), (0x1F7D9, 0x1F7D9, "S"), (0x1FA75, 0x1FA77, "S"),
    (0x1FA87, 0x1FA88, "S"), (0x1FAAD, 0x1FAAF, "S"), (0x1FABB, 0x1FABD, "S"),
    (0x1FABF, 0x1FABF, "S"), (0x1FACE, 0x1FACF, "S"), (0x1FADA, 0x1FADB, "S"),
    (0x1FAE8, 0x1FAE8, "S"), (0x1FAF7, 0x1FAF8, "S"), (0x2B739, 0x2B739, "L"),
    (0x2EBF0, 0x2EE5D, "L"), (0x31350, 0x323AF, "L"),
)

_STANDIN = {"N": NUMBER, "L": LETTER, "P": PUNCT, "M": MARK, "S": SYMBOL}


def category_class(cp: int) -> str:
    """The first letter of ``cp``'s general category as llama.cpp's tables have it."""
    cat = unicodedata.category(chr(cp))
    if cat == "Cn":
        for first, last, cls in _ASSIGNED_15:
            if first <= cp <= last:
                return cls
    return cat[0]


def is_unassigned(cp: int) -> bool:
    """True when llama.cpp's tables call ``cp`` undefined (category Cn in Unicode 15.1)."""
    return (unicodedata.category(chr(cp)) == "Cn"
            and not any(first <= cp <= last for first, last, _ in _ASSIGNED_15))


def standin(cp: int) -> str:
    """The collapsed-text stand-in for a non-ASCII code point."""
    if cp in NON_ASCII_WHITESPACE:
        return WHITESPACE_STANDIN
    return _STANDIN.get(category_class(cp), OTHER)


class _CollapseTable(dict):
    """``str.translate`` table filled on first sight of each code point (ASCII maps to itself)."""

    def __missing__(self, cp: int) -> int:
        value = cp if cp < 128 else ord(standin(cp))
        self[cp] = value
        return value


class _WideTable(dict):
    """For regexes without \\p{..}: only non-ASCII whitespace is replaced (by ``\\v``)."""

    def __missing__(self, cp: int) -> int:
        value = 0x0B if cp in NON_ASCII_WHITESPACE else cp
        self[cp] = value
        return value


_COLLAPSE = _CollapseTable()
_WIDE = _WideTable()


def collapse(text: str) -> str:
    """Same length as ``text``; non-ASCII code points replaced by their class stand-in."""
    return text if text.isascii() else text.translate(_COLLAPSE)


def widen(text: str) -> str:
    """Same length as ``text``; non-ASCII whitespace replaced by ``\\v`` (llama.cpp's wregex)."""
    return text if text.isascii() else text.translate(_WIDE)


def _bytes_to_unicode() -> list[str]:
    """GPT-2's map: printable bytes stand for themselves, the other 68 go to U+0100 and up."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = [""] * 256
    for b in keep:
        table[b] = chr(b)
    n = 0
    for b in range(256):
        if not table[b]:
            table[b] = chr(256 + n)
            n += 1
    return table


BYTE_TO_UNICODE: list[str] = _bytes_to_unicode()
UNICODE_TO_BYTE: dict[str, int] = {c: b for b, c in enumerate(BYTE_TO_UNICODE)}
# latin-1 code point (= byte value) -> GPT-2 character, for str.translate
_BYTE_ENCODE_TABLE = {b: c for b, c in enumerate(BYTE_TO_UNICODE)}


def byte_encode(word: str) -> str:
    """A word's UTF-8 bytes spelled in GPT-2's byte alphabet."""
    return word.encode("utf-8", "surrogatepass").decode("latin-1").translate(_BYTE_ENCODE_TABLE)
