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
from gguflm.quant import matrix
matrix.entry_point_defaults(owns_cores=sys.argv[1] == "owns", serving=sys.argv[1] == "serve")
import resource
def minor_faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
block = b"\1" * (24 << 20)  # a 24 MiB block, written (so its pages are touched), freed
del block
before = minor_faults()
for _ in range(4):  # the same block again: fresh pages, or the freed ones kept
    block = b"\1" * (24 << 20)
    del block
reuse_faults = minor_faults() - before
print(json.dumps({"import": after_import, "omp": os.environ.get("OMP_WAIT_POLICY"),
                  "reuse_faults": reuse_faults,
                  "spin": os.environ.get("GOMP_SPINCOUNT"),
                  "spin_threshold": matrix.PARALLEL_MIN_MACS == matrix.SPIN_PARALLEL_MIN_MACS}))
"""


def _probe(env: dict[str, str], owns_cores: bool = False, serving: bool = False) -> dict:
    argv = [sys.executable, "-c", _PROBE, "owns" if owns_cores else "serve" if serving else "-"]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_changes_nothing_and_entry_point_sets_defaults() -> None:
    env = {k: v for k, v in os.environ.items()  # (another test may have set them here)
           if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OPENBLAS_NUM_THREADS",
                        "OMP_NUM_THREADS", "MALLOC_MMAP_THRESHOLD_",
                        "MALLOC_TRIM_THRESHOLD_")}
    got = _probe(env)
    assert got["import"] == {"env": [], "threads": True}
    assert got["omp"] == "passive" and got["spin"] is None and not got["spin_threshold"]
    # LLM() in someone else's process leaves glibc's allocator alone: the block again
    # takes fresh pages (6144 of 4 KiB) at least once
    assert got["reuse_faults"] > 3000, got
    # one user's command: workers spin a bounded while, and smaller products go parallel
    got = _probe(env, owns_cores=True)
    assert (got["omp"], got["spin"], got["spin_threshold"]) == ("active", "100000", True)
    assert got["reuse_faults"] < 1500, got  # the freed memory kept (keep_freed_memory)
    # the server: workers spin briefly between one step's products, then sleep
    got = _probe(env, serving=True)
    assert (got["omp"], got["spin"], got["spin_threshold"]) == ("active", "20000", False)
    assert got["reuse_faults"] < 1500, got


def test_single_user_commands_own_the_cores_and_the_server_does_not() -> None:
    from gguflm.cli import build_parser

    parser = build_parser()
    for argv in (["run", "-p", "x"], ["chat"], ["bench"], ["perplexity", "-f", "x"],
                 ["embed", "-p", "x"]):
        assert parser.parse_args(argv).owns_cores is True, argv
    assert not getattr(parser.parse_args(["serve"]), "owns_cores", False)
    assert parser.parse_args(["serve"]).serving is True


def test_entry_point_leaves_an_explicit_choice_alone() -> None:
    env = {k: v for k, v in os.environ.items()}
    env["OMP_WAIT_POLICY"] = "active"
    assert _probe(env)["omp"] == "active"
    env["OMP_WAIT_POLICY"] = "passive"
    got = _probe(env, owns_cores=True)
    assert got["omp"] == "passive" and not got["spin_threshold"]
