"""Byte-level BPE (``tokenizer.ggml.model = gpt2``): pre-tokenize, then merge by rank.

llama.cpp's ``llm_tokenizer_bpe``: the pre-tokenizer regexes cut the text into words; each
word is spelled in GPT-2's byte alphabet (one printable character per byte); then, within a
word, the adjacent pair with the lowest merge rank is merged (ties: the leftmost) until no
pair has a rank. Words that are whole tokens skip merging when the vocabulary says
``ignore_merges``. Gemma 4 style vocabularies (``gemma4``) use raw UTF-8 with ``▁`` for
spaces and ``<0xNN>`` byte tokens instead of the byte alphabet.
"""

from __future__ import annotations

from heapq import heapify, heappop, heappush

from .pretokenize import RAW_UTF8_KINDS, splitter
from .unicode_data import byte_encode
from .vocab import Vocab

_CACHE_LIMIT = 1 << 16  # words; a plain dict is cleared when full (text rarely has more)


class BPETokenizer:
    """Tokenizes one raw-text fragment (no special tokens in it) into ids."""

    def __init__(self, vocab: Vocab) -> None:
        assert vocab.pre is not None
        self.vocab = vocab
        self.lookup = vocab.token_to_id
        self.kind = vocab.pre.kind
        self.split = splitter(self.kind).split
        self.byte_level = self.kind not in RAW_UTF8_KINDS
        self.ignore_merges = vocab.pre.ignore_merges
        self._ranks: dict[str, int] | None = None
        self._cache: dict[str, list[int]] = {}
        if self.byte_level:
            # a symbol that is no token falls back to its bytes, each looked up as a one-byte
            # string (llama.cpp does this on the byte-alphabet spelling: only ASCII survives)
            self.byte_ids = [self.lookup.get(bytes([b]).decode("utf-8", "surrogateescape"))
                             for b in range(256)]
        else:
            self.byte_ids = [self.lookup.get(f"<0x{b:02X}>") for b in range(256)]

    @property
    def ranks(self) -> dict[str, int]:
        """``"left right"`` -> merge rank (built on first use; the first of duplicates wins)."""
        if self._ranks is None:
            merges = self.vocab.merges
            merges = merges.tolist() if hasattr(merges, "tolist") else list(merges)
            n = len(merges)
            self._ranks = dict(zip(reversed(merges), range(n - 1, -1, -1)))
        return self._ranks

    def encode(self, text: str, out: list[int]) -> None:
        """Append the ids of ``text`` to ``out``."""
        cache = self._cache
        for word in self.split(text):
            ids = cache.get(word)
            if ids is None:
                if len(cache) >= _CACHE_LIMIT:
                    cache.clear()
                ids = cache[word] = self._word(byte_encode(word) if self.byte_level else word)
            out.extend(ids)

    def _word(self, word: str) -> list[int]:
        lookup = self.lookup
        if self.ignore_merges or (self.kind == "gemma4" and not word.strip("\n")):
            tid = lookup.get(word)
            if tid is not None:
                return [tid]
        n = len(word)
        if n == 1:
            syms = [word]
        else:
            syms = self._merge(word)
        ids: list[int] = []
        for sym in syms:
            tid = lookup.get(sym)
            if tid is not None:
                ids.append(tid)
                continue
            for b in sym.encode("utf-8", "surrogateescape"):
                tid = self.byte_ids[b]
                if tid is not None:  # llama.cpp drops what it cannot find
                    ids.append(tid)
        return ids

    def _merge(self, word: str) -> list[str]:
        ranks = self.ranks
        syms = list(word)  # symbol texts; "" once merged into its left neighbour
        n = len(syms)
        prev = list(range(-1, n - 1))
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        heap: list[tuple[int, int, int, str]] = []  # (rank, left, right, merged text)
        for i in range(n - 1):
            r = ranks.get(syms[i] + " " + syms[i + 1])
            if r is not None:
                heap.append((r, i, i + 1, syms[i] + syms[i + 1]))
        heapify(heap)

        def add(left: int, right: int) -> None:
            if left >= 0 and right >= 0:
                r = ranks.get(syms[left] + " " + syms[right])
                if r is not None:
                    heappush(heap, (r, left, right, syms[left] + syms[right]))

        while heap:
            _, left, right, text = heappop(heap)
            a, b = syms[left], syms[right]
            if not a or not b or a + b != text:
                continue  # stale: one side changed since this pair was queued
            syms[left] = text
            syms[right] = ""
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prev[nxt[right]] = left
            add(prev[left], left)
            add(left, nxt[left])
        return [s for s in syms if s]
