"""Prompt-lookup speculative decoding (engine/lookup.py, the engine's draft verification):
the drafts, and that with them the engine gives exactly the tokens it gives without them
(greedy and seeded), keeping each slot's cache consistent for reuse."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gguflm import LLM
from gguflm.api import InvalidRequestError
from gguflm.engine.lookup import NgramDrafter
from gguflm.engine.sampling import SamplerParams
from gguflm.engine.scheduler import Engine
from gguflm.engine.sequence import Request

GREEDY = SamplerParams(temp=0.0)


def test_drafts_continue_the_latest_match_of_the_longest_suffix() -> None:
    d = NgramDrafter([1, 2, 3, 4, 5, 9, 3, 4, 7, 8, 2, 3, 4])
    # suffix (2, 3, 4) occurred at 1..3, followed by 5 9 3; (3, 4) last continued with 7
    assert d.draft(3) == [5, 9, 3]
    assert d.draft(1) == [5]
    d.push(7)                      # ... 3 4 7: the suffix (3, 4, 7) continued with 8
    assert d.draft(5) == [8, 2, 3, 4, 7]
    assert NgramDrafter([1, 2, 3]).draft(4) == []           # nothing repeats
    assert NgramDrafter([5, 6, 5]).draft(4) == []           # one token is not enough
    assert NgramDrafter([5, 6, 5, 6]).draft(0) == []


@pytest.fixture(scope="module")
def llm(smollm2_path: Path):
    model = LLM(smollm2_path, n_ctx=1024, parallel=2)
    yield model
    model.close()


TEXT = ("The lighthouse stood at the edge of the cliff for more than a hundred years. "
        "Every night its keeper climbed the narrow stairs and watched the beam sweep "
        "acros the dark water.")


@pytest.fixture(scope="module")
def copying(llm: LLM) -> list[int]:
    """A chat prompt whose reply copies most of it (the drafts mostly hold)."""
    msgs = [{"role": "user", "content": "Correct the spelling in this text:\n\n" + TEXT}]
    return llm.chat_prompt_ids(msgs)


def test_lookup_keeps_limits_and_the_slot_cache_right(llm: LLM, copying: list[int]) -> None:
    engine = llm.engine
    want = engine.run(Request(copying, GREEDY, max_tokens=40)).tokens
    for n in (1, 2, 5):   # max_tokens exactly, though the drafts are longer
        got = engine.run(Request(copying, GREEDY, max_tokens=n, lookup=8))
        assert got.tokens == want[:n] and got.stopped_by == "max_tokens"
    engine.forget()
    got = engine.run(Request(copying, GREEDY, max_tokens=40, lookup=8))
    assert got.tokens == want and got.n_drafted > got.n_draft_kept > 20  # some rejected
    # the slot holds exactly the prompt and the generated tokens but the last
    held = next(s.cache.ids.tolist() for s in engine.slots
                if s.cache.ids[:len(copying)].tolist() == copying)  # the cache owns its ids
    assert held == copying + want[:-1]
    # a request continuing that text reuses the cache the drafts left
    again = engine.run(Request(copying + want[:10], GREEDY, max_tokens=30, lookup=8))
    assert again.n_cached > len(copying) and again.tokens == want[10:40]
    # the end of the context, exactly where it falls without drafts
    small = Engine(llm.model, llm.tokenizer, n_ctx=len(copying) + 12, n_slots=1)
    got = small.run(Request(copying, GREEDY, lookup=8))
    assert got.tokens == want[:13] and got.stopped_by == "context" and got.n_draft_kept
    small.close()


def test_lookup_gives_the_same_text_alone_and_in_a_batch(llm: LLM,
                                                          copying: list[int]) -> None:
    """Greedy and seeded, alone and beside another sequence: the same text with lookup,
    most of it taken from drafts."""
    ids = copying
    other = llm.tokenize("Once upon a time, there was a lighthouse keeper. Once upon a time,")

    def both(lookup: int = 0, **kw):
        a = llm.submit(ids, max_tokens=48, lookup=lookup, **kw)
        b = llm.submit(other, max_tokens=24, temperature=0.8, seed=5, lookup=lookup)
        return ["".join(p.text for p in s) for s in (a, b)], a

    for sampling, least in (({"temperature": 0}, 24), ({"temperature": 0.8, "seed": 3}, 5)):
        alone = llm.submit(ids, max_tokens=48, **sampling)
        want = "".join(p.text for p in alone)
        fast = llm.submit(ids, max_tokens=48, lookup=8, **sampling)
        assert "".join(p.text for p in fast) == want
        texts, a = both(8, **sampling)
        assert texts == both(**sampling)[0] and texts[0] == want
        assert min(a.n_draft_kept, fast.n_draft_kept) >= least, fast.timings_dict()
    with pytest.raises(InvalidRequestError, match="lookup"):
        llm.generate("x", lookup=65)
    with pytest.raises(InvalidRequestError, match="lookup"):
        LLM(llm.model_path, lookup=-1)


def test_lookup_with_a_json_schema_keeps_the_constraint(llm: LLM) -> None:
    """Each drafted row is masked by the grammar in turn: the same valid JSON as without."""
    schema = {"type": "object", "properties": {"name": {"type": "string"},
                                               "age": {"type": "integer"}},
              "required": ["name", "age"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": schema}}
    msgs = [{"role": "user", "content": 'Repeat this JSON exactly: {"name": "Alice Smith", '
                                        '"age": 42}. {"name": "Alice Smith", "age": 42}'}]
    kept = llm.engine.stats.accepted_tokens
    plain = llm.chat(msgs, max_tokens=40, temperature=0, response_format=fmt)
    fast = llm.chat(msgs, max_tokens=40, temperature=0, response_format=fmt, lookup=8)
    text = fast["choices"][0]["message"]["content"]
    assert text == plain["choices"][0]["message"]["content"]
    assert json.loads(text)["age"] == 42
    assert llm.engine.stats.accepted_tokens > kept  # drafts were kept under the grammar


@pytest.mark.parametrize("value, message", [("65", "lookup must be an integer from 0 to 64"),
                                            ("-1", "lookup must be an integer from 0 to 64"),
                                            ("abc", "not an integer")])
def test_bad_lookup_option_is_a_usage_error(value: str, message: str) -> None:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "gguflm.cli", "run", "-p", "x", "--lookup",
                          value], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert message in out.stderr and "Traceback" not in out.stderr
