"""The decoder layers run by a team of threads (model/team.py) against the separate blocks.

For a few rows every layer runs in one compiled call whose threads take the work items of
every step and wait for each other at spin barriers; its numbers must be the blocks' bit
for bit, for every architecture, whether the team has its threads, runs on this thread
alone, or has more members than numba has threads (members then run one after another,
and the first must do every layer without waiting for the others).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import gguflm
from gguflm.model import team
from gguflm.quant import matrix
from refcheck import counted
from test_fused import TINY, _quantized, _run
from tinymodel import random_tensors, tiny_metadata, write_model


@pytest.mark.parametrize("arch", list(TINY))
def test_team_matches_the_fused_layers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                 arch: str) -> None:
    md = tiny_metadata(arch, **TINY[arch])
    model = gguflm.load_model(write_model(tmp_path / "m.gguf", md, random_tensors(md),
                                          _quantized(md)))
    with monkeypatch.context() as m:
        m.setattr(team, "MAX_ROWS", 0)  # layer by layer, through the blocks
        blocks = _run(model)
    alone = counted(monkeypatch, team, "stack_alone")
    together = counted(monkeypatch, team, "stack_team")
    got = {"alone": _run(model)}  # the tiny layers are below the parallel threshold
    monkeypatch.setattr(matrix, "PARALLEL_MIN_MACS", 0)
    monkeypatch.setattr(matrix, "threads", lambda: 2)
    got["team"] = _run(model)
    monkeypatch.setattr(matrix, "threads", lambda: 5)  # more members than threads
    got["crowded"] = _run(model)
    assert alone[0] > 0 and together[0] > 0  # phi3's fused tensors included
    for how, logits in got.items():
        assert np.isfinite(logits).all(), how
        np.testing.assert_array_equal(logits, blocks, err_msg=how)


@pytest.mark.parametrize("which", ["smollm2", "gemma3"])
def test_team_matches_the_fused_layers_on_real_models(request: pytest.FixtureRequest,
                                                monkeypatch: pytest.MonkeyPatch,
                                                which: str) -> None:
    model = gguflm.load_model(request.getfixturevalue(f"{which}_path"))
    together = counted(monkeypatch, team, "stack_team")
    monkeypatch.setattr(matrix, "threads", lambda: 2)
    got = _run(model)
    assert together[0] > 0
    monkeypatch.setattr(team, "MAX_ROWS", 0)
    np.testing.assert_array_equal(got, _run(model))


def test_team_buffers_are_each_threads_own(smollm2_path: Path) -> None:
    """The layers' shared arrays are reused call after call (``_Stack.buffers``): forwards
    of one model on several threads at once must not write into each other's, and a block
    grown for more rows serves fewer."""
    import threading

    model = gguflm.load_model(smollm2_path)
    want = _run(model, steps=4)
    got: dict[int, list[np.ndarray]] = {i: [] for i in range(4)}
    gate = threading.Barrier(4)

    def work(i: int) -> None:
        gate.wait()
        for _ in range(3):
            got[i].append(_run(model, steps=4))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    for i, runs in got.items():
        assert len(runs) == 3, i
        for logits in runs:
            np.testing.assert_array_equal(logits, want, err_msg=f"thread {i}")
