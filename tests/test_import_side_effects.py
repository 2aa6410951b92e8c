"""Importing gguflm changes no process-wide setting; the entry points choose them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

_PROBE = r"""
import json, os, sys
import numba
before_env, before_threads = dict(os.environ), numba.get_num_threads()
import gguflm, gguflm.api, gguflm.server, gguflm.engine.scheduler
import gguflm.quant.kernels, gguflm.quant.matrix, gguflm.model.attention
changed = sorted(set(os.environ.items()) ^ set(before_env.items()))
after_import = {"env": changed, "threads": numba.get_num_threads() == before_threads}
from gguflm.quant.matrix import entry_point_defaults
entry_point_defaults()
print(json.dumps({"import": after_import, "omp": os.environ.get("OMP_WAIT_POLICY")}))
"""


def _probe(env: dict[str, str]) -> dict:
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True,
                         text=True, timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_changes_nothing_and_entry_point_sets_defaults() -> None:
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_WAIT_POLICY", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}
    got = _probe(env)
    assert got["import"] == {"env": [], "threads": True}
    assert got["omp"] == "passive"


def test_entry_point_leaves_an_explicit_choice_alone() -> None:
    env = {k: v for k, v in os.environ.items()}
    env["OMP_WAIT_POLICY"] = "active"
    assert _probe(env)["omp"] == "active"
