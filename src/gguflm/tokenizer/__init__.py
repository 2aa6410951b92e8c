"""Tokenizers from GGUF metadata: SentencePiece, WordPiece and byte-level BPE, as llama.cpp
runs them.

``Tokenizer.from_file(path)`` reads ``tokenizer.ggml.*`` (model or vocabulary-only files);
``encode``/``decode``/``decoder`` turn text into ids and back. Needs only ``gguflm.gguf``.
"""

from .decode import IncrementalDecoder
from .tokenizer import Tokenizer
from .vocab import Attr, TokenizerError, TokenType

__all__ = ["Attr", "IncrementalDecoder", "TokenType", "Tokenizer", "TokenizerError"]
