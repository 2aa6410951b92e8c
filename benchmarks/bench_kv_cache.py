"""The KV cache types (``-ctk/-ctv``): decoding tokens/s and cache bytes, f16 vs q8_0 (f32 too).

    .venv/bin/python benchmarks/bench_kv_cache.py [MODEL] [-d 16,1024] [-n 32] [-r 3]
        [--types f16,q8_0] [--llama-bench PATH]

For each depth D (cached positions before the timed tokens) and cache type, in alternating
rounds: a D-token prompt (not timed), then N tokens decoded one at a time (each a forward
pass of one row, as llama.cpp's ``tg`` at depth D). Prints the median tokens/s per type and
depth, the arena's bytes, and the ratio to f16. With ``--llama-bench``, llama.cpp's
``tgN @ dD`` with the same cache types (flash attention on: llama.cpp needs it for a
quantized V cache) on the same threads, in each round.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time


def _decode_tps(model: object, kv: str, depth: int, n: int) -> tuple[float, int]:
    """tokens/s of n one-token steps after a depth-token prompt; the arena's bytes."""
    import numpy as np

    model.use_kv_type(kv)
    cache = model.new_cache(depth + n + 1)
    rng = np.random.default_rng(depth)
    model.forward(list(rng.integers(100, 1000, depth)), cache)
    t0 = time.perf_counter()
    for t in rng.integers(100, 1000, n):
        model.forward([int(t)], cache)
    return n / (time.perf_counter() - t0), cache.arena.nbytes


def _llama_bench(path: str, model: str, kv: str, depth: int, n: int, threads: int) -> float:
    out = subprocess.run([path, "-m", model, "-p", "0", "-n", str(n), "-d", str(depth),
                          "-ctk", kv, "-ctv", kv, "-fa", "1", "-t", str(threads), "-r", "1",
                          "-o", "json"], capture_output=True, text=True, check=True).stdout
    return float(json.loads(out)[0]["avg_ts"])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", nargs="?", default="smollm2-135m")
    p.add_argument("-d", "--depths", default="16,1024")
    p.add_argument("-n", type=int, default=32)
    p.add_argument("-r", "--rounds", type=int, default=3)
    p.add_argument("--types", default="f16,q8_0")
    p.add_argument("--llama-bench", default=None)
    args = p.parse_args()
    import gguflm
    from gguflm.hub import resolve_model
    from gguflm.quant.matrix import entry_point_defaults, threads

    entry_point_defaults()
    path = str(resolve_model(args.model))
    model = gguflm.load_model(path)
    depths = [int(d) for d in args.depths.split(",")]
    kinds = args.types.split(",")
    for kv in kinds:  # compiled or loaded once, not in the timings
        _decode_tps(model, kv, 4, 2)
    ours: dict[tuple[str, int], list[float]] = {}
    theirs: dict[tuple[str, int], list[float]] = {}
    size: dict[tuple[str, int], int] = {}
    for _ in range(args.rounds):
        for depth in depths:
            for kv in kinds:
                tps, size[kv, depth] = _decode_tps(model, kv, depth, args.n)
                ours.setdefault((kv, depth), []).append(tps)
                if args.llama_bench:
                    theirs.setdefault((kv, depth), []).append(
                        _llama_bench(args.llama_bench, path, kv, depth, args.n, threads()))
    for depth in depths:
        base = statistics.median(ours["f16", depth]) if "f16" in kinds else None
        for kv in kinds:
            med = statistics.median(ours[kv, depth])
            line = (f"tg{args.n} @ d{depth} {kv:5s} {med:7.1f} tok/s "
                    f"(runs {', '.join(f'{x:.1f}' for x in ours[kv, depth])})"
                    f"  cache {size[kv, depth] / 2**20:.2f} MiB")
            if base:
                line += f"  {med / base:.2f}x f16"
            if theirs:
                lc = statistics.median(theirs[kv, depth])
                line += f"  llama.cpp {lc:.1f} tok/s ({med / lc:.2f}x)"
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
