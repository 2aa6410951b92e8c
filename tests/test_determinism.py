"""The standing rule of the serving engine, on both real models, the tiny Qwen3.5 (whose
recurrent layers' state is restored from a snapshot after a cache hit), the tiny Gemma 4
(shared KV layers, per-layer inputs), the tiny Qwen3-MoE and gpt-oss (rows grouped by
the experts they chose), the tiny LFM2 (short convolutions' state) and the tiny DeepSeek-V3
layout (latent attention): a sequence's logits do not depend on what else is in the batch
or in the cache.

For 20 prompts, each followed by its greedy continuation, the logits of every position are
bit-identical (np.array_equal) when the sequence is evaluated as one prefill, token by
token, in chunks of 7, in one batch with 7 other sequences (some prefilling, some decoding),
and after a prefix-cache hit (a slot that held the same start and then something else).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gguflm import load_model
from gguflm.engine.sampling import SamplerParams
from gguflm.engine.scheduler import Engine
from gguflm.engine.sequence import Request
from gguflm.model.batch import ALL, LAST, Part, Pause
from gguflm.tokenizer import Tokenizer

PROMPTS = [
    "The capital of France is", "Once upon a time, in a small village,",
    "def fibonacci(n):", "The three primary colors are", "1, 2, 3, 4, 5,",
    "Water boils at", "My favourite food is", "The quick brown fox",
    "In 1969, the first humans", "To make a cup of tea,", "The largest planet is",
    "Dear Sir or Madam,", "Photosynthesis is the process", "SELECT * FROM",
    "The sun rises in the", "import numpy as np\n", "A haiku about autumn:",
    "The meaning of life is", "Roses are red,", "Translate to French: cheese =",
]
N_GEN = 6


@pytest.fixture(scope="module", params=["smollm2", "gemma3", "qwen35", "gemma4",
                                                 "qwen3moe", "gpt_oss", "lfm2", "deepseek2",
                                                 "granitehybrid"])
def setup(request: pytest.FixtureRequest):
    path: Path = request.getfixturevalue(f"{request.param}_path")
    model = load_model(path)
    tok = Tokenizer.from_gguf(model.gguf)
    engine = Engine(model, tok, n_ctx=128, n_slots=8)
    seqs = [engine.submit(Request(tok.encode(p), SamplerParams(temp=0), max_tokens=N_GEN))
            for p in PROMPTS]
    full = []
    for p, s in zip(PROMPTS, seqs, strict=True):
        s.wait(600)
        full.append(tok.encode(p) + s.tokens[:-1])  # the positions that were evaluated
    engine.close()
    yield model, full
    model.gguf.close()


def test_one_prefill_token_by_token_and_chunks_agree(setup) -> None:
    model, full = setup
    for ids in full:
        alone = model.forward(ids, model.new_cache(64), all_logits=True)
        cache = model.new_cache(64)
        steps = np.stack([model.forward([t], cache) for t in ids])
        assert np.array_equal(alone, steps)
        cache = model.new_cache(64)
        chunks = np.concatenate([model.forward(ids[i:i + 7], cache, all_logits=True)
                                 for i in range(0, len(ids), 7)])
        assert np.array_equal(alone, chunks)


def test_batched_with_seven_others_and_after_a_cache_hit(setup) -> None:
    model, full = setup
    rng = np.random.default_rng(0)
    for i, ids in enumerate(full):
        alone = model.forward(ids, model.new_cache(64), all_logits=True)
        # seven other sequences, part-way through their own prompts, in one arena
        arena = model.new_arena(64, 8)
        others = [full[(i + k) % len(full)] for k in range(1, 8)]
        cut = [int(rng.integers(1, len(o))) for o in others]
        model.forward_batch([Part(arena.slots[k + 1], np.array(o[:c]), LAST)
                             for k, (o, c) in enumerate(zip(others, cut, strict=True))])
        parts = [Part(arena.slots[0], np.array(ids), ALL)]
        for k, (o, c) in enumerate(zip(others, cut, strict=True)):  # decode 1, or prefill
            parts.append(Part(arena.slots[k + 1], np.array(o[c:c + 1 + k % 3]), LAST))
        mixed = model.forward_batch(parts)
        assert np.array_equal(alone, mixed[:len(ids)]), f"prompt {i}: batched"
        # the slot held the same start and then other tokens: cut back, evaluate the rest
        keep = len(ids) // 2
        cache = arena.slots[0]
        cache.truncate(keep)
        model.forward(others[0][:5], cache)  # something else after the shared start
        cache.truncate(keep)
        rest = model.forward(ids[keep:], cache, all_logits=True)
        assert np.array_equal(alone[keep:], rest), f"prompt {i}: after a cache hit"


def test_a_batch_paused_between_its_layers_for_other_batches(setup) -> None:
    """The serving engine lets a newcomer's prompt run in a pause of a decoding step
    (``forward_batch(..., pause)``, between two layers and before the output product):
    the paused batch's logits (7 rows: padded to 8 in the team) and the newcomers' are
    those computed alone."""
    model, full = setup
    arena = model.new_arena(64, 12)
    others = full[:7]
    cut = [len(o) - 1 for o in others]
    model.forward_batch([Part(arena.slots[k], np.array(o[:c]), LAST)
                         for k, (o, c) in enumerate(zip(others, cut, strict=True))])
    step = [Part(arena.slots[k], np.array(o[c:c + 1]), LAST)
            for k, (o, c) in enumerate(zip(others, cut, strict=True))]
    # one newcomer per pause (between two layers, before the output product), at most 4
    newcomers = full[7:7 + min(4, len(model.blocks))]
    got: list[np.ndarray] = []

    def pause() -> None:
        k = len(got)
        if k < len(newcomers):
            got.append(model.forward_batch([Part(arena.slots[7 + k], np.array(newcomers[k]),
                                                 ALL)]))

    paused = model.forward_batch(step, Pause(pause, np.ones(2, np.int64)))  # every layer
    assert len(got) == len(newcomers), "the batch paused between its layers too"
    for ids, logits in zip(newcomers, got, strict=False):
        assert np.array_equal(logits, model.forward(ids, model.new_cache(64), True))
    for k, c in enumerate(cut):
        arena.slots[k].truncate(c)
    assert np.array_equal(paused, model.forward_batch(step))
    # 7 rows run padded to 8 (a copy of the last row, dropped): each row is still its own
    for k, o in enumerate(others):
        assert np.array_equal(paused[k], model.forward(o, model.new_cache(64))), f"row {k}"
