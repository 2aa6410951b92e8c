"""Dequantization throughput per ggml type: gguflm.quant vs gguf-py's gguf.quants.dequantize.

Both sides decode the same bytes: each type's block data from the quant zoo
(shared/reference/quant-zoo), tiled to --mweights million values. gguf-py runs in its own
interpreter (default: .venv-oracle/bin/python, where it may be installed; it is never a
dependency of gguflm) as a worker subprocess, on the same data and with the same timing loop;
the two sides alternate per type so that both see the same machine load.
Also times the embedding path: 16 rows of Gemma 3's 262144 x 640 token_embd.weight.

    .venv/bin/python benchmarks/bench_dequant.py [--mweights 1.5] [--repeat 5]
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import gguflm.gguf as gguf
from gguflm.gguf.types import GGMLType
from gguflm.quant import dequantize, dequantize_raw, dequantize_rows

REPO = Path(__file__).resolve().parent.parent
REFERENCE = Path(os.environ.get("GGUFLM_REFERENCE", REPO.parent / "shared" / "reference"))
ORACLE = REPO / ".venv-oracle" / "bin" / "python"
CACHE = Path(os.environ.get("GGUFLM_HOME", Path.home() / ".cache" / "gguflm"))


def best_time(fn, repeat: int) -> float:
    """Best of ``repeat`` timed calls after one warm-up (the same loop on both sides)."""
    fn()
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


# gguf-py side: a worker in the oracle interpreter that loads the same arrays, then times
# one type per request line, so that both sides alternate under the same machine load. It
# times with ``best_time`` itself (its source is sent along).
ORACLE_WORKER = """
import json, sys, time
import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize
data = np.load(sys.argv[1])
""" + inspect.getsource(best_time) + """
print("ready", flush=True)
for line in sys.stdin:
    name, repeat = line.split()
    raw, ref = data["raw." + name], data["ref." + name]
    try:
        qtype = Q[name]
        y = dequantize(raw[:len(ref)], qtype).astype(np.float32)
        exact = bool(np.array_equal(y.view(np.uint32), ref.view(np.uint32)))
        res = {"seconds": best_time(lambda: dequantize(raw, qtype), int(repeat)),
               "exact": exact}
    except Exception as e:  # a type gguf-py lacks
        res = {"error": f"{type(e).__name__}: {e}"[:80]}
    print(json.dumps(res), flush=True)
"""


def zoo_data(mweights: float) -> dict[str, tuple[GGMLType, np.ndarray, np.ndarray]]:
    """type name -> (type, tiled raw blocks as uint8 rows, ggml's float32 of the zoo rows)."""
    f = gguf.open(REFERENCE / "quant-zoo" / "quant-zoo.gguf")
    out = {}
    for name, t in f.tensors.items():
        if not name.endswith(".q"):
            continue
        raw = np.ascontiguousarray(t.data).view(np.uint8).reshape(t.n_rows, t.row_bytes)
        reps = max(1, round(mweights * 1e6 / t.n_elements))
        out[name[:-2]] = (t.type, np.tile(raw, (reps, 1)),
                          np.asarray(f.tensors[name[:-2] + ".f32"].data))
    return out


class Oracle:
    """gguf-py in its own interpreter, timing on request (None if it is not installed)."""

    def __init__(self, python: Path, data: dict, tmp: Path) -> None:
        path = tmp / "data.npz"
        arrays = {}
        for name, (_, raw, ref) in data.items():
            arrays["raw." + name], arrays["ref." + name] = raw, ref
        np.savez(path, **arrays)
        self.proc = subprocess.Popen([str(python), "-c", ORACLE_WORKER, str(path)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError("gguf-py worker failed to start")

    def time(self, name: str, repeat: int) -> dict:
        self.proc.stdin.write(f"{name} {repeat}\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def bench_types(args: argparse.Namespace) -> None:
    data = zoo_data(args.mweights)
    with tempfile.TemporaryDirectory() as tmp:
        oracle = None
        if Path(args.oracle).exists():
            oracle = Oracle(Path(args.oracle), data, Path(tmp))
        else:
            print(f"(gguf-py interpreter {args.oracle} not found: gguflm side only)")
        try:
            _type_table(data, oracle, args.repeat)
        finally:
            if oracle:
                oracle.close()


def _type_table(data: dict, oracle: Oracle | None, repeat: int) -> None:
    print(f"{'type':8s} {'Mweights':>8s} {'gguflm Mw/s':>12s} {'gguf-py Mw/s':>13s} "
          f"{'speedup':>8s}  bit-exact vs ggml (gguflm/gguf-py)")
    ratios = []
    for name, (gtype, raw, ref) in sorted(data.items(), key=lambda kv: kv[1][0]):
        shape = (raw.shape[0], ref.shape[-1])
        n = shape[0] * shape[1]
        mine_exact = np.array_equal(
            dequantize_raw(gtype, raw[:len(ref)], ref.shape).view(np.uint32),
            ref.view(np.uint32))
        # alternate the two sides in rounds so that both see the same machine load
        ours, o = float("inf"), {}
        for _ in range(3):
            ours = min(ours, best_time(lambda g=gtype, r=raw, s=shape: dequantize_raw(g, r, s),
                                       repeat))
            if oracle:
                r = oracle.time(name, repeat)
                if "seconds" in r and (not o or r["seconds"] < o["seconds"]):
                    o = r
        if "seconds" in o:
            ratio = o["seconds"] / ours
            ratios.append(ratio)
            theirs = f"{n / o['seconds'] / 1e6:13.0f} {ratio:7.2f}x"
            ex = "yes" if o["exact"] else "NO"
        else:
            theirs, ex = f"{'-':>13s} {'-':>8s}", "n/a"
        print(f"{name:8s} {n / 1e6:8.2f} {n / ours / 1e6:12.0f} {theirs}  "
              f"{'yes' if mine_exact else 'NO'}/{ex}")
    if ratios:
        gm = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
        print(f"geometric mean speedup over the {len(ratios)} types gguf-py decodes: {gm:.2f}x")


def bench_embedding(args: argparse.Namespace) -> None:
    path = CACHE / "gemma-3-270m-q4_k_m.gguf"
    if not path.exists():
        print(f"(skipping embedding rows: {path} not found)")
        return
    f = gguf.open(path)
    t = f.tensors["token_embd.weight"]
    rng = np.random.default_rng(0)
    start = int(rng.integers(0, t.n_rows - 16))
    ids = rng.integers(0, t.n_rows, 16)
    block = best_time(lambda: dequantize_rows(t, start, start + 16), args.repeat * 20)
    scattered = best_time(lambda: [dequantize_rows(t, int(i), int(i) + 1) for i in ids],
                          args.repeat * 20)
    full = best_time(lambda: dequantize(t), 1)
    print(f"\nGemma 3 token_embd.weight {t.type.ggml_name} {t.np_shape}:")
    print(f"  16 consecutive rows   {block * 1e6:9.1f} us")
    print(f"  16 scattered rows     {scattered * 1e6:9.1f} us")
    print(f"  whole tensor          {full * 1e6:9.0f} us ({t.n_elements / full / 1e6:.0f} Mw/s)")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mweights", type=float, default=1.5, help="values per type (millions)")
    p.add_argument("--repeat", type=int, default=5, help="timed runs per type (best kept)")
    p.add_argument("--oracle", default=str(ORACLE), help="python with gguf-py installed")
    args = p.parse_args()
    if not (REFERENCE / "quant-zoo" / "quant-zoo.gguf").exists():
        print(f"quant zoo not found under {REFERENCE} (set GGUFLM_REFERENCE)", file=sys.stderr)
        return 1
    t = time.perf_counter()
    bench_types(args)
    bench_embedding(args)
    print(f"\n({time.perf_counter() - t:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
