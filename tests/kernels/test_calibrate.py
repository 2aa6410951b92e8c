"""Kernel variants chosen by measuring the machine (``quant/calibrate.py``): the
measurement, what is kept beside the compiled kernels and read back, the setting the row
kernels read, and ``gguflm bench --kernels``."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gguflm.gguf.types import GGMLType
from gguflm.quant import calibrate, int_tiles, kernels

Q8_0 = int(GGMLType.Q8_0)


@pytest.fixture
def fresh(monkeypatch, tmp_path):  # noqa: ANN001, ANN201
    """No choice made in this process, the cache folder empty, the setting restored."""
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(calibrate, "_chosen", None)
    monkeypatch.setattr(calibrate, "MATRIX_BYTES", 8 << 20)  # a quick measurement
    settings = int_tiles.kernel_settings()
    before = [settings[slot] for slot in int_tiles.WALK_SETTINGS]
    yield tmp_path
    for slot, walk in zip(int_tiles.WALK_SETTINGS, before, strict=True):
        settings[slot] = walk


def test_measured_once_then_read_back(fresh, monkeypatch) -> None:  # noqa: ANN001
    entry = calibrate.ensure([int(GGMLType.F16), Q8_0])  # F16: no integer kernel
    assert entry["type"] == "Q8_0" and len(entry["walks"]) == len(calibrate.CLASSES)
    assert all(0 <= w < len(int_tiles.WALKS) for w in entry["walks"])
    assert [len(r) for r in entry["gb_per_s"]] == [len(int_tiles.WALKS)] * 2
    assert all(r > 0 for rates in entry["gb_per_s"] for r in rates)
    settings = int_tiles.kernel_settings()
    assert [settings[slot] for slot in int_tiles.WALK_SETTINGS] == entry["walks"]
    kept = json.loads((fresh / "calibration.json").read_text())
    assert kept[calibrate.cpu_key()] == entry
    # a later run reads it: nothing measured again
    monkeypatch.setattr(calibrate, "_chosen", None)
    monkeypatch.setattr(calibrate, "measure", lambda kind: pytest.fail("measured again"))
    assert calibrate.ensure([Q8_0]) == entry


def test_a_kept_choice_is_applied_and_a_broken_file_measured_again(fresh, monkeypatch) -> None:  # noqa: ANN001
    path = fresh / "calibration.json"
    entry = {"walks": [2, 3], "type": "Q8_0", "matrix_mb": 8, "rounds": 5, "when": "then",
             "gb_per_s": [[1.0, 1.0, 2.0, 1.0], [1.0, 1.0, 1.0, 2.0]]}
    path.write_text(json.dumps({calibrate.cpu_key(): entry, "another CPU": {"walks": [1]}}))
    assert calibrate.ensure([Q8_0])["walks"] == [2, 3]
    settings = int_tiles.kernel_settings()
    assert [settings[slot] for slot in int_tiles.WALK_SETTINGS] == [2, 3]
    lines = calibrate.describe()
    assert any("short rows" in line and "a row out of step" in line for line in lines)
    assert any("long rows" in line and "one stream" in line for line in lines)
    path.write_text("{not json")
    monkeypatch.setattr(calibrate, "_chosen", None)
    assert calibrate.ensure([Q8_0])["type"] == "Q8_0"  # measured, and the file rewritten
    assert calibrate.cpu_key() in json.loads(path.read_text())


BROKEN = [{"walks": [9, -1]}, {"walks": [True, 0]}, {"type": None}, {"type": 7},
          {"matrix_mb": "8"}, {"rounds": None}, {"when": 3}, {"gb_per_s": [[1.0] * 4]},
          {"gb_per_s": [[1.0, "x", 1.0, 1.0], [1.0] * 4]}, {"gb_per_s": [None, [1.0] * 4]}]


@pytest.mark.parametrize("change", BROKEN)
def test_an_edited_entry_is_measured_again(fresh, monkeypatch, change) -> None:  # noqa: ANN001
    """A kept entry that is not what the measurement writes (edited by hand, or by another
    version): measured again, never applied or described as it is."""
    entry = {"walks": [2, 3], "type": "Q8_0", "matrix_mb": 8, "rounds": 5, "when": "then",
             "gb_per_s": [[1.0, 1.0, 2.0, 1.0], [1.0, 1.0, 1.0, 2.0]]}
    path = fresh / "calibration.json"
    path.write_text(json.dumps({calibrate.cpu_key(): dict(entry, **change)}))
    measured = dict(entry, walks=[0, 0], when="now")
    monkeypatch.setattr(calibrate, "measure", lambda kind: measured)
    assert calibrate.ensure([Q8_0]) == measured
    assert json.loads(path.read_text())[calibrate.cpu_key()] == measured
    assert any("long rows" in line for line in calibrate.describe())


def test_an_entry_for_other_kernels_is_replaced(fresh, monkeypatch) -> None:  # noqa: ANN001
    """The key holds the kernels' sources' stamp: a changed kernel is measured again, and
    the same CPU's entry for the old kernels dropped; other CPUs' entries stay."""
    key = calibrate.cpu_key()
    stale = calibrate._cpu_part() + "0"
    path = fresh / "calibration.json"
    path.write_text(json.dumps({stale: {"walks": [1, 1]}, "another CPU": {"walks": [1]}}))
    monkeypatch.setattr(calibrate, "measure", lambda kind: {"walks": [0, 0]})
    calibrate.ensure([Q8_0])
    assert set(json.loads(path.read_text())) == {key, "another CPU"}


def test_no_integer_types_nothing_measured(fresh) -> None:  # noqa: ANN001
    assert calibrate.ensure([int(GGMLType.F16), int(GGMLType.F32)]) is None
    assert not (fresh / "calibration.json").exists()
    assert calibrate.describe()[-1].endswith("not measured yet")


def test_the_default_stays_unless_beaten_in_every_round() -> None:
    """Another walk must be faster by MARGIN in every round: a noisy measurement (one slow
    round of the default) or a small gain keeps the default."""
    base = [1.0, 1.0, 1.0]
    assert calibrate.choose({0: base, 1: [0.8, 0.85, 0.7], 2: [0.5, 0.5, 2.0]}) == 1
    assert calibrate.choose({0: base, 1: [0.8, 0.85, 0.7], 2: [0.6, 0.6, 0.6]}) == 2
    assert calibrate.choose({0: [1.0, 1.0, 3.0], 1: [0.5, 1.0, 0.5], 2: base}) == 0
    assert calibrate.choose({0: base, 1: [0.95, 0.95, 0.95], 2: [1.5] * 3}) == 0


def test_bench_kernels_command(reference, fresh, capsys) -> None:  # noqa: ANN001
    from gguflm import load_model
    from gguflm.cli import main

    model = reference / "tiny-llama-q4_0" / "tiny-llama-q4_0.gguf"
    most = GGMLType(load_model(model).kernel_types_by_size()[0]).ggml_name
    assert main(["bench", str(model), "--kernels"]) == 0
    out = capsys.readouterr().out
    assert "SIMD: " in out and "  short rows (2048 values): " in out
    assert f"decoding's row walk, measured {calibrate._chosen['when']} ({most}, " in out
    assert main(["bench", str(model), "--kernels", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["cpu_key"] == calibrate.cpu_key() and res["choice"]["type"] == most


def test_every_walk_gives_the_same_products() -> None:
    """The walks on a real product (Q8_0, rows beyond the 8 a walk needs, rows left over)."""
    rng = np.random.default_rng(5)
    blk = rng.integers(0, 256, (37 * 8, 34), dtype=np.uint8)
    blk[:, :2] = np.frombuffer(np.float16(0.02).tobytes(), np.uint8)
    w = blk.reshape(37, 8 * 34)
    x = rng.standard_normal((1, 256)).astype(np.float32)
    settings = int_tiles.kernel_settings()
    slot = int_tiles.WALK_SETTINGS[0]  # rows of 272 bytes: short
    before = settings[slot]
    outs = []
    try:
        for walk in range(len(int_tiles.WALKS)):
            settings[slot] = walk
            out = np.empty((1, 37), np.float32)
            kernels.qmatmul(Q8_0, w, x, out, parallel=False)
            outs.append(out)
    finally:
        settings[slot] = before
    for out in outs[1:]:
        np.testing.assert_array_equal(out, outs[0])
