"""SentencePiece (``tokenizer.ggml.model = llama``): score-ordered bigram merges.

llama.cpp's ``llm_tokenizer_spm``: start from single characters; repeatedly merge the
adjacent pair whose concatenation is a vocabulary token with the highest score (ties: the
leftmost); what is left and still not a token falls back to its UTF-8 bytes (``<0xNN>``).
Spaces are ``▁`` (U+2581) by the time text gets here.
"""

from __future__ import annotations

from heapq import heappop, heappush

from .vocab import Vocab


class SPMTokenizer:
    """Tokenizes one raw-text fragment (no special tokens in it) into ids."""

    def __init__(self, vocab: Vocab) -> None:
        self.lookup = vocab.token_to_id
        # a float32 memoryview: indexing gives a Python float, nearly as fast as a list
        self.scores = memoryview(vocab.scores).cast("B").cast("f")
        self.unk = vocab.special["unk"]
        # byte fallback: "<0xNN>", else the byte itself as a token (llama.cpp's byte_to_token)
        self.byte_ids: list[int | None] = []
        for b in range(256):
            tid = self.lookup.get(f"<0x{b:02X}>")
            if tid is None:
                tid = self.lookup.get(bytes([b]).decode("utf-8", "surrogateescape"))
            self.byte_ids.append(tid)

    def encode(self, text: str, out: list[int]) -> None:
        """Append the ids of ``text`` (spaces already escaped) to ``out``."""
        n = len(text)
        if n == 0:
            return
        lookup, scores = self.lookup, self.scores
        start = list(range(n))  # symbol i covers text[start[i]:start[i] + size[i]]
        size = [1] * n
        prev = list(range(-1, n - 1))
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        heap: list[tuple[float, int, int, int]] = []  # (-score, left, right, merged length)

        def add(left: int, right: int) -> None:
            if left < 0 or right < 0:
                return
            s = start[left]
            length = size[left] + size[right]
            tid = lookup.get(text[s:s + length])
            if tid is not None:
                heappush(heap, (-scores[tid], left, right, length))

        for i in range(n - 1):
            add(i, i + 1)
        while heap:
            _, left, right, length = heappop(heap)
            # skip pairs made stale by an earlier merge of either side
            if size[left] == 0 or size[right] == 0 or size[left] + size[right] != length:
                continue
            size[left] = length
            size[right] = 0
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prev[nxt[right]] = left
            add(prev[left], left)
            add(left, nxt[left])

        i = 0
        while i != -1:
            piece = text[start[i]:start[i] + size[i]]
            tid = lookup.get(piece)
            if tid is not None:
                out.append(tid)
            else:
                self._bytes(piece, out)
            i = nxt[i]

    def _bytes(self, piece: str, out: list[int]) -> None:
        for b in piece.encode("utf-8", "surrogateescape"):
            tid = self.byte_ids[b]
            if tid is None:
                tid = self.unk  # llama.cpp would abort: the vocabulary lacks byte tokens
            if tid is not None:
                out.append(tid)
