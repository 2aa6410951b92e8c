"""WordPiece (tokenizer.ggml.model = bert) against llama.cpp's bert-bge suite and by hand.

The suite (``ggml-vocab-bert-bge.gguf`` + ``.inp``/``.out``, llama.cpp's test-tokenizer-0) is
looked for in the reference vocab folder, then in ``$GGUFLM_LLAMA_CPP_MODELS`` (llama.cpp's
``models/`` folder, e.g. the llama-cpp-python sdist's ``vendor/llama.cpp/models``).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gguflm.tokenizer import Tokenizer, TokenType

SEP = "\n__ggml_vocab_test__\n"
SUITE = "ggml-vocab-bert-bge.gguf"


def _suite(reference_dir: Path) -> Path:
    candidates = [reference_dir / "vocab" / SUITE]
    if os.environ.get("GGUFLM_LLAMA_CPP_MODELS"):
        candidates.append(Path(os.environ["GGUFLM_LLAMA_CPP_MODELS"]) / SUITE)
    for path in candidates:
        if path.is_file() and path.with_name(SUITE + ".inp").is_file():
            return path
    pytest.skip(f"{SUITE} not found in {', '.join(map(str, candidates))}: set "
                "GGUFLM_LLAMA_CPP_MODELS to llama.cpp's models/ folder (llama-cpp-python "
                "0.3.36 sdist, vendor/llama.cpp/models)")


def test_bert_bge_suite() -> None:
    from conftest import REFERENCE

    path = _suite(REFERENCE)
    tok = Tokenizer.from_file(path)
    cases = path.with_name(SUITE + ".inp").read_text("utf-8").split(SEP)[:-1]
    expected = path.with_name(SUITE + ".out").read_text("utf-8").split("\n")
    assert len(cases) == 46
    wrong = [(text, got, want) for text, line in zip(cases, expected)
             if (got := tok.encode(text, add_special=False)) != (want := [int(x) for x in
                                                                           line.split()])]
    assert not wrong, f"{len(wrong)}/{len(cases)} cases differ, first: {wrong[0]}"
    assert tok.encode("Hello") == [101, 7592, 102]  # [CLS] ... [SEP] with add_special


def _tiny(**meta: object) -> Tokenizer:
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "▁hello", "▁world", "▁un", "aff", "able",
             "▁cafe", "▁!", "▁中", "▁国", "▁Hello", "s"]
    types = [TokenType.CONTROL] * 4 + [TokenType.NORMAL] * (len(words) - 4)
    md = {"tokenizer.ggml.model": "bert", "tokenizer.ggml.tokens": words,
          "tokenizer.ggml.token_type": [int(t) for t in types],
          "tokenizer.ggml.bos_token_id": 2, "tokenizer.ggml.seperator_token_id": 3,
          "tokenizer.ggml.unknown_token_id": 1, "tokenizer.ggml.padding_token_id": 0, **meta}
    return Tokenizer.from_metadata(md)


def test_wordpiece_rules() -> None:
    tok = _tiny()
    assert tok.encode("Hello  WORLD!", add_special=False) == [4, 5, 10]
    assert tok.encode("unaffable", add_special=False) == [6, 7, 8]
    # a word with an unmatched position becomes one [UNK], the next word is unaffected
    assert tok.encode("unaffablex hello", add_special=False) == [1, 4]
    assert tok.encode("Café", add_special=False) == [9]           # accents stripped
    assert tok.encode("中国", add_special=False) == [11, 12]       # CJK split per ideograph
    assert tok.encode("hello\x00\u200b", add_special=False) == [4]  # NUL and Cf dropped
    assert tok.encode("hello") == [2, 4, 3]
    assert tok.encode("[CLS]hello", parse_special=True) == [2, 2, 4, 3]


def test_normaliser_flags() -> None:
    tok = _tiny(**{"tokenizer.ggml.normalizer.lowercase": False})
    assert tok.encode("Hello hello", add_special=False) == [13, 4]
    assert tok.encode("Café", add_special=False) == [1]  # no lowercase: no accent strip either
