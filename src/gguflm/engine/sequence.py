"""One generation in the engine: a request, its KV slot, its sampler, its text, its end.

A ``Request`` says what to generate; the ``Engine`` (scheduler.py) turns it into a
``Job`` and advances it one batch step at a time from its own thread. The consumer
(the CLI, ``gguflm.LLM``, the server) reads the sequence's ``Piece``s as they come: by
iterating it (blocking), or with ``poll()`` after a ``notify`` callback (asyncio). It may
``cancel()`` at any time; the slot is freed at the engine's next step.

Text is decoded here (an incremental UTF-8 decoder) and stop strings are cut here, so
every adapter gets the same text. End-of-generation tokens end the sequence and are not
part of its text.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import numpy as np

from .errors import NoTokenAllowed
from .lookup import NgramDrafter
from .reasoning import BudgetState
from .sampling import Sampler, SamplerParams
from .stops import StopScanner

__all__ = ["Piece", "Request", "Job"]

WAITING, PREFILL, DECODE, DONE = "waiting", "prefill", "decode", "done"
MAX_PAUSE = 16  # the longest run of steps without a draft after drafts that failed outright


class Constraint(Protocol):
    """What a grammar constraint gives the engine (see constraints.py)."""

    def mask(self, logits: np.ndarray) -> None: ...   # disallowed tokens -> -inf, in place
    def allows(self, token: int) -> bool: ...         # (after mask) may it come next?
    def accept(self, token: int) -> None: ...


@dataclass
class Request:
    """What to generate: ``prompt_ids`` (non-empty), up to ``max_tokens`` tokens (-1: until
    an end-of-generation token or the end of the context), sampled with ``params``;
    ``stop`` strings end the text (not included); ``constraint`` masks each step's logits;
    ``lookup`` > 0 drafts up to that many tokens per step from the text so far
    (lookup.py: fewer forward passes, the same tokens); ``ignore_eos``: end-of-generation
    tokens are never sampled (llama.cpp's --ignore-eos: their logits are -inf); ``watch``,
    if given, sees each piece of text as it is emitted (on the engine's thread) and ends
    the sequence (``stopped_by`` "watch", finish_reason "stop") by returning True: the
    tool-call reader stops a model that repeats a call it has made; ``logit_bias`` maps
    token ids to what is added to their logits before the constraint's mask and the
    sampler (``-inf``: never; see ``check_logit_bias``); ``budget`` limits the reply's
    reasoning block (reasoning.py: once spent, its end is forced)."""

    prompt_ids: list[int]
    params: SamplerParams = field(default_factory=SamplerParams)
    max_tokens: int = -1
    stop: list[str] = field(default_factory=list)
    constraint: Constraint | None = None
    lookup: int = 0
    ignore_eos: bool = False
    watch: Callable[[str], bool] | None = None
    logit_bias: dict[int, float] = field(default_factory=dict)
    budget: BudgetState | None = None
    special: bool = False  # control tokens shown as their text (a chat format's markers)


MAX_LOGIT_BIAS = 100.0  # OpenAI's range: -100 (in effect: never) .. 100 (in effect: only)


def check_logit_bias(bias: Any, n_vocab: int) -> dict[int, float]:
    """OpenAI's ``logit_bias`` (``{"token id": bias}``, JSON keys are strings) or
    llama-server's list of ``[id, bias]`` pairs, checked: ids in the vocabulary, biases
    finite numbers in -100..100, or ``false`` (llama-server: the token is never chosen).
    ValueError naming the entry otherwise."""
    import math

    if bias is None:
        return {}
    if isinstance(bias, dict):
        items = list(bias.items())
    elif isinstance(bias, list) and all(isinstance(p, list) and len(p) == 2 for p in bias):
        items = [(p[0], p[1]) for p in bias]
    else:
        raise ValueError("logit_bias must be an object mapping token ids to biases "
                         "(or a list of [token id, bias] pairs)")
    if len(items) > n_vocab:
        raise ValueError(f"logit_bias has {len(items)} entries, more than the vocabulary")
    out: dict[int, float] = {}
    for key, value in items:
        text = str(key) if isinstance(key, int) and not isinstance(key, bool) else key
        if not isinstance(text, str) or not text.isascii() or not text.isdigit() \
                or len(text) > 12 or not int(text) < n_vocab:
            raise ValueError(f"logit_bias: {str(key)[:40]!r} is not a token id "
                             f"(0..{n_vocab - 1})")
        if value is False:
            out[int(text)] = -math.inf
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) \
                or not -MAX_LOGIT_BIAS <= value <= MAX_LOGIT_BIAS:
            raise ValueError(f"logit_bias[{text}] must be a number in -100..100 (or false), "
                             f"got {str(value)[:40]}")
        out[int(text)] = float(value)
    if len(out) == n_vocab and all(v == -math.inf for v in out.values()):
        raise ValueError("logit_bias bans every token of the vocabulary (false for all "
                         f"{n_vocab}): there would be nothing to generate")
    return out


class Piece(NamedTuple):
    """A piece of generated text and the token ids it came from (text may be empty while
    a UTF-8 character or a possible stop string is held back)."""

    text: str
    tokens: tuple[int, ...]


@dataclass
class Timings:
    """Wall-clock points of a sequence (time.perf_counter()) and its evaluated counts."""

    submitted: float = 0.0
    started: float = 0.0        # admitted to a slot
    prompt_done: float = 0.0    # its last prompt token evaluated
    first_token: float = 0.0
    ended: float = 0.0
    prompt_evaluated: int = 0   # prompt tokens evaluated (not taken from the cache)

    def as_dict(self, n_generated: int) -> dict[str, float]:
        prompt_s = max(self.prompt_done - self.started, 0.0)
        gen_s = max(self.ended - self.prompt_done, 0.0)
        return {
            "queued_seconds": round(max(self.started - self.submitted, 0.0), 6),
            "prompt_tokens": self.prompt_evaluated,
            "prompt_seconds": round(prompt_s, 6),
            "prompt_tokens_per_second": round(self.prompt_evaluated / prompt_s, 3)
            if prompt_s else 0.0,
            "time_to_first_token": round(max(self.first_token - self.submitted, 0.0), 6),
            "generated_tokens": n_generated,
            "generation_seconds": round(gen_s, 6),
            "generation_tokens_per_second": round(max(n_generated - 1, 0) / gen_s, 3)
            if gen_s and n_generated > 1 else 0.0,
        }


_ids = itertools.count(1)


class Job:
    """A request being served. Iterate it for ``Piece``s (blocking); afterwards
    ``finish_reason`` is ``stop`` (end of generation or a stop string), ``length``
    (``max_tokens`` or the end of the context: ``stopped_by`` says which), ``cancelled``
    or ``error`` (``error`` holds the exception)."""

    def __init__(self, request: Request, decoder: Any, eog_ids: frozenset[int],
                 notify: Callable[[], None] | None = None) -> None:
        self.id = next(_ids)
        self.request = request
        self.prompt_ids = list(request.prompt_ids)
        self.sampler = Sampler(request.params)
        self.tokens: list[int] = []
        self.text_parts: list[str] = []
        self.state = WAITING
        self.finish_reason: str | None = None
        self.stopped_by: str | None = None  # eos, stop_string, max_tokens, context, ...
        self.error: BaseException | None = None
        self.n_cached = 0           # prompt tokens reused from the slot's cache
        self.n_prompt_done = 0      # prompt tokens in the cache (reused + evaluated)
        self.slot: Any = None       # engine.scheduler.Slot while running
        self.timings = Timings(submitted=time.perf_counter())
        self._decoder = decoder
        self._scanner = StopScanner(request.stop)
        self._eog = eog_ids
        self._events: queue.SimpleQueue[Piece | None] = queue.SimpleQueue()
        self._notify = notify
        self._cancelled = threading.Event()
        self._done = threading.Event()
        self._drafter = NgramDrafter(self.prompt_ids) if request.lookup > 0 else None
        self._draft_cap = request.lookup  # adapts to how much of the recent drafts held
        self._misses = 0  # drafts in a row of which nothing held
        self._pause = 0  # steps left without a draft after such misses
        self.n_drafted = self.n_draft_kept = 0

    # --- the consumer's side -----------------------------------------------------------------

    @property
    def seed(self) -> int:
        return self.sampler.seed

    @property
    def stop_string(self) -> str | None:
        """The stop string that ended the text (``stopped_by`` ``stop_string``), else None."""
        return self._scanner.matched

    @property
    def done(self) -> bool:
        return self._done.is_set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def cancel(self) -> None:
        """Stop this sequence at the engine's next step (its slot is freed then)."""
        self._cancelled.set()

    def __iter__(self) -> Iterator[Piece]:
        return self.pieces()

    def pieces(self, cancel: Callable[[], bool] | None = None,
               poll_seconds: float = 0.1) -> Iterator[Piece]:
        """The pieces as they are generated (blocks); ends when the sequence does.
        ``cancel``, if given, is polled between pieces (and while waiting): True cancels.
        Leaving the loop early (break, an exception, close()) cancels the sequence."""
        try:
            while True:
                try:
                    piece = self._events.get(timeout=poll_seconds if cancel else None)
                except queue.Empty:
                    if cancel is not None and cancel():
                        self.cancel()
                    continue
                if piece is None:
                    return
                yield piece
                if cancel is not None and not self.cancelled and cancel():
                    self.cancel()
        finally:
            if not self.done:
                self.cancel()

    def poll(self) -> tuple[list[Piece], bool]:
        """Non-blocking: the pieces that arrived since the last call, and whether the
        sequence has ended (all its pieces then delivered)."""
        out, ended = [], False
        while True:
            try:
                piece = self._events.get_nowait()
            except queue.Empty:
                break
            if piece is None:
                ended = True
                break
            out.append(piece)
        return out, ended

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the sequence has ended; True if it has."""
        return self._done.wait(timeout)

    @property
    def text(self) -> str:
        return "".join(self.text_parts)

    def usage(self) -> dict[str, Any]:
        n_prompt = len(self.prompt_ids)
        return {"prompt_tokens": n_prompt, "completion_tokens": len(self.tokens),
                "total_tokens": n_prompt + len(self.tokens),
                "prompt_tokens_details": {"cached_tokens": self.n_cached}}

    def timings_dict(self) -> dict[str, float]:
        """The timings (llama-server's ``timings``; with ``lookup``, its ``draft_n`` and
        ``draft_n_accepted`` too)."""
        out = self.timings.as_dict(len(self.tokens))
        if self.request.lookup:
            out |= {"draft_n": self.n_drafted, "draft_n_accepted": self.n_draft_kept}
        return out

    # --- the engine's side (called from the engine thread only) ------------------------------

    def start(self) -> None:
        """The engine has taken the request up (into a slot, or ended it at once)."""
        self.timings.started = time.perf_counter()

    def admit(self, slot: Any, n_cached: int) -> None:
        """Into ``slot``, whose cache already holds the first ``n_cached`` prompt tokens."""
        self.slot = slot
        self.n_cached = self.n_prompt_done = n_cached
        self.state = PREFILL
        self.start()

    def evaluated(self, n: int) -> bool:
        """``n`` more prompt tokens are in the cache; whether the whole prompt is now."""
        self.n_prompt_done += n
        self.timings.prompt_evaluated += n
        return self.n_prompt_done == len(self.prompt_ids)

    def start_decoding(self) -> None:
        """The prompt is in; the next logits are the first token's."""
        self.state = DECODE

    def draft(self, room: int) -> list[int]:
        """Tokens to verify after the last one (prompt lookup), at most ``room``."""
        if self._drafter is None:
            return []
        if self._pause:
            self._pause -= 1
            return []
        room = min(room, self._draft_cap)
        if self.request.max_tokens >= 0:  # the last row's token must still be wanted
            room = min(room, self.request.max_tokens - len(self.tokens) - 1)
        return self._drafter.draft(room)

    def drafted(self, n_draft: int, n_kept: int) -> None:
        """Adapt the next draft's length: double it after a draft held in full (up to the
        request's ``lookup``), otherwise just past what held (a failing guess costs a row).
        After drafts of which nothing held, draft again only after 1, 2, 4 ... 16 steps:
        in free text most guesses fail, and a decode step with one guessed row costs about
        1.5x a plain one (SmolLM2, 2 threads), so guessing on every step made free
        generation slower than without lookup."""
        self.n_drafted += n_draft
        self.n_draft_kept += n_kept
        if n_draft:
            self._draft_cap = (min(2 * self._draft_cap, self.request.lookup)
                               if n_kept == n_draft else n_kept + 1)
            self._misses = self._misses + 1 if n_kept == 0 else 0
            self._pause = min(1 << (self._misses - 1), MAX_PAUSE) if self._misses else 0

    def _emit(self, piece: Piece | None) -> None:
        if piece is not None and piece.text:
            self.text_parts.append(piece.text)
        self._events.put(piece)
        if self._notify is not None:
            self._notify()

    def finish(self, reason: str, stopped_by: str,
                error: BaseException | None = None) -> None:
        """End the sequence: flush held text (unless cancelled or failed), signal the end."""
        if self.state == DONE:
            return
        if reason in ("stop", "length"):
            rest = self._scanner.feed(self._decoder.flush()) + self._scanner.flush()
            if rest:
                self._emit(Piece(rest, ()))
        self.state = DONE
        self.finish_reason = reason
        self.stopped_by = stopped_by
        self.error = error
        self.timings.ended = time.perf_counter()
        if not self.timings.prompt_done:
            self.timings.prompt_done = self.timings.ended
        self._done.set()
        self._emit(None)

    def on_logits(self, logits: np.ndarray, n_ctx: int, n_cached_now: int) -> None:
        """Sample the next token from ``logits`` (n_vocab,), emit its text, and decide
        whether the sequence ends. ``n_cached_now``: positions in the slot's cache."""
        now = time.perf_counter()
        if not self.tokens:
            self.timings.prompt_done = now
            self.sampler.accept_all(self.prompt_ids)  # the penalties see the prompt
        c = self.request.constraint
        bias = self.request.logit_bias
        if c is not None or bias or self.request.ignore_eos:
            logits = np.array(logits, dtype=np.float32)
        if self.request.ignore_eos and self._eog:
            logits[list(self._eog)] = -np.inf
        if bias:
            ids = np.fromiter(bias.keys(), dtype=np.int64, count=len(bias))
            logits[ids] += np.fromiter(bias.values(), dtype=np.float32, count=len(bias))
        if c is not None:
            c.mask(logits)
        if (bias or self.request.ignore_eos) and not (logits > -np.inf).any():
            raise NoTokenAllowed(self._nothing_allowed())
        budget = self.request.budget
        token = budget.forced() if budget is not None else None
        if token is not None and c is not None and not c.allows(token):
            token = budget.yield_to_constraint()  # the grammar writes the rest of the end
        if token is None:
            token = self.sampler.sample(logits)
            if c is not None and not c.allows(token):
                token = _best_allowed(logits, c)
        self.sampler.accept(token)
        if c is not None:
            c.accept(token)
        if budget is not None:
            budget.accept(token)
        self.tokens.append(token)
        if self._drafter is not None:
            self._drafter.push(token)
        if len(self.tokens) == 1:
            self.timings.first_token = now
        if token in self._eog:
            self.finish("stop", "eos")
            return
        text = self._scanner.feed(self._decoder.feed(token))
        self._emit(Piece(text, (token,)))
        if self._scanner.hit:
            self.finish("stop", "stop_string")
        elif text and self.request.watch is not None and self.request.watch(text):
            self.finish("stop", "watch")
        elif 0 <= self.request.max_tokens <= len(self.tokens):
            self.finish("length", "max_tokens")
        elif n_cached_now >= n_ctx:  # no room to evaluate this token
            self.finish("length", "context")

    def _nothing_allowed(self) -> str:
        which = "every token" + (" the grammar allows" if self.request.constraint else "")
        eos = " other than end-of-generation ones (ignore_eos bans those)" \
            if self.request.ignore_eos else ""
        return (f"logit_bias bans {which}{eos}: nothing is left to choose as generated "
                f"token {len(self.tokens) + 1}")

    def __repr__(self) -> str:
        return (f"Job({self.id}, {self.state}, prompt {len(self.prompt_ids)}, "
                f"generated {len(self.tokens)}, finish {self.finish_reason})")


def _best_allowed(logits: np.ndarray, c: Constraint) -> int:
    """The highest-logit token the constraint allows (NaN counted lowest): taken when the
    sampler's arithmetic (NaN or infinite logits) picked a masked one, so that no masked
    token is ever chosen."""
    order = np.argsort(-np.nan_to_num(logits, nan=-np.inf), kind="stable")
    for t in order.tolist():
        if c.allows(t):
            return int(t)
    return int(order[0])  # nothing allowed: mask() has raised before this can happen
