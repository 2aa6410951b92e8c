"""Quantizing a real model: SmolLM2-135M from F16 to Q4_K_M (or --type), gguflm vs
llama-quantize at the same thread count.

The F16 source is made here once, from the pulled Q4_1 SmolLM2 (``gguflm pull
smollm2-135m``): every quantized tensor dequantized (bit-exact, as ggml does) and stored as
F16, the rest copied, ``general.file_type`` set to 1 (MOSTLY_F16); it is kept in
``--work-dir``. Then ``quantize_file`` is timed (best of --repeat), with a breakdown by
target type, and, when a llama-quantize binary is found (--llama-quantize, default
/work/llama.cpp-build/bin/llama-quantize), that binary on the same file with the same
thread count: times side by side, alternating, and whether the two outputs are identical.

    .venv/bin/python benchmarks/bench_quantize.py [--type Q4_K_M] [-t 2] [--repeat 3]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import gguflm.gguf as gguf
from gguflm.gguf.types import GGMLType, ValueType
from gguflm.gguf.writer import GGUFWriter
from gguflm.quant import dequantize, quantize_file

CACHE = Path(os.environ.get("GGUFLM_HOME", Path.home() / ".cache" / "gguflm"))
SOURCE = CACHE / "SmolLM2-135M-Instruct.Q4_1.gguf"
LLAMA_QUANTIZE = Path("/work/llama.cpp-build/bin/llama-quantize")


def make_f16(src: Path, dst: Path) -> None:
    """``src`` with every quantized tensor dequantized and stored as F16."""
    with gguf.open(src) as f:
        w = GGUFWriter(dst)
        for key, value in f.metadata.items():
            w.add(key, value, f.types[key])
        w.set("general.file_type", 1, ValueType.UINT32)
        for t in f.tensors.values():
            if t.type.quantized:
                w.add_tensor(t.name, dequantize(t).astype("<f2"), type=GGMLType.F16)
            else:
                w.add_tensor(t.name, t)
        w.write()


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            h.update(chunk)
    return h.hexdigest()


def time_gguflm(src: Path, out: Path, ftype: str, threads: int) -> tuple[float, dict]:
    """One run: seconds, and seconds per target type (from the progress callback)."""
    per_type: dict[str, float] = defaultdict(float)
    state = {"t": time.perf_counter(), "what": None}

    def progress(done, total, tensor):
        now = time.perf_counter()
        if state["what"] is not None:
            per_type[state["what"]] += now - state["t"]
        state["t"] = now
        state["what"] = None if tensor is None else (
            f"{tensor.source.ggml_name}->{tensor.target.ggml_name}" if tensor.converted
            else "copied")

    t0 = time.perf_counter()
    quantize_file(src, out, ftype, threads=threads, progress=progress)
    return time.perf_counter() - t0, dict(per_type)


def time_llama(binary: Path, src: Path, out: Path, ftype: str, threads: int) -> float:
    t0 = time.perf_counter()
    subprocess.run([str(binary), str(src), str(out), ftype, str(threads)], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--type", default="Q4_K_M", help="file type (default Q4_K_M)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--work-dir", type=Path, default=CACHE / "bench")
    ap.add_argument("--llama-quantize", type=Path, default=LLAMA_QUANTIZE)
    args = ap.parse_args()
    if not SOURCE.is_file():
        print(f"error: {SOURCE} not found; run `gguflm pull smollm2-135m`", file=sys.stderr)
        return 1
    args.work_dir.mkdir(parents=True, exist_ok=True)
    f16 = args.work_dir / "SmolLM2-135M-Instruct.F16.gguf"
    if not f16.is_file():
        t0 = time.perf_counter()
        make_f16(SOURCE, f16)
        print(f"made {f16} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    with gguf.open(f16) as f:
        n_weights = sum(t.n_elements for t in f.tensors.values())
    ours = args.work_dir / f"ours.{args.type}.gguf"
    theirs = args.work_dir / f"llama.{args.type}.gguf"
    binary = args.llama_quantize if args.llama_quantize.is_file() else \
        shutil.which("llama-quantize")
    print(f"SmolLM2-135M F16 ({n_weights / 1e6:.1f}M weights) -> {args.type}, "
          f"{args.threads} threads, best of {args.repeat}")
    time_gguflm(f16, ours, args.type, args.threads)  # warm-up: kernels loaded/compiled
    best_ours, best_theirs, breakdown = float("inf"), float("inf"), {}
    for _ in range(args.repeat):
        s, per_type = time_gguflm(f16, ours, args.type, args.threads)
        if s < best_ours:
            best_ours, breakdown = s, per_type
        if binary:
            best_theirs = min(best_theirs, time_llama(Path(binary), f16, theirs, args.type,
                                                      args.threads))
    print(f"gguflm quantize:  {best_ours:6.2f} s")
    for what, s in sorted(breakdown.items(), key=lambda kv: -kv[1]):
        print(f"    {what:16s} {s:6.2f} s")
    if binary:
        same = sha256(ours) == sha256(theirs)
        print(f"llama-quantize:   {best_theirs:6.2f} s  ({binary})")
        print(f"ratio gguflm / llama-quantize: {best_ours / best_theirs:.2f}; outputs "
              f"{'identical' if same else 'DIFFER'}")
    else:
        print("llama-quantize:   not found (pass --llama-quantize PATH): comparison pending")
    return 0


if __name__ == "__main__":
    sys.exit(main())
