"""``gguflm bench [MODEL] [-p 128] [-n 64] [-t N] [-r 3] [--json] [--vs-llama-cpp]``.

``-p`` and ``-n`` take comma-separated lists (``-p 64,128,512 -n 32,64``), one test each,
and the results are printed as llama-bench's table (model, size, params, backend, threads,
test, t/s as mean ± standard deviation).

llama-bench's definitions: ``pp`` is tokens/s evaluating a P-token prompt from an empty
cache with logits for the last position only; ``tg`` is tokens/s generating N tokens one
at a time from an empty cache. Token ids are seeded pseudo-random (as llama-bench's), so
no tokenizer or sampler time is counted. Each test runs once untimed (warm-up), then
``-r`` times; we report the mean, standard deviation and median over the repetitions,
and the process's peak resident memory.

``--vs-llama-cpp`` runs llama.cpp (llama-cpp-python) on the same file, thread count and
token ids in the same run, each repetition right after ours (a noisy neighbour on a shared
machine then slows both alike), and prints the ratios of the medians. When
llama-cpp-python is not importable here, ``--llama-python PY`` names an interpreter that
has it (llama.cpp then runs in that child process, and the peak RSS is ours alone).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ..engine import timing
from . import CLIError, UsageError
from .common import (
    add_kv_cache_options,
    add_model_argument,
    batch_size,
    kv_cache_type,
    refuse_encoder,
    say_if_compiling,
    use_kv_cache_type,
)
from .common import non_negative_int as _non_negative
from .common import positive_int as _positive


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "bench", help="prompt-processing and generation speed (llama-bench's definitions)",
        description="Measure prompt processing (pp: a P-token prompt from an empty cache, "
                    "logits for the last position) and generation (tg: N tokens one at a "
                    "time) in tokens/s, as llama-bench does.")
    add_model_argument(p, optional=True)
    p.add_argument("-p", "--n-prompt", type=_sizes, action=_Extend, default=[128],
                   metavar="P[,P...]",
                   help="prompt tokens for the pp test; a list runs one test each "
                        "(default 128; 0 skips it)")
    p.add_argument("-n", "--n-gen", type=_sizes, action=_Extend, default=[64],
                   metavar="N[,N...]",
                   help="tokens for the tg test; a list runs one test each (default 64; 0 "
                        "skips it)")
    p.add_argument("-t", "--threads", type=_counts, default=None, metavar="N",
                   help="threads (default: the cores available); llama-bench's list "
                        "(1,2,4) runs the first only, with a note")
    p.add_argument("-r", "--repetitions", type=_positive, default=3, metavar="R",
                   help="timed repetitions of each test (default 3)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("-o", "--output", choices=("md", "json", "csv", "jsonl", "sql"),
                   default="md", help="llama-bench's output formats: md (the table, the "
                                      "default) and json (--json); csv, jsonl and sql are "
                                      "not made here: the table instead, with a note")
    for short, long, what in (("-b", "--batch-size", "logical"), ("-ub", "--ubatch-size",
                                                                    "physical")):
        p.add_argument(short, long, type=_counts, default=None, metavar="N",
                       help=f"{what} batch: pp's rows per product are min(-b, -ub), at most "
                            "512 (default: 512); a list runs the first only, with a note")
    add_kv_cache_options(p)
    p.add_argument("--no-warmup", dest="warmup", action="store_false",
                   help="time every repetition (none is an untimed warm-up first)")
    p.add_argument("--vs-llama-cpp", action="store_true",
                   help="also run llama.cpp (llama-cpp-python) and print the ratios")
    p.add_argument("--llama-python", default=None, metavar="PY",
                   help="a Python interpreter with llama-cpp-python, for --vs-llama-cpp when "
                        "it is not importable here")
    p.add_argument("--kernels", action="store_true",
                   help="print which kernel variants run on this CPU and why (the SIMD "
                        "flavour, the interleaved GEMM's types, decoding's row walk as "
                        "measured on the most common integer type of MODEL, now if this "
                        "CPU has no measurement yet) and exit")
    p.set_defaults(func=run, owns_cores=True)  # one user's command: spinning workers


class _Extend(argparse.Action):
    """llama-bench's lists: comma-separated, or the option repeated (the values add up;
    the default goes once one is given)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        given = getattr(namespace, f"_{self.dest}_given", False)
        old = getattr(namespace, self.dest) if given else []
        setattr(namespace, self.dest, [*old, *values])
        setattr(namespace, f"_{self.dest}_given", True)


def _counts(text: str) -> list[int]:
    """argparse type: a positive count or llama-bench's comma-separated list of them."""
    return [_positive(x.strip()) for x in text.split(",")]


def _first_of_lists(args: argparse.Namespace) -> None:
    """-t/-b/-ub lists: gguflm bench measures one setting a run, the first (said in a
    note); the lists become that one value."""
    for name, flag in (("threads", "-t"), ("batch_size", "-b"), ("ubatch_size", "-ub")):
        values = getattr(args, name)
        if values is None:
            continue
        if len(values) > 1:
            print(f"note: {flag} {','.join(map(str, values))}: gguflm bench measures one "
                  f"value a run; using {values[0]}", file=sys.stderr)
        setattr(args, name, values[0])


def _sizes(text: str) -> list[int]:
    """argparse type: a token count or a comma-separated list of them (llama-bench's)."""
    return [_non_negative(x.strip()) for x in text.split(",")]


def _stats(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "mean": statistics.fmean(values),
            "std": statistics.stdev(values) if len(values) > 1 else 0.0}


def _peak_rss_mb() -> float:
    try:
        import resource
    except ImportError:  # not on this platform
        return float("nan")
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # bytes on macOS
    return kb * 1024 / 1e6 if sys.platform != "darwin" else kb / 1e6


def _token_ids(n_vocab: int, count: int, seed: int) -> list[int]:
    import numpy as np

    rng = np.random.default_rng(seed)
    return [int(t) for t in rng.integers(0, n_vocab, size=count)]


class _Ours:
    """Our model: one timed pp or tg run per call (seconds)."""

    def __init__(self, model: Any, n_ctx: int, n_batch: int) -> None:
        self.model, self.n_ctx, self.n_batch = model, n_ctx, n_batch

    def pp(self, prompt: list[int]) -> float:
        return timing.prefill_seconds(self.model, prompt, self.n_ctx, self.n_batch)  # -b/-ub

    def tg(self, gen: list[int]) -> float:
        return timing.decode_seconds(self.model, gen, self.n_ctx)

    def close(self) -> None:
        pass


# llama.cpp through llama-cpp-python: in this process, or as a child interpreter that reads
# one command per line ("pp" / "tg" / "quit") and answers the seconds it took.
_LLAMA_SCRIPT = r'''
import json, sys, time
from llama_cpp import Llama

class Runner:
    def __init__(self, path, threads, n_ctx, n_batch):
        self.llm = Llama(model_path=path, n_ctx=n_ctx + 8, n_batch=n_batch, n_ubatch=n_batch,
                         n_threads=threads, n_threads_batch=threads, logits_all=False,
                         verbose=False)

    def pp(self, prompt):
        self.llm.reset()
        t0 = time.perf_counter()
        self.llm.eval(prompt)
        return time.perf_counter() - t0

    def tg(self, gen):
        self.llm.reset()
        t0 = time.perf_counter()
        for tok in gen:
            self.llm.eval([tok])
        return time.perf_counter() - t0

    def close(self):
        self.llm.close()

if __name__ == "__main__":
    path, threads, n_ctx, n_batch = sys.argv[1], *map(int, sys.argv[2:5])
    prompt, gen = json.loads(sys.argv[5]), json.loads(sys.argv[6])
    r = Runner(path, threads, n_ctx, n_batch)
    print("ready", flush=True)
    for line in sys.stdin:
        cmd, _, size = line.strip().partition(" ")
        if cmd == "quit":
            break
        n = int(size) if size else None
        print(r.pp(prompt[:n]) if cmd == "pp" else r.tg(gen[:n]), flush=True)
    r.close()
'''


class _LlamaChild:
    """llama.cpp in a child interpreter (one that has llama-cpp-python)."""

    def __init__(self, python: str, path: Path, threads: int, n_ctx: int, n_batch: int,
                 prompt: list[int], gen: list[int]) -> None:
        self.prompt, self.gen = prompt, gen
        env = dict(os.environ)
        for name in os.environ.get("GGUFLM_OMP_DEFAULTED", "").split(","):
            env.pop(name, None)  # our OpenMP defaults are not llama.cpp's
        cmd = [python, "-c", _LLAMA_SCRIPT, str(path), str(threads), str(n_ctx), str(n_batch),
               json.dumps(prompt), json.dumps(gen)]
        try:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, text=True, env=env)
        except OSError as e:
            raise CLIError(f"cannot run {python}: {e.strerror or e}") from None
        self._expect("ready")

    def _expect(self, what: str) -> str:
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line:
            err = self.proc.stderr.read() if self.proc.stderr else ""
            tail = (err.strip().splitlines() or ["(no output)"])[-1]
            raise CLIError(f"llama.cpp run failed: {tail}")
        return line.strip()

    def _ask(self, cmd: str) -> float:
        assert self.proc.stdin is not None
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        return float(self._expect(cmd.split()[0]))

    def pp(self, prompt: list[int]) -> float:
        return self._ask(f"pp {len(prompt)}")

    def tg(self, gen: list[int]) -> float:
        return self._ask(f"tg {len(gen)}")

    def close(self) -> None:
        if self.proc.poll() is None and self.proc.stdin:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.flush()
        self.proc.wait(timeout=60)


def _llama_runner(python: str | None, path: Path, threads: int, n_ctx: int, n_batch: int,
                  prompt: list[int], gen: list[int]) -> Any:
    if python is not None:
        return _LlamaChild(python, path, threads, n_ctx, n_batch, prompt, gen)
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        raise CLIError("--vs-llama-cpp needs llama-cpp-python (pip install llama-cpp-python), "
                       "or --llama-python PY naming an interpreter that has it") from None
    namespace: dict[str, Any] = {"__name__": "gguflm_llama_bench"}
    exec(compile(_LLAMA_SCRIPT, "<llama-bench>", "exec"), namespace)  # noqa: S102
    return namespace["Runner"](str(path), threads, n_ctx, n_batch)


def _measure(runners: dict[str, Any], tests: list[tuple[str, int]], prompt: list[int],
             gen: list[int], reps: int, warmup: bool = True
             ) -> dict[str, dict[tuple[str, int], dict[str, float]]]:
    """Each test, each runner in turn within a repetition (so that a noisy neighbour hits
    both alike); the first repetition is an untimed warm-up (unless not ``warmup``)."""
    res: dict[str, dict[tuple[str, int], Any]] = {name: {} for name in runners}
    for test, n in tests:
        ids = (prompt if test == "pp" else gen)[:n]
        times: dict[str, list[float]] = {name: [] for name in runners}
        for rep in range(0 if warmup else 1, reps + 1):
            for name, runner in runners.items():
                dt = getattr(runner, test)(ids)
                if rep:
                    times[name].append(dt)
        for name in runners:
            res[name][(test, n)] = _stats([len(ids) / t for t in times[name]])
    return res


def _model_label(path: Path) -> tuple[str, str, str]:
    """llama-bench's model, size and params columns: "llama 135M Q4_1", "98.36 MB",
    "134.52 M" (sizes in MB of 10^6 bytes, as everywhere in gguflm)."""
    from .. import gguf
    from ..gguf.summary import summarize

    with gguf.open(path) as f:
        s = summarize(f)
    n = s.get("n_params") or 0
    size = s.get("n_bytes") or os.path.getsize(path)
    scaled = next(((n / d, u) for d, u in ((1e9, "B"), (1e6, "M"), (1e3, "K")) if n >= d),
                  (n, ""))
    name = f"{s.get('architecture') or '?'} {scaled[0]:.0f}{scaled[1]} " \
           f"{(s.get('file_type_name') or '?').removeprefix('MOSTLY_')}"
    return name, f"{size / 1e6:.2f} MB", f"{scaled[0]:.2f} {scaled[1]}".strip()


def _table(rows: list[list[str]]) -> str:
    """A markdown table as llama-bench prints it (text left, numbers right)."""
    head = ["model", "size", "params", "backend", "threads", "test", "t/s"]
    right = {1, 2, 4, 5, 6}
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.rjust(w) if i in right else c.ljust(w)
                                 for i, (c, w) in enumerate(zip(cells, widths))) + " |"
    sep = "| " + " | ".join("-" * (w - 1) + ":" if i in right else "-" * w
                            for i, w in enumerate(widths)) + " |"
    return "\n".join([line(head), sep, *(line(r) for r in rows)])


def _kernels(args: argparse.Namespace) -> int:
    """``--kernels``: the variants and the measured choice, as lines (or one JSON object)."""
    from .. import load_model
    from ..quant import calibrate
    from .pull import resolve

    entry = calibrate.ensure(load_model(resolve(args.model)).kernel_types_by_size())
    if args.json:
        print(json.dumps({"cpu_key": calibrate.cpu_key(), "choice": entry,
                          "lines": calibrate.describe(entry)}))
    else:
        print("\n".join(calibrate.describe(entry)))
    return 0


def run(args: argparse.Namespace) -> int:
    if args.kernels:
        return _kernels(args)
    if args.output == "json":
        args.json = True
    elif args.output != "md":
        print(f"note: -o {args.output}: gguflm bench prints llama-bench's markdown table or "
              "JSON (-o json); here the table", file=sys.stderr)
    _first_of_lists(args)
    tests = [("pp", n) for n in args.n_prompt if n] + [("tg", n) for n in args.n_gen if n]
    if not tests:
        raise UsageError("nothing to measure: -p and -n are both 0")
    from .. import load_model
    from ..quant.matrix import set_threads
    from .pull import resolve

    path = resolve(args.model)
    threads = set_threads(args.threads)
    from ..quant import kernels

    say_if_compiling()
    compile_s = kernels.warm_up()
    t0 = time.perf_counter()
    model = load_model(path)
    use_kv_cache_type(model, kv_cache_type(args))
    refuse_encoder(model, path)
    load_s = time.perf_counter() - t0
    n_vocab = model.config.n_vocab
    prompt = _token_ids(n_vocab, max(args.n_prompt), seed=1)
    gen = _token_ids(n_vocab, max(args.n_gen), seed=2)
    # first products load (or compile) the kernels: timed separately, as the start-up cost
    warmup_s = timing.warm(model, prompt, gen)
    n_ctx = max(len(prompt), len(gen), 1)
    runners: dict[str, Any] = {"gguflm": _Ours(model, n_ctx, batch_size(args))}
    if args.vs_llama_cpp:
        runners["llama.cpp"] = _llama_runner(args.llama_python, path, threads, n_ctx,
                                             max(len(prompt), 1), prompt, gen)
    try:
        measured = _measure(runners, tests, prompt, gen, args.repetitions, args.warmup)
    finally:
        for runner in runners.values():
            runner.close()
    ours = measured["gguflm"]
    rss = _peak_rss_mb()  # includes llama.cpp's when it ran in this process
    file_mb = os.path.getsize(path) / 1e6
    kv_mb = model.new_cache(n_ctx).nbytes / 1e6
    single = len(args.n_prompt) == 1 and len(args.n_gen) == 1
    first_pp = next(((t, n) for t, n in tests if t == "pp"), None)
    first_tg = next(((t, n) for t, n in tests if t == "tg"), None)
    result: dict[str, Any] = {
        "model": str(path), "file_mb": round(file_mb, 1), "threads": threads,
        "n_prompt": args.n_prompt[0] if single else args.n_prompt,
        "n_gen": args.n_gen[0] if single else args.n_gen, "repetitions": args.repetitions,
        "pp_tps": ours[first_pp]["median"] if first_pp else None,
        "tg_tps": ours[first_tg]["median"] if first_tg else None,
        "pp": ours.get(first_pp), "tg": ours.get(first_tg),
        "peak_rss_mb": round(rss, 1), "kv_cache_mb": round(kv_mb, 1),
        "kernels_s": round(compile_s, 3), "load_s": round(load_s, 3),
        "first_forward_s": round(warmup_s, 3),
    }
    if not single:
        result["tests"] = [{"test": f"{t}{n}", "n_prompt": n if t == "pp" else 0,
                            "n_gen": n if t == "tg" else 0, **ours[(t, n)]} for t, n in tests]
    if "llama.cpp" in measured:
        result["rss_includes_llama_cpp"] = args.llama_python is None
        ref = measured["llama.cpp"]
        result["llama_cpp"] = {"pp": ref.get(first_pp), "tg": ref.get(first_tg)}
        for test, key in (("pp", first_pp), ("tg", first_tg)):
            if key in ours and key in ref:
                result[f"ratio_{test}"] = round(ours[key]["median"] / ref[key]["median"], 3)
        if not single:
            result["llama_cpp"]["tests"] = [{"test": f"{t}{n}", **ref[(t, n)]}
                                            for t, n in tests]

    if args.json:
        print(json.dumps(result))
        return 0
    name, size, params = _model_label(path)
    rows = []
    for runner, res in measured.items():
        backend = "CPU" if runner == "gguflm" else "llama.cpp CPU"
        for t, n in tests:
            st = res[(t, n)]
            rows.append([name, size, params, backend, str(threads), f"{t}{n}",
                         f"{st['mean']:.2f} ± {st['std']:.2f}"])
    print(_table(rows))
    print()
    print(f"repetitions: {args.repetitions}; start-up: kernels {compile_s:.2f} s, model load "
          f"{load_s:.2f} s, first forward {warmup_s:.2f} s")
    if "llama.cpp" in measured:
        ref = measured["llama.cpp"]
        print("gguflm / llama.cpp (medians): " + ", ".join(
            f"{t}{n} {ours[(t, n)]['median'] / ref[(t, n)]['median']:.2f}x" for t, n in tests))
    note = " (llama.cpp's included: it ran in this process)" \
        if result.get("rss_includes_llama_cpp") else ""
    print(f"peak RSS: {rss:.1f} MB (model file {file_mb:.1f} MB + KV cache {kv_mb:.1f} MB; "
          f"ratio {rss / (file_mb + kv_mb):.2f}){note}")
    return 0
