"""Per-type throughput of the quantized kernels, so regressions show.

For every ggml type in the quant zoo (shared/reference/quant-zoo) that has a kernel, the
zoo's 32 rows (1536 columns, ggml's own quantization of a real SmolLM2 matrix) are tiled to
a 2048 x 1536 matrix and multiplied:

- ``mv``: one vector (token-by-token decoding), one thread and ``-t`` threads;
- ``mm``: a 128-row batch (prompt processing) with the quantized GEMM, and for comparison
  the fallback (dequantized tiles into BLAS).

Also the real models' output projections when they are in the cache (SmolLM2's 49152 x 576
and Gemma 3's 262144 x 640, both Q8_0): a large share of every generated token's work.

Figures are GMAC/s (10^9 multiply-adds per second) from the best of ``--reps`` runs, wall
clock and this process's CPU time (CPU time is steadier on a shared machine).

    python benchmarks/bench_kernels.py [-t N] [--reps 7] [--types Q4_0,Q8_0] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))

import gguflm.gguf as gguf  # noqa: E402
from gguflm.quant import kernels  # noqa: E402
from gguflm.quant.matrix import QMatrix, entry_point_defaults, set_threads  # noqa: E402

KERNEL_TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
                "IQ4_NL", "IQ4_XS", "MXFP4", "F16", "BF16"]
REFERENCE = Path(os.environ.get("GGUFLM_REFERENCE", REPO.parent / "shared" / "reference"))
CACHE = Path(os.environ.get("GGUFLM_HOME", Path.home() / ".cache" / "gguflm"))


def best(fn, reps: int) -> tuple[float, float]:  # noqa: ANN001
    """(best wall seconds, best CPU seconds) over ``reps`` runs after one warm-up."""
    fn()
    wall, cpu = [], []
    for _ in range(reps):
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return min(wall), min(cpu)


def measure(m: QMatrix, n: int, reps: int, threads: int,
            product=QMatrix.matmul) -> dict[str, float]:
    """``product(m, x, out)`` for an ``(n, d_in)`` batch on ``threads`` threads."""
    x = np.random.default_rng(0).standard_normal((n, m.shape[1])).astype(np.float32)
    out = np.empty((n, m.shape[0]), np.float32)
    set_threads(threads)
    wall, cpu = best(lambda: product(m, x, out), reps)
    macs = n * m.shape[0] * m.shape[1]
    return {"gmacs_wall": macs / wall / 1e9, "gmacs_cpu": macs / max(cpu, 1e-9) / 1e9,
            "ms_wall": wall * 1e3}


def main() -> int:
    entry_point_defaults()  # this script owns the process, as the CLI does
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-t", "--threads", type=int, default=None)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--rows", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--types", default=",".join(KERNEL_TYPES))
    ap.add_argument("--no-models", action="store_true", help="skip the real output projections")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    threads = set_threads(args.threads)
    zoo_path = REFERENCE / "quant-zoo" / "quant-zoo.gguf"
    if not zoo_path.is_file():
        print(f"quant zoo not found at {zoo_path} (set GGUFLM_REFERENCE)", file=sys.stderr)
        return 1
    results = []
    t0 = time.perf_counter()
    with gguf.open(zoo_path) as zoo:
        for name in args.types.split(","):
            t = zoo.tensors[f"{name}.q"]
            reps_rows = -(-args.rows // t.data.shape[0])
            raw = np.ascontiguousarray(np.tile(t.data, (reps_rows, 1))[:args.rows])
            m = QMatrix(t.type, raw, (args.rows, t.shape[0]), name=name)
            r = {"type": name, "shape": list(m.shape),
                 "mv_1t": measure(m, 1, args.reps * 3, 1),
                 "mv": measure(m, 1, args.reps * 3, threads),
                 "mm": measure(m, args.batch, args.reps, threads),
                 "mm_fallback": measure(m, args.batch, args.reps, threads,
                                        QMatrix._matmul_tiles)}
            results.append(r)
    if not args.no_models:
        for fname, tname in (("SmolLM2-135M-Instruct.Q4_1.gguf", "token_embd.weight"),
                             ("gemma-3-270m-q4_k_m.gguf", "token_embd.weight")):
            path = CACHE / fname
            if not path.is_file():
                continue
            with gguf.open(path) as f:
                m = QMatrix.from_tensor(f.tensors[tname])
                results.append({"type": f"{m.type.ggml_name} {fname.split('.')[0]} output",
                                "shape": list(m.shape),
                                "mv_1t": measure(m, 1, args.reps, 1),
                                "mv": measure(m, 1, args.reps, threads)})
                del m
    set_threads(threads)
    info = {"threads": threads, "simd": kernels.SIMD, "rows": args.rows, "batch": args.batch,
            "seconds": round(time.perf_counter() - t0, 1), "results": results}
    if args.json:
        print(json.dumps(info))
        return 0
    print(f"threads {threads}, SIMD {kernels.SIMD}; GMAC/s, best of runs: wall (CPU time)")
    print(f"{'type':<28}{'shape':>14}{'mv 1 thread':>18}{'mv':>18}{'mm (qGEMM)':>18}"
          f"{'mm (tiles+BLAS)':>18}")

    def cell(d: dict | None) -> str:
        return f"{d['gmacs_wall']:7.1f} ({d['gmacs_cpu']:5.1f})" if d else "-"

    for r in results:
        shape = "x".join(map(str, r["shape"]))
        print(f"{r['type']:<28}{shape:>14}{cell(r.get('mv_1t')):>18}{cell(r.get('mv')):>18}"
              f"{cell(r.get('mm')):>18}{cell(r.get('mm_fallback')):>18}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
