"""Embedding speed of an encoder (all-MiniLM-L6-v2): embeddings per second, batched.

    .venv/bin/python benchmarks/bench_embed.py [MODEL] [-t THREADS] [-r REPEATS]
        [--llama-embedding PATH/TO/llama-embedding]

Two workloads: 256 short texts (about 12 tokens each) and 32 long ones (about 250 tokens),
made from the Apache-2.0 licence text in the reference data (deterministic). gguflm embeds
each workload with one ``LLM.embed`` call (every text in batched forwards); the median of
``-r`` runs after a warm-up. With ``--llama-embedding``, llama.cpp's tool embeds the same
texts from the same file (``--pooling mean --embd-normalize -1``, the same threads, batches
of ``--llama-batch`` tokens); its time runs from its first batch to its end (model loading
left out; its own perf counters skip encoder batches), so both sides count the same work.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REFERENCE = Path(os.environ.get("GGUFLM_REFERENCE",
                                Path(__file__).resolve().parents[2] / "shared" / "reference"))


def workloads() -> dict[str, list[str]]:
    words = (REFERENCE / "text" / "apache-2.0.txt").read_text("utf-8").split()
    def texts(n: int, length: int) -> list[str]:
        return [" ".join(words[(i * 37) % (len(words) - length):][:length]) for i in range(n)]
    return {"short": texts(256, 9), "long": texts(32, 190)}


def bench_gguflm(model: str, threads: int, repeats: int) -> dict[str, tuple[float, int]]:
    from gguflm import LLM

    llm = LLM(model, threads=threads)
    out = {}
    try:
        llm.warm_up()
        print(f"gguflm: {llm.model!r}", file=sys.stderr)
        for name, texts in workloads().items():
            n_tokens = sum(len(llm.tokenize(t)) for t in texts)
            llm.embed(texts[:8])
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                llm.embed(texts, normalize=False)
                times.append(time.perf_counter() - t0)
            out[name] = (statistics.median(times), n_tokens)
    finally:
        llm.close()
    return out


_STAMP = re.compile(r"^(\d+)\.(\d+)\.(\d+)\.(\d+) ")  # llama.cpp's log time: m.ss.ms.us


def _seconds(line: str) -> float:
    m, sec, ms, us = (int(g) for g in _STAMP.match(line).groups())
    return m * 60 + sec + ms / 1e3 + us / 1e6


def bench_llama_cpp(binary: str, path: Path, threads: int, repeats: int, n_batch: int
                    ) -> dict[str, tuple[float, int]]:
    """llama-embedding's time from its first batch to its end (its own perf counters do not
    count encoder batches): every batch and the printing of the vectors, not the loading.
    OpenMP waits passively: on a shared machine its spinning barriers halved its speed."""
    out = {}
    for name, texts in workloads().items():
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
            f.write("\n".join(texts))
        cmd = [binary, "-m", str(path), "-f", f.name, "--pooling", "mean",
               "--embd-normalize", "-1", "-t", str(threads), "-tb", str(threads),
               "-b", str(n_batch), "-ub", str(n_batch), "-c", str(n_batch),
               "-np", str(len(texts)), "--perf", "-lv", "5"]
        times, n_tokens = [], 0
        try:
            for _ in range(repeats):
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900,
                                      env=os.environ | {"OMP_WAIT_POLICY": "passive"})
                lines = proc.stderr.splitlines()
                first = next((ln for ln in lines if "batch_decode: n_tokens" in ln), None)
                end = next((ln for ln in lines if "total time" in ln), None)
                if proc.returncode or first is None or end is None:
                    raise SystemExit(f"llama-embedding failed ({proc.returncode}): "
                                     f"{proc.stderr[-800:]}")
                times.append(_seconds(end) - _seconds(first))
                n_tokens = sum(int(re.search(r"n_tokens = (\d+)", ln).group(1))
                               for ln in lines if "batch_decode: n_tokens" in ln)
        finally:
            os.unlink(f.name)
        out[name] = (statistics.median(times), n_tokens)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default="all-minilm-l6-v2")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--repeats", type=int, default=3)
    ap.add_argument("--llama-embedding", metavar="PATH", help="llama.cpp's llama-embedding")
    ap.add_argument("--llama-batch", type=int, default=512, metavar="N",
                    help="llama-embedding's -b/-ub (its batches hold whole texts and attend "
                         "over the whole batch: 512 was its fastest here of 512-8192)")
    args = ap.parse_args()

    from gguflm import hub

    path = hub.resolve_model(args.model)
    counts = {name: len(texts) for name, texts in workloads().items()}
    ours = bench_gguflm(str(path), args.threads, args.repeats)
    theirs = bench_llama_cpp(args.llama_embedding, path, args.threads, args.repeats,
                             args.llama_batch) if args.llama_embedding else {}
    print(f"{path.name}, {args.threads} threads, median of {args.repeats}")
    for name, (seconds, n_tokens) in ours.items():
        line = (f"{name:5s} {counts[name]:4d} texts, {n_tokens:5d} tokens: gguflm "
                f"{counts[name] / seconds:7.1f} embeddings/s ({n_tokens / seconds:7.0f} tok/s)")
        if name in theirs:
            t, n = theirs[name]
            line += (f" | llama.cpp {counts[name] / t:7.1f} embeddings/s ({n / t:7.0f} tok/s)"
                     f" | ratio {t / seconds:.2f}x")
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
