"""Speed at real sizes against llama-bench: pp128, pp512 and tg32 ratios, engines alternating.

    .venv/bin/python benchmarks/bench_size.py --llama-bin DIR [--models 1b,1b-qwen2,...]
        [--types Q4_K_M,Q8_0] [-r 3] [-t 2] [--work DIR] [--seed N] [--tool-python PY]

The models are random-weight files of real shape made with the shared tool
(``../shared/tools/make_big_model.py``: F16, then requantized by llama.cpp's own
``llama-quantize`` to each type), so the weights stream from memory as a real 1B-3B
model's do (the pulled test models fit in cache). Each round runs ``gguflm bench --json``
and then ``llama-bench -o json`` on the same file, thread count and test sizes, one
repetition each, so that a noisy moment slows both alike; the table shows the medians over
the rounds and their ratios, and gguflm's peak RSS against the file and its KV cache.
Run it on a quiet machine (nothing else running). The tool needs gguf-py, which gguflm
does not depend on: ``--tool-python`` names an interpreter (a separate venv) that has it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TOOL = REPO.parent / "shared" / "tools" / "make_big_model.py"
# name: (make_big_model --shape, --arch)
MODELS = {"1b": ("1b", "llama"), "1b-qwen2": ("1b", "qwen2"), "1b-phi3": ("1b", "phi3"),
          "3b": ("3b", "llama"), "0.5b": ("0.5b", "qwen2")}
TESTS = (("pp", 128), ("pp", 512), ("tg", 32))


def requantized(f16: Path, out: Path, qtype: str, args: argparse.Namespace,
                write: Callable[[Path], None], drop_f16: bool = False) -> Path:
    """``out``, made once: the F16 file ``write(f16)`` makes (unless it is there), then
    ``llama-quantize`` to ``qtype`` on ``args.threads`` threads; ``drop_f16``: the F16 file
    deleted after."""
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        if not f16.exists():
            write(f16)
        subprocess.run([str(Path(args.llama_bin) / "llama-quantize"), str(f16), str(out),
                        qtype, str(args.threads)], check=True, capture_output=True)
        if drop_f16:
            f16.unlink()
    return out


def make(name: str, qtype: str, args: argparse.Namespace) -> Path:
    """The requantized model file (made once, kept in ``--work``)."""
    shape, arch = MODELS[name]
    stem = Path(args.work) / f"big-{name}-s{args.seed}"

    def write(f16: Path) -> None:
        from gguflm import hub

        subprocess.run([args.tool_python, str(TOOL), str(hub.resolve_model("smollm2-135m")),
                        str(f16), "--shape", shape, "--arch", arch, "--seed", str(args.seed)],
                       check=True)

    return requantized(Path(f"{stem}-f16.gguf"), Path(f"{stem}-{qtype}.gguf"), qtype, args,
                       write)


def ours(path: Path, threads: int) -> tuple[dict[str, float], float, float]:
    """({test: tokens/s}, peak RSS MB, KV cache MB) of one ``gguflm bench`` repetition."""
    cmd = [str(REPO / ".venv" / "bin" / "gguflm"), "bench", str(path), "-t", str(threads),
           "-r", "1", "--json", "-p", ",".join(str(n) for t, n in TESTS if t == "pp"),
           "-n", ",".join(str(n) for t, n in TESTS if t == "tg")]
    res = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    return ({t["test"]: t["median"] for t in res["tests"]}, res["peak_rss_mb"],
            res["kv_cache_mb"])


def theirs(path: Path, threads: int, llama_bin: str) -> dict[str, float]:
    """{test: tokens/s} of one ``llama-bench`` repetition."""
    cmd = [str(Path(llama_bin) / "llama-bench"), "-m", str(path), "-t", str(threads), "-r",
           "1", "-o", "json", "-p", ",".join(str(n) for t, n in TESTS if t == "pp"),
           "-n", ",".join(str(n) for t, n in TESTS if t == "tg")]
    rows = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    out = {}
    for r in rows:
        test = f"pp{r['n_prompt']}" if r["n_gen"] == 0 else f"tg{r['n_gen']}"
        out[test] = r["avg_ts"]
    return out


def bench(path: Path, args: argparse.Namespace) -> None:
    got: dict[str, list[float]] = {}
    ref: dict[str, list[float]] = {}
    rss = kv = 0.0
    # a first run compiles what the kernels' cache lacks (after a source change), and the
    # compiler's memory would count in that round's peak RSS
    subprocess.run([str(REPO / ".venv" / "bin" / "gguflm"), "bench", str(path), "-t",
                    str(args.threads), "-r", "1", "-p", "8", "-n", "1"], check=True,
                   capture_output=True)
    for _ in range(args.rounds):
        mine, rss_i, kv = ours(path, args.threads)
        rss = max(rss, rss_i)
        for k, v in mine.items():
            got.setdefault(k, []).append(v)
        for k, v in theirs(path, args.threads, args.llama_bin).items():
            ref.setdefault(k, []).append(v)
    cells = []
    for t, n in TESTS:
        k = f"{t}{n}"
        a, b = statistics.median(got[k]), statistics.median(ref[k])
        cells.append(f"{k} {a:7.1f} / {b:7.1f} = {a / b:.2f}x")
    file_mb = path.stat().st_size / 1e6
    print(f"{path.name:<28} " + "   ".join(cells)
          + f"   RSS {rss:.0f} MB (file {file_mb:.0f} + KV {kv:.0f} + "
            f"{rss - file_mb - kv:.0f})", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-bin", required=True, help="folder with llama-bench, llama-quantize")
    ap.add_argument("--models", default="1b,1b-qwen2,1b-phi3,3b")
    ap.add_argument("--types", default="Q4_K_M,Q8_0")
    ap.add_argument("-r", "--rounds", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--work", default=str(Path(os.environ.get("GGUFLM_HOME",
                                                              Path.home() / ".cache/gguflm"))
                                          / "big"))
    ap.add_argument("--tool-python", default=sys.executable,
                    help="an interpreter with gguf-py (`pip install gguf`) for the shared tool")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("-r must be at least 1")
    print("model                        medians: gguflm / llama.cpp tokens/s (ratio)")
    for name in args.models.split(","):
        if name not in MODELS:
            ap.error(f"unknown model {name!r} (known: {', '.join(MODELS)})")
        for qtype in args.types.split(","):
            bench(make(name, qtype, args), args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
