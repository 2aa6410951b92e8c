"""A forward pass its caller runs a stretch at a time (model/forward_pass.py), on the
reference data's tiny Llama: it stops only where asked, where it was asked, gives the
logits of an uncut pass, hands its errors to its driver, and a pass given up at a stop
leaves its worker free for the next."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

from gguflm import load_model
from gguflm.model.batch import LAST, Part
from gguflm.model.forward_pass import HEAD, LAYER, Pass
from gguflm.model.kv_cache import ContextFullError


@pytest.fixture(scope="module")
def model(tiny_llama: str):
    return load_model(tiny_llama)


def _step(model, arena, n: int = 3) -> list[Part]:
    return [Part(arena.slots[k], np.array([5 + k, 9, 17 + k]), LAST) for k in range(n)]


def test_a_pass_stops_only_where_asked_and_its_numbers_do_not_change(model) -> None:
    want = model.forward_batch(_step(model, model.new_arena(16, 3)))
    quiet = model.forward_steps(_step(model, model.new_arena(16, 3)))
    assert list(quiet) == [] and np.array_equal(quiet.logits, want)
    run = model.forward_steps(_step(model, model.new_arena(16, 3)))
    stops = []
    run.stop()
    for where in run:
        stops.append(where)
        run.stop()
    n_layer = len(model.blocks)
    assert stops == [LAYER] * (n_layer - 1) + [HEAD]  # between layers, then the head
    assert run.done and np.array_equal(run.logits, want)
    held = model.forward_steps(_step(model, model.new_arena(16, 3)), stoppable=False)
    held.stop()  # a pass that may not stop runs through
    assert list(held) == [] and np.array_equal(held.logits, want)


def test_an_error_in_the_pass_reaches_its_driver(model) -> None:
    run = model.forward_steps([Part(model.new_cache(2), np.array([1, 2, 3]), LAST)])
    with pytest.raises(ContextFullError, match="do not fit"):  # raised on the worker
        list(run)
    assert run.done


def test_a_pass_given_up_at_a_stop_frees_its_worker(model) -> None:
    arena = model.new_arena(16, 4)
    run = model.forward_steps(_step(model, arena))
    run.stop()
    assert next(run) == LAYER
    run.close()  # the driver gives it up here
    assert run.done and run.logits is None
    alone = model.forward_batch([Part(model.new_cache(16), np.array([3, 4]), LAST)])
    again = model.forward_steps([Part(arena.slots[3], np.array([3, 4]), LAST)])
    again.stop()
    assert list(again) == [LAYER] and np.array_equal(again.logits, alone)  # one stop


def test_an_idle_worker_keeps_nothing_of_its_last_pass() -> None:
    """A model pool frees a model's memory when nothing refers to it any more: the worker
    that ran its last pass must not keep that pass (and with it the model) alive."""
    class Held:
        pass

    held = Held()
    gone = weakref.ref(held)
    run = Pass(lambda stops, held=held: np.zeros((1, 2), np.float32), True)
    run.stop()
    assert list(run) == [] and run.logits.shape == (1, 2)
    del run, held
    gc.collect()
    assert gone() is None
