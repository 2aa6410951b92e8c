"""The kernels' disk cache cannot go stale silently: every cached numba function of gguflm
is stamped with the sources of its module and of all it imports (``quant.jitcache``)."""

from __future__ import annotations

import importlib
import os
import pkgutil
import shutil
import subprocess
import sys
from pathlib import Path

import numba
import pytest
from numba.core.ccallback import CFunc

import gguflm
from gguflm.quant import jitcache

_SRC = Path(gguflm.__file__).resolve().parent


def _cached_functions() -> list:
    found = []
    for info in pkgutil.walk_packages(gguflm.__path__, "gguflm."):
        if info.name.endswith("__main__"):
            continue
        mod = importlib.import_module(info.name)
        for value in vars(mod).values():
            py_func = getattr(value, "py_func", getattr(value, "_pyfunc", None))
            if (isinstance(value, numba.core.dispatcher.Dispatcher | CFunc)
                    and py_func.__module__ == mod.__name__
                    and not isinstance(value._cache, numba.core.caching.NullCache)):
                found.append((f"{mod.__name__}.{py_func.__name__}", value))
    return found


def test_every_cached_kernel_is_stamped() -> None:
    """A module whose kernels cache without the stamp (it did not import ``jitcache`` before
    its first ``njit``) would load machine code built from other sources."""
    from gguflm.quant import int_tiles

    fns = _cached_functions()
    assert len(fns) > 50
    fns += [(f"rows kernel of {k}", int_tiles._rows_kernel(k)) for k in (2, 3, 8, 12, 14)]
    assert [name for name, f in fns if not jitcache.stamped(f)] == []


def test_stamp_covers_what_a_module_imports_and_nothing_above() -> None:
    team = [p.relative_to(_SRC).as_posix() for p in jitcache._closure(_SRC / "model/team.py")]
    for needed in ("model/team.py", "model/fused.py", "model/attention.py",
                   "model/rowkernels.py", "quant/int_tiles.py", "quant/int_weights.py",
                   "quant/kerneltypes.py", "quant/formats.py", "quant/floatbits.py"):
        assert needed in team, needed
    assert not [p for p in team if p.split("/")[0] in ("engine", "cli", "server.py", "api.py")]
    assert "model/archs/llama.py" not in team


def test_stamp_follows_the_build_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    key = jitcache.sources_key(_SRC / "quant/int_tiles.py")
    monkeypatch.setenv("GGUFLM_SIMD", "generic")
    assert jitcache.sources_key(_SRC / "quant/int_tiles.py") != key


def test_a_callee_edited_in_another_file_is_recompiled(tmp_path: Path) -> None:
    """numba alone would reuse act_quant's cached quantizer after floatbits.round_f16 (which
    it inlines) changed: its own file did not. The stamp makes it compile again."""
    pkg = tmp_path / "gguflm"
    shutil.copytree(_SRC, pkg, ignore=shutil.ignore_patterns("__pycache__"))
    probe = ("import numpy as np\n"
             "from gguflm.quant import act_quant\n"
             "x = np.full((1, 32), 1 / 3, np.float32)\n"
             "qa, da, aux = act_quant.quantize_activations(x, 8)\n"
             "print(repr(float(da[0, 0])))\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path), NUMBA_CACHE_DIR=str(tmp_path / "cache"))

    def run() -> str:
        r = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                           text=True, timeout=600, cwd=tmp_path)
        assert r.returncode == 0, r.stderr[-2000:]
        return r.stdout.strip()

    rounded = run()
    floatbits = pkg / "quant/floatbits.py"
    src = floatbits.read_text()
    body = ('"""float32 x (|x| < 65504) rounded to the nearest float16 (ties to even), '
            'as float32."""')
    assert body in src
    floatbits.write_text(src.replace(body, body + "\n    return x"))
    assert run() != rounded  # no longer rounded to float16
