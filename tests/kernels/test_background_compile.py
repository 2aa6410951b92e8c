"""A first run's compiled layers built by a background process (model/background.py): while
it holds its lock the plan runs the reference path (said in ``describe``), the same numbers
bit for bit; once the lock is free and the layers are cached it switches to them; if the
compilation ended without them it stays on the reference path for good."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from gguflm.model import background, load_model

HOLD = ("import fcntl, sys; f = open(sys.argv[1], 'w'); fcntl.flock(f, fcntl.LOCK_EX); "
        "print('locked', flush=True); sys.stdin.read()")


@pytest.fixture
def lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A process holding the compilation lock (as ``compile_layers``'s does) until the test
    closes its standard input."""
    path = str(tmp_path / "compiling.lock")
    monkeypatch.setattr(background, "lock_path", lambda: path)
    proc = subprocess.Popen([sys.executable, "-c", HOLD, path], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def _release(proc: subprocess.Popen) -> None:
    proc.stdin.close()
    proc.wait(timeout=30)
    time.sleep(background.CHECK_SECONDS + 0.1)  # the plan's next look sees it


def test_waits_on_the_reference_path_then_switches(tiny_llama: str, lock) -> None:  # noqa: ANN001
    model = load_model(tiny_llama)
    ids = [5, 17, 300, 9, 42, 8, 77]
    compiled = model.logits(ids)
    assert background.Compiling.start(tiny_llama, lambda: True).pid is None  # joins it
    model.plan.defer(background.Compiling(lock.pid, lambda: True))
    assert model.plan.waiting()
    assert "compiled in the background (pid" in model.plan.describe()
    waiting = model.logits(ids)
    assert model.plan.waiting()
    np.testing.assert_array_equal(waiting, compiled)
    _release(lock)
    assert not model.plan.waiting()
    assert model.plan.describe().startswith("compiled")
    np.testing.assert_array_equal(model.logits(ids), compiled)


def test_a_compilation_that_ended_without_the_layers_is_not_waited_for(tiny_llama: str,
                                                                        lock) -> None:  # noqa: ANN001
    model = load_model(tiny_llama)
    model.plan.defer(background.Compiling(lock.pid, lambda: False))
    _release(lock)
    assert model.plan.waiting() and model.plan.waiting()  # the reference path, for good
    assert "ended without them" in model.plan.describe()


def test_a_scripts_run_joins_a_compilation_in_progress(tiny_llama: str, lock,  # noqa: ANN001
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A run that may not leave a background compilation behind (a script: ``warm_up``
    without ``background``) that finds one in progress waits for it on the reference path
    instead of compiling the same code again beside it; with none running it starts none."""
    from gguflm.model import base

    monkeypatch.setattr(base, "compiled", lambda *a: False)  # as on a first run
    monkeypatch.setattr(base, "_compile_steps", lambda *a: {
        "decoding": ("decoding layers", 60.0), "prompts": ("prompt layers", 10.0)})
    model = load_model(tiny_llama)
    model.warm_up()
    assert model.plan.waiting(), "joined the compilation in progress"
    assert "compiled in the background" in model.plan.describe()
    _release(lock)
    assert background.Compiling.start(tiny_llama, lambda: True, join_only=True) is None
    monkeypatch.setattr(base, "compiled", lambda *a: True)
    assert not model.plan.waiting()
