"""``Tokenizer``: text <-> token ids from a GGUF file's metadata, as llama.cpp does it."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from .bpe import BPETokenizer
from .decode import IncrementalDecoder, clean_up_spaces, make_piece
from .special import SpecialSplitter
from .spm import SPMTokenizer
from .vocab import Attr, TokenizerError, Vocab, load_vocab
from .wpm import WPMTokenizer

_HIDDEN = int(Attr.CONTROL | Attr.UNKNOWN)  # rendered only with special=True


class Tokenizer:
    """SentencePiece, WordPiece or byte-level BPE tokenizer built from GGUF metadata alone.

    Works on full model files and on vocabulary-only files. ``encode`` matches llama.cpp's
    ``llama_tokenize``; ``token_to_piece`` its ``llama_token_to_piece``; ``detokenize`` its
    ``llama_detokenize``; ``decode`` concatenates pieces (see there).
    """

    def __init__(self, vocab: Vocab) -> None:
        self.vocab = vocab
        self._special = SpecialSplitter(vocab)
        model = {"spm": SPMTokenizer, "wpm": WPMTokenizer}.get(vocab.kind, BPETokenizer)
        self._model = model(vocab)
        self._attrs = memoryview(vocab.attrs).cast("B").cast("i")  # indexing gives an int
        self._pieces: dict[int, bytes] = {}    # filled as tokens are shown

    # --- construction ------------------------------------------------------------------------

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Tokenizer:
        """Open a GGUF file (a model or a vocabulary-only file) and read its tokenizer."""
        from .. import gguf

        try:
            return cls.from_gguf(gguf.open(path))
        except TokenizerError as e:
            raise e.with_path(str(path)) from None

    @classmethod
    def from_gguf(cls, f: Any) -> Tokenizer:
        """From an open ``GGUFFile``."""
        return cls.from_metadata(f.metadata)

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any]) -> Tokenizer:
        """From a metadata mapping (``tokenizer.ggml.*`` keys)."""
        return cls(load_vocab(metadata))

    # --- facts ---------------------------------------------------------------------------------

    @property
    def n_vocab(self) -> int:
        return self.vocab.n_vocab

    @property
    def model(self) -> str:
        """``tokenizer.ggml.model``: ``llama`` (SentencePiece), ``bert`` (WordPiece), ``gpt2``
        or ``gemma4`` (BPE)."""
        return self.vocab.model

    @property
    def pre(self) -> str:
        """The pre-tokenizer name (BPE only; ``""`` for SentencePiece)."""
        return self.vocab.pre_name

    @property
    def bos_id(self) -> int | None:
        return self.vocab.special["bos"]

    @property
    def eos_id(self) -> int | None:
        return self.vocab.special["eos"]

    @property
    def eot_id(self) -> int | None:
        return self.vocab.special["eot"]

    @property
    def unk_id(self) -> int | None:
        return self.vocab.special["unk"]

    @property
    def pad_id(self) -> int | None:
        return self.vocab.special["pad"]

    @property
    def add_bos(self) -> bool:
        return self.vocab.add_bos

    @property
    def add_eos(self) -> bool:
        return self.vocab.add_eos

    @property
    def eog_ids(self) -> frozenset[int]:
        """Ids that end generation: EOS, EOT, EOM and tokens such as ``<|im_end|>``."""
        return self.vocab.eog_ids

    def is_eog(self, tid: int) -> bool:
        return tid in self.vocab.eog_ids

    def token_text(self, tid: int) -> str:
        """The token's string as stored in the vocabulary (``▁``, byte alphabet and all)."""
        self._check(tid)
        return self.vocab.tokens[tid]

    def token_attr(self, tid: int) -> Attr:
        self._check(tid)
        return Attr(self._attrs[tid])

    def token_id(self, text: str) -> int | None:
        """The id whose vocabulary string is ``text`` exactly, or None."""
        return self.vocab.token_to_id.get(text)

    # --- encoding ------------------------------------------------------------------------------

    def encode(self, text: str, add_special: bool = True, parse_special: bool = False,
               space_prefix: bool = True) -> list[int]:
        """Token ids of ``text``.

        ``add_special`` adds BOS/EOS as the vocabulary asks (``add_bos``/``add_eos``);
        WordPiece always puts [CLS] before and [SEP] after the text (llama.cpp's WPM branch);
        ``parse_special`` turns control tokens written in the text (``<|im_start|>``) into
        their ids. User-defined tokens are recognised either way, as in llama.cpp.
        ``space_prefix=False`` leaves out the space a SentencePiece vocabulary with
        ``add_space_prefix`` puts before the text: for text that continues other text.
        """
        v = self.vocab
        text = _valid_unicode(text)
        if v.kind == "wpm":
            return self._encode_wpm(text, add_special, parse_special)
        out: list[int] = []
        if add_special and v.add_bos:
            if v.special["bos"] is None:
                raise TokenizerError("the vocabulary asks for BOS but has no BOS token")
            out.append(v.special["bos"])
        frags = self._special.split(text, parse_special) if text else []
        if v.kind == "spm":
            # the space prefix goes before text that follows a special token, and before
            # the start of the text unless space_prefix is off
            prev_special = space_prefix
            for frag in frags:
                if isinstance(frag, int):
                    out.append(frag)
                    prev_special = True
                    continue
                if v.add_space_prefix and prev_special:
                    frag = " " + frag
                self._model.encode(frag.replace(" ", "\u2581"), out)
                prev_special = False
        else:
            for frag in frags:
                if isinstance(frag, int):
                    out.append(frag)
                elif v.escape_whitespaces:
                    self._model.encode(frag.replace(" ", "\u2581"), out)
                else:
                    self._model.encode(frag, out)
        if add_special and v.add_eos:
            if v.special["eos"] is None:
                raise TokenizerError("the vocabulary asks for EOS but has no EOS token")
            out.append(v.special["eos"])
        return out

    def _encode_wpm(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        special = self.vocab.special
        if add_special and (special["bos"] is None or special["sep"] is None):
            raise TokenizerError("a WordPiece vocabulary needs [CLS] (BOS) and [SEP] ids")
        out = [special["bos"]] if add_special else []
        for frag in self._special.split(text, parse_special) if text else []:
            if isinstance(frag, int):
                out.append(frag)
            else:
                self._model.encode(frag, out)
        if add_special:
            out.append(special["sep"])
        return out

    # --- decoding ------------------------------------------------------------------------------

    def _check(self, tid: int) -> None:
        if not 0 <= tid < self.vocab.n_vocab:
            raise TokenizerError(f"token id {tid} is out of range: the vocabulary has "
                                 f"{self.vocab.n_vocab} tokens (0..{self.vocab.n_vocab - 1})")

    def token_to_piece(self, tid: int, special: bool = False) -> bytes:
        """The bytes of one token (llama.cpp's ``llama_token_to_piece``, no lstrip).

        Control and unknown tokens give ``b""`` unless ``special``.
        """
        self._check(tid)
        if not special and self._attrs[tid] & _HIDDEN:
            return b""
        piece = self._pieces.get(tid)
        if piece is None:
            piece = self._pieces[tid] = make_piece(self.vocab, tid)
        return piece

    def decode(self, ids: Iterable[int], special: bool = False) -> str:
        """Text of ``ids``: their pieces joined, invalid UTF-8 replaced by U+FFFD.

        When the vocabulary adds a space prefix (SentencePiece) and ``ids`` starts with BOS,
        the space that prefix put before the first word is dropped, so that
        ``decode(encode(text)) == text``. This matches llama-cpp-python's ``detokenize``
        (the reference data's ``detokenized``), which drops a space after BOS whatever the
        vocabulary; ``detokenize`` is llama.cpp's own ``llama_detokenize``.
        """
        ids = list(ids)
        data = b"".join([self.token_to_piece(t, special) for t in ids])
        if (self.vocab.add_space_prefix and ids and ids[0] == self.bos_id
                and data.startswith(b" ")):
            data = data[1:]
        return data.decode("utf-8", "replace")

    def detokenize(self, ids: Iterable[int], special: bool = False,
                   remove_special: bool = False) -> str:
        """llama.cpp's ``llama_detokenize``.

        Drops the space prefix from the first piece (SentencePiece), removes a leading BOS
        and trailing EOS the vocabulary adds when ``remove_special``, and applies
        clean_up_tokenization_spaces when the vocabulary asks for it (most BPE ones).
        """
        v = self.vocab
        ids = list(ids)
        remove_space = v.add_space_prefix
        if remove_special and v.add_bos and ids and ids[0] == v.special["bos"]:
            remove_space = False
            ids = ids[1:]
        if remove_special and v.add_eos and ids and ids[-1] == v.special["eos"]:
            ids = ids[:-1]
        parts = []
        for t in ids:
            piece = self.token_to_piece(t, special)
            if remove_space and piece.startswith(b" "):
                piece = piece[1:]
            remove_space = False
            parts.append(piece)
        data = b"".join(parts)
        if v.clean_spaces:
            data = clean_up_spaces(data)
        return data.decode("utf-8", "replace")

    def decoder(self, special: bool = False) -> IncrementalDecoder:
        """A streaming decoder: ``feed(id) -> str`` never splits a character; ``flush()``."""
        return IncrementalDecoder(self.token_to_piece, special)

    def __repr__(self) -> str:
        pre = f", pre={self.pre!r}" if self.pre else ""
        return f"Tokenizer(model={self.model!r}{pre}, n_vocab={self.n_vocab})"


def _valid_unicode(text: str) -> str:
    """``text`` with lone surrogates (undecodable input bytes) replaced by U+FFFD."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raw = text.encode("utf-8", "surrogateescape" if _escapes_only(text) else "surrogatepass")
        return raw.decode("utf-8", "replace")
    return text


def _escapes_only(text: str) -> bool:
    return all(not 0xD800 <= ord(c) <= 0xDFFF or 0xDC80 <= ord(c) <= 0xDCFF for c in text)
