"""Tokenizer against llama.cpp's own outputs (../shared/reference).

- ``vocab/``: llama.cpp's tokenizer test suites (test-tokenizer-0), no BOS, no special parsing.
- ``*/tokenize.json``: ids (parse_special false and true) and detokenized text.
- ``*/greedy.json``: prompt_tokens (BOS per add_bos_token, special parsing when asked),
  generated text as streamed by the incremental decoder, and end-of-generation ids.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest

from gguflm.tokenizer import Tokenizer

SEP = "\n__ggml_vocab_test__\n"
VOCABS = ["llama-spm", "gpt-2", "llama-bpe", "qwen2"]
# reference folder -> where its model file is (a cached model, or inside the folder)
MODELS = {
    "smollm2-135m-q4_1": "smollm2_path",
    "gemma3-270m-q4_k_m": "gemma3_path",
    "tiny-llama-f16": "tiny-llama-f16/tiny-llama-f16.gguf",
    "tiny-llama-q4_0": "tiny-llama-q4_0/tiny-llama-q4_0.gguf",
}
GREEDY_ONLY = {f"arch/{a}": f"arch/{a}/tiny-{a}-f16.gguf" for a in ("qwen2", "qwen3", "phi3",
                                                                     "gemma2")}


@cache
def _tokenizer(path: str) -> Tokenizer:
    return Tokenizer.from_file(path)


def _model(request: pytest.FixtureRequest, reference: Path, where: str) -> Tokenizer:
    if where.endswith("_path"):
        path = request.getfixturevalue(where)
    else:
        path = reference / where
        if not path.is_file():
            pytest.skip(f"{path} not found")
    return _tokenizer(str(path))


@pytest.mark.parametrize("name", VOCABS)
def test_llama_cpp_vocab_suite(reference: Path, name: str) -> None:
    path = reference / "vocab" / f"ggml-vocab-{name}.gguf"
    tok = _tokenizer(str(path))
    cases = path.with_name(path.name + ".inp").read_text("utf-8").split(SEP)[:-1]
    expected = path.with_name(path.name + ".out").read_text("utf-8").split("\n")
    assert len(cases) == 46
    wrong = []
    for text, line in zip(cases, expected):
        want = [int(x) for x in line.split()]
        got = tok.encode(text, add_special=False, parse_special=False)
        if got != want:
            wrong.append((text, got, want))
    assert not wrong, f"{len(wrong)}/{len(cases)} cases differ, first: {wrong[0]}"


@pytest.mark.parametrize("folder", list(MODELS))
def test_tokenize_json(request: pytest.FixtureRequest, reference: Path, folder: str) -> None:
    tok = _model(request, reference, MODELS[folder])
    cases = json.loads((reference / folder / "tokenize.json").read_text("utf-8"))["cases"]
    assert {c["parse_special"] for c in cases} == {False, True}
    wrong = []
    for c in cases:
        ids = tok.encode(c["text"], add_special=False, parse_special=c["parse_special"])
        text = tok.decode(c["ids"])
        if ids != c["ids"] or text != c["detokenized"]:
            wrong.append((c["text"], c["parse_special"], ids, c["ids"], text, c["detokenized"]))
    assert not wrong, f"{len(wrong)}/{len(cases)} cases differ, first: {wrong[0]}"


@pytest.mark.parametrize("folder", [*MODELS, *GREEDY_ONLY])
def test_greedy_prompt_tokens_and_text(request: pytest.FixtureRequest, reference: Path,
                                       folder: str) -> None:
    tok = _model(request, reference, {**MODELS, **GREEDY_ONLY}[folder])
    data = json.loads((reference / folder / "greedy.json").read_text("utf-8"))
    assert tok.add_bos == data["meta"]["add_bos"]
    for case in data["cases"]:
        ids = tok.encode(case["prompt"], add_special=True, parse_special=case["special"])
        assert ids == case["prompt_tokens"], case["id"]
        # streamed piece by piece, the generated text is llama.cpp's
        dec = tok.decoder()
        text = "".join(dec.feed(t) for t in case["generated_tokens"]) + dec.flush()
        assert text == case["generated_text"], case["id"]
        # generation stopped at the first end-of-generation token, and only there
        gen = case["generated_tokens"]
        eog_at = [i for i, t in enumerate(gen) if tok.is_eog(t)]
        if case["stop"] == "eos":
            assert eog_at == [len(gen) - 1], case["id"]
        else:
            assert eog_at == [], case["id"]


def test_chat_end_tokens_end_generation(request: pytest.FixtureRequest, reference: Path) -> None:
    smol = _model(request, reference, "smollm2_path")
    assert smol.token_id("<|im_end|>") in smol.eog_ids
    assert smol.eos_id in smol.eog_ids
    gemma = _model(request, reference, "gemma3_path")
    assert {gemma.token_id("<end_of_turn>"), gemma.token_id("<eos>")} <= gemma.eog_ids
    assert gemma.token_id("<start_of_turn>") not in gemma.eog_ids
