"""The generation loop, on the TinyLlama-shaped reference model (fast: 4 layers, n_embd 256).

Greedy output is checked against llama.cpp's (reference greedy.json): wherever the tokens
first differ, llama.cpp's top-1/top-2 margin must be small there (0.25 is the F16 bar).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gguflm import load_model
from gguflm.engine.generate import PromptTooLongError, generate, stream_text
from gguflm.engine.sampling import Sampler, SamplerParams

GREEDY = SamplerParams(temp=0.0)


@pytest.fixture(scope="module")
def tiny(reference: Path):
    base = reference / "tiny-llama-f16"
    cases = {c["id"]: c for c in json.loads((base / "greedy.json").read_text())["cases"]}
    return load_model(base / "tiny-llama-f16.gguf"), cases


class Counting:
    """The real model, counting forward passes and the tokens they evaluate."""

    def __init__(self, model) -> None:
        self.model, self.calls = model, []

    def new_cache(self, n_ctx: int):
        return self.model.new_cache(n_ctx)

    def forward(self, ids, cache, all_logits: bool = False):
        self.calls.append(len(ids))
        return self.model.forward(ids, cache, all_logits)


def _first_difference(ours: list[int], ref: list[int]) -> int | None:
    return next((i for i, (a, b) in enumerate(zip(ours, ref)) if a != b), None)


@pytest.mark.parametrize("case_id", ["colors", "fib"])
def test_greedy_matches_llama_cpp_where_it_is_decisive(tiny, case_id: str) -> None:
    model, cases = tiny
    case = cases[case_id]
    counting = Counting(model)
    gen = generate(counting, case["prompt_tokens"], Sampler(GREEDY), max_tokens=12)
    tokens = list(gen)
    assert len(tokens) == 12 and gen.tokens == tokens and gen.stop == "length"
    i = _first_difference(tokens, case["generated_tokens"])
    if i is not None:
        top = case["top_logits"][i]
        assert top[0][1] - top[1][1] < 0.25, f"differs at step {i} where llama.cpp is decisive"
    # the prompt as one batch, then one token at a time; the last token is not evaluated
    assert counting.calls == [len(case["prompt_tokens"])] + [1] * 11
    t = gen.timings
    assert (t.prompt_tokens, t.generated_tokens) == (len(case["prompt_tokens"]), 12)
    assert t.prompt_tokens_per_second > 0 and t.generation_tokens_per_second > 0


def test_stops_after_an_end_of_generation_token(tiny) -> None:
    model, cases = tiny
    case = cases["colors"]
    eog = case["generated_tokens"][2]  # pretend the third greedy token ends generation
    counting = Counting(model)
    gen = generate(counting, case["prompt_tokens"], Sampler(GREEDY), max_tokens=10,
                   eog_ids=[eog])
    assert list(gen) == case["generated_tokens"][:3]  # the end token is yielded
    assert gen.stop == "eos"
    assert counting.calls == [len(case["prompt_tokens"]), 1, 1]


def test_stops_at_the_end_of_the_context(tiny) -> None:
    model, cases = tiny
    prompt = cases["colors"]["prompt_tokens"]
    gen = generate(model, prompt, Sampler(GREEDY), max_tokens=-1, n_ctx=len(prompt) + 2)
    assert len(list(gen)) == 3 and gen.stop == "length"
    gen = generate(model, prompt, Sampler(GREEDY), max_tokens=0)
    assert list(gen) == [] and gen.stop == "length"


def test_prompt_too_long_and_bad_arguments(tiny) -> None:
    model, cases = tiny
    prompt = cases["colors"]["prompt_tokens"]
    with pytest.raises(PromptTooLongError, match=f"{len(prompt)} tokens"):
        generate(model, prompt, Sampler(GREEDY), n_ctx=len(prompt) - 1)
    with pytest.raises(PromptTooLongError, match="empty"):
        generate(model, [], Sampler(GREEDY), max_tokens=4)
    with pytest.raises(ValueError, match="n_ctx is required"):
        generate(model, prompt, Sampler(GREEDY), max_tokens=-1)
    with pytest.raises(ValueError, match="max_tokens"):
        generate(model, prompt, Sampler(GREEDY), max_tokens=-2)


def test_same_seed_same_tokens(tiny) -> None:
    model, cases = tiny
    prompt = cases["village"]["prompt_tokens"]

    def sample(seed: int) -> list[int]:
        params = SamplerParams(temp=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=seed)
        return list(generate(model, prompt, Sampler(params), max_tokens=8))

    first = sample(5)
    assert sample(5) == first
    assert sample(6) != first
    gen = generate(model, prompt, Sampler(GREEDY), max_tokens=1)
    list(gen)
    with pytest.raises(RuntimeError):
        list(gen)


def test_stream_text_is_the_decoded_text(tiny, reference: Path) -> None:
    from gguflm.tokenizer import Tokenizer

    model, cases = tiny
    tok = Tokenizer.from_gguf(model.gguf)
    ids = cases["unicode"]["generated_tokens"][:20]
    pieces = list(stream_text(ids, tok.decoder()))
    assert "".join(pieces) == tok.decode(ids)
