"""The serving engine: continuous batching of many sequences over one model.

The one path from a prompt to tokens: ``gguflm run``, ``gguflm chat``, ``gguflm.LLM`` and
the server all ``submit`` a ``Request`` here and read the ``Job`` it returns. An
``EmbedRequest`` (embed.py) is scheduled the same way, but its prompt chunks ask the batch
for final hidden states instead of logits, and it ends, pooled, when its prompt is done.

``n_slots`` sequences run at once (llama-server's ``--parallel``), each in a slot of one KV
arena. Every step, one engine thread builds one batch: one token for each decoding sequence,
plus a chunk of a waiting prompt (at most ``prefill_chunk`` tokens while others decode, so a
long prompt does not freeze their streams; up to ``n_batch`` when nothing else runs). New
requests join at the next step (a prompt chunk is also kept to about STEP_TARGET seconds,
from the measured cost of a row); a finished or cancelled sequence frees its slot at once;
requests beyond the slots wait in arrival order (at most ``max_queue`` in all).

Each slot keeps its cache after a sequence ends, and a new request goes to the free slot
whose cached tokens share the longest prefix with its prompt (then the least recently used),
evaluating only the rest: a chat's earlier turns, a shared system prompt. Because every
per-row computation of the model is batch-invariant, a sequence's tokens do not depend on
which slot, batch or cache hit it got: with the same seed, the same text under any load.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..model.base import import_kernels
from ..model.batch import ALL, LAST, NONE, Part
from .embed import EmbedJob, EmbedRequest
from .sequence import DECODE, DONE, PREFILL, Job, Request

__all__ = ["Engine", "QueueFullError"]

DEFAULT_SLOTS = 4
DEFAULT_MAX_QUEUE = 256
DEFAULT_N_CTX = 4096  # llama.cpp's default context, capped by the model's training context
N_BATCH = 512         # rows per step at most (llama.cpp's n_batch)
PREFILL_CHUNK = 128   # prompt rows per step at most while other sequences are decoding
STEP_TARGET = 0.25    # seconds a step may take while others decode (sets the chunk size)


class QueueFullError(RuntimeError):
    """``max_queue`` sequences are already running or waiting."""


def default_n_ctx(n_ctx_train: int) -> int:
    """The context size when none is asked for: 4096, at most the training context."""
    return min(DEFAULT_N_CTX, n_ctx_train) if n_ctx_train > 0 else DEFAULT_N_CTX


def common_prefix(a: Sequence[int] | np.ndarray, b: Sequence[int] | np.ndarray) -> int:
    """Length of the longest common prefix of two id sequences."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(differ[0]) if len(differ) else n


@dataclass
class Slot:
    """One place for a running sequence: a KV cache, which owns the ids it holds
    (``cache.ids``)."""

    index: int
    cache: Any                     # model.kv_cache.KVCache
    seq: Job | None = None
    last_used: float = 0.0
    # the cache's keys and values were computed with flash attention (embeddings): its
    # layers past the first differ in the last bits from the plain path's, so a prefix is
    # reused only by a request computed the same way
    flash: bool = False


def _prompt_left(slot: Slot) -> int:
    """Prompt tokens of the slot's sequence not yet evaluated."""
    return len(slot.seq.prompt_ids) - slot.seq.n_prompt_done


@dataclass
class Stats:
    """Totals since start (for /metrics)."""

    requests: int = 0
    finished: dict[str, int] = field(default_factory=dict)
    prompt_tokens: int = 0       # evaluated
    cached_tokens: int = 0       # reused from a slot
    generated_tokens: int = 0
    drafted_tokens: int = 0      # prompt-lookup draft tokens verified
    accepted_tokens: int = 0     # ... and kept
    steps: int = 0
    busy_seconds: float = 0.0
    rejected: int = 0
    ttft: list[float] = field(default_factory=list)      # recent times to first token
    durations: list[float] = field(default_factory=list)  # recent request durations


class Engine:
    """Runs requests on ``model`` in slots of ``n_ctx`` positions, continuously batched.

    ``tokenizer`` decodes the generated ids; ``threads`` sets the kernels' thread count in
    the engine thread. The engine thread starts at once and idles when there is no work.
    """

    def __init__(self, model: Any, tokenizer: Any, *, n_ctx: int, n_slots: int = DEFAULT_SLOTS,
                 threads: int | None = None, max_queue: int = DEFAULT_MAX_QUEUE,
                 n_batch: int = N_BATCH, prefill_chunk: int = PREFILL_CHUNK) -> None:
        if n_slots < 1:
            raise ValueError(f"the number of slots must be at least 1, got {n_slots}")
        if max_queue < 1:
            raise ValueError(f"max_queue must be at least 1, got {max_queue}")
        self.model = model
        self.tokenizer = tokenizer
        self.n_ctx = n_ctx
        self.threads = threads
        self.max_queue = max_queue
        self.n_batch = max(1, n_batch)
        self.prefill_chunk = max(1, min(prefill_chunk, self.n_batch))
        self.arena = model.new_arena(n_ctx, n_slots)
        self.slots = [Slot(i, c) for i, c in enumerate(self.arena.slots)]
        self.eog_ids = frozenset(int(t) for t in tokenizer.eog_ids)
        self.stats = Stats()
        self.started = time.time()
        self._row_seconds = 0.0  # measured cost of one batch row (moving average)
        self._prefill_only = False  # the last step ran newcomers' prompts alone
        self._in_step: set[int] = set()  # the slots of the step in flight (_cut_in)
        self._cut_done = False  # a newcomer has cut into the step in flight
        self._cut_seconds = 0.0  # how long that took
        # the step in flight, when a newcomer may cut into it: submit asks it to stop
        self._in_flight: Any = None  # model.forward_pass.Pass
        self._waiting: deque[Job] = deque()
        self._tasks: deque[tuple[Callable[[], Any], list[Any], threading.Event]] = deque()
        self._cv = threading.Condition()
        self._closed = False
        self._broken: BaseException | None = None  # what killed the engine thread, if anything
        import_kernels()  # here, not in the engine thread: see its docstring
        self._thread = threading.Thread(target=self._loop, name="gguflm-engine", daemon=True)
        self._thread.start()

    @property
    def n_slots(self) -> int:
        return len(self.slots)

    # --- the consumers' side -----------------------------------------------------------------

    def submit(self, request: Request, notify: Callable[[], None] | None = None) -> Job:
        """Queue ``request``; returns its Job at once. ``notify`` (if given) is called
        from the engine thread after each new piece and at the end. Raises
        QueueFullError when ``max_queue`` sequences are running or waiting, ValueError for
        a request that cannot run (empty prompt, longer than the context)."""
        ids = request.prompt_ids
        if not ids:
            raise ValueError("the prompt is empty")
        if len(ids) > self.n_ctx:
            raise ValueError(f"the prompt is {len(ids)} tokens, longer than the context of "
                             f"{self.n_ctx}")
        kind = EmbedJob if isinstance(request, EmbedRequest) else Job
        special = getattr(request, "special", False)  # embeddings have no text
        seq = kind(request, self.tokenizer.decoder(special=special), self.eog_ids, notify)
        with self._cv:
            if self._broken is not None:
                raise self._stopped()
            if self._closed:
                raise RuntimeError("the engine is closed")
            if self.n_running + len(self._waiting) >= self.max_queue:
                self.stats.rejected += 1
                raise QueueFullError(f"the server is busy ({self.max_queue} requests running "
                                     "or queued)")
            self.stats.requests += 1
            self._waiting.append(seq)
            if self._in_flight is not None:  # it may cut in at the next stop (_evaluate)
                self._in_flight.stop()
            self._cv.notify()
        return seq

    def run(self, request: Request) -> Job:
        """Submit ``request`` and wait for it to end."""
        seq = self.submit(request)
        for _ in seq:
            pass
        return seq

    @property
    def n_running(self) -> int:
        return sum(1 for s in self.slots if s.seq is not None)

    @property
    def n_waiting(self) -> int:
        return len(self._waiting)

    def slots_info(self) -> list[dict[str, Any]]:
        """Each slot's state, as llama-server's ``/slots`` shows it."""
        out = []
        for s in self.slots:
            seq = s.seq
            out.append({
                "id": s.index, "n_ctx": self.n_ctx, "is_processing": seq is not None,
                "state": seq.state if seq is not None else "idle",
                "n_cached": s.cache.n, "task": None if seq is None else {
                    "id": seq.id, "prompt_tokens": len(seq.prompt_ids),
                    "cached_tokens": seq.n_cached, "generated_tokens": len(seq.tokens)},
            })
        return out

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn()`` in the engine thread between two steps and return its result (the
        kernels must not run in two threads at once)."""
        box: list[Any] = []
        done = threading.Event()
        with self._cv:
            if self._broken is not None:
                raise self._stopped()
            self._tasks.append((fn, box, done))
            self._cv.notify()
        done.wait()
        if isinstance(box[0], BaseException):
            raise box[0]
        return box[0]

    def encode(self, batch: Any) -> Any:
        """An encoder's hidden states for ``batch`` (``Model.embed_batch``), computed in the
        engine thread between two steps."""
        return self.call(lambda: self.model.embed_batch(batch))

    def forget(self) -> None:
        """Drop the cached prefixes of idle slots (later requests evaluate their whole
        prompt)."""
        with self._cv:
            for s in self.slots:
                if s.seq is None:
                    s.cache.clear()

    def close(self) -> None:
        """Cancel everything and stop the engine thread."""
        with self._cv:
            self._closed = True
            for seq in self._waiting:
                seq.cancel()
            for s in self.slots:
                if s.seq is not None:
                    s.seq.cancel()
            self._cv.notify()
        self._thread.join(timeout=30)

    # --- the engine thread -------------------------------------------------------------------

    def _loop(self) -> None:
        try:
            self._serve()
        except BaseException as e:  # a bug: end every waiting caller rather than hang them
            self._fail_everything(e)
            raise

    def _fail_everything(self, error: BaseException) -> None:
        """The engine thread is dying of ``error``: finish every queued and running sequence
        and every pending task with it; later submissions raise."""
        with self._cv:
            self._broken = error
            seqs = list(self._waiting) + [s.seq for s in self.slots if s.seq is not None]
            self._waiting.clear()
            tasks = list(self._tasks)
            self._tasks.clear()
        for s in self.slots:
            s.seq = None
        for seq in seqs:
            seq.finish("error", "error", error)
        for _, box, done in tasks:
            box.append(self._stopped())
            done.set()

    def _stopped(self) -> RuntimeError:
        """What a call gets once the engine thread has died."""
        return RuntimeError(f"the engine stopped: {self._broken!r}")

    def _serve(self) -> None:
        from ..quant.matrix import set_threads

        set_threads(self.threads)  # numba's thread count belongs to the calling thread
        while True:
            with self._cv:
                while (not self._closed and not self._waiting and not self._tasks
                       and self.n_running == 0):
                    self._cv.wait()
                tasks = list(self._tasks)
                self._tasks.clear()
                if self._closed and self.n_running == 0:
                    for seq in self._waiting:
                        seq.finish("cancelled", "cancelled")
                    self._waiting.clear()
                    for _, box, done in tasks:
                        box.append(RuntimeError("the engine is closed"))
                        done.set()
                    return
                if not tasks:
                    self._admit()
            if tasks:  # between two steps, before anything new is admitted
                for fn, box, done in tasks:
                    try:
                        box.append(fn())
                    except BaseException as e:  # noqa: BLE001 - handed to the caller
                        box.append(e)
                    done.set()
                continue
            try:
                self._step()
            except Exception as e:  # noqa: BLE001 - fail the batch, keep serving the rest
                for s in self.slots:
                    if s.seq is not None:
                        self._end(s, "error", "error", e)

    def _admit(self) -> None:
        """Move waiting sequences (arrival order) into free slots; drop cancelled ones."""
        while self._waiting:
            seq = self._waiting[0]
            if seq.cancelled:
                self._waiting.popleft()
                seq.finish("cancelled", "cancelled")
                continue
            embedding = isinstance(seq, EmbedJob)
            if seq.request.max_tokens == 0 and not embedding:  # nothing to generate
                self._waiting.popleft()
                seq.start()
                seq.finish("length", "max_tokens")
                continue
            free = [s for s in self.slots if s.seq is None]
            if not free:
                return
            self._waiting.popleft()
            prompt = seq.prompt_ids
            flash = embedding and seq.request.flash_attn
            shared = {s.index: common_prefix(s.cache.ids, prompt) if s.flash == flash else 0
                      for s in free}  # the prefix this request may reuse from each slot
            # the slot sharing the longest prefix, when that prefix is worth keeping (at least
            # half the prompt or 16 tokens, like llama-server's slot similarity); otherwise an
            # empty slot, else the least recently used, so that a shared BOS alone does not
            # evict another conversation's cache
            slot = max(free, key=lambda s: (shared[s.index], -s.last_used))
            if shared[slot.index] < min(16, len(prompt) // 2 + 1):
                empty = [s for s in free if s.cache.n == 0]
                slot = empty[0] if empty else min(free, key=lambda s: s.last_used)
            keep = min(shared[slot.index], len(prompt) - 1)
            if embedding and seq.request.pooling != "last":
                keep = 0  # every token's hidden state is needed: the cache has none
            # a recurrent state cannot be cut back: it resumes at a snapshot (``reusable``)
            slot.cache.truncate(slot.cache.reusable(min(keep, slot.cache.n)))
            keep = slot.cache.n
            slot.flash = flash
            slot.seq = seq
            seq.admit(slot, keep)
            self.stats.cached_tokens += keep

    def _chunk(self) -> int:
        """Prompt rows a step may add while others decode (about STEP_TARGET seconds)."""
        chunk = self.prefill_chunk
        if self._row_seconds > 0:
            chunk = min(chunk, max(16, int(STEP_TARGET / self._row_seconds)))
        return chunk

    def _step(self) -> None:
        """One batch: every decoding sequence's last token, then prompt chunks."""
        t0 = time.perf_counter()
        active = []
        for s in self.slots:
            seq = s.seq
            if seq is None:
                continue
            if seq.cancelled:
                self._end(s, "cancelled", "cancelled")
                continue
            active.append(s)
        if not active:
            return
        parts: list[Part] = []
        owners: list[tuple[Slot, bool, list[int]]] = []  # (slot, wants logits, draft)
        decoding = [s for s in active if s.seq.state == DECODE]
        prefilling = sorted((s for s in active if s.seq.state == PREFILL),
                            key=lambda s: s.seq.timings.started)
        # A newcomer whose whole prompt fits in one chunk gets a step of its own, between two
        # decoding steps: its first token comes after that short step instead of after a
        # full batch step (the running streams wait one short step; never twice in a row)
        chunk = self._chunk()
        quick = [s for s in prefilling if _prompt_left(s) <= chunk]
        prefill_only = bool(decoding and quick and not self._prefill_only)
        self._prefill_only = prefill_only
        if prefill_only:
            decoding, prefilling = [], quick
        for s in decoding:  # the last token, and a draft to verify when the request asks
            # a draft's rejected tail is cut from the cache: a recurrent state cannot be
            draft = s.seq.draft(min(s.cache.n_free, self.n_batch) - 1) if s.cache.rewinds else []
            parts.append(Part(s.cache, np.array([s.seq.tokens[-1], *draft]),
                              ALL if draft else LAST))
            owners.append((s, True, draft))
        budget = self.n_batch - sum(len(p.ids) for p in parts)
        if decoding or prefill_only:  # keep the running streams flowing: a bounded chunk
            budget = min(budget, chunk)
        self._add_prompts(prefilling, budget, parts, owners)
        # while running streams decode and a slot is free, a newcomer may cut in (_cut_in)
        self._in_step = {s.index for s, _, _ in owners}
        self._cut_seconds = 0.0
        self._cut_done = False
        free = any(s.seq is None for s in self.slots)
        try:
            logits = self._evaluate(parts, bool(decoding) and free)
        finally:
            self._in_step = set()
        self._settle(parts, owners, logits)
        self._account(parts, time.perf_counter() - t0 - self._cut_seconds)

    def _add_prompts(self, prefilling: list[Slot], budget: int, parts: list[Part],
                     owners: list[tuple[Slot, bool, list[int]]]) -> None:
        """Chunks of the prefilling slots' prompts (in order, ``budget`` rows in all)."""
        for s in prefilling:
            if budget <= 0:
                break
            seq = s.seq
            start = seq.n_prompt_done
            n = min(len(seq.prompt_ids) - start, budget)
            last = start + n == len(seq.prompt_ids)
            ids = np.array(seq.prompt_ids[start:start + n])
            if isinstance(seq, EmbedJob):  # hidden states, not logits
                parts.append(Part(s.cache, ids, NONE, seq.hidden_wanted(last),
                                  flash=seq.request.flash_attn))
                owners.append((s, False, []))
            else:
                parts.append(Part(s.cache, ids, LAST if last else NONE))
                owners.append((s, last, []))
            budget -= n

    def _settle(self, parts: list[Part], owners: list[tuple[Slot, bool, list[int]]],
                logits: np.ndarray) -> None:
        """Hand a step's results to its sequences: prompt progress, hidden states, samples."""
        row = 0
        for (s, wants, draft), part in zip(owners, parts, strict=True):
            seq = s.seq
            if seq.state == PREFILL:
                n = len(part.ids)
                done = seq.evaluated(n)
                self.stats.prompt_tokens += n
                if isinstance(seq, EmbedJob):
                    seq.on_hidden(part.hidden_states, done)
                    if done:  # (finishing marks the prompt done)
                        self._end(s, "stop", "embedded")
                    continue
                if not wants:
                    continue
                seq.start_decoding()
            self._sample(s, logits[row:row + 1 + len(draft)], draft)
            row += 1 + len(draft)

    def _account(self, parts: list[Part], elapsed: float) -> None:
        rows = sum(len(p.ids) for p in parts)
        if rows >= 16:  # enough rows for the per-row cost to dominate the fixed cost
            per_row = elapsed / rows
            self._row_seconds = per_row if not self._row_seconds else (
                0.7 * self._row_seconds + 0.3 * per_row)
        self.stats.steps += 1
        self.stats.busy_seconds += elapsed

    def _evaluate(self, parts: list[Part], stoppable: bool = False) -> np.ndarray:
        """Run one batch through the model (``Model.forward_steps``) and return its logits.
        ``stoppable``: a request arriving meanwhile (``submit``) asks the pass to stop, at
        its next layer or before (or inside) its output product, and ``_cut_in`` runs
        there before the pass goes on."""
        run = self.model.forward_steps(parts, stoppable)
        if stoppable:
            with self._cv:
                self._in_flight = run
                if self._waiting:  # arrived since _admit
                    run.stop()
        try:
            for _ in run:
                self._cut_in()
        finally:
            if stoppable:
                with self._cv:
                    self._in_flight = None
            run.close()
        return run.logits

    def _cut_in(self) -> None:
        """At a stop of a decoding step in flight, where a request has arrived (``submit``
        asked the pass to stop; the team stops at the next layer). Newcomers whose whole
        prompt fits in one chunk are admitted and get a step of their own now, inside the
        step in flight, instead of after it: a request arriving beside busy streams waits a
        layer for its first token, not the rest of a whole step (a busy step takes several
        times a short newcomer's own). At most once
        per step, so the running streams wait for at most one such step. The newcomers'
        slots are free slots, none in the step in flight, whose caches it does not touch;
        every row's numbers are its own, so this changes no sequence's tokens."""
        if self._cut_done or not self._waiting or self._closed:
            return
        t0 = time.perf_counter()
        with self._cv:
            self._admit()
        chunk = self._chunk()
        quick = sorted((s for s in self.slots
                        if s.seq is not None and s.index not in self._in_step
                        and s.seq.state == PREFILL and not s.seq.cancelled
                        and _prompt_left(s) <= chunk),
                       key=lambda s: s.seq.timings.started)
        if quick:
            self._cut_done = True
            parts: list[Part] = []
            owners: list[tuple[Slot, bool, list[int]]] = []
            self._add_prompts(quick, chunk, parts, owners)
            self._settle(parts, owners, self._evaluate(parts))
            self._account(parts, time.perf_counter() - t0)
        self._cut_seconds += time.perf_counter() - t0

    def _sample(self, slot: Slot, logits: np.ndarray, draft: list[int]) -> None:
        """Sample the slot's sequence from each row of ``logits`` in turn: row 0 follows
        its last token, row i+1 follows ``draft[i]``, which holds only if row i's sample was
        that token. The cache keeps the positions of the inputs that held."""
        seq = slot.seq
        n_cache = slot.cache.n - len(draft)  # positions cached before the draft
        i = 0
        for i, lg in enumerate(logits):
            try:
                seq.on_logits(lg, self.n_ctx, n_cache + i)
            except Exception as e:  # noqa: BLE001 - e.g. a constraint failing: this one only
                self._end(slot, "error", "error", e)
                break
            self.stats.generated_tokens += 1
            if seq.state == DONE:
                self._end(slot, seq.finish_reason, seq.stopped_by)
                break
            if i == len(draft) or seq.tokens[-1] != draft[i]:
                break
        slot.cache.truncate(n_cache + i)
        seq.drafted(len(draft), i)
        self.stats.drafted_tokens += len(draft)
        self.stats.accepted_tokens += i

    def _end(self, slot: Slot, reason: str, stopped_by: str,
             error: BaseException | None = None) -> None:
        """Finish the slot's sequence (if not already) and free the slot at once."""
        seq = slot.seq
        slot.seq = None
        slot.last_used = time.perf_counter()
        if seq is None:
            return
        seq.finish(reason, stopped_by, error)
        st = self.stats
        st.finished[seq.finish_reason] = st.finished.get(seq.finish_reason, 0) + 1
        if seq.timings.first_token:
            st.ttft.append(seq.timings.first_token - seq.timings.submitted)
        st.durations.append(seq.timings.ended - seq.timings.submitted)
        del st.ttft[:-1000], st.durations[:-1000]
        with self._cv:
            self._cv.notify()

    def __repr__(self) -> str:
        return (f"Engine({self.n_slots} slots, n_ctx {self.n_ctx}, {self.n_running} running, "
                f"{self.n_waiting} waiting)")

