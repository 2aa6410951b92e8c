"""Reranking speed against llama.cpp: 32 documents of about 64 tokens (query included)
scored by a real-size random BERT cross-encoder (bge-reranker-base's shape: 12 layers of
768, 12 heads, FFN 3072, 512 positions; all-MiniLM's WordPiece vocabulary), through
``gguflm serve`` and ``llama-server --reranking``, one request at a time, the engines
alternating.

    .venv/bin/python benchmarks/bench_rerank.py --llama-server PATH/TO/llama-server
        [-t THREADS] [-r REPEATS] [--dtype f16|f32] [--model FILE]

The model is made by tests/rerank_models.py (seed 0) unless ``--model`` names one. Both
servers run on 127.0.0.1 with the same threads; llama-server with 32 slots and one batch
of 2048 tokens (every document in one encoder pass, its fastest setting) and its OpenMP
threads waiting passively, as benchmarks/bench_embed.py runs llama.cpp. Each round sends the
same request to each server (which goes first alternates); the figure is the ratio of the
medians (llama.cpp's time / gguflm's: above 1 means gguflm is faster), after a warm-up
request each. The documents are slices of the Apache-2.0 licence in the reference data.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "src"))

from make_rerankers import CACHE, REFERENCE, free_port  # noqa: E402
from rerank_models import make_bert_reranker  # noqa: E402

N_DOCS, DOC_WORDS = 32, 38  # about 64 tokens a pair with the query


def request_body() -> dict[str, Any]:
    words = (REFERENCE / "text" / "apache-2.0.txt").read_text("utf-8").split()
    docs = [" ".join(words[(i * 53) % (len(words) - DOC_WORDS):][:DOC_WORDS])
            for i in range(N_DOCS)]
    return {"query": "What does the license say about patents and trademarks?",
            "documents": docs}


def post(port: int, body: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/rerank",
                                 json.dumps(body).encode(), {"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as r:
        answer = json.load(r)
    return time.perf_counter() - t0, answer


def start(cmd: list[str], port: int, log: Path, env: dict[str, str]) -> subprocess.Popen:
    with open(log, "wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{cmd[0]} stopped: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return proc
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"{cmd[0]} did not start: {log.read_text()[-2000:]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--repeats", type=int, default=5)
    ap.add_argument("--dtype", choices=("f16", "f32"), default="f16")
    ap.add_argument("--model", help="a reranker GGUF (default: make the random one)")
    args = ap.parse_args()
    from gguflm.gguf.types import GGMLType

    body = request_body()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        model = Path(args.model) if args.model else make_bert_reranker(
            folder / "bert-base-reranker.gguf", CACHE / "all-MiniLM-L6-v2-F16.gguf",
            n_layer=12, n_embd=768, n_head=12, n_ff=3072,
            dtype=GGMLType.F16 if args.dtype == "f16" else GGMLType.F32)
        t = str(args.threads)
        ours, theirs = free_port(), free_port()
        procs: list[subprocess.Popen] = []
        try:
            procs.append(start(
                [sys.executable, "-m", "gguflm.cli", "serve", str(model), "--host",
                 "127.0.0.1", "--port", str(ours), "-t", t, "-np", "8", "-c", "512"],
                ours, folder / "gguflm.log", dict(os.environ)))
            procs.append(start(
                [args.llama_server, "-m", str(model), "--reranking", "--host", "127.0.0.1",
                 "--port", str(theirs), "-t", t, "-tb", t, "-np", str(N_DOCS),
                 "-c", str(N_DOCS * 512), "-b", "2048", "-ub", "2048"],
                theirs, folder / "llama.log", os.environ | {"OMP_WAIT_POLICY": "passive"}))
            times: dict[int, list[float]] = {ours: [], theirs: []}
            answers = {port: post(port, body)[1] for port in times}  # warm-up
            for r in range(args.repeats):
                for port in ((ours, theirs) if r % 2 == 0 else (theirs, ours)):
                    times[port].append(post(port, body)[0])
        finally:
            for p in procs:
                p.terminate()
                p.wait(30)
    n_tokens = answers[ours]["usage"]["prompt_tokens"]
    a, b = statistics.median(times[ours]), statistics.median(times[theirs])
    same = [x["index"] for x in answers[ours]["results"]] == \
        [x["index"] for x in answers[theirs]["results"]]
    score = {p: {x["index"]: x["relevance_score"] for x in answers[p]["results"]}
             for p in answers}
    worst = max(abs(score[ours][i] - score[theirs][i]) / abs(score[theirs][i])
                for i in score[ours])
    print(f"{model.name} ({args.dtype}), {N_DOCS} documents, {n_tokens} tokens "
          f"({n_tokens / N_DOCS:.1f} a pair), {args.threads} threads, median of "
          f"{args.repeats}: gguflm {a * 1000:.0f} ms ({n_tokens / a:.0f} tok/s), llama.cpp "
          f"{b * 1000:.0f} ms ({n_tokens / b:.0f} tok/s), ratio {b / a:.2f}x; "
          f"order {'identical' if same else 'different'}, scores within {worst:.1e} "
          f"(relative; spread {min(score[theirs].values()):.4f} .. "
          f"{max(score[theirs].values()):.4f})")
    print("rounds (ms): gguflm " + " ".join(f"{x * 1000:.0f}" for x in times[ours])
          + " | llama.cpp " + " ".join(f"{x * 1000:.0f}" for x in times[theirs]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
