"""A forward pass its caller runs a stretch at a time (``Model.forward_steps``).

The serving engine lets a short newcomer run between two layers of a decoding step in
flight, so that its first token does not wait for the rest of that step. The engine drives:
it iterates a ``Pass``; each ``next()`` runs the pass to its next stop and returns where it
stopped ("layer": between two layers, "head": before the output product, "half": between
the halves of a big output product), or ends it. The pass stops only where ``stop()`` has
asked since its last stop (any thread may ask: the engine does when a request arrives);
the layer team reads the same flag (``team.run_stack``), so that a pass nobody asks to
stop costs an atomic read per layer.

A pass that may stop runs on a worker thread of its own, because its stops are deep in an
architecture's forward (between the layers ``run_layers`` runs, inside ``head``): at a stop
the worker hands control to the driver and waits until the driver's next ``next()``.
Exactly one of the two threads runs at any time, so the kernels never run in two threads
at once, and what the driver runs meanwhile (other sequences' batches of the same arena,
never this batch's) sees the pass's caches as they were before it: every row's numbers are
its own. A pass that may not stop runs in the caller's thread at the first ``next()``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

import numpy as np

LAYER, HEAD, HALF = "layer", "head", "half"

# An output product of this many weight bytes (a big vocabulary's, such as Gemma 3's) runs
# in two halves with a stop between them (``output_product``), where a newcomer arriving
# during it would wait for all of it. Copying each half's products into place costs a
# little time, paid only by passes that may stop; figures in docs/internals.md.
SPLIT_BYTES = 64 << 20


class _Abandoned(BaseException):
    """Raised at a stop of a pass its driver closed before the end (unwinds the worker)."""


class Stops:
    """Where a pass may stop, as the model's code meets them: ``flag[0]`` nonzero asks for
    a stop (``Pass.stop``); ``flag[1]`` is the layer the team stopped before."""

    def __init__(self, owner: Pass) -> None:
        self.flag = np.zeros(2, np.int64)
        self._owner = owner

    def at(self, where: str) -> None:
        """A place the pass may stop: when a stop is asked, clear the ask and hand control
        to the driver until its next ``next()``."""
        if self.flag[0]:
            self.flag[0] = 0
            self._owner._stopped(where)


class Pass:
    """One batch's forward pass (``Model.forward_steps``): iterate it to run it, a stretch
    per ``next()`` (see the module docstring); ``logits`` once it has ended."""

    def __init__(self, body: Callable[[Stops | None], np.ndarray], stoppable: bool) -> None:
        self._body = body
        self.stops = Stops(self) if stoppable else None
        self.logits: np.ndarray | None = None
        self.done = False
        self._worker: _Worker | None = None
        self._where: str | None = None
        self._error: BaseException | None = None
        self._abandon = False

    def stop(self) -> None:
        """Ask the pass to stop at its next stop (any thread; none in a pass that may not)."""
        if self.stops is not None:
            self.stops.flag[0] = 1

    def run(self) -> np.ndarray:
        """Run the pass to its end, through any stops; its logits."""
        for _ in self:
            pass
        return self.logits

    def __iter__(self) -> Pass:
        return self

    def __next__(self) -> str:
        if self.done:
            raise StopIteration
        if self.stops is None:
            self.done = True
            with _here_stops(None):
                self.logits = self._body(None)
            raise StopIteration
        self._switch()
        if self._where is not None:
            return self._where
        self._release()
        if self._error is not None:
            raise self._error
        raise StopIteration

    def close(self) -> None:
        """End the pass here if it stopped and its driver gives it up (an error between its
        stops): its batch is left half evaluated, as after an error inside it."""
        if self._worker is not None and not self.done:
            self._abandon = True
            self._switch()
            self._release()

    # -- the worker's side ---------------------------------------------------------------------
    def _switch(self) -> None:
        """Run the pass on its worker until it stops or ends."""
        from ..quant.matrix import threads

        if self._worker is None:
            self._worker = _Worker.take()
            self._worker.start(self._run, threads())
        else:
            self._worker.resume()

    def _release(self) -> None:
        self.done = True
        self._worker.give_back()

    def _run(self) -> None:
        """On the worker: the whole pass, with the stops of its output product."""
        try:
            with _here_stops(self.stops):
                self.logits = self._body(self.stops)
        except _Abandoned:
            pass
        except BaseException as e:  # noqa: BLE001 - raised in the driver's next()
            self._error = e
        self._where = None

    def _stopped(self, where: str) -> None:
        """On the worker, at a stop: hand control to the driver until it resumes."""
        self._where = where
        self._worker.hand_back()
        self._where = None
        if self._abandon:
            raise _Abandoned


class _Worker:
    """A thread that runs passes that may stop, one at a time, taking turns with the driver:
    ``start``/``resume`` (the driver) run it until it ``hand_back``s or its pass ends."""

    _idle: list[_Worker] = []
    _lock = threading.Lock()

    def __init__(self) -> None:
        self._go = threading.Lock()
        self._go.acquire()
        self._back = threading.Lock()
        self._back.acquire()
        self._job: Callable[[], None] | None = None
        self._threads = 0  # the kernel threads set in this worker's thread
        self._want = 0     # ... and those its driver runs on
        threading.Thread(target=self._loop, name="gguflm-pass", daemon=True).start()

    @classmethod
    def take(cls) -> _Worker:
        with cls._lock:
            return cls._idle.pop() if cls._idle else cls()

    def give_back(self) -> None:
        with self._lock:
            self._idle.append(self)

    def start(self, job: Callable[[], None], threads: int) -> None:
        """Run ``job`` here with the driver's kernel thread count, until it hands back or ends."""
        self._job, self._want = job, threads
        self.resume()

    def resume(self) -> None:
        self._go.release()
        self._back.acquire()

    def hand_back(self) -> None:
        """(on the worker) Hand control back to the driver until it resumes."""
        self._back.release()
        self._go.acquire()

    def _loop(self) -> None:
        from ..quant.matrix import set_threads

        while True:
            self._go.acquire()
            if self._want != self._threads:  # numba's count is per thread
                set_threads(self._want)
                self._threads = self._want
            job, self._job = self._job, None
            job()
            # an idle worker holds nothing of its last pass: its model (and its memory,
            # which a server's model pool waits to see freed) goes with its last user
            job = None
            self._back.release()


_HERE = threading.local()  # the stops of the pass this thread runs (``output_product``)


@contextmanager
def _here_stops(stops: Stops | None) -> Any:
    """``stops`` for the pass this thread runs now (None: a pass inside it that may not
    stop, such as a recurrent cache's replay), then those before again."""
    before = getattr(_HERE, "stops", None)
    _HERE.stops = stops
    try:
        yield
    finally:
        _HERE.stops = before


def output_product(w: Any, x: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """``w.matmul(x, bias=bias)`` (w a QMatrix: the output projection); in a pass that may
    stop, a matrix of SPLIT_BYTES or more runs in two halves of its rows with a stop between
    them. Each row's products are its own either way."""
    stops = getattr(_HERE, "stops", None)
    if stops is None or w.nbytes < SPLIT_BYTES:
        return w.matmul(x, bias=bias)
    from ..quant.matrix import QMatrix

    d_out, d_in = w.shape
    half = (d_out + 1) // 2
    out = np.empty((len(x), d_out), np.float32)
    for r0, r1 in ((0, half), (half, d_out)):
        if r0:
            stops.at(HALF)
        out[:, r0:r1] = QMatrix(w.type, w.raw[r0:r1], (r1 - r0, d_in), w.name).matmul(
            x, bias=None if bias is None else bias[r0:r1])
    return out
