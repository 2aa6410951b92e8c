"""The serving engine (engine/scheduler.py) on the TinyLlama-shaped reference model (fast:
4 layers, n_embd 256): greedy output against llama.cpp's, how sequences end, continuous
batching, fair queueing, prefix reuse across requests and cancellation.

Greedy output is checked against llama.cpp's (reference greedy.json): wherever the tokens
first differ, llama.cpp's top-1/top-2 margin must be small there (0.25 is the F16 bar).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest

from gguflm import load_model
from gguflm.engine.sampling import SamplerParams
from gguflm.engine.scheduler import Engine, QueueFullError
from gguflm.engine.sequence import Request
from gguflm.model.batch import ALL, Part
from gguflm.tokenizer import Tokenizer

GREEDY = SamplerParams(temp=0.0)


@pytest.fixture(scope="module")
def tiny(reference: Path):
    base = reference / "tiny-llama-f16"
    cases = {c["id"]: c for c in json.loads((base / "greedy.json").read_text())["cases"]}
    model = load_model(base / "tiny-llama-f16.gguf")
    return model, Tokenizer.from_gguf(model.gguf), cases


class Counting:
    """The real model, recording the rows of each batch it evaluates."""

    def __init__(self, model) -> None:
        self.model, self.batches = model, []

    def new_arena(self, n_ctx: int, n_slots: int = 1):
        return self.model.new_arena(n_ctx, n_slots)

    def forward_steps(self, parts, stoppable=False):
        self.batches.append([len(p.ids) for p in parts])
        return self.model.forward_steps(parts, stoppable)


def _engine(tiny, **kw) -> Engine:
    model, tok, _ = tiny
    return Engine(model, tok, **({"n_ctx": 256} | kw))


def _first_difference(ours: list[int], ref: list[int]) -> int | None:
    return next((i for i, (a, b) in enumerate(zip(ours, ref)) if a != b), None)


@pytest.mark.parametrize("case_id", ["colors", "fib"])
def test_greedy_matches_llama_cpp_where_it_is_decisive(tiny, case_id: str) -> None:
    model, tok, cases = tiny
    case = cases[case_id]
    counting = Counting(model)
    engine = Engine(counting, tok, n_ctx=256, n_slots=2)
    seq = engine.run(Request(case["prompt_tokens"], GREEDY, max_tokens=12))
    assert len(seq.tokens) == 12 and seq.finish_reason == "length"
    assert seq.stopped_by == "max_tokens"
    i = _first_difference(seq.tokens, case["generated_tokens"])
    if i is not None:
        top = case["top_logits"][i]
        assert top[0][1] - top[1][1] < 0.25, f"differs at step {i} where llama.cpp is decisive"
    # the prompt as one batch, then one token at a time; the last token is not evaluated
    assert counting.batches == [[len(case["prompt_tokens"])]] + [[1]] * 11
    t = seq.timings_dict()
    assert (t["prompt_tokens"], t["generated_tokens"]) == (len(case["prompt_tokens"]), 12)
    assert t["prompt_tokens_per_second"] > 0 and t["generation_tokens_per_second"] > 0
    assert seq.text == tok.decode(seq.tokens)
    engine.close()


def test_stops_after_an_end_of_generation_token(tiny) -> None:
    _, _, cases = tiny
    case = cases["colors"]
    engine = _engine(tiny)
    engine.eog_ids = frozenset([case["generated_tokens"][2]])  # pretend it ends a turn
    seq = engine.run(Request(case["prompt_tokens"], GREEDY, max_tokens=10))
    assert seq.tokens == case["generated_tokens"][:3]  # the end token is counted
    assert (seq.finish_reason, seq.stopped_by) == ("stop", "eos")
    assert seq.text == tiny[1].decode(seq.tokens[:2])  # ... but is not text
    engine.close()


def test_stops_at_the_end_of_the_context(tiny) -> None:
    _, _, cases = tiny
    prompt = cases["colors"]["prompt_tokens"]
    engine = _engine(tiny, n_ctx=len(prompt) + 2)
    seq = engine.run(Request(prompt, GREEDY, max_tokens=-1))
    assert len(seq.tokens) == 3 and (seq.finish_reason, seq.stopped_by) == ("length", "context")
    seq = engine.run(Request(prompt, GREEDY, max_tokens=0))
    assert seq.tokens == [] and seq.finish_reason == "length"
    with pytest.raises(ValueError, match="longer than the context"):
        engine.submit(Request(prompt + [1, 2, 3], GREEDY))
    with pytest.raises(ValueError, match="empty"):
        engine.submit(Request([], GREEDY))
    engine.close()


def test_same_seed_same_tokens(tiny) -> None:
    _, _, cases = tiny
    prompt = cases["village"]["prompt_tokens"]
    engine = _engine(tiny)

    def sample(seed: int) -> list[int]:
        params = SamplerParams(temp=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=seed)
        return engine.run(Request(prompt, params, max_tokens=8)).tokens

    first = sample(5)
    assert sample(5) == first
    assert sample(6) != first
    engine.close()


def test_sequences_batched_together_give_their_solo_tokens(tiny) -> None:
    """Continuous batching: requests that arrive together or mid-way run in one batch, and
    each gets exactly what it gets alone, greedy or seeded."""
    model, tok, cases = tiny
    prompts = [c["prompt_tokens"] for c in cases.values()][:6]
    params = [GREEDY, SamplerParams(temp=0.9, seed=3)] * 3
    solo_engine = _engine(tiny, n_slots=1)
    solo = [solo_engine.run(Request(p, s, max_tokens=10)).tokens
            for p, s in zip(prompts, params, strict=True)]
    solo_engine.close()
    counting = Counting(model)
    engine = Engine(counting, tok, n_ctx=256, n_slots=4, prefill_chunk=5)
    seqs = [engine.submit(Request(p, s, max_tokens=10)) for p, s in zip(prompts, params,
                                                                         strict=True)]
    for s in seqs:
        s.wait(120)
    assert [s.tokens for s in seqs] == solo
    assert max(len(b) for b in counting.batches) == 4      # at most n_slots sequences
    # prompts were chunked (at most 5 prompt rows beside decoding rows)
    assert any(len(b) > 1 and sum(b) - b.count(1) <= 5 for b in counting.batches)
    engine.close()


class Arriving(Counting):
    """The real model; before the first decoding step that may be paused, ``request`` is
    submitted, so that it is waiting when the step pauses."""

    def __init__(self, model, request: Request) -> None:
        super().__init__(model)
        self.request, self.engine, self.newcomer = request, None, None
        self.paused = None  # the pass of the step that may be paused
        self.during: list[list[int]] = []  # the batches evaluated inside the paused step

    def forward_steps(self, parts, stoppable=False):
        if self.paused is not None and not self.paused.done:
            self.during.append([len(p.ids) for p in parts])
        if not stoppable or self.newcomer is not None:
            return super().forward_steps(parts, stoppable)
        self.newcomer = self.engine.submit(self.request)
        self.paused = super().forward_steps(parts, stoppable)
        return self.paused


def test_a_newcomer_cuts_into_the_step_in_flight_and_changes_nobodys_tokens(tiny) -> None:
    """A short request arriving while others decode is evaluated in a pause of the step in
    flight (its first token does not wait for the whole step), once per step; every
    sequence's tokens are what it gets alone."""
    model, tok, cases = tiny
    a, b = cases["colors"]["prompt_tokens"], cases["fib"]["prompt_tokens"]
    solo = _engine(tiny, n_slots=1)
    want_a = solo.run(Request(a, GREEDY, max_tokens=8)).tokens
    want_b = solo.run(Request(b, GREEDY, max_tokens=8)).tokens
    solo.close()
    arriving = Arriving(model, Request(b, GREEDY, max_tokens=8))
    engine = Engine(arriving, tok, n_ctx=256, n_slots=2)
    arriving.engine = engine
    first = engine.submit(Request(a, GREEDY, max_tokens=8))
    assert first.wait(120)
    assert arriving.newcomer is not None and arriving.newcomer.wait(120)
    assert arriving.during == [[len(b)]]  # the newcomer's whole prompt, in the pause
    assert first.tokens == want_a and arriving.newcomer.tokens == want_b
    assert engine.stats.steps == len(arriving.batches)
    engine.close()


def test_waiting_requests_start_in_arrival_order_and_the_queue_is_bounded(tiny) -> None:
    _, _, cases = tiny
    prompt = cases["colors"]["prompt_tokens"]
    engine = _engine(tiny, n_slots=1, max_queue=4)
    release = threading.Event()
    holder = threading.Thread(target=engine.call, args=(release.wait,))
    holder.start()  # hold the engine thread so that all of them queue
    try:
        seqs = [engine.submit(Request(prompt + [i + 3], GREEDY, max_tokens=2))
                for i in range(4)]
        with pytest.raises(QueueFullError):
            engine.submit(Request(prompt, GREEDY, max_tokens=2))
    finally:
        release.set()
        holder.join()
    for s in seqs:
        s.wait(60)
    starts = [s.timings.started for s in seqs]
    assert starts == sorted(starts) and all(s.finish_reason == "length" for s in seqs)
    assert engine.stats.rejected == 1
    engine.close()


def test_a_slot_keeps_its_cache_for_the_next_request_with_the_same_start(tiny) -> None:
    _, tok, cases = tiny
    a, b = cases["colors"]["prompt_tokens"], cases["fib"]["prompt_tokens"]
    engine = _engine(tiny, n_slots=2)
    first = engine.run(Request(a, GREEDY, max_tokens=5))
    engine.run(Request(b, GREEDY, max_tokens=5))  # the other slot (least recently used)
    # a's prompt and reply, then more: reuses a's slot; the reply equals a fresh run's
    follow = a + first.tokens[:-1] + [tok.bos_id or 1]
    again = engine.run(Request(follow, GREEDY, max_tokens=5))
    assert again.n_cached == len(a) + len(first.tokens) - 1
    fresh = _engine(tiny, n_slots=1).run(Request(follow, GREEDY, max_tokens=5))
    assert fresh.n_cached == 0 and fresh.tokens == again.tokens
    assert engine.slots_info()[0]["n_cached"] > 0
    engine.forget()
    assert all(s["n_cached"] == 0 for s in engine.slots_info())
    engine.close()


def test_cancel_frees_the_slot_at_once(tiny) -> None:
    _, _, cases = tiny
    prompt = cases["colors"]["prompt_tokens"]
    engine = _engine(tiny, n_slots=1)
    long = engine.submit(Request(prompt, GREEDY, max_tokens=200))
    next(iter(long))  # it is running
    waiting = engine.submit(Request(prompt, GREEDY, max_tokens=3))
    long.cancel()
    assert waiting.wait(60) and len(waiting.tokens) == 3
    assert long.finish_reason == "cancelled" and len(long.tokens) < 200
    # leaving an iteration early cancels too
    seq = engine.submit(Request(prompt, GREEDY, max_tokens=200))
    for _ in seq:
        break
    assert seq.wait(60) and seq.finish_reason == "cancelled"
    engine.close()


def test_logits_do_not_depend_on_the_batch(tiny) -> None:
    """The standing rule on the F16 tiny model (its F16 products and attention): a
    sequence's logits are bit-identical alone, in chunks, and beside others."""
    from gguflm.model.batch import LAST

    model, _, cases = tiny
    seqs = [c["prompt_tokens"] + c["generated_tokens"][:8] for c in cases.values()][:4]
    ids = seqs[0]
    alone = model.forward(ids, model.new_cache(64), all_logits=True)
    cache = model.new_cache(64)
    steps = np.stack([model.forward([t], cache) for t in ids])
    assert np.array_equal(alone, steps)
    arena = model.new_arena(64, 4)
    for i in (1, 2, 3):
        model.forward_batch([Part(arena.slots[i], np.array(seqs[i][:5]), LAST)])
    mixed = model.forward_batch(
        [Part(arena.slots[1], np.array(seqs[1][5:6]), LAST),
         Part(arena.slots[0], np.array(ids), ALL),
         Part(arena.slots[2], np.array(seqs[2][5:9]), ALL)])
    assert np.array_equal(alone, mixed[1:1 + len(ids)])


def test_the_engine_imports_numba_in_the_thread_that_builds_it(reference: Path) -> None:
    """numba's package breaks when two threads import it at once, so an engine imports it
    (and the kernels) before its thread starts: a program importing numba right after
    building one cannot collide with the engine thread's first step. Checked in a fresh
    interpreter, where nothing has imported numba yet."""
    import subprocess
    import sys

    code = (
        "import sys, threading\n"
        "from gguflm import load_model\n"
        "from gguflm.engine.scheduler import Engine\n"
        "from gguflm.tokenizer import Tokenizer\n"
        f"m = load_model({str(reference / 'tiny-llama-f16' / 'tiny-llama-f16.gguf')!r})\n"
        "assert 'numba' not in sys.modules\n"
        "started = threading.Thread.start\n"
        "def start(self):\n"
        "    if self.name == 'gguflm-engine':\n"
        "        for mod in ('numba', 'gguflm.quant.kernels', 'gguflm.model.team'):\n"
        "            assert mod in sys.modules, mod + ' is left to the engine thread'\n"
        "    started(self)\n"
        "threading.Thread.start = start\n"
        "e = Engine(m, Tokenizer.from_gguf(m.gguf), n_ctx=64)\n"
        "e.close()\n"
        "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dying_engine_thread_ends_its_callers_instead_of_hanging_them(tiny) -> None:
    """A bug that kills the engine thread (here: admitting raises) finishes every queued
    sequence with the error and refuses later work, rather than leaving callers waiting."""
    _, _, cases = tiny
    prompt = cases["colors"]["prompt_tokens"]
    engine = _engine(tiny)
    admit = engine._admit

    def broken_admit() -> None:  # runs under the engine's lock: it must not block
        if len(engine._waiting) == 3:  # fails once all three are queued
            raise RuntimeError("a bug in admitting")

    engine._admit = broken_admit
    seqs = [engine.submit(Request(prompt, GREEDY, max_tokens=3)) for _ in range(3)]
    for seq in seqs:
        assert seq.wait(60), "a queued sequence was left waiting"
        assert seq.finish_reason == "error" and "a bug in admitting" in str(seq.error)
    engine._thread.join(60)
    assert not engine._thread.is_alive()
    with pytest.raises(RuntimeError, match="engine stopped"):
        engine.submit(Request(prompt, GREEDY, max_tokens=3))
    with pytest.raises(RuntimeError, match="engine stopped"):
        engine.call(lambda: 1)
    engine._admit = admit


class Recording(Counting):
    """The real model, keeping every logits array it returns."""

    def __init__(self, model) -> None:
        super().__init__(model)
        self.runs = []

    def forward_steps(self, parts, stoppable=False):
        run = super().forward_steps(parts, stoppable)
        self.runs.append(run)
        return run

    @property
    def logits(self) -> list[np.ndarray]:
        """The logits of every batch evaluated (those that have any)."""
        return [r.logits for r in self.runs if len(r.logits)]


def test_embeddings_and_generation_never_reuse_each_others_cache(tiny) -> None:
    """An embedding's keys and values are computed with flash attention, whose last bits
    differ from generation's: a generation after an embedding of the same text, and a
    last-token embedding after a generation of it, each get exactly what they get from an
    empty cache (a reused prefix would carry the other arithmetic's rounding)."""
    from gguflm.engine.embed import EmbedRequest

    model, tok, cases = tiny
    prompt = cases["colors"]["prompt_tokens"]

    def generated(before=None):
        rec = Recording(model)
        engine = Engine(rec, tok, n_ctx=256, n_slots=1)
        if before is not None:
            engine.run(before)
        rec.runs.clear()
        seq = engine.run(Request(prompt, GREEDY, max_tokens=4))
        engine.close()
        return seq.tokens, np.concatenate(rec.logits)

    def embedded(pooling, before=None):
        engine = _engine(tiny, n_slots=1)
        if before is not None:
            engine.run(before)
        seq = engine.run(EmbedRequest(prompt, pooling=pooling))
        engine.close()
        return seq.embedding

    tokens, logits = generated()
    for pooling in ("last", "mean"):
        after = generated(EmbedRequest(prompt, pooling=pooling))
        assert after[0] == tokens and np.array_equal(after[1], logits)
    alone = embedded("last")
    after = embedded("last", Request(prompt + [1, 2], GREEDY, max_tokens=2))
    assert np.array_equal(alone, after)
    # the two arithmetics do differ here: the test would see a reused prefix
    flash = model.forward_batch([Part(model.new_cache(64), np.array(prompt), ALL,
                                      flash=True)])
    plain = model.forward_batch([Part(model.new_cache(64), np.array(prompt), ALL)])
    assert not np.array_equal(flash, plain)
