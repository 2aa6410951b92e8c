"""Tokenizer start-up and throughput on the real models and llama.cpp's vocabulary files.

Start-up is measured in a fresh interpreter per file (imports excluded, as a user of an
already-imported gguflm sees it): open the GGUF file, build the Tokenizer, tokenize one short
prompt (which builds the BPE merges table, done on first use). Throughput: encode the
Apache-2.0 licence text (cold word cache: a new Tokenizer per run) and decode its ids, best
of --repeat.

    .venv/bin/python benchmarks/bench_tokenizer.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
REFERENCE = Path(os.environ.get("GGUFLM_REFERENCE", REPO.parent / "shared" / "reference"))
CACHE = Path(os.environ.get("GGUFLM_HOME", Path.home() / ".cache" / "gguflm"))
FILES = {
    "gemma3-270m (SPM, 262k)": CACHE / "gemma-3-270m-q4_k_m.gguf",
    "smollm2-135m (BPE smollm, 49k)": CACHE / "SmolLM2-135M-Instruct.Q4_1.gguf",
    "llama-spm (32k)": REFERENCE / "vocab" / "ggml-vocab-llama-spm.gguf",
    "llama-bpe (128k, 280k merges)": REFERENCE / "vocab" / "ggml-vocab-llama-bpe.gguf",
    "qwen2 (152k)": REFERENCE / "vocab" / "ggml-vocab-qwen2.gguf",
}

_STARTUP = """
import json, sys, time
import gguflm.gguf as gguf
from gguflm.tokenizer import Tokenizer
t0 = time.perf_counter()
f = gguf.open(sys.argv[1])
t1 = time.perf_counter()
tok = Tokenizer.from_gguf(f)
t2 = time.perf_counter()
tok.encode("The capital of France is Parizzz")  # not one token: merges needed
t3 = time.perf_counter()
print(json.dumps({"open": t1 - t0, "build": t2 - t1, "first": t3 - t2}))
"""


def startup(path: Path) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", _STARTUP, str(path)], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


def throughput(path: Path, text: str, repeat: int) -> tuple[int, float, float]:
    from gguflm.tokenizer import Tokenizer

    best_enc = best_dec = float("inf")
    ids: list[int] = []
    for _ in range(repeat):
        tok = Tokenizer.from_file(path)
        tok.encode("Parizzz")  # the BPE merges table, built on first use, counts as start-up
        t0 = time.perf_counter()
        ids = tok.encode(text)
        t1 = time.perf_counter()
        tok.decode(ids)
        t2 = time.perf_counter()
        best_enc, best_dec = min(best_enc, t1 - t0), min(best_dec, t2 - t1)
    return len(ids), best_enc, best_dec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    text = (REFERENCE / "text" / "apache-2.0.txt").read_text(encoding="utf-8")
    print(f"text: apache-2.0.txt, {len(text)} characters; best of {args.repeat}")
    print(f"{'vocabulary':32} {'open':>7} {'build':>7} {'1st enc':>8} | "
          f"{'tokens':>6} {'encode':>9} {'tok/s':>8} {'decode':>8}")
    for name, path in FILES.items():
        if not path.is_file():
            print(f"{name:32} (missing: {path})")
            continue
        s = min((startup(path) for _ in range(args.repeat)), key=lambda r: r["build"])
        n, enc, dec = throughput(path, text, args.repeat)
        print(f"{name:32} {s['open'] * 1e3:5.0f}ms {s['build'] * 1e3:5.0f}ms "
              f"{s['first'] * 1e3:6.1f}ms | {n:6d} {enc * 1e3:7.1f}ms {n / enc:8.0f} "
              f"{dec * 1e3:6.1f}ms")


if __name__ == "__main__":
    main()
