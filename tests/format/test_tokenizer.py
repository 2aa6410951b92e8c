"""Tokenizer behaviour on real vocabularies: round trips, streaming, special tokens, errors.

Expected strings marked "llama.cpp" were recorded from llama.cpp 0c1e570's own
llama_detokenize on the same vocabulary files.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gguflm import gguf
from gguflm.tokenizer import Attr, Tokenizer, TokenizerError
from gguflm.tokenizer.pretokenize import PRE_NAMES, SPLITS, splitter

# text with the characters tokenizers trip over: whitespace of all kinds, combining marks,
# digits of other scripts, astral code points, contractions, and special-token look-alikes
ALPHABET = st.one_of(
    st.characters(codec="utf-8", exclude_characters="\u2581"),
    st.sampled_from(list(" \t\n\r\x0b\x0c\x1c\x85\xa0\u3000\u2028'sStTdD0123456789<>|") +
                    ["'ll", "'RE", "<s>", "</s>", "<|im_end|>", "<h1>", "  ", "\n\n"]),
)
TEXT = st.lists(ALPHABET, max_size=24).map("".join)
SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


@cache
def _tok(path: str) -> Tokenizer:
    return Tokenizer.from_file(path)


@pytest.fixture(scope="module")
def vocab_dir(reference: Path) -> Path:
    return reference / "vocab"


@pytest.fixture(scope="module")
def spm(vocab_dir: Path) -> Tokenizer:
    return _tok(str(vocab_dir / "ggml-vocab-llama-spm.gguf"))


@pytest.fixture(scope="module")
def gpt2(vocab_dir: Path) -> Tokenizer:
    return _tok(str(vocab_dir / "ggml-vocab-gpt-2.gguf"))


@pytest.fixture(scope="module")
def smollm(smollm2_path: Path) -> Tokenizer:
    return _tok(str(smollm2_path))


@pytest.fixture(scope="module")
def gemma(gemma3_path: Path) -> Tokenizer:
    return _tok(str(gemma3_path))


# --- round trips -------------------------------------------------------------------------------

@SETTINGS
@given(text=TEXT)
def test_bpe_round_trip(gpt2: Tokenizer, text: str) -> None:
    assert gpt2.decode(gpt2.encode(text, add_special=False)) == text


@SETTINGS
@given(text=TEXT)
def test_spm_round_trip_with_bos(spm: Tokenizer, text: str) -> None:
    ids = spm.encode(text)
    assert ids[0] == spm.bos_id
    assert spm.decode(ids) == text  # the space prefix goes away again after BOS


@SETTINGS
@given(text=TEXT)
def test_gemma_round_trip(gemma: Tokenizer, text: str) -> None:
    # user-defined tokens such as "<h1>" and runs of spaces come back as their text
    assert gemma.decode(gemma.encode(text)) == text


# --- streaming ---------------------------------------------------------------------------------

@SETTINGS
@given(text=TEXT)
def test_decoder_never_splits_a_character(spm: Tokenizer, text: str) -> None:
    ids = spm.encode(text, add_special=False)
    dec = spm.decoder()
    chunks = [dec.feed(t) for t in ids] + [dec.flush()]
    assert "".join(chunks) == spm.decode(ids)
    assert all("\ufffd" not in c for c in chunks)  # every chunk is whole characters


def test_decoder_holds_back_partial_bytes(spm: Tokenizer) -> None:
    ids = spm.encode("🦙", add_special=False)  # no token: four byte tokens
    assert [spm.token_attr(t) & Attr.BYTE for t in ids[-4:]] == [Attr.BYTE] * 4
    dec = spm.decoder()
    assert [dec.feed(t) for t in ids] == [" ", "", "", "", "🦙"]
    dec.feed(ids[1])
    assert dec.flush() == "\ufffd"  # a truncated character at the end of the stream
    assert spm.decode(ids[1:3]) == "\ufffd"  # invalid UTF-8 is replaced


# --- special tokens ----------------------------------------------------------------------------

def test_control_tokens_render_only_when_asked(smollm: Tokenizer) -> None:
    ids = smollm.encode("<|im_start|>user\nhi<|im_end|>", parse_special=True)
    assert ids[0] == smollm.token_id("<|im_start|>")
    assert smollm.token_attr(ids[0]) & Attr.CONTROL
    assert smollm.decode(ids) == "user\nhi"
    assert smollm.decode(ids, special=True) == "<|im_start|>user\nhi<|im_end|>"
    assert smollm.token_to_piece(ids[0]) == b""
    assert smollm.token_to_piece(ids[0], special=True) == b"<|im_start|>"
    # without parse_special the markers are ordinary text
    plain = smollm.encode("<|im_start|>user", parse_special=False)
    assert smollm.token_id("<|im_start|>") not in plain
    assert smollm.decode(plain) == "<|im_start|>user"


def test_user_defined_tokens_match_without_parse_special(gemma: Tokenizer) -> None:
    tid = gemma.token_id("<h1>")
    assert tid is not None and gemma.token_attr(tid) & Attr.USER_DEFINED
    assert tid in gemma.encode("<h1>Title", add_special=False)
    start = gemma.token_id("<start_of_turn>")
    assert start not in gemma.encode("<start_of_turn>", add_special=False)
    assert gemma.encode("<start_of_turn>", add_special=False, parse_special=True) == [start]


def test_bos_eos_flags(spm: Tokenizer, smollm: Tokenizer, gemma: Tokenizer) -> None:
    assert (spm.add_bos, spm.add_eos, spm.bos_id, spm.eos_id) == (True, False, 1, 2)
    assert spm.encode("") == [1] and spm.encode("", add_special=False) == []
    assert (smollm.add_bos, smollm.add_eos) == (False, False)
    assert smollm.encode("hi") == smollm.encode("hi", add_special=False)
    assert gemma.add_bos and gemma.encode("hi")[0] == gemma.bos_id == 2


# --- llama.cpp's detokenizer -------------------------------------------------------------------

def test_detokenize_drops_space_prefix(spm: Tokenizer) -> None:
    ids = spm.encode("Hello world", add_special=False)
    assert ids == [15043, 3186]
    assert spm.decode(ids) == " Hello world"  # the pieces
    assert spm.detokenize(ids) == "Hello world"  # llama.cpp
    assert spm.detokenize([1, *ids]) == " Hello world"  # llama.cpp: BOS takes the strip
    assert spm.detokenize([1, *ids], remove_special=True) == " Hello world"  # llama.cpp
    assert spm.detokenize([1, *ids, 2], special=True) == "<s> Hello world</s>"  # llama.cpp


def test_detokenize_cleans_spaces_when_the_vocabulary_asks(gpt2: Tokenizer,
                                                           vocab_dir: Path) -> None:
    text = ("Hello , world ! it 's a ' quoted ' thing . I 'm sure they 've done , "
            "we 'll see ' ' x")
    assert gpt2.detokenize(gpt2.encode(text)) == (  # llama.cpp
        "Hello, world! it's a'quoted'thing. I'm sure they've done, we 'll see'' x")
    assert gpt2.decode(gpt2.encode(text)) == text
    qwen2 = _tok(str(vocab_dir / "ggml-vocab-qwen2.gguf"))  # clean_spaces off for qwen2
    assert qwen2.detokenize(qwen2.encode(text)) == text  # llama.cpp


# --- pre-tokenizers ----------------------------------------------------------------------------

def test_pre_tokenizer_table_is_complete() -> None:
    assert {pre.kind for pre in PRE_NAMES.values()} <= set(SPLITS)
    for name in ("default", "gpt-2", "llama-bpe", "llama3", "qwen2", "smollm", "deepseek-llm",
                 "tekken", "gpt-4o", "chameleon", "superbpe", "afmoe", "tiny_aya"):
        assert name in PRE_NAMES


@settings(max_examples=25, deadline=None)
@given(text=TEXT)
def test_every_pre_tokenizer_splits_without_losing_text(text: str) -> None:
    for kind in SPLITS:
        words = splitter(kind).split(text)
        assert "".join(words) == text and all(words), kind


def test_pre_tokenizer_classes_follow_llama_cpp() -> None:
    gpt2 = splitter("gpt2").split
    # \p{N} is every number (not just 0-9); U+001C..U+001F are not whitespace;
    # a letter assigned in Unicode 15 (U+1E4D0, Nag Mundari) is a letter
    assert gpt2("x ²³½ y") == ["x", " ²³½", " y"]
    assert gpt2("a \x1cb") == ["a", " \x1c", "b"]
    assert gpt2("x\U0001e4d0\U0001e4d1 y") == ["x\U0001e4d0\U0001e4d1", " y"]
    # contractions: case-sensitive for GPT-2, not for Llama 3; whitespace before a word
    assert gpt2("IT'S it's") == ["IT", "'", "S", " it", "'s"]
    assert splitter("llama3").split("IT'S  x\n\n y") == ["IT", "'S", " ", " x", "\n\n", " y"]
    assert splitter("llama3").split("12345") == ["123", "45"]
    assert splitter("qwen2").split("12345") == ["1", "2", "3", "4", "5"]
    assert splitter(PRE_NAMES["smollm"].kind).split("in 2024") == ["in", " ", "2", "0", "2", "4"]


# --- errors ------------------------------------------------------------------------------------

def test_bad_ids_are_clear_errors(spm: Tokenizer) -> None:
    for bad in (-1, spm.n_vocab):
        with pytest.raises(TokenizerError, match="out of range"):
            spm.decode([5, bad])
        with pytest.raises(TokenizerError, match="out of range"):
            spm.token_to_piece(bad)


def test_file_without_vocabulary(reference: Path) -> None:
    with pytest.raises(TokenizerError, match="tokenizer.ggml.model"):
        Tokenizer.from_file(reference / "quant-zoo" / "quant-zoo.gguf")


def test_unknown_model_and_pre_tokenizer(vocab_dir: Path) -> None:
    meta = dict(gguf.open(vocab_dir / "ggml-vocab-gpt-2.gguf").metadata)
    for key, value, message in (("tokenizer.ggml.pre", "no-such-pre", "unknown pre-tokenizer"),
                                ("tokenizer.ggml.pre", "kimi-k2", "not supported"),
                                ("tokenizer.ggml.model", "t5", "unsupported tokenizer model"),
                                ("tokenizer.ggml.model", "nonsense", "unknown tokenizer model")):
        with pytest.raises(TokenizerError, match=message):
            Tokenizer.from_metadata({**meta, key: value})
    del meta["tokenizer.ggml.merges"]
    with pytest.raises(TokenizerError, match="merges"):
        Tokenizer.from_metadata(meta)
